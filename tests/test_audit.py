"""The fixity audit (`gcis-migrate audit`), run as an operator runs it, on a few tiny masters harvested from a
folder into a local store or MinIO: objects damaged or deleted behind the ledger's back are found, named, and
re-derived with --repair; --limit slices, --older-than and --dry-run read only what they say."""
from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sqlite3
from pathlib import Path

import pytest

from gcis_etl.config import load_config
from gcis_etl.deposits import pipeline_keys
from gcis_etl.errors import StoreUnavailable
from gcis_etl.ledger import Ledger, now
from gcis_etl.migration import MigrationContext, MigrationReport, load_script
from gcis_etl.progress import AuditProgress, audit_progress
from gcis_etl.stores import open_store
from tests.emulators.faults import Fault, FaultInjector
from tests.servers import s3_fault_proxy
from tests.harvests import wait_for
from tests.test_migrations import (BIN, CORPUS, MASTERS, PIPELINE, bucket_objects, folder_site, ok, report_of,
                                   s3_store)

DAMAGED = "museum/b/b~2Fx.jpg.tif"
DELETED = "museum/a/a~2Fp1.png.tif"
MANIFEST = "museum/c/manifest-v3.json"
KEYS = 8  # 4 access masters, 3 manifests, the collection


def audit(site, *args: str, code: int = 0) -> dict:
    return report_of(ok(site.migrate("audit", "--pipeline", PIPELINE, *args), code))


def problems(report: dict) -> dict[str, tuple[str, str]]:
    """The report's CSV: key -> (outcome, reason)."""
    with open(report["csv_path"], newline="") as f:
        return {row["subject"]: (row["outcome"], row["reason"]) for row in csv.DictReader(f)}


def audits(site) -> dict[str, tuple[str, str]]:
    """key -> (audited, outcome), as the ledger records them."""
    with site.ledger() as ledger:
        return {key: (record.audited, record.outcome) for key in site.keys
                if (record := ledger.audit(PIPELINE, key)) is not None}


def recorded(site) -> dict[str, str]:
    """The ledger's SHA-256 of every access master."""
    with site.ledger() as ledger:
        return {r.output_key: r.sha256 for r in ledger.items(PIPELINE)}


def loaded(tmp_path):
    site = folder_site(tmp_path)
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    site.keys = sorted(site.stored())
    assert len(site.keys) == KEYS
    return site


