"""The source failing under a running harvest: an outage (the item's object cannot be described again either)
or refused credentials stop the run, as a store outage does, with no item's attempt spent; one file that
always fails to download, on a source that otherwise answers, is that item's failure and the run goes on.
Also: depositing a new item asks the store about its key once."""
from __future__ import annotations

import yaml

from gcis_etl.config import load_config
from gcis_etl.work import Outcome, Worker
from tests.broker import tasks_of
from tests.emulators import FAST_RETRY
from tests.emulators.catalogue import CORPUS
from tests.emulators.faults import Fault
from tests.emulators.rosetta import RosettaCatalogue, RosettaEmulator
from tests.harvests import ie, rosetta_source, serving
from tests.servers import MinioServer, free_port

pytest_plugins = ("tests.harvests",)  # the `rig` fixture

MASTERS = ("rgb8-tiff-uncompressed/hopper.tif", "gray8/gray.tif", "rgb8-tiff-lzw/hopper_lzw.tif")
ITEMS = ("FL4102", "FL4103", "FL4104")  # ie() numbers the files of IE4100 from 4102


def one_object() -> RosettaCatalogue:
    """One object whose three items are fetched one after the other (concurrency 1, with no transfer slot, in
    the outage test): the listing is over by the time an outage begins at the second item's download, so
    nothing but the downloads meets it."""
    return RosettaCatalogue([ie(4100, "2024-01-01 10:00:00", *MASTERS)])


def test_a_source_outage_mid_run_stops_the_run_and_spends_no_attempt(rig):
    """Every request to Rosetta answers 503 from the second item's download on: that download outlasts its
    retries, describing the object again fails too, and the run stops (exit 1) saying the source is unavailable,
    with no attempt counted for the items not deposited; with Rosetta back, the next run deposits them."""
    with serving(RosettaEmulator(one_object())) as emulator:
        emulator.before(f"dps_pid={ITEMS[1]}", lambda: emulator.inject("", Fault.http(503), times=None))
        rig.write(rosetta_source(emulator.url), concurrency=1, transfer_slots=0)  # the items one after the other

        run = rig.cli("harvest")

        assert run.returncode == 1, run.stderr
        assert "Traceback" not in run.stderr
        assert f"{rig.pipeline}: run stopped: fetching: " in run.stderr
        assert "the source is unavailable: run again once it is back (no item's attempt was counted)" in run.stderr
        (status, note), = rig.peek("SELECT status, note FROM runs")
        assert status == "failed" and note.startswith("RunHalted: fetching: "), note
        assert len(emulator.requests("IEWebServices")) > 1  # the object was described again: the probe
        assert rig.peek("SELECT item_id, status, attempts FROM items") == [(ITEMS[0], "deposited", 0)]

        emulator.faults.clear()
        again = rig.cli("harvest")
        assert again.returncode == 0, again.stderr
        assert rig.peek("SELECT item_id, status, attempts FROM items ORDER BY item_id") == [
            (ITEMS[0], "deposited", 0), (ITEMS[1], "deposited", 0), (ITEMS[2], "deposited", 0)]


def test_one_file_that_always_fails_is_that_items_failure_and_the_run_goes_on(rig):
    """Only the second item's download answers 503, however often it is asked; describing its object works:
    that item fails with its attempt counted, saying the source answers otherwise, and the others deposit."""
    with serving(RosettaEmulator(one_object())) as emulator:
        emulator.inject(f"dps_pid={ITEMS[1]}", Fault.http(503), times=None)
        rig.write(rosetta_source(emulator.url), concurrency=1)

        run = rig.cli("harvest")

    assert run.returncode == 1, run.stderr
    assert "run stopped" not in run.stderr and "Traceback" not in run.stderr
    (status,), = rig.peek("SELECT status FROM runs")
    assert status == "completed"
    rows = {item: (status, attempts, reason) for item, status, attempts, reason in
            rig.peek("SELECT item_id, status, attempts, reason FROM items")}
    assert {item: row[:2] for item, row in rows.items()} == {
        ITEMS[0]: ("deposited", 0), ITEMS[1]: ("failed", 1), ITEMS[2]: ("deposited", 0)}
    assert "HTTP 503" in rows[ITEMS[1]][2] and "(the source answers otherwise)" in rows[ITEMS[1]][2]


