"""`gcis-etl harvest` on a filesystem source into a local store: the embedded default's shape, end to end."""
from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from gcis_etl.config import load_config
from gcis_etl.harvesting import HarvestOptions, decide, harvest
from gcis_etl.iiif_validation import require_valid
from gcis_etl.ledger import Ledger
from gcis_etl.locks import pipeline_lock
from gcis_etl.models import item_label
from gcis_etl.reports import pipeline_status
from gcis_etl.verification import verify
from tests.conftest import run_on_a_terminal

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "corpus"

# object folder -> corpus files (a rejected master among good ones, a whole rejected object)
OBJECTS = {
    "book-1": ["rgb8-tiff-lzw/hopper_lzw.tif", "gray8/hopper_gray.jpg", "truncated/truncated.jpg"],
    "print-2": ["cmyk-jpeg/pil_sample_cmyk.jpg"],
    "photo-3": ["icc-adobergb/sample.jpg", "exif-orientation/hopper_orientation_5.jpg"],
    "bad-4": ["multipage-tiff/multipage.tiff", "zero-byte/empty.tif"],
}


def expected_verdicts() -> dict[str, str]:
    with open(CORPUS / "MANIFEST.csv", newline="") as f:
        return {row["local_path"]: row["expected"] for row in csv.DictReader(f)}


LAST_YEAR = time.time() - 365 * 86400  # masters last touched long before the first run