def flip_a_byte(path) -> None:
    """In place: the same file and size, so the store's sidecar still vouches for it."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    with open(path, "r+b") as f:
        f.write(data)


def test_damaged_and_missing_keys_are_named_and_repair_re_derives_them_from_the_source(tmp_path):
    site = loaded(tmp_path)
    before = site.stored()
    sha256 = recorded(site)
    flip_a_byte(site.store / DAMAGED)
    (site.store / DELETED).unlink()
    (site.store / MANIFEST).unlink()

    report = audit(site, code=1)
    assert report["counts"] == {"ok": 5, "damaged": 1, "missing": 2}
    found = problems(report)
    assert {key: outcome for key, (outcome, _) in found.items()} == {DAMAGED: "damaged", DELETED: "missing",
                                                                     MANIFEST: "missing"}
    damage = hashlib.sha256((site.store / DAMAGED).read_bytes()).hexdigest()
    size = len(before[DAMAGED])
    assert found[DAMAGED][1] == (f"the ledger recorded SHA-256 {sha256[DAMAGED][:12]} ({size} bytes), "
                                 f"read SHA-256 {damage[:12]} ({size} bytes)")
    assert found[DELETED][1] == f"not in {site.store / DELETED}"
    assert {key: outcome for key, (_, outcome) in audits(site).items()} == {
        key: found.get(key, ("ok",))[0] for key in site.keys}

    report = audit(site, "--repair")
    assert report["counts"]["ok"] == 5 and report["counts"]["repaired"] == 3, report
    assert set(problems(report)) == {DAMAGED, DELETED, MANIFEST}
    assert problems(report)[DAMAGED] == ("repaired", f"was damaged: {found[DAMAGED][1]}")

    report = audit(site)
    assert report["counts"] == {"ok": KEYS}
    stored = site.stored()
    assert {key: hashlib.sha256(stored[key]).hexdigest() for key in sha256} == recorded(site)
    assert set(stored) == set(before)


def test_a_limit_audits_a_slice_and_the_next_run_goes_on_with_the_keys_not_audited(tmp_path):
    site = loaded(tmp_path)
    first = audit(site, "--limit", "3")
    assert first["status"] == "completed" and first["counts"] == {"ok": 3}
    assert first["notes"] == ["audited 3 of 8 keys (--limit 3): the next run goes on with those not audited, or "
                              "audited longest ago"]
    sliced = audits(site)
    assert len(sliced) == 3

    assert audit(site, "--limit", "3")["counts"] == {"ok": 3}
    after = audits(site)
    assert len(after) == 6 and {key: after[key] for key in sliced} == sliced  # none read again

    assert audit(site, "--limit", "3")["counts"] == {"ok": 3}
    last = audits(site)
    assert set(last) == set(site.keys)
    again = [key for key in sliced if last[key] != sliced[key]]
    assert len(again) == 1 and again[0] == min(sliced, key=lambda key: sliced[key][0])  # the oldest audit


def test_older_than_leaves_out_the_keys_audited_recently(tmp_path):
    site = loaded(tmp_path)
    assert audit(site)["counts"] == {"ok": KEYS}
    flip_a_byte(site.store / DAMAGED)
    out = ok(site.migrate("audit", "--pipeline", PIPELINE, "--older-than", "1"))
    assert out.startswith("audit: completed: nothing to do"), out
    assert report_of(out)["counts"] == {}
    assert audit(site, "--older-than", "0", code=1)["counts"] == {"ok": KEYS - 1, "damaged": 1}


def test_max_minutes_stops_starting_keys_and_a_rerun_goes_on(tmp_path):
    site = loaded(tmp_path)
    out = ok(site.migrate("audit", "--pipeline", PIPELINE, "--max-minutes", "0.000001"))
    assert out.startswith("audit: stopped: nothing done"), out
    assert report_of(out)["notes"] == ["stopped: --max-minutes 1e-06 spent: run again to go on"]
    assert audits(site) == {}
    assert audit(site, "--max-minutes", "60")["counts"] == {"ok": KEYS}


def test_a_dry_run_counts_the_keys_it_would_read_and_reads_nothing(tmp_path):
    site = loaded(tmp_path)
    flip_a_byte(site.store / DAMAGED)
    out = ok(site.migrate("audit", "--pipeline", PIPELINE, "--dry-run"))
    assert out.strip() == f"audit: dry-run: {KEYS} would audit"
    assert ok(site.migrate("audit", "--pipeline", PIPELINE, "--dry-run", "--limit", "3")).startswith(
        "audit: dry-run: 3 would audit")
    assert audits(site) == {}
    assert not list((site.root / "state" / "reports").glob("audit-*"))


def test_a_key_the_store_cannot_read_is_unreadable_not_damaged(tmp_path):
    site = loaded(tmp_path)
    (site.store / MANIFEST).unlink()
    (site.store / MANIFEST).mkdir()  # there, but no object can be read from it
    report = audit(site, code=1)
    assert report["counts"] == {"ok": KEYS - 1, "unreadable": 1}
    outcome, reason = problems(report)[MANIFEST]
    assert (outcome, reason) == ("unreadable", f"{site.store / MANIFEST}: cannot read: Is a directory")
    assert not (site.root / "state" / "scratch" / f"audit-{PIPELINE}").exists()  # nothing copied: no scratch room


def test_an_older_ledger_gets_the_audits_table_and_reads_as_never_audited(tmp_path):
    path = tmp_path / "ledger.sqlite"
    Ledger(path).close()
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE audits")
    with Ledger(path, read_only=True) as ledger:  # as a dry run opens it: nothing written
        assert ledger.audit_queue("p", [("k1", "1"), ("k2", "2")], None) == 2
        assert list(ledger.audit_queued()) == [("k1", "1"), ("k2", "2")]
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT 1 FROM sqlite_master WHERE name='audits'").fetchone() is None
    with Ledger(path) as ledger:
        ledger.record_audit("p", "k1", "ok")
        assert ledger.audit_queue("p", [("k1", "1"), ("k2", "2")], None) == 2
        assert list(ledger.audit_queued()) == [("k2", "2"), ("k1", "1")]  # never audited first


def test_a_store_in_minio_is_audited_and_repaired_alike(tmp_path, minio, s3_bucket, aws_env):
    site = folder_site(tmp_path)
    site.configure(s3_store(minio, s3_bucket))
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    before = bucket_objects(minio, s3_bucket)
    site.keys = sorted(before)
    client = minio.client()
    client.put_object(Bucket=s3_bucket, Key=f"iiif/{DAMAGED}", Body=b"other bytes")  # another tool's
    client.put_object(Bucket=s3_bucket, Key=f"iiif/{MANIFEST}", Body=b"{}")
    client.delete_object(Bucket=s3_bucket, Key=f"iiif/{DELETED}")

    report = audit(site, code=1)
    assert report["counts"] == {"ok": 5, "damaged": 2, "missing": 1}
    found = problems(report)
    assert {key: outcome for key, (outcome, _) in found.items()} == {DAMAGED: "damaged", MANIFEST: "damaged",
                                                                     DELETED: "missing"}
    assert found[DAMAGED][1].endswith("read SHA-256 " + hashlib.sha256(b"other bytes").hexdigest()[:12] +
                                      " (11 bytes)")
    assert found[MANIFEST][1].startswith("the store records no SHA-256 for it")

    assert audit(site, "--repair")["counts"]["repaired"] == 3
    assert audit(site)["counts"] == {"ok": KEYS}
    stored = bucket_objects(minio, s3_bucket)
    assert set(stored) == set(before)
    assert {key: hashlib.sha256(stored[key]).hexdigest() for key in recorded(site)} == recorded(site)


def test_queueing_keys_holds_no_lock_between_batches_so_a_harvest_can_commit(tmp_path):
    """The entries are read from the ledger as they are queued (pipeline_keys): with journal_mode delete a
    transaction open across those reads would keep another process's harvest from committing."""
    path = tmp_path / "ledger.sqlite"
    Ledger(path, journal_mode="delete").close()
    committed = []

    def entries(ledger):
        for n in range(6):
            if n and n % 2 == 0:
                ledger.audit("p", "k0")  # a read of the ledger, as the next page of pipeline_keys'
                with sqlite3.connect(path, timeout=0.2) as other:  # another pipeline's harvest
                    other.execute("INSERT INTO audits (pipeline, key, audited, outcome) VALUES (?,?,?,?)",
                                  ("other", f"k{n}", "2024-01-01T00:00:00+00:00", "ok"))
                committed.append(n)
            yield f"k{n}", str(n)

    with Ledger(path, journal_mode="delete") as ledger:
        assert ledger.audit_queue("p", entries(ledger), None, page=2) == 6
    assert committed == [2, 4]


