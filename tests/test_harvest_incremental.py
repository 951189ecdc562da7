"""Incremental harvests: what changed in the emulated source is processed, and only that; rejected items wait for
the source to change; failed ones are retried up to max_attempts, then wait for `gcis-etl retry`; the
checkpoint never lets a later run skip an item (overlap window, failures, runs cut short)."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from tests.emulators.catalogue import CorpusFile, utc
from tests.emulators.faults import Fault
from tests.emulators.otmm import MODIFIED_FIELD, OtmmEmulator
from tests.emulators.rosetta import SRU_DATE_INDEX, RosettaCatalogue, RosettaEmulator, RosettaFile
from tests.harvests import ie, otmm_source, rosetta_expected, rosetta_source, serving

pytest_plugins = ("tests.harvests",)  # the `rig` fixture


NOTHING = {"deposited": 0, "skipped": 0, "rejected": 0, "failed": 0}


def catalogue() -> RosettaCatalogue:
    return RosettaCatalogue([
        ie(5000, "2024-01-10 09:00:00", "rgb8-tiff-uncompressed/hopper.tif", "jpeg-baseline/flowers.jpeg"),
        ie(5010, "2024-02-01 12:30:00", "png/png-rgb-64x56x8.png"),
        ie(5020, "2024-03-01 08:00:00", "truncated/truncated.jpg", "gray8/gray.tif"),
    ])


def stamp(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def outcomes(rig, run_id: int) -> dict[tuple[str, str], str]:
    with rig.ledger() as ledger:
        return {(i.object_id, i.item_id): i.outcome for i in ledger.run_items(run_id)}


def test_the_next_run_processes_exactly_what_changed(rig):
    source = catalogue()
    with serving(RosettaEmulator(source)) as emulator:
        rig.write(rosetta_source(emulator.url))
        assert rig.harvest().counts == {"deposited": 4, "skipped": 0, "rejected": 1, "failed": 0}
        assert rig.harvest().counts == NOTHING
        replaced = rig.client.head_object(Bucket=rig.bucket, Key=f"iiif/{rig.image_key('IE5000', 'FL5003')}")

        # A curator replaces one master of IE5000, edits IE5010's description only, and adds IE5030.
        source.entities["IE5000"].reps[0].files[1].source = CorpusFile("jpeg-baseline/jpg-rgb-594x522x8-baseline.jpg")
        source.touch("IE5000")
        source.touch("IE5010")
        source.entities["IE5030"] = ie(5030, stamp(datetime.now(timezone.utc)), "gray8/minisblack-1c-8b.tiff")
        run = rig.harvest()
        assert outcomes(rig, run.run_id) == {("IE5000", "FL5002"): "skipped", ("IE5000", "FL5003"): "deposited",
                                             ("IE5010", "FL5012"): "skipped", ("IE5030", "FL5032"): "deposited"}
        assert run.counts == {"deposited": 2, "skipped": 2, "rejected": 0, "failed": 0}
        fetched = [r.arg("dps_pid") for r in emulator.requests("DeliveryManagerServlet")]
        assert {pid: fetched.count(pid) for pid in set(fetched)} == {"FL5002": 1, "FL5003": 2, "FL5012": 1,
                                                                     "FL5022": 1, "FL5023": 1, "FL5032": 1}

        rig.check_final_state(rosetta_expected(source))
        now = rig.client.head_object(Bucket=rig.bucket, Key=f"iiif/{rig.image_key('IE5000', 'FL5003')}")
        assert now["Metadata"]["sha256"] != replaced["Metadata"]["sha256"]
        canvas = rig.document(f"{rig.pipeline}/IE5000/manifest-v3.json")["items"][1]
        assert (canvas["width"], canvas["height"]) == (594, 522)


def test_a_rejected_item_waits_for_the_source_to_change(rig):
    source = catalogue()
    with serving(RosettaEmulator(source)) as emulator:
        rig.write(rosetta_source(emulator.url))
        rig.harvest()
        assert len(rig.document(f"{rig.pipeline}/IE5020/manifest-v3.json")["items"]) == 1  # the other image

        source.touch("IE5020")  # metadata edited, the same broken master
        run = rig.harvest()
        assert outcomes(rig, run.run_id) == {("IE5020", "FL5022"): "skipped", ("IE5020", "FL5023"): "skipped"}
        with rig.ledger() as ledger:
            (item,) = [i for i in ledger.run_items(run.run_id) if i.item_id == "FL5022"]
            assert item.reason.startswith("rejected before (corrupt or truncated")
            assert ledger.item(rig.pipeline, "IE5020", "FL5022").status == "rejected"
        assert len(emulator.requests("dps_pid=FL5022")) == 1

        source.entities["IE5020"].reps[0].files[0].source = CorpusFile("rgb8-tiff-lzw/hopper_lzw.tif")
        source.touch("IE5020")
        run = rig.harvest()
        assert outcomes(rig, run.run_id) == {("IE5020", "FL5022"): "deposited", ("IE5020", "FL5023"): "skipped"}
        rig.check_final_state(rosetta_expected(source))
        assert len(rig.document(f"{rig.pipeline}/IE5020/manifest-v3.json")["items"]) == 2


def test_a_failing_item_is_retried_max_attempts_times_then_waits_for_retry(rig):
    source = catalogue()
    failing = source.entities["IE5010"]
    with serving(RosettaEmulator(source)) as emulator:
        rig.write(rosetta_source(emulator.url), max_attempts=2)
        emulator.inject("dps_pid=FL5012", Fault.http(503), times=None)  # outlasts the connector's own retries

        run = rig.cli("harvest")
        assert run.returncode == 1 and "3 deposited, 0 skipped, 1 rejected, 1 failed" in run.stdout, run.stderr
        with rig.ledger() as ledger:
            item = ledger.item(rig.pipeline, "IE5010", "FL5012")
            assert (item.status, item.attempts, item.transient) == ("failed", 1, 1)
            assert "503" in item.reason
            assert ledger.checkpoint(rig.pipeline) <= failing.modified  # the next run lists IE5010 again
        assert "dam/IE5010/manifest-v3.json" not in rig.keys()  # an object with a failed item waits

        run = rig.cli("harvest")
        assert run.returncode == 1, run.stderr
        assert outcomes(rig, 2) == {("IE5010", "FL5012"): "failed", ("IE5020", "FL5022"): "skipped",
                                    ("IE5020", "FL5023"): "skipped"}  # listed again from the held checkpoint
        with rig.ledger() as ledger:
            assert ledger.item(rig.pipeline, "IE5010", "FL5012").attempts == 2

        emulator.faults.clear()  # the source is fine again, but the item has had its attempts
        fetches = len(emulator.requests("dps_pid=FL5012"))
        run = rig.cli("harvest")
        assert run.returncode == 1, run.stderr
        assert "failed: IE5010/FL5012: failed 2 times (last: fetching:" in run.stdout
        assert "`gcis-etl retry` tries again" in run.stdout
        assert len(emulator.requests("dps_pid=FL5012")) == fetches

        asked = len(emulator.requests("IE5010"))  # reported from the ledger: the object is not asked for again
        run = rig.cli("harvest")
        assert run.returncode == 1 and "0 deposited, 0 skipped, 0 rejected, 1 failed" in run.stdout, run.stderr
        assert "failed: IE5010/FL5012: failed 2 times" in run.stdout
        assert len(emulator.requests("IE5010")) == asked

        healthy = len(emulator.requests("IE5020"))
        run = rig.cli("retry", "--object", "IE5020")  # nothing of it failed: not harvested, no run recorded
        assert (run.returncode, run.stdout) == (0, "nothing to retry: no failed item in IE5020\n"), run.stderr
        assert len(emulator.requests("IE5020")) == healthy

        run = rig.cli("retry")
        assert run.returncode == 0, run.stderr
        assert "dam: retrying 1 object" in run.stdout and "1 deposited" in run.stdout
        assert "run 5 " in run.stdout
        rig.check_final_state(rosetta_expected(source))

        run = rig.cli("harvest")
        assert run.returncode == 0 and "0 deposited, 0 skipped, 0 rejected, 0 failed" in run.stdout, run.stderr


def test_the_overlap_window_catches_late_and_equal_timestamps(rig):
    source = catalogue()
    with serving(RosettaEmulator(source)) as emulator:
        rig.write(rosetta_source(emulator.url), overlap_seconds=300)
        rig.harvest()
        with rig.ledger() as ledger:
            checkpoint = ledger.checkpoint(rig.pipeline)

        # Objects stamped at or before the checkpoint that the first run could not see: the source's clock
        # lags ours, or an edit stamped before the run's window closed became visible after the listing.
        source.entities["IE5040"] = ie(5040, stamp(checkpoint - timedelta(seconds=120)), "gray8/gray.tif")
        source.entities["IE5050"] = ie(5050, stamp(checkpoint), "png/png-rgb-64x56x8.png")
        run = rig.harvest()
        assert outcomes(rig, run.run_id) == {("IE5040", "FL5042"): "deposited", ("IE5050", "FL5052"): "deposited"}
        assert datetime.fromisoformat(run.since) == checkpoint - timedelta(seconds=300)
        rig.check_final_state(rosetta_expected(source))


def test_a_run_cut_short_leaves_the_checkpoint_and_the_next_run_finishes(rig):
    """OAI-PMH does not promise its order (test_harvest_cut_short.py has the sources that do)."""
    source = catalogue()
    with serving(RosettaEmulator(source)) as emulator:
        rig.write(rosetta_source(emulator.url))
        run = rig.harvest(limit=2)
        assert run.status == "stopped" and run.checkpoint_after is None
        assert run.note.startswith("stopped at the limit of 2 items; the checkpoint stays where it was, so the next "
                                   "run lists the same window again from its start (dam is not known to list")
        assert run.note.endswith("raise max_run_minutes or --max-minutes, or load the backlog once with "
                                 "`gcis-migrate initial_load` (dam's listing cannot be sorted on the modified date)")  # no OAI setting sorts
        assert run.counts == {"deposited": 2, "skipped": 0, "rejected": 0, "failed": 0}
        with rig.ledger() as ledger:
            assert ledger.checkpoint(rig.pipeline) is None
        run = rig.harvest()
        assert outcomes(rig, run.run_id) == {("IE5000", "FL5002"): "skipped", ("IE5000", "FL5003"): "skipped",
                                             ("IE5010", "FL5012"): "deposited", ("IE5020", "FL5022"): "rejected",
                                             ("IE5020", "FL5023"): "deposited"}
        rig.check_final_state(rosetta_expected(source))


@pytest.mark.parametrize("dam", ["otmm", "rosetta-sru"])
def test_a_run_cut_short_on_an_unsorted_listing_names_the_settings_that_sort_it(rig, dam):
    """The advice names the keys of the source's own listing, as config.yaml writes them."""
    emulator, source, setting = {
        "otmm": (OtmmEmulator(), lambda url: otmm_source(url, group=None, search={
            "modified_field_id": MODIFIED_FIELD, "modified_operator_id": "ARTESIA.OPERATOR.DATE.IS ON OR AFTER"}),
                 f"search.sort: asc_{MODIFIED_FIELD} and search.modified_order: true"),
        "rosetta-sru": (RosettaEmulator(catalogue()), lambda url: rosetta_source(
            url, discovery="sru", sru={"modified_index": SRU_DATE_INDEX}),
                        f"sru.sort_by: {SRU_DATE_INDEX}/sort.ascending and sru.modified_order: true")}[dam]
    with serving(emulator) as server:
        rig.write(source(server.url))
        run = rig.harvest(limit=1)
    assert run.status == "stopped" and run.checkpoint_after is None
    assert (f"raise max_run_minutes or --max-minutes, set {setting} under pipelines.{rig.pipeline}.source (a listing sorted oldest "
            f"first on the modified date), or load the backlog once with `gcis-migrate initial_load`") in run.note


