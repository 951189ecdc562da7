"""gcis-migrate under --log-json: every line on stderr is JSON, and every migration's end is one of them, as a
harvest run's is. A migration the lock or a store stopped wrote nothing on stderr (its summary went to stdout
only), and a failed or missing key was logged at INFO like a copied one."""
from __future__ import annotations

import json
import subprocess

from gcis_etl.locks import RunLock
from tests.servers import free_port
from tests.test_migrations import PIPELINE, Site, folder_site, ok


def logged(proc: subprocess.CompletedProcess) -> list[dict]:
    return [json.loads(line) for line in proc.stderr.splitlines()]  # every line JSON


def ends(lines: list[dict]) -> list[dict]:
    return [line for line in lines if "exit_code" in line]


def loaded(tmp_path) -> Site:
    site = folder_site(tmp_path)
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    return site


def test_a_completed_migration_logs_its_end_at_info(tmp_path):
    site = folder_site(tmp_path)
    lines = logged(proc := site.migrate("initial_load", "--pipeline", PIPELINE, "--log-json"))
    assert proc.returncode == 0, proc.stderr
    [end] = ends(lines)
    assert end["level"] == "info" and end["status"] == "completed" and end["exit_code"] == 0, end
    assert end["message"].startswith("initial_load: completed: 4 deposited") and end["counts"]["deposited"] == 4
    assert end["report"] and proc.stdout.rstrip().endswith(end["report"])


def test_a_migration_the_lock_stops_says_so_and_logs_its_end(tmp_path):
    site = loaded(tmp_path)
    with RunLock(site.root / "state" / "locks" / f"{PIPELINE}.lock", "a harvest"):
        proc = site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", "{kind: local, root: other}",
                            "--log-json")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    lines = logged(proc)
    [said] = [line for line in lines if line["level"] == "error"]
    assert said["logger"] == "gcis_etl.cli" and "is already running" in said["message"], said
    [end] = ends(lines)
    assert end["level"] == "warning" and end["status"] == "stopped" and end["exit_code"] == 3, end
    assert "already running" in end["note"]


def test_a_migration_a_store_stops_says_so_and_logs_its_end(tmp_path, monkeypatch):
    site = loaded(tmp_path)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-not-logged")
    down = json.dumps({"kind": "s3", "bucket": "gone", "endpoint_url": f"http://127.0.0.1:{free_port()}",
                       "region": "us-east-1", "retry": {"max_attempts": 1}})
    proc = site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", down, "--log-json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = logged(proc)
    [said] = [line for line in lines if line["level"] == "error"]
    assert said["message"].startswith("move_store: stopped on an error: StoreUnavailable: "), said
    [end] = ends(lines)
    assert end["level"] == "warning" and end["status"] == "stopped on an error" and end["exit_code"] == 1, end
    assert "secret-not-logged" not in proc.stderr


def test_a_failed_and_a_missing_key_are_warnings(tmp_path):
    site = loaded(tmp_path)
    damaged = site.store / PIPELINE / "b" / "b~2Fx.jpg.tif"
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 0xFF
    with open(damaged, "r+b") as f:  # the same size: only the bytes read show it
        f.write(data)
    (site.store / PIPELINE / "c" / "c~2Fy.tif.tif").unlink()
    proc = site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", "{kind: local, root: other}",
                        "--log-json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = logged(proc)
    levels = {line["outcome"]: line["level"] for line in lines if "outcome" in line}
    assert levels == {"copied": "info", "failed": "warning", "missing": "warning"}, lines
    [end] = ends(lines)
    assert end["level"] == "warning" and end["status"] == "completed" and end["counts"]["failed"] == 1, end
