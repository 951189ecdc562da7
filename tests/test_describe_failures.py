"""One object the source cannot describe within its retries (a 5xx or a timeout every time it is asked), on a
source that otherwise answers, fails alone and the rest of the listing goes on; with the source down as a whole
the run still stops, naming the object. Also: a damaged OTMM login answer, and a stop asked for during a retry
wait. Over real HTTP against the emulators."""
from __future__ import annotations

import threading
import time

import pytest

from connectors import open_source
from connectors.base import SourceObject, UnreadableObject, described
from connectors.errors import RetryStopped, SourceDataError, SourceUnavailable
from connectors.retry import waits_end_when
from tests.emulators import FAST_RETRY
from tests.emulators.faults import Fault
from tests.emulators.otmm import OtmmEmulator
from tests.emulators.rosetta import RosettaEmulator
from tests.emulators.server import EmulatorServer, Request, Response
from gcis_etl.harvesting import OBJECT
from tests.harvests import OTMM_PASSWORD, ROSETTA_PASSWORD, otmm_source, outcome, serving

pytest_plugins = ("tests.harvests",)  # the `rig` fixture

LIVE_IN_SET = ["IE1001", "IE1011", "IE1016", "IE1020", "IE1023"]  # the seed catalogue's IEs in the OAI set
BROKEN = "IE1016"


class GatewayTimeouts(RosettaEmulator):
    """getIE of the IEs in `broken` answers 504 (a gateway timing out on a METS too large to make in time), however
    often it is asked; every other request is answered."""

    def __init__(self, *broken: str):
        super().__init__()
        self.broken = broken

    def handle(self, request: Request) -> Response:
        if request.method == "POST" and any(f"<iePid>{pid}</iePid>".encode() in request.body for pid in self.broken):
            return Response(504, b"<html><body>Gateway Timeout</body></html>", "text/html")
        return super().handle(request)


def rosetta(url: str):
    return open_source("rosetta", {"base_url": url, "username": "harvester", "institution_code": "INS00",
                                   "password": ROSETTA_PASSWORD, "oai": {"set": "gcis"}, "retry": FAST_RETRY},
                       name="rosetta-test")


def otmm(url: str):
    return open_source("otmm", {"base_url": url, "username": "tsuper", "password": OTMM_PASSWORD,
                                "retry": FAST_RETRY, "search": {"page_size": 2}}, name="otmm-test")


def test_an_otmm_asset_whose_description_always_fails_fails_alone_and_the_run_goes_on(rig):
    """The bug: `GET assets/<id>` of one asset answering 500 for ever stopped every run at it. It is now that
    object's failure, its attempt counted, saying the source answers otherwise; the others deposit."""
    with serving(OtmmEmulator()) as emulator:
        assets = emulator.app.catalogue.assets
        broken = sorted(assets)[0]
        emulator.inject(rf"GET /otmmapi/v6/assets/{broken}\?", Fault.http(500), times=None)
        rig.write(otmm_source(emulator.url, group=None))

        run = rig.cli("harvest")

    assert run.returncode == 1, run.stderr
    assert "run stopped" not in run.stderr and "Traceback" not in run.stderr
    assert rig.peek("SELECT status FROM runs") == [("completed",)]
    rows = {(o, i): (s, a, r) for o, i, s, a, r in rig.peek("SELECT object_id, item_id, status, attempts, reason "
                                                            "FROM items")}
    status, attempts, reason = rows.pop((broken, OBJECT))
    assert (status, attempts) == ("failed", 1)
    assert broken in reason and "HTTP 500" in reason and "(the source answers otherwise)" in reason
    assert {key: row[0] for key, row in rows.items()} == {
        (a, a): outcome(asset.master) for a, asset in assets.items() if a != broken}


