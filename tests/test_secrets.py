"""Secrets that must not get out: not into Celery task messages (a locator), not into a worker's DEBUG log (botocore's
request headers), not into failure reasons (a ${VAR} under a parameter whose name looks harmless), not into the
traceback of a URL that cannot be parsed, not into configuration errors. Over the OTMM emulator, a real Redis,
MinIO and a real worker process."""
from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import redis

from connectors import open_source
from connectors.errors import SourceRequestFailed
from connectors.http import HttpSession, HttpSourceSettings
from gcis_etl.config import load_config
from gcis_etl.errors import ConfigError
from gcis_etl.settings import parse
from gcis_etl.work import ItemTask, Outcome
from gcis_etl.worker import CeleryExecutor
from tests.broker import make_masters, minio_env, pool_config, run_all, s3_store, tasks_of
from tests.emulators import FAST_RETRY
from tests.emulators.faults import Fault
from tests.emulators.otmm import OtmmEmulator
from tests.emulators.rosetta import RosettaEmulator
from tests.emulators.server import EmulatorServer

PASSWORD = "otmm-Secret-3"  # the emulator's user tsuper


@pytest.fixture
def emulator():
    with EmulatorServer(OtmmEmulator()) as server:
        yield server


def otmm(**options):
    return open_source("otmm", {"username": "tsuper", "password": PASSWORD, "retry": FAST_RETRY,
                                "discovery": "ids", "id_list": {"ids": ["listed-by-no-test"]}, **options}, name="otmm-secrets")


def first_object(source, emulator):
    asset = next(iter(emulator.app.catalogue.assets))
    return next(source.get([asset]))


# ------------------------------------------------------------------------------------------- locators


def test_a_base_url_password_stays_out_of_locators_and_links_and_is_sent_when_fetching(emulator, tmp_path):
    gateway = emulator.url.replace("http://", "http://gate:Gate-Pass-55@")
    source = otmm(base_url=gateway,
                  source_url_template="{base_url}/otmm/ux-html/index.html#asset/{id}")
    obj = first_object(source, emulator)
    item = obj.items[0]

    task = json.dumps(ItemTask("library", obj.id, item, "ptiff-jpeg-q90", "digest").to_dict())
    assert "Gate-Pass-55" not in task and "gate:" not in task  # what a Celery task message carries
    assert item.locator.startswith(emulator.url + "/otmmapi/v6/assets/")
    assert obj.source_url.startswith(emulator.url + "/otmm/")  # the manifest's homepage link

    fetched = source.fetch(item, tmp_path)  # the user-info is added when fetching
    assert fetched.size == item.size
    contents = emulator.requests("/contents")[-1]
    assert contents.headers["Authorization"] == "Basic " + base64.b64encode(b"gate:Gate-Pass-55").decode()


def test_task_messages_show_no_signed_query_in_their_argsrepr(tmp_path, redis_server):
    """A locator may need a signed query to fetch (a presigned rendition URL): the worker gets it in the body,
    but what task events, Flower and worker logs show of the arguments (argsrepr) is scrubbed."""
    masters = make_masters(tmp_path / "masters", objects=1, per_object=1)
    config = load_config(pool_config(tmp_path / "c.yaml", masters=masters, broker_url=redis_server.url(),
                                     store={"kind": "local", "root": str(tmp_path / "store")}))
    pipeline = config.pipeline("demo")
    task = tasks_of(pipeline)[0]
    signed = "https://cdn.example.org/m.tif?X-Amz-Credential=AKIA-Key-Id-77&X-Amz-Signature=Sig-Secret-42"
    task = ItemTask(task.pipeline, task.object_id, task.item.__class__(**{**task.item.__dict__, "locator": signed}),
                    task.recipe, task.recipe_digest)
    executor = CeleryExecutor({"demo": pipeline}, 2, tmp_path / "scratch", config.celery)
    assert executor.submit(task) == []  # no worker: the message waits in the queue
    executor.app.close()

    [raw] = redis.Redis(port=redis_server.port).lrange(config.celery.default_queue, 0, -1)
    message = json.loads(raw)
    body = base64.b64decode(message["body"]).decode()
    assert "Sig-Secret-42" in body  # the worker needs it
    shown = message["headers"]["argsrepr"]
    assert "Sig-Secret-42" not in shown and "AKIA-Key-Id-77" not in shown
    assert "X-Amz-Signature=***" in shown and task.item.id in shown


# ------------------------------------------------------------------------------------ worker DEBUG log


def test_a_worker_at_debug_level_logs_no_s3_credentials(tmp_path, minio, s3_bucket, redis_server, celery_workers,
                                                         aws_env):
    masters = make_masters(tmp_path / "masters", objects=1, per_object=1)
    config_file = pool_config(tmp_path / "c.yaml", masters=masters, broker_url=redis_server.url(),
                              store=s3_store(minio, s3_bucket))
    worker = celery_workers("debug", config_file, minio_env(minio, tmp_path), "--loglevel", "DEBUG")
    config = load_config(config_file)
    pipeline = config.pipeline("demo")
    results = run_all(CeleryExecutor({"demo": pipeline}, 2, tmp_path / "scratch", config.celery),
                      tasks_of(pipeline))
    assert [r.outcome for r in results] == [Outcome.DEPOSITED]  # requests were signed and sent
    worker.stop()
    log = worker.log_text()
    assert "DEBUG/" in log  # the worker did log at DEBUG
    assert minio.access_key not in log and "Credential=" not in log and "Signature=" not in log


