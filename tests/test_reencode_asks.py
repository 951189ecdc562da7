"""reencode describes each object of a batch once: the harvest run it makes takes the objects as the migration
described them (to leave out those the source no longer has), rather than asking the source again. Counted on
the Rosetta emulator's request log, getIE by getIE, over real HTTP."""
from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

from tests.emulators.rosetta import RosettaCatalogue, RosettaEmulator
from tests.emulators.server import EmulatorServer, Request, Response
from tests.harvests import ie, rosetta_source, serving

pytest_plugins = ("tests.harvests",)  # the `rig` fixture

MIGRATE = str(Path(sys.executable).with_name("gcis-migrate"))
TO_JP2 = ("--from-recipe", "ptiff-jpeg-q90", "--to-recipe", "jp2-openjpeg-lossless", "--batch-size", "2")


class Garbled:
    """The emulator, but getIE of `pid` answers a body that is no SOAP envelope: the source cannot describe that
    object (an UnreadableObject, not gone) until `mend()`."""

    def __init__(self, app: RosettaEmulator, pid: str):
        self.app = app
        self.pid = pid

    def handle(self, request: Request) -> Response:
        if self.pid and f"<iePid>{self.pid}</iePid>".encode() in request.body:
            return Response.xml(b"<garbled")
        return self.app.handle(request)

    def control(self, name: str, request: Request) -> Response:
        return self.app.control(name, request)

    def mend(self) -> None:
        self.pid = ""


def described(emulator: EmulatorServer, since: int) -> Counter[str]:
    """getIE calls among the requests after the first `since`, by IE."""
    return Counter(re.search(rb"<iePid>([^<]*)</iePid>", r.body)[1].decode()
                   for r in emulator.requests()[since:] if r.path.endswith("/IEWebServices"))


def migrate(rig, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([MIGRATE, "--config", str(rig.config), "reencode", *args], capture_output=True, text=True,
                          timeout=180)


def test_reencode_asks_the_source_once_an_object_and_the_harvest_takes_what_it_was_told(rig):
    """Three IEs in two batches, one gone from the source and one it cannot describe: each is asked for once (it
    was twice: once to leave out the gone, once more by the harvest run); the others are re-derived, the gone
    one listed, the unreadable one failed as the harvest fails it, and re-derived once the source mends it."""
    catalogue = RosettaCatalogue([ie(5000, "2024-01-01 10:00:00", "png/png-rgb-64x56x8.png", "gray8/hopper_gray.jpg"),
                                  ie(5010, "2024-01-01 10:00:00", "gray8/hopper_gray.jpg"),
                                  ie(5020, "2024-01-01 10:00:00", "png/png-rgb-64x56x8.png")])
    garbled = Garbled(RosettaEmulator(catalogue), "")
    with serving(garbled) as emulator:
        rig.write(rosetta_source(emulator.url), recipe="ptiff-jpeg-q90", max_attempts=2)
        harvest = rig.cli("harvest")
        assert harvest.returncode == 0, harvest.stderr
        catalogue.entities["IE5010"].deleted = True
        garbled.pid = "IE5020"

        since = len(emulator.requests())
        run = migrate(rig, *TO_JP2)
        assert run.returncode == 1, run.stdout + run.stderr  # IE5020 failed
        assert described(emulator, since) == {"IE5000": 1, "IE5010": 1, "IE5020": 1}, run.stdout
        assert "1 no longer in the source" in run.stdout and "2 deposited" in run.stdout, run.stdout
        assert rig.peek("SELECT item_id, status, attempts, reason FROM items WHERE object_id='IE5020' "
                        "ORDER BY item_id") == [
            ("(object)", "failed", 1, "the source cannot describe it: IE5020: getIE response: "
                                       "not well-formed XML (unclosed token: line 1, column 0)"),
            ("FL5022", "deposited", 0, None)]  # with ptiff-jpeg-q90, as the initial harvest left it
        options = rig.peek("SELECT options FROM runs ORDER BY run_id DESC LIMIT 1")[0][0]
        assert '"object_ids": ["IE5020"]' in options and "described" not in options, options

        garbled.mend()
        since = len(emulator.requests())
        run = migrate(rig, *TO_JP2)
        assert run.returncode == 0, run.stdout + run.stderr
        assert described(emulator, since) == {"IE5010": 1, "IE5020": 1}, run.stdout
        items = rig.peek("SELECT object_id, item_id, status, recipe FROM items")
        assert {(o, i): (status, recipe) for o, i, status, recipe in items} == {
            ("IE5000", "FL5002"): ("deposited", "jp2-openjpeg-lossless"),
            ("IE5000", "FL5003"): ("deposited", "jp2-openjpeg-lossless"),
            ("IE5010", "FL5012"): ("deposited", "ptiff-jpeg-q90"),  # left as it is
            ("IE5020", "FL5022"): ("deposited", "jp2-openjpeg-lossless")}  # the object's failure forgotten