def test_a_rosetta_ie_whose_getie_always_times_out_stands_alone_in_the_listing_named():
    with EmulatorServer(GatewayTimeouts(BROKEN)) as emulator:
        listed = list(rosetta(emulator.url).changes(None))
    assert [o.id for o in listed] == LIVE_IN_SET
    (unreadable,) = [o for o in listed if isinstance(o, UnreadableObject)]
    assert unreadable.id == BROKEN and not unreadable.gone
    assert f"getIE {BROKEN}: " in unreadable.reason and "HTTP 504" in unreadable.reason
    assert unreadable.reason.endswith("(the source answers otherwise)")


@pytest.mark.parametrize("source", ["rosetta", "otmm"])
def test_objects_asked_for_by_id_whose_description_always_fails_stand_alone(source):
    """--object, revisits and reencode describe by id (connectors.base.described): the same holds there."""
    if source == "rosetta":
        server, broken, ids = EmulatorServer(GatewayTimeouts(BROKEN)), BROKEN, ["IE1001", BROKEN, "IE1020"]
    else:
        server = EmulatorServer(OtmmEmulator())
        ids = sorted(server.app.catalogue.assets)[:3]
        broken = ids[1]
        server.inject(rf"GET /otmmapi/v6/assets/{broken}\?", Fault.http(503), times=None)
    with server:
        got = list(described(rosetta(server.url) if source == "rosetta" else otmm(server.url), ids))
    assert [(o.id, type(o)) for o in got] == [(ids[0], SourceObject), (broken, UnreadableObject),
                                              (ids[2], SourceObject)]
    assert broken in got[1].reason and got[1].reason.endswith("(the source answers otherwise)")
    assert not got[1].gone


def test_a_rosetta_down_as_a_whole_while_describing_still_stops_the_listing_naming_the_ie():
    """Every request answers 503 from the first getIE on: the probe fails too, so this is the source's outage,
    which must not fail every IE in turn; the error names the IE being described."""
    with EmulatorServer(RosettaEmulator()) as emulator:
        emulator.before("IEWebServices", lambda: emulator.inject("", Fault.http(503), times=None))
        with pytest.raises(SourceUnavailable, match=f"getIE {LIVE_IN_SET[0]}: .*HTTP 503") as raised:
            list(rosetta(emulator.url).changes(None))
        assert emulator.requests(r"GET /dpsws/repository/IEWebServices\?wsdl")  # the probe was asked
    assert "answers otherwise" not in str(raised.value)


def test_a_damaged_otmm_login_answer_is_asked_for_again_and_never_crashes_or_shows_the_token():
    """The login answer's middle byte flipped lands in the session's message_digest, which then cannot go in a
    header (http.client raised UnicodeEncodeError, a crash): a bad answer, asked for again; for ever damaged, a
    SourceDataError that does not show it."""
    with EmulatorServer(OtmmEmulator()) as emulator:
        emulator.inject("POST /otmmapi/v6/sessions", Fault.corrupt())
        assert len(list(otmm(emulator.url).changes(None))) == 6
        assert len(emulator.requests("POST /otmmapi/v6/sessions")) == 2

        emulator.inject("POST /otmmapi/v6/sessions", Fault.corrupt(), times=None)
        with pytest.raises(SourceDataError, match="cannot go in a request header") as raised:
            list(otmm(emulator.url).changes(None))
        digests = [s.digest for s in emulator.app.sessions.values()]
    assert len(digests) == 2 + FAST_RETRY["max_attempts"]
    assert not any(d[:8] in str(raised.value) for d in digests)


def test_a_stop_ends_a_retry_wait_at_once():
    """The OAI listing answers 503 with Retry-After: 20 every time: asked to stop 0.3 s in, the wait ends then
    (RetryStopped, which the harvest takes as its stop), not 20 s later."""
    stop = threading.Event()
    with EmulatorServer(RosettaEmulator()) as emulator:
        emulator.inject("GET /oaiprovider/request", Fault.http(503, retry_after=20), times=None)
        threading.Timer(0.3, stop.set).start()
        began = time.monotonic()
        with waits_end_when(stop.is_set), pytest.raises(RetryStopped, match="HTTP 503.*asked to stop"):
            list(rosetta(emulator.url).changes(None))
    assert time.monotonic() - began < 2