def test_credentials_refused_mid_run_stop_the_run_and_spend_no_attempt(rig):
    """File downloads answer 401 (the password changed under the run): the run stops at the first download,
    saying to fix the credentials, and no item counts an attempt; with the downloads accepted, all deposit."""
    with serving(RosettaEmulator(one_object())) as emulator:
        emulator.inject("DeliveryManagerServlet", Fault.http(401), times=None)
        rig.write(rosetta_source(emulator.url), concurrency=1)

        run = rig.cli("harvest")

        assert run.returncode == 1, run.stderr
        assert f"{rig.pipeline}: run stopped: fetching: " in run.stderr
        assert "fix the source's credentials, then run again (no item's attempt was counted)" in run.stderr
        assert len(emulator.requests("DeliveryManagerServlet")) < len(ITEMS)  # stopped before every item was tried
        assert rig.peek("SELECT item_id, status, attempts FROM items") == []

        emulator.faults.clear()
        again = rig.cli("harvest")
        assert again.returncode == 0, again.stderr
        assert set(rig.statuses().values()) == {"deposited"} and len(rig.statuses()) == len(ITEMS)


def test_depositing_a_new_item_heads_its_key_once(rig, tmp_path):
    """The worker asks the store what its key holds before converting; for a key that holds nothing, put's own
    look (to leave identical bytes alone) could find nothing more, and is not made."""
    catalogue = RosettaCatalogue([ie(4200, "2024-01-01 10:00:00", MASTERS[1])])
    with serving(RosettaEmulator(catalogue)) as emulator:
        rig.write(rosetta_source(emulator.url))
        pipeline = load_config(rig.config).pipeline(rig.pipeline)
        task, = tasks_of(pipeline)
        heads: list[str] = []
        pipeline.store.client.meta.events.register("before-parameter-build.s3.HeadObject",
                                                   lambda params, **_: heads.append(params["Key"]))
        with Worker({pipeline.name: pipeline}, tmp_path / "scratch") as worker:
            result = worker.process(task)

    assert result.outcome is Outcome.DEPOSITED, result.reason
    assert heads == [f"iiif/{rig.image_key('IE4200', 'FL4202')}"]
    assert rig.keys() == [rig.image_key("IE4200", "FL4202")]


def test_an_s3_source_gone_mid_run_stops_the_run_after_asking_for_one_listing_page(tmp_path):
    """An S3 source (its own MinIO) stops after the items were listed: the download outlasts its retries, the
    source's reachable() fails too, and the result stops the run, spending no attempt. That check asks for one
    listing page (tests/test_connector_s3.py), not the whole bucket that describing the object would list."""
    source_server = MinioServer(data_dir=tmp_path / "minio", port=free_port())
    source_server.start()
    try:
        source_server.client().create_bucket(Bucket="masters")
        source_server.client().put_object(Bucket="masters", Key="IE1/page1.tif",
                                          Body=(CORPUS / MASTERS[0]).read_bytes())
        (tmp_path / "config.yaml").write_text(yaml.safe_dump({"pipelines": {"dam": {
            "source": {"kind": "s3", "bucket": "masters", "endpoint_url": source_server.endpoint,
                       "access_key_id": source_server.access_key, "secret_access_key": source_server.secret_key,
                       "addressing_style": "path", "retry": FAST_RETRY},
            "store": {"kind": "local", "root": str(tmp_path / "store")}}}}))
        pipeline = load_config(tmp_path / "config.yaml").pipeline("dam")
        task, = tasks_of(pipeline)
    finally:
        source_server.stop()
    asked: list[str] = []
    pipeline.source.client.meta.events.register("before-call.s3.ListObjectsV2", lambda **_: asked.append("list"))

    with Worker({pipeline.name: pipeline}, tmp_path / "scratch") as worker:
        result = worker.process(task)

    assert result.stops_run and result.transient, result
    assert "the source is unavailable: run again once it is back (no item's attempt was counted)" in result.reason
    assert asked, "the source was not asked whether it is reachable"
    assert not list((tmp_path / "store").rglob("*.tif"))