def test_the_access_master_of_an_item_whose_re_derivation_failed_is_still_required(tmp_path):
    """The item keeps its last deposit, which its published manifest still shows: gone from the store, it is
    missing, not a superseded access master retired since."""
    site = loaded(tmp_path)
    (site.root / "masters" / "b" / "x.jpg").write_bytes(b"not an image any more")
    ok(site.run("gcis-etl", "harvest"), 1)
    status, _, key = site.items()["b/x.jpg"]
    assert status in ("rejected", "failed") and key == DAMAGED
    (site.store / DAMAGED).unlink()
    report = audit(site, code=1)
    assert report["counts"] == {"ok": KEYS - 1, "missing": 1}
    assert problems(report)[DAMAGED] == ("missing", f"not in {site.store / DAMAGED}")


def audit_module():
    """migrations/audit.py, as run_script and migrate() load it."""
    return load_script("audit")


@pytest.mark.parametrize("cut", ["signal", "max-minutes"])
def test_a_repair_that_cannot_run_leaves_a_damaged_manifest_in_place_and_reports_it_damaged(tmp_path, cut):
    """A SIGTERM, or --max-minutes spent, after the last key was read and before the repair: the damaged
    manifest is not deleted (no harvest would publish it again), and is reported as found."""
    site = loaded(tmp_path)
    flip_a_byte(site.store / MANIFEST)
    damaged = (site.store / MANIFEST).read_bytes()
    config = load_config(site.config)
    ctx = MigrationContext(config, MigrationReport("audit", False, config.reports_dir))
    pipeline = ctx.pipeline(PIPELINE)
    with ctx.ledger() as ledger, ctx.lock(PIPELINE) as lock:
        audit = audit_module().Audit(ctx, pipeline, open_store(pipeline.settings.store), lock,
                                     audit_progress(PIPELINE, KEYS, ctx.report.counts))

        def keys():
            yield from pipeline_keys(ledger, pipeline)
            if cut == "signal":
                ctx.stop.set()
            else:
                ctx.budget.minutes = 1e-9

        assert audit.run(ledger, keys(), 1, None) == KEYS
    assert ctx.report.counts == {"ok": KEYS - 1, "damaged": 1}
    assert (site.store / MANIFEST).read_bytes() == damaged
    assert [e.subject for e in ctx.report.problems] == [MANIFEST]
    assert ctx.report.runs == []  # no harvest
    if cut == "max-minutes":  # a signal's is said once the script returns, as for any migration
        assert (ctx.report.status, ctx.report.notes) == (
            "stopped", ["stopped: --max-minutes 1e-09 spent before the repair of 1 object: run again to go on"])