def test_a_run_cut_short_on_a_sorted_sru_listing_moves_the_checkpoint_by_the_sorted_date(rig):
    """SRU sorts IEs on their own date; IE6010's file was replaced after its IE record was last modified, so the
    object's newest date runs two days ahead of its place in the listing. The run stopping with IE6010 in hand
    moves the checkpoint to IE6010's IE date, not its file's, which would pass over IE6020 and IE6030 for ever."""
    replaced = RosettaFile("FL6012", CorpusFile("gray8/hopper_gray.jpg"), "Image 1",
                           modified=utc("2024-01-05 10:00:00"))
    source = RosettaCatalogue([ie(6000, "2024-01-01 10:00:00", "png/png-rgb-64x56x8.png"),
                               ie(6010, "2024-01-02 10:00:00", replaced),
                               ie(6020, "2024-01-03 10:00:00", "rgb8-tiff-lzw/hopper_lzw.tif"),
                               ie(6030, "2024-01-04 10:00:00", "gray8/gray.tif")])
    with serving(RosettaEmulator(source)) as emulator:
        rig.write(rosetta_source(emulator.url, discovery="sru", sru={
            "modified_index": SRU_DATE_INDEX, "page_size": 2, "sort_by": f"{SRU_DATE_INDEX}/sort.ascending",
            "modified_order": True}))
        run = rig.harvest(limit=1)
        assert run.status == "stopped" and outcomes(rig, run.run_id) == {("IE6000", "FL6002"): "deposited"}
        assert datetime.fromisoformat(run.checkpoint_after) == utc("2024-01-02 10:00:00")
        run = rig.harvest()
        assert outcomes(rig, run.run_id) == {("IE6010", "FL6012"): "deposited", ("IE6020", "FL6022"): "deposited",
                                             ("IE6030", "FL6032"): "deposited"}
        rig.check_final_state(rosetta_expected(source))