@pytest.fixture
def site(tmp_path):
    """A config.yaml beside its masters, store and state, as an operator would lay it out."""
    masters = tmp_path / "masters"
    for folder, files in OBJECTS.items():
        (masters / folder).mkdir(parents=True)
        for n, relative in enumerate(files, 1):
            shutil.copy(CORPUS / relative, masters / folder / f"p{n}-{Path(relative).name}")
            os.utime(masters / folder / f"p{n}-{Path(relative).name}", (LAST_YEAR, LAST_YEAR))
    # No overlap: a folder source lists the masters by when they were copied in (seconds before the first run), not
    # by their old modification times, so within the default 300 s overlap every run would list them all again.
    config = {"defaults": {"concurrency": 2},
              "pipelines": {"museum": {
                  "source": {"kind": "filesystem", "root": "masters"}, "overlap_seconds": 0,
                  "store": {"kind": "local", "root": "store"},
                  "manifests": {"manifest_base_url": "https://iiif.example.org/store",
                                "image_service_base_url": "https://iiif.example.org/iiif",
                                "versions": ["3.0", "2.1"]}}}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    return tmp_path


def cli(site: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gcis_etl.cli", "--config", str(site / "config.yaml"), *args],
                          capture_output=True, text=True, cwd=site, timeout=300)


def ledger_rows(site: Path) -> dict[tuple[str, str], dict]:
    cfg = load_config(site / "config.yaml")
    with Ledger.open(cfg) as ledger:
        return {(r.object_id, r.item_id): r.__dict__ for r in ledger.items("museum")}


def listed_at(folder: Path) -> datetime:
    """When a folder source lists the object of `folder`: when a file of it was last changed, copied in or
    touched (its modification or status-change time, whichever is newer), or a file added to it."""
    stats = [os.stat(p) for p in (folder, *folder.iterdir())]
    return datetime.fromtimestamp(max(max(s.st_mtime, s.st_ctime) for s in stats), timezone.utc)


def corpus_of(item_id: str) -> str:
    folder, name = item_id.split("/")
    index = int(name.split("-", 1)[0][1:]) - 1
    return OBJECTS[folder][index]


def test_the_front_door_harvest_stays_the_function_once_its_module_is_imported():
    """`gcis_etl.harvest(...)`, as the README shows, once anything imported the module behind it (the CLI,
    a migration, this file): a module of the same name used to replace the function on the package."""
    import gcis_etl
    assert gcis_etl.harvest is harvest and gcis_etl.HarvestOptions is HarvestOptions


def test_first_run_settles_every_item_as_the_corpus_says_and_publishes_valid_manifests(site):
    done = cli(site, "harvest")
    assert done.returncode == 1, done.stderr  # some masters were rejected
    assert "run 1 completed: 5 deposited, 0 skipped, 3 rejected, 0 failed; 3 manifests published" in done.stdout

    rows = ledger_rows(site)
    listed = {(folder, f"{folder}/p{n}-{Path(r).name}") for folder, files in OBJECTS.items()
              for n, r in enumerate(files, 1)}
    assert set(rows) == listed
    verdicts = expected_verdicts()
    store = site / "store"
    for (object_id, item_id), row in rows.items():
        expected = verdicts[corpus_of(item_id)]
        if expected == "reject":
            assert row["status"] == "rejected" and row["reason"], item_id
            assert row["output_key"] is None
        else:
            assert row["status"] == "deposited", (item_id, row["reason"])
            report = verify(store / row["output_key"])
            assert report.ok, report.errors
            assert (report.width, report.height) == (row["width"], row["height"])
            assert row["sha256"] and row["bytes"] == (store / row["output_key"]).stat().st_size
    for object_id in ("book-1", "print-2", "photo-3"):
        for version in ("3", "2"):
            document = json.loads((store / f"museum/{object_id}/manifest-v{version}.json").read_text())
            require_valid(document, object_id)
        canvases = json.loads((store / f"museum/{object_id}/manifest-v3.json").read_text())["items"]
        deposited = sorted(r["sequence"] for (o, _), r in rows.items() if o == object_id
                           and r["status"] == "deposited")
        assert len(canvases) == len(deposited)
    assert not (store / "museum/bad-4").exists()  # nothing deposited, no manifest
    collection = json.loads((store / "collections/museum-v3.json").read_text())
    require_valid(collection, "collection")
    assert sorted(i["id"].split("/")[-2] for i in collection["items"]) == ["book-1", "photo-3", "print-2"]

    reports = sorted((site / "var/state/reports").glob("museum-run1*"))
    assert [p.name for p in reports] == ["museum-run1-problems.csv", "museum-run1.json"]
    with open(reports[0], newline="") as f:
        problems = list(csv.DictReader(f))
    assert sorted(p["item_id"] for p in problems) == sorted(i for (_, i), r in rows.items()
                                                            if r["status"] == "rejected")
    assert json.loads(reports[1].read_text())["counts"] == {"deposited": 5, "skipped": 0, "rejected": 3,
                                                           "failed": 0}


def test_second_run_skips_everything_and_a_changed_master_is_the_only_work(site):
    assert cli(site, "harvest").returncode == 1
    store_before = {p: p.stat().st_mtime_ns for p in (site / "store").rglob("*") if p.is_file()}

    again = cli(site, "harvest", "--since", "2000-01-01")  # every object listed again
    assert again.returncode == 0, again.stdout + again.stderr  # rejected items are skipped, not re-rejected
    assert "0 deposited, 8 skipped, 0 rejected, 0 failed; 0 manifests published" in again.stdout
    assert {p: p.stat().st_mtime_ns for p in (site / "store").rglob("*") if p.is_file()} == store_before

    changed = site / "masters/photo-3/p1-sample.jpg"
    shutil.copy(CORPUS / "jpeg-progressive/bentheim_pulver_turm.jpg", changed)
    os.utime(changed, (time.time() + 5, time.time() + 5))
    third = cli(site, "harvest", "-v")
    assert third.returncode == 0, third.stderr
    assert "1 deposited, 1 skipped, 0 rejected, 0 failed; 1 manifest published" in third.stdout
    assert "deposited photo-3/p1-sample.jpg" in third.stderr  # -v: one log line per item
    rows = ledger_rows(site)
    assert rows[("photo-3", "photo-3/p1-sample.jpg")]["last_run"] == 3
    assert all(r["last_run"] == 1 for k, r in rows.items() if k[0] != "photo-3")


def test_a_rejected_new_version_keeps_the_last_deposit_on_show(site):
    """A good master replaced by a broken upload is rejected with its reason, and the access master of the last
    good version stays what the manifest shows: one page of two (photo-3) or the only one (print-2), the
    manifests unchanged rather than a page dropped from one and the other left as it was."""
    assert cli(site, "harvest").returncode == 1
    manifests = {p: p.read_bytes() for p in (site / "store").rglob("manifest*.json")}
    images = {p: p.read_bytes() for p in (site / "store").rglob("*.tif")}
    for broken in ("photo-3/p1-sample.jpg", "print-2/p1-pil_sample_cmyk.jpg"):
        shutil.copy(CORPUS / "truncated/truncated.jpg", site / "masters" / broken)
        os.utime(site / "masters" / broken, (time.time() + 5, time.time() + 5))

    again = cli(site, "harvest")

    assert again.returncode == 1, again.stderr
    assert "0 deposited, 1 skipped, 2 rejected, 0 failed" in again.stdout
    rows = ledger_rows(site)
    for object_id, item_id in (("photo-3", "photo-3/p1-sample.jpg"), ("print-2", "print-2/p1-pil_sample_cmyk.jpg")):
        row = rows[(object_id, item_id)]
        assert row["status"] == "rejected" and row["last_run"] == 2 and row["reason"], row
        assert (site / "store" / row["output_key"]).read_bytes() == images[site / "store" / row["output_key"]]
    assert {p: p.read_bytes() for p in (site / "store").rglob("manifest*.json")} == manifests
    canvases = json.loads((site / "store" / "museum" / "photo-3" / "manifest-v3.json").read_text())["items"]
    assert len(canvases) == 2


def test_a_master_touched_without_changing_is_recognised_by_its_bytes_not_converted_again(site):
    """A new modification time (the same file uploaded again) is a new source version, but the master's bytes
    are those the stored access master was made from: fetched and hashed, not converted. The store keeps the
    provenance of the first version, so a run that lost the ledger (killed before recording) must do the same."""
    assert cli(site, "harvest").returncode == 1
    touched = site / "masters/print-2/p1-pil_sample_cmyk.jpg"
    os.utime(touched, (time.time() + 5, time.time() + 5))
    recognised = ("deposited print-2/p1-pil_sample_cmyk.jpg (warnings: already in the store from the same "
                  "master bytes and recipe; only the source's version of the master changed)")

    again = cli(site, "harvest", "-v")
    assert "1 deposited, 0 skipped, 0 rejected, 0 failed" in again.stdout, again.stdout + again.stderr
    assert recognised in again.stderr
    assert ledger_rows(site)[("print-2", "print-2/p1-pil_sample_cmyk.jpg")]["fingerprint"].endswith(
        datetime.fromtimestamp(touched.stat().st_mtime, timezone.utc).isoformat())

    (site / "var/state/ledger.sqlite").unlink()
    lost = cli(site, "harvest", "-v")
    assert "5 deposited, 0 skipped, 3 rejected, 0 failed" in lost.stdout, lost.stdout + lost.stderr
    assert recognised in lost.stderr
    assert lost.stderr.count("(warnings: already in the store from the same source version and recipe)") == 4


def test_a_deposited_items_conversion_warnings_are_logged_with_it(site):
    """The corpus policy for a master with a wrong extension: sniff the content, deposit it, record a warning."""
    shutil.copy(CORPUS / "wrong-extension/jpg-incorrect-extension.png", site / "masters/photo-3/p3-scan.png")
    run = cli(site, "harvest", "--object", "photo-3", "--log-json", "-v")
    (line,) = [json.loads(ln) for ln in run.stderr.splitlines() if '"photo-3/p3-scan.png"' in ln]
    expected = "extension .png does not match the content (JPEG); processed as JPEG"
    assert (line["outcome"], line["warnings"]) == ("deposited", [expected])
    assert line["message"] == f"deposited photo-3/p3-scan.png (warnings: {expected})"


def test_an_object_whose_id_cannot_name_a_store_key_fails_at_once_as_not_transient(site):
    """30 CJK characters are 90 bytes, 270 once escaped for a key segment: nothing is fetched or converted, and
    retrying soon (a Celery worker's backoff) cannot help."""
    folder = site / "masters" / ("\u5c71" * 30)
    folder.mkdir()
    shutil.copy(CORPUS / "gray8/hopper_gray.jpg", folder / "p1.jpg")
    run = cli(site, "harvest", "--object", folder.name)
    assert "0 deposited, 0 skipped, 0 rejected, 1 failed" in run.stdout, run.stdout + run.stderr
    (row,) = [r for (o, _), r in ledger_rows(site).items() if o == folder.name]
    assert row["reason"].startswith("cannot be named in the store: identifier") and "too long" in row["reason"]
    assert row["transient"] == 0


def test_each_item_is_logged_once_and_a_rejected_one_as_a_warning_with_its_fields(site):
    plain = cli(site, "harvest")  # without -v: the problems alone, one readable line each
    assert plain.returncode == 1, plain.stderr
    rows = ledger_rows(site)
    problems = {key: r for key, r in rows.items() if r["status"] in ("rejected", "failed")}
    assert sorted(plain.stderr.splitlines()) == sorted(f"WARNING {r['status']} {item_label(o, i)}: {r['reason']}"
                                                       for (o, i), r in problems.items())

    shutil.rmtree(site / "var")
    shutil.rmtree(site / "store")
    logged = cli(site, "harvest", "--log-json")
    assert logged.returncode == 1, logged.stderr
    lines = [json.loads(line) for line in logged.stderr.splitlines()]
    for (object_id, item_id), row in ledger_rows(site).items():
        about = [line for line in lines if item_label(object_id, item_id) in line["message"]]
        assert len(about) == 1, about
        line = about[0]
        assert (line["pipeline"], line["object_id"], line["item_id"], line["outcome"]) == (
            "museum", object_id, item_id, row["status"])
        assert line["level"] == ("warning" if (object_id, item_id) in problems else "info"), line
        assert line["reason"] == row["reason"]


def test_on_a_terminal_each_logged_line_stands_apart_from_the_live_line(site):
    run, shown = run_on_a_terminal([sys.executable, "-m", "gcis_etl.cli", "--config", str(site / "config.yaml"),
                                "harvest"], cwd=site)
    assert run.wait(300) == 1
    lines = shown.replace("\r\n", "\n").split("\n")
    warnings = [line for line in lines if "WARNING" in line]
    assert len(warnings) == 3 and all(line.startswith("WARNING rejected ") for line in warnings), lines
    assert any(line.startswith("\rmuseum: ") and "items (deposited" in line for line in lines), lines


def test_dry_run_lists_the_plan_and_changes_nothing(site):
    done = cli(site, "harvest", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "process  book-1/p1-hopper_lzw.tif: new" in done.stdout
    assert "museum: would process 8 items, skip 0" in done.stdout
    assert not (site / "store").exists()
    assert not load_config(site / "config.yaml").state_dir.exists()  # not even an empty ledger


def test_limit_stops_early_and_moves_the_checkpoint_no_further_than_the_object_cut_short(site):
    done = cli(site, "harvest", "--limit", "2")
    assert done.returncode in (0, 1), done.stdout + done.stderr  # 1 when one of the two was a reject
    assert "run 1 stopped" in done.stdout and "stopped at the limit of 2 items" in done.stdout
    cfg = load_config(site / "config.yaml")
    with Ledger.open(cfg) as ledger:  # book-1, the first copied in and listed, was cut short
        assert ledger.checkpoint("museum") == listed_at(site / "masters/book-1")
        assert sum(ledger.counts("museum").values()) == 2
    rest = cli(site, "harvest")
    assert "run 2 completed" in rest.stdout, rest.stderr
    counts = json.loads((site / "var/state/reports/museum-run2.json").read_text())["counts"]
    assert counts["skipped"] == 2 and counts["deposited"] + counts["rejected"] == 6 and counts["failed"] == 0
    with Ledger.open(cfg) as ledger:
        assert ledger.counts("museum") == {"deposited": 5, "skipped": 0, "rejected": 3, "failed": 0}
        assert ledger.checkpoint("museum") is not None


def test_object_option_harvests_only_that_object_and_keeps_the_checkpoint(site):
    done = cli(site, "harvest", "--object", "print-2")
    assert "1 deposited, 0 skipped, 0 rejected, 0 failed; 1 manifest published" in done.stdout, done.stderr
    with Ledger.open(load_config(site / "config.yaml")) as ledger:
        assert ledger.checkpoint("museum") is None
        assert {r.object_id for r in ledger.items("museum")} == {"print-2"}


def test_force_publishes_the_manifest_again(site):
    cli(site, "harvest")
    manifest = site / "store/museum/print-2/manifest-v3.json"
    published = manifest.read_text()
    manifest.unlink()  # lost from the store: only --force can know to write it again
    assert "0 manifests published" in cli(site, "harvest", "--object", "print-2").stdout
    forced = cli(site, "harvest", "--object", "print-2", "--force")
    assert "1 deposited, 0 skipped, 0 rejected, 0 failed; 1 manifest published" in forced.stdout, forced.stderr
    assert manifest.read_text() == published


def test_force_repairs_an_access_master_damaged_in_the_store(site):
    """The store's record of an access master (its sidecar) outlives damage to the bytes in place: --force
    converts and deposits again instead of trusting that record."""
    cli(site, "harvest")
    (row,) = [r for (o, _), r in ledger_rows(site).items() if o == "print-2"]
    master = site / "store" / row["output_key"]
    with open(master, "r+b") as f:  # same size, same inode: the sidecar still vouches for it
        f.seek(2000)
        damaged = bytes(b ^ 0xFF for b in f.read(500))
        f.seek(2000)
        f.write(damaged)
    assert hashlib.sha256(master.read_bytes()).hexdigest() != row["sha256"]
    forced = cli(site, "harvest", "--object", "print-2", "--force")
    assert "1 deposited, 0 skipped, 0 rejected, 0 failed" in forced.stdout, forced.stderr
    assert hashlib.sha256(master.read_bytes()).hexdigest() == ledger_rows(site)[("print-2", row["item_id"])]["sha256"]
    report = verify(master)
    assert report.ok, report.errors


def test_status_and_report_summarise_the_ledger(site):
    cli(site, "harvest")
    status = cli(site, "status", "--json")
    assert status.returncode == 0, status.stderr
    state = json.loads(status.stdout)
    assert state["items"] == {"deposited": 5, "skipped": 0, "rejected": 3, "failed": 0}
    assert state["last_run"]["run_id"] == 1 and state["checkpoint"]
    assert {p["item_id"] for p in state["problems"]} == {"book-1/p3-truncated.jpg", "bad-4/p1-multipage.tiff",
                                                         "bad-4/p2-empty.tif"}
    report = cli(site, "report", "--json")
    assert report.returncode == 1  # the run had rejections
    assert json.loads(report.stdout)["counts"]["rejected"] == 3
    for command in (["harvest", "library"], ["status", "library"], ["retry", "library"],
                    ["report", "--pipeline", "library"]):
        unknown = cli(site, *command)
        assert unknown.returncode == 2 and "no pipeline 'library'" in unknown.stderr, (command, unknown.stderr)
        assert "Traceback" not in unknown.stderr


def test_a_stray_language_tag_goes_out_under_the_default_language_with_a_warning(site):
    sidecar = site / "masters/objects.csv"  # the curator typed "en gb" for a language
    sidecar.write_text("object_id,file,title@en gb,title@en\nprint-2,print-2/p1-pil_sample_cmyk.jpg,Misfiled,\n"
                       "photo-3,photo-3/p1-sample.jpg,,Fine\n")
    os.utime(sidecar, (LAST_YEAR, LAST_YEAR))
    first = cli(site, "harvest")
    assert first.returncode == 0 and "2 manifests published" in first.stdout, first.stdout + first.stderr
    assert "source language 'en gb' is not a language tag" in first.stderr
    assert "en gb" not in (site / "store/museum/print-2/manifest-v3.json").read_text()


def test_status_shows_a_rejected_manifest_until_a_later_run_publishes_it(site):
    """A filesystem source can no longer make an invalid manifest (test_manifests covers rejection itself):
    the rejection is recorded as a harvest records it, then the object changes and a run publishes it."""
    sidecar = site / "masters/objects.csv"
    sidecar.write_text("object_id,file\nprint-2,print-2/p1-pil_sample_cmyk.jpg\nphoto-3,photo-3/p1-sample.jpg\n")
    os.utime(sidecar, (LAST_YEAR, LAST_YEAR))
    assert "2 manifests published" in cli(site, "harvest").stdout
    cfg = load_config(site / "config.yaml")
    with Ledger.open(cfg) as ledger:
        run_id = ledger.begin_run("museum", None, None, {})
        ledger.reject_manifest(run_id, "museum", "print-2", "manifest not published: not valid")
        ledger.finish_run(run_id, "completed", {}, 0, None)
    assert cli(site, "harvest").returncode == 0  # a later run with nothing to do: the problem is still there

    status = cli(site, "status", "--json")
    problems = json.loads(status.stdout)["problems"]
    assert len(problems) == 1, status.stdout
    problem = problems[0]
    assert (problem["object_id"], problem["item_id"], problem["status"]) == ("print-2", "(manifest)", "rejected")
    assert f"rejected: print-2/(manifest): {problem['reason']}" in cli(site, "status").stdout
    with Ledger.open(cfg) as ledger:
        museum = cfg.pipeline("museum")  # as the CLI asks
        assert pipeline_status(ledger, "museum", pipeline_lock(cfg.state_dir, "museum"), listing=museum.listing_digest,
                               max_attempts=museum.settings.max_attempts).to_dict() == json.loads(status.stdout)

    sidecar.write_text(sidecar.read_text().replace("object_id,file", "object_id,file,title"))
    sidecar.write_text(sidecar.read_text().replace("p1-pil_sample_cmyk.jpg", "p1-pil_sample_cmyk.jpg,Print"))
    os.utime(sidecar, (time.time() + 5, time.time() + 5))
    fixed = cli(site, "harvest")  # photo-3, listed again with the sidecar, has the same manifest: not published
    assert fixed.returncode == 0 and "1 manifest published" in fixed.stdout, fixed.stdout + fixed.stderr
    assert json.loads(cli(site, "status", "--json").stdout)["problems"] == []


def test_demo_on_the_shipped_config_harvests_the_samples_then_has_nothing_to_do(tmp_path):
    shutil.copytree(ROOT / "samples", tmp_path / "samples")
    shutil.copy(ROOT / "config.yaml", tmp_path / "config.yaml")
    first = subprocess.run([sys.executable, "-m", "gcis_etl.cli", "demo"], capture_output=True, text=True,
                           cwd=tmp_path, timeout=300)
    assert first.returncode == 0, first.stderr
    assert "5 deposited, 0 skipped, 0 rejected, 0 failed; 4 manifests published" in first.stdout
    assert f"access masters and manifests under {tmp_path / 'var/store'}" in first.stdout
    second = subprocess.run([sys.executable, "-m", "gcis_etl.cli", "demo"], capture_output=True, text=True,
                            cwd=tmp_path, timeout=300)
    assert second.returncode == 0, second.stderr
    assert "0 deposited" in second.stdout and "0 rejected, 0 failed; 0 manifests published" in second.stdout


class _Record:
    def __init__(self, **values):
        defaults = dict(fingerprint="md5:1", recipe="r", recipe_digest="d1", status="deposited", attempts=0,
                        reason=None, output_key="p/o/1.tif")
        self.__dict__.update(defaults | values)


@pytest.mark.parametrize("record, kwargs, process, reason", [
    (None, {}, True, "new"),
    (_Record(fingerprint="md5:0"), {}, True, "changed in the source"),
    (_Record(), {}, False, "unchanged"),
    (_Record(recipe_digest="d0"), {}, False, "--force or the reencode migration"),
    (_Record(), {"force": True}, True, "forced"),
    (_Record(), {"placed": "p/o/1.tif"}, False, "unchanged"),
    (_Record(recipe_digest="d0"), {"placed": "p/o/2.tif"}, True, "goes from p/o/1.tif to p/o/2.tif"),
    (_Record(status="rejected", reason="bad"), {}, False, "waits for the source to change"),
    (_Record(status="rejected"), {"redo_rejected": True}, True, "asked to try again"),
    (_Record(status="failed", attempts=2), {}, True, "retry 3 of 3"),
    (_Record(status="failed", attempts=3), {}, False, "`gcis-etl retry` tries again"),
])
def test_decide(record, kwargs, process, reason):
    decision = decide(record, "md5:1", "d1", 3, **kwargs)
    assert decision.process is process
    assert reason in decision.reason


def test_library_harvest_returns_the_report(site):
    cfg = load_config(site / "config.yaml")
    report = harvest(cfg, "museum", HarvestOptions(object_ids=("book-1",)))
    assert report.counts == {"deposited": 2, "skipped": 0, "rejected": 1, "failed": 0}
    assert report.exit_code == 1 and report.json_path and Path(report.json_path).is_file()