def test_keys_last_found_a_problem_come_first_and_a_slice_that_leaves_some_out_exits_1(tmp_path):
    """Every finding is recorded with the time it was made: keys found damaged went to the back of the queue, so a
    --limit or --older-than run skipped them and exited 0 while the ledger recorded them damaged."""
    site = loaded(tmp_path)
    assert audit(site)["counts"] == {"ok": KEYS}
    flip_a_byte(site.store / DAMAGED)
    (site.store / DELETED).unlink()
    found = problems(audit(site, code=1))
    assert {key: outcome for key, (outcome, _) in found.items()} == {DAMAGED: "damaged", DELETED: "missing"}

    report = audit(site, "--older-than", "1", "--limit", "1", code=1)  # every key audited within the day
    assert report["counts"] == {"damaged": 1, "missing": 1}
    listed = problems(report)
    read, = [key for key, (_, reason) in listed.items() if reason == found[key][1]]
    left, = set(listed) - {read}
    with site.ledger() as ledger:
        recorded_at = ledger.audit(PIPELINE, left).audited
    assert listed[left] == (found[left][0], f"not read by this run (outside its slice); recorded {recorded_at}: "
                                            f"{found[left][1]}")
    assert report["notes"][0] == ("1 key recorded damaged/missing/unreadable was not in this slice (listed with the "
                                  "reason recorded: \"not read by this run\"): run again with --repair to read it")

    report = audit(site, "--older-than", "1", "--repair")
    assert {outcome: n for outcome, n in report["counts"].items() if n} == {
        "repaired": 2, "deposited": 3, "manifests published": 2}  # objects a and b harvested again
    assert audit(site, "--older-than", "1")["counts"] == {}  # all audited today, and found right


def test_the_queue_puts_keys_last_found_a_problem_first_whenever_they_were_audited(tmp_path):
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        before = now()
        ledger.record_audit("p", "damaged", "damaged", "bytes differ")
        ledger.record_audit("p", "unreadable", "unreadable", "refused")
        ledger.record_audit("p", "fine", "ok")
        entries = [(key, key) for key in ("fine", "new", "unreadable", "damaged")]
        assert ledger.audit_queue("p", entries, None) == 4
        assert [key for key, _ in ledger.audit_queued()] == ["damaged", "unreadable", "new", "fine"]
        assert ledger.audit_queue("p", entries, before) == 3  # all audited since: only the one found ok left out
        assert [key for key, _ in ledger.audit_queued()] == ["damaged", "unreadable", "new"]
        assert [r.key for r in ledger.audit_problems_left("p", now())] == ["damaged", "unreadable"]
        assert list(ledger.audit_problems_left("p", before)) == []  # a run that began before: it read them