def test_an_object_with_failed_items_that_left_the_source_does_not_stop_the_runs(rig):
    source = catalogue()
    with serving(RosettaEmulator(source)) as emulator:
        rig.write(rosetta_source(emulator.url))
        emulator.inject("dps_pid=FL5012", Fault.http(503), times=None)
        assert rig.harvest().counts["failed"] == 1
        source.entities["IE5010"].deleted = True  # withdrawn before its item could be retried
        source.touch("IE5020")
        run = rig.harvest()
        assert run.status == "completed"
        assert outcomes(rig, run.run_id) == {("IE5020", "FL5022"): "skipped", ("IE5020", "FL5023"): "skipped"}
        with rig.ledger() as ledger:
            assert ledger.checkpoint(rig.pipeline) > source.entities["IE5020"].modified


def test_an_object_listed_twice_in_one_run_is_processed_once(rig):
    source = catalogue()
    with serving(RosettaEmulator(source)) as emulator:
        rig.write(rosetta_source(emulator.url, discovery="pids", pid_list={"ids": ["IE5000", "IE5010", "IE5000"]}))
        run = rig.harvest()
        assert run.status == "completed"
        assert outcomes(rig, run.run_id) == {("IE5000", "FL5002"): "deposited", ("IE5000", "FL5003"): "deposited",
                                             ("IE5010", "FL5012"): "deposited"}
        assert len(emulator.requests("DeliveryManagerServlet")) == 3