def test_rosetta_delivery_credentials_stay_out_of_locators_and_links_and_are_sent_when_fetching(tmp_path,
                                                                                                 monkeypatch):
    monkeypatch.setenv("PDS_CODE", "Pds-Code-Secret-4")
    with EmulatorServer(RosettaEmulator()) as app, EmulatorServer(RosettaEmulator(app.app.catalogue)) as delivery:
        source = open_source("rosetta", {
            "base_url": app.url, "username": "harvester", "institution_code": "INS00", "password": "harvest-Secret-1",
            "oai": {"set": "gcis"}, "retry": FAST_RETRY,
            "delivery_base_url": delivery.url.replace("http://", "http://dlv:Dlv-Pass-66@"),
            "delivery_params": {"code": "${PDS_CODE}"}}, name="rosetta-secrets")
        (obj,) = source.get(["IE1011"])
        item = obj.items[0]
        task = json.dumps(ItemTask("library", obj.id, item, "ptiff-jpeg-q90", "digest").to_dict())
        assert [secret for secret in ("Pds-Code-Secret-4", "Dlv-Pass-66", "dlv:") if secret in task] == []
        assert item.locator.startswith(delivery.url + "/") and obj.source_url.startswith(delivery.url + "/")

        assert source.fetch(item, tmp_path).size == item.size  # the parameters are added when fetching
        download = delivery.requests("DeliveryManagerServlet")[-1]
        assert download.query["code"] == ["Pds-Code-Secret-4"]

        delivery.inject("DeliveryManagerServlet", Fault.http(404))
        with pytest.raises(SourceRequestFailed) as failed:
            source.fetch(item, tmp_path)
        assert "Pds-Code-Secret-4" not in str(failed.value) and "Dlv-Pass-66" not in str(failed.value)


# ----------------------------------------------------------------------------- values from the environment


def test_a_value_from_the_environment_is_kept_out_of_failure_reasons_whatever_its_key(emulator, tmp_path,
                                                                                       monkeypatch):
    monkeypatch.setenv("OTMM_URL", emulator.url)
    monkeypatch.setenv("CONTENT_CODE", "Content-Code-Secret-7")
    monkeypatch.setenv("VERIFY", "true")  # a switch, no secret: "true" stays readable in messages
    source = otmm(base_url="${OTMM_URL}", contents_params={"code": "${CONTENT_CODE}"}, verify_tls="${VERIFY}")
    item = first_object(source, emulator).items[0]
    emulator.inject("/contents", Fault.http(404))

    with pytest.raises(SourceRequestFailed) as failed:
        source.fetch(item, tmp_path)
    reason = str(failed.value)
    assert "Content-Code-Secret-7" not in reason and "code=***" in reason
    assert emulator.url in reason  # the URL from the environment is no secret: the host stays named
    assert emulator.requests("/contents")[-1].query["code"] == ["Content-Code-Secret-7"]  # it was sent


# ------------------------------------------------------------------------------ URLs that cannot be parsed


def test_a_base_url_whose_password_has_an_unencoded_hash_is_refused_at_load_without_showing_it(monkeypatch):
    monkeypatch.setenv("OTMM_URL", "http://tsuper:Hash-Secret-Start#5@127.0.0.1:8080")
    with pytest.raises(ConfigError) as from_environment:
        otmm(base_url="${OTMM_URL}")
    with pytest.raises(ConfigError) as written:
        otmm(base_url="http://tsuper:Hash-Secret-Start#5@127.0.0.1:8080")
    for error in (from_environment, written):
        assert "base_url: " in str(error.value) and "percent-encode" in str(error.value)
        assert "Hash-Secret-Start" not in str(error.value)
    assert otmm(base_url="http://tsuper:Hash-Secret-Start%235@127.0.0.1:8080")  # encoded, it loads


def test_a_url_that_cannot_be_parsed_fails_the_request_without_showing_its_password():
    session = HttpSession(parse(HttpSourceSettings, {"base_url": "http://127.0.0.1:9"}, "config.yaml"))
    with pytest.raises(SourceRequestFailed) as failed:  # a URL a source handed (a rendition's), say
        session.request("GET", "http://user:Hash-Secret-Start#5@127.0.0.1:9/master.tif")
    assert "not a valid URL" in str(failed.value) and "Hash-Secret-Start" not in str(failed.value)


# ------------------------------------------------------------------------------------ configuration errors


def write_config(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text("pipelines:\n  library:\n    source:\n      kind: otmm\n      base_url: http://127.0.0.1:9\n"
                    "      username: tsuper\n" + source + "    store: {kind: local, root: store}\n")
    return path


@pytest.mark.parametrize("source, key", [
    ("      password: x-y-z-1\n      passwd: LiteralPw-77\n", "library.source.passwd: unknown key"),
    ("      password: x-y-z-1\n      extra_headers: {Ocp-Apim-Subscription-Key: 982734982374982374}\n",
     "library.source.extra_headers.Ocp-Apim-Subscription-Key: Input should be a valid string"),
])
def test_a_configuration_error_never_shows_a_value_under_an_unknown_key_or_a_header(tmp_path, source, key):
    with pytest.raises(ConfigError) as error:
        load_config(write_config(tmp_path, source))
    assert key in str(error.value)
    assert "LiteralPw-77" not in str(error.value) and "982734982374982374" not in str(error.value)


def test_a_yaml_error_gives_line_and_column_without_the_line_itself(tmp_path):
    with pytest.raises(ConfigError) as error:
        load_config(write_config(tmp_path, "      password: @LiteralPw-77\n"))
    assert "not valid YAML at line 7, column 17" in str(error.value)
    assert "LiteralPw-77" not in str(error.value)