class DownAfterADelete(FaultInjector):
    """Every request passes until the first DELETE; every one after it is answered 503: the store goes down right
    after a repair deleted a damaged manifest, before the harvest that would publish it again."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    def take(self, method: str, target: str) -> Fault | None:
        if self.down:
            return Fault.http(503)
        self.down = method == "DELETE"
        return None


def test_a_manifest_deleted_for_a_repair_whose_harvest_fails_is_recorded_missing_and_repaired_first(
        tmp_path, minio, s3_bucket, aws_env):
    """It was reported, and recorded, damaged as found: but it was gone, and went to the back of the queue."""
    site = folder_site(tmp_path)
    with s3_fault_proxy(minio) as proxy:
        site.configure({**s3_store(minio, s3_bucket), "endpoint_url": f"http://127.0.0.1:{proxy.server_port}",
                        "retry": {"mode": "standard", "max_attempts": 2}})
        ok(site.migrate("initial_load", "--pipeline", PIPELINE))
        site.keys = sorted(bucket_objects(minio, s3_bucket))
        minio.client().put_object(Bucket=s3_bucket, Key=f"iiif/{MANIFEST}", Body=b"{}")  # another tool's
        proxy.faults = DownAfterADelete()
        report = audit(site, "--repair", code=1)
        assert report["status"] == "stopped on an error", report
        assert {outcome: n for outcome, n in report["counts"].items() if n} == {"ok": KEYS - 1, "missing": 1}
        outcome, reason = problems(report)[MANIFEST]
        assert (outcome, reason.split(" (was damaged: ")[0]) == (
            "missing", "deleted for a repair that did not finish: run --repair again")
        assert f"iiif/{MANIFEST}" not in {f"iiif/{key}" for key in bucket_objects(minio, s3_bucket)}
        assert audits(site)[MANIFEST][1] == "missing"

        proxy.faults = FaultInjector()
        report = audit(site, "--limit", "1", "--repair")  # first in the queue
        assert report["counts"]["repaired"] == 1 and "ok" not in report["counts"], report
        assert problems(report)[MANIFEST][0] == "repaired"
        assert audit(site)["counts"] == {"ok": KEYS}


def test_a_repair_that_cannot_bring_back_an_item_the_source_no_longer_lists_says_so(tmp_path):
    site = loaded(tmp_path)
    flip_a_byte(site.store / DELETED)
    (site.root / "masters" / "a" / "p1.png").unlink()  # its object keeps a/p2.jpg
    report = audit(site, "--repair", code=1)
    outcome, reason = problems(report)[DELETED]
    assert outcome == "damaged"
    assert reason.startswith("the repair could not bring it back: the source no longer lists item 'a/p1.png' of "
                             "object 'a' (its master deleted or renamed since), whose access master it is (put its "
                             "master back in the source (under its old name) and run --repair again; until then it "
                             "is recorded lost, and no more reported as a problem): the ledger recorded SHA-256 "
                             ), reason


def test_a_key_whose_item_the_source_no_longer_lists_is_reported_once_then_recorded_lost(tmp_path):
    """It stayed damaged, read first every night, and every run exited 1 for ever: no repair brings it back."""
    site = loaded(tmp_path)
    flip_a_byte(site.store / DELETED)
    (site.root / "masters" / "a" / "p1.png").unlink()
    assert problems(audit(site, "--repair", code=1))[DELETED][0] == "damaged"
    assert audits(site)[DELETED][1] == "lost"
    for args in ((), ("--repair",)):
        report = audit(site, *args)
        outcome, reason = problems(report)[DELETED]
        assert outcome == "lost" and "put its master back in the source" in reason, reason
        assert report["counts"].get("lost") == 1 and audits(site)[DELETED][1] == "lost"

    shutil.copy(CORPUS / MASTERS["a/p1.png"], site.root / "masters" / "a" / "p1.png")  # put back: repaired
    report = audit(site, "--repair")
    assert problems(report)[DELETED][0] == "repaired" and audits(site)[DELETED][1] == "ok"


def test_a_live_line_shows_the_keys_audited_of_those_queued_and_the_problems(tmp_path, capsys):
    site = loaded(tmp_path)
    flip_a_byte(site.store / DAMAGED)
    config = load_config(site.config)
    ctx = MigrationContext(config, MigrationReport("audit", False, config.reports_dir))
    pipeline = ctx.pipeline(PIPELINE)
    progress = AuditProgress(PIPELINE, KEYS, True, False, ctx.report.counts)
    with ctx.ledger() as ledger:
        audit = audit_module().Audit(ctx, pipeline, open_store(pipeline.settings.store), None, progress)
        assert audit.run(ledger, pipeline_keys(ledger, pipeline), 1, None) == KEYS
    progress.clear()
    last = capsys.readouterr().err.split("\r")[-1]
    assert last.startswith(f"{PIPELINE}: {KEYS} of {KEYS} keys (problems 1 repaired 0), "), last
    assert "elapsed" in last


def test_the_report_files_and_the_end_line_name_the_pipeline(tmp_path):
    site = loaded(tmp_path)
    proc = site.migrate("audit", "--pipeline", PIPELINE, "--log-json")
    report = report_of(ok(proc))
    end, = [line for line in map(json.loads, proc.stderr.splitlines()) if "exit_code" in line]
    assert (report["pipeline"], end["pipeline"]) == (PIPELINE, PIPELINE)
    assert Path(end["report"]).name.startswith(f"audit-{PIPELINE}-") and end["report"].endswith(".json")


def test_a_ctrl_c_says_the_audit_finishes_the_keys_in_flight(tmp_path, minio, s3_bucket, aws_env):
    site = folder_site(tmp_path)
    with s3_fault_proxy(minio) as proxy:
        site.configure({**s3_store(minio, s3_bucket), "endpoint_url": f"http://127.0.0.1:{proxy.server_port}"})
        ok(site.migrate("initial_load", "--pipeline", PIPELINE))
        proxy.faults.inject(r"^GET .*manifest", Fault.slow(5), times=1)  # a key held in flight
        audit = subprocess.Popen([str(BIN / "gcis-migrate"), "audit", "--pipeline", PIPELINE, "--concurrency", "1"],
                                 cwd=site.root, env={**os.environ, "GCIS_CONFIG": str(site.config)},
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: any(line.endswith(" slow") for line in proxy.answered), "a key in flight")
        audit.send_signal(signal.SIGINT)
        out, err = audit.communicate(timeout=120)
    assert audit.returncode == 130, out + err
    assert "stopping after the keys in flight (Ctrl-C again to abandon them)" in err, err


def test_a_key_whose_store_went_down_is_not_counted_audited_on_the_live_line(tmp_path, minio, s3_bucket, aws_env):
    """It was: the line counted the key whose read raised StoreUnavailable as done."""
    site = folder_site(tmp_path)
    with s3_fault_proxy(minio) as proxy:
        site.configure({**s3_store(minio, s3_bucket), "endpoint_url": f"http://127.0.0.1:{proxy.server_port}",
                        "retry": {"max_attempts": 1}})
        ok(site.migrate("initial_load", "--pipeline", PIPELINE))
        proxy.faults.inject(r"^(HEAD|GET) ", Fault.http(503), times=None)
        config = load_config(site.config)
        ctx = MigrationContext(config, MigrationReport("audit", False, config.reports_dir))
        pipeline = ctx.pipeline(PIPELINE)
        progress = AuditProgress(PIPELINE, KEYS, False, False, ctx.report.counts)
        with ctx.ledger() as ledger:
            audit = audit_module().Audit(ctx, pipeline, open_store(pipeline.settings.store), None, progress)
            with pytest.raises(StoreUnavailable):
                audit.run(ledger, pipeline_keys(ledger, pipeline), 1, None)
    assert progress.done == 0 and ctx.report.counts == {}