def test_an_object_edited_while_the_listing_is_paged_holds_the_checkpoint(rig):
    """The OAI listing pages by offset over IEs in datestamp order: IE5000, edited once the first page is read,
    moves to the end and IE5020 moves back onto the page already read. The run never sees IE5020, so it must
    leave the checkpoint where it was for the next run to list it again."""
    source = catalogue()
    with serving(RosettaEmulator(source, oai_page_size=2)) as emulator:
        rig.write(rosetta_source(emulator.url))
        emulator.before("resumptionToken=", lambda: source.touch("IE5000"))
        run = rig.harvest()
        assert run.status == "completed" and run.checkpoint_after is None
        assert run.note.startswith("IE5000 was listed twice: the source's listing moved while it was paged")
        assert outcomes(rig, run.run_id) == {("IE5000", "FL5002"): "deposited", ("IE5000", "FL5003"): "deposited",
                                             ("IE5010", "FL5012"): "deposited"}  # IE5020 passed over
        with rig.ledger() as ledger:
            assert ledger.checkpoint(rig.pipeline) is None

        run = rig.harvest()
        assert outcomes(rig, run.run_id) == {("IE5000", "FL5002"): "skipped", ("IE5000", "FL5003"): "skipped",
                                             ("IE5010", "FL5012"): "skipped", ("IE5020", "FL5022"): "rejected",
                                             ("IE5020", "FL5023"): "deposited"}
        assert run.note is None and run.checkpoint_after is not None
        rig.check_final_state(rosetta_expected(source))


