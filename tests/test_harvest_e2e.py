"""End to end over the real parts: emulated Rosetta and OTMM over HTTP → `gcis-etl harvest` → MinIO.

What a complete run must leave is derived from the emulator's catalogue (what the source lists) and the corpus
MANIFEST.csv (what each master deserves), then compared with the ledger, the bucket, the manifests and the
collections.
"""
from __future__ import annotations

import csv
import json

from tests.emulators.otmm import OtmmEmulator
from tests.emulators.rosetta import RosettaCatalogue, RosettaEmulator
from tests.harvests import (corpus_verdicts, ie, otmm_expected, otmm_source, rosetta_expected,
                            rosetta_source, serving)

pytest_plugins = ("tests.harvests",)  # the `rig` fixture


def corpus_catalogue() -> RosettaCatalogue:
    """Every corpus file, one IE per corpus folder (so objects mix accepted and rejected masters, and some
    share a modification time), plus an IE outside the harvested set and a deleted one."""
    folders: dict[str, list[str]] = {}
    for relative in corpus_verdicts():
        folders.setdefault(relative.split("/")[0], []).append(relative)
    entities, number = [], 10000
    for n, (folder, files) in enumerate(sorted(folders.items())):
        entities.append(ie(number, f"2024-01-{1 + n % 20:02d} 10:00:00", *files, title=folder))
        number += len(files) + 10
    entities.append(ie(number, "2024-02-01 10:00:00", "png/exif.png", sets={"other"}))
    entities.append(ie(number + 10, "2024-02-01 10:00:00", "png/exif.png", deleted=True))
    return RosettaCatalogue(entities)


def test_rosetta_corpus_harvest_deposits_every_accepted_master_and_rejects_the_rest(rig):
    catalogue = corpus_catalogue()
    expected = rosetta_expected(catalogue)
    assert sorted(expected.outcomes.values()).count("rejected") == list(corpus_verdicts().values()).count("reject")
    with serving(RosettaEmulator(catalogue)) as emulator:
        rig.write(rosetta_source(emulator.url))
        run = rig.cli("harvest")
        assert run.returncode == 1, run.stderr  # items were rejected: cron must hear of it
        assert f"{rig.pipeline}: run 1 completed" in run.stdout
        rig.check_final_state(expected)
        with rig.ledger() as ledger:
            records = {(r.object_id, r.item_id): r for r in ledger.items(rig.pipeline)}
            assert all(r.sequence == expected.order[o].index(i) + 1 for (o, i), r in records.items())
            assert len(ledger.run_items(1)) == len(expected.outcomes)  # each item once
            assert ledger.run(1).status == "completed" and ledger.checkpoint(rig.pipeline) is not None

        rejected = {key: r.reason for key, r in records.items() if r.status == "rejected"}
        with open(rig.root / "state" / "reports" / f"{rig.pipeline}-run1-problems.csv", newline="") as f:
            problems = {(row["object_id"], row["item_id"]): row["reason"] for row in csv.DictReader(f)}
        assert problems == rejected  # every reason reaches the curator's report
        shown = dict(line.removeprefix("  rejected: ").split(": ", 1) for line in run.stdout.splitlines()
                     if line.startswith("  rejected: "))
        assert len(shown) == 10 and all(rejected[tuple(item.split("/"))] == reason for item, reason in shown.items())
        assert f"and {len(rejected) - 10} more" in run.stdout

        status = json.loads(rig.cli("status", "--json").stdout)
        assert status["items"] == {"deposited": len(expected.outcomes) - len(rejected), "skipped": 0,
                                   "rejected": len(rejected), "failed": 0}
        assert status["last_run"]["status"] == "completed"


def test_otmm_asset_groups_become_manifests(rig):
    emulator_app = OtmmEmulator()
    expected = otmm_expected(emulator_app.catalogue)
    assert len(expected.order) == 4 and len(expected.order["2019.M.1"]) == 3
    with serving(emulator_app) as emulator:
        rig.write(otmm_source(emulator.url, content_checksum="none"))
        run = rig.cli("harvest")
        assert run.returncode == 0, run.stderr
        assert "6 deposited, 0 skipped, 0 rejected, 0 failed; 4 manifests published" in run.stdout
        rig.check_final_state(expected)
        manifest = rig.document(f"{rig.pipeline}/2019.M.1/manifest-v3.json")
        assert manifest["label"] == {"none": ["Irises"]}
        assert [c["label"] for c in manifest["items"]] == [{"none": [str(n)]} for n in (1, 2, 3)]

        # With content_checksum: none an asset's version is its size and modification time.
        recto, verso, detail = expected.order["2019.M.1"]
        emulator_app.catalogue.touch(recto)
        run = rig.cli("harvest")
        assert run.returncode == 0 and "1 deposited, 2 skipped, 0 rejected, 0 failed" in run.stdout, run.stderr
        with rig.ledger() as ledger:
            assert {(i.item_id, i.outcome) for i in ledger.run_items(2)} == {
                (recto, "deposited"), (verso, "skipped"), (detail, "skipped")}  # the group, and nothing else
        rig.check_final_state(expected)


def test_a_record_link_that_is_no_http_url_is_left_out_with_a_warning_and_the_manifests_go_out(rig):
    """The link to the source record is optional (as a stray language tag, it goes out as well as it can): each
    object gets its manifests without it, and the run says so, once per object."""
    catalogue = RosettaCatalogue([
        ie(6000, "2024-01-01 10:00:00", "rgb8-tiff-uncompressed/hopper.tif"),
        ie(6010, "2024-01-02 10:00:00", "gray8/gray.tif", "png/png-rgb-64x56x8.png"),
        ie(6020, "2024-01-03 10:00:00", "jpeg-baseline/flowers.jpeg"),
    ])
    expected = rosetta_expected(catalogue)
    with serving(RosettaEmulator(catalogue)) as emulator:
        rig.write(rosetta_source(emulator.url, source_url_template="ftp://records.example.org/{id}"))
        run = rig.cli("harvest")
        assert run.returncode == 0, run.stderr
        assert "run 1 completed: 4 deposited, 0 skipped, 0 rejected, 0 failed; 3 manifests published" in run.stdout
        assert run.stderr.count("is not an http(s) URL: the manifests go out without the link to the source "
                                "record") == 3, run.stderr
        assert "source URL 'ftp://records.example.org/IE6010' is not an http(s) URL" in run.stderr
        rig.check_final_state(expected)
        for pid in ("IE6000", "IE6010", "IE6020"):
            assert "homepage" not in rig.document(f"{rig.pipeline}/{pid}/manifest-v3.json")
            assert "related" not in rig.document(f"{rig.pipeline}/{pid}/manifest-v2.json")