def test_an_object_the_source_cannot_describe_fails_alone_and_holds_the_checkpoint(rig):
    source = catalogue()
    broken = source.entities["IE5010"]
    broken.reps[0].preservation_type = "PRESERVATION_MASTER"  # no MODIFIED_MASTER: getIE cannot give its images
    with serving(RosettaEmulator(source)) as emulator:
        rig.write(rosetta_source(emulator.url))
        plan = rig.cli("harvest", "--dry-run")
        assert "fail     IE5010/(object): IE5010: no representation of preservation type" in plan.stdout, plan.stderr
        assert "would process 4 items, skip 0, fail 1 objects the source cannot describe" in plan.stdout
        assert plan.returncode == 1  # as the run it foresees
        run = rig.cli("harvest")
        assert run.returncode == 1 and "3 deposited, 0 skipped, 1 rejected, 1 failed" in run.stdout, run.stderr
        assert "failed: IE5010/(object): the source cannot describe it: IE5010: no representation" in run.stdout
        with rig.ledger() as ledger:
            assert ledger.item(rig.pipeline, "IE5010", "(object)").attempts == 1
            assert ledger.checkpoint(rig.pipeline) <= broken.modified  # the next run lists IE5010 again
        assert f"{rig.pipeline}/IE5020/manifest-v3.json" in rig.keys()  # listed after it: harvested all the same

        broken.reps[0].preservation_type = "MODIFIED_MASTER"  # mended in the source, not touched
        run = rig.harvest()
        assert outcomes(rig, run.run_id) == {("IE5010", "FL5012"): "deposited", ("IE5020", "FL5022"): "skipped",
                                             ("IE5020", "FL5023"): "skipped"}
        with rig.ledger() as ledger:
            assert ledger.item(rig.pipeline, "IE5010", "(object)") is None
            assert ledger.checkpoint(rig.pipeline) > source.entities["IE5020"].modified
        rig.check_final_state(rosetta_expected(source))


def test_an_undescribable_object_out_of_attempts_waits_for_retry(rig):
    source = catalogue()
    broken = source.entities["IE5000"]
    broken.reps[0].preservation_type = "PRESERVATION_MASTER"
    with serving(RosettaEmulator(source)) as emulator:
        rig.write(rosetta_source(emulator.url), max_attempts=1)
        assert rig.harvest().counts == {"deposited": 2, "skipped": 0, "rejected": 1, "failed": 1}
        with rig.ledger() as ledger:
            assert ledger.checkpoint(rig.pipeline) > source.entities["IE5020"].modified  # attempts spent

        asked = len(emulator.requests("IEWebServices"))
        run = rig.cli("harvest")  # reported from the ledger, the source is not asked again
        assert run.returncode == 1 and "0 deposited, 0 skipped, 0 rejected, 1 failed" in run.stdout, run.stderr
        assert "failed: IE5000/(object): failed 1 times (last: the source cannot describe it" in run.stdout
        assert len(emulator.requests("IEWebServices")) == asked

        broken.reps[0].preservation_type = "MODIFIED_MASTER"
        run = rig.cli("retry")
        assert run.returncode == 0 and "2 deposited" in run.stdout, run.stdout + run.stderr
        rig.check_final_state(rosetta_expected(source))
        status = json.loads(rig.cli("status", "--json").stdout)
        assert status["items"]["failed"] == status["last_run"]["failed"] == status["problems_total"]["failed"] == 0


def test_an_object_asked_for_by_id_that_the_source_does_not_have_fails_that_run_only(rig):
    with serving(RosettaEmulator(catalogue())) as emulator:
        rig.write(rosetta_source(emulator.url))
        run = rig.cli("harvest", "--object", "IE9990", "--object", "IE5010")
        assert run.returncode == 1 and "1 deposited, 0 skipped, 0 rejected, 1 failed" in run.stdout, run.stderr
        assert "failed: IE9990/(object): getIE IE9990: SOAP fault IEWSException" in run.stdout
        with rig.ledger() as ledger:
            assert [i.object_id for i in ledger.items(rig.pipeline)] == ["IE5010"]  # nothing kept of IE9990


def test_a_store_that_refuses_the_credentials_stops_the_run_before_any_item(rig, monkeypatch):
    with serving(RosettaEmulator(catalogue())) as emulator:
        rig.write(rosetta_source(emulator.url))
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")  # the CLI's environment
        run = rig.cli("harvest")
        assert run.returncode == 1 and "dam: run stopped:" in run.stderr, run.stdout + run.stderr
        assert "SignatureDoesNotMatch" in run.stderr and "check the store's credentials" in run.stderr
        assert "not-the-secret" not in run.stdout + run.stderr
        assert len(emulator.requests("DeliveryManagerServlet")) == 0
        with rig.ledger() as ledger:
            assert ledger.items(rig.pipeline) == []  # no item spent an attempt
            assert ledger.runs(rig.pipeline)[0].status == "failed"
