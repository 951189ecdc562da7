"""A stop asked for (SIGINT) while the source is waited for before a retry ends the wait at once: the run ends as
a stopped run does, rather than after a Retry-After (with the defaults, up to max_total_seconds: systemd would
SIGKILL it first)."""
from __future__ import annotations

import signal
import subprocess
import threading

from tests.emulators.faults import Fault
from tests.emulators.rosetta import RosettaEmulator
from tests.harvests import rosetta_source, serving, wait_for

pytest_plugins = ("tests.harvests",)  # the `rig` fixture


def test_a_first_ctrl_c_during_a_retry_wait_of_the_listing_stops_the_run_at_once(rig):
    with serving(RosettaEmulator()) as emulator:
        emulator.inject("GET /oaiprovider/request", Fault.http(503, retry_after=20), times=None)
        rig.write(rosetta_source(emulator.url))
        run = rig.start("harvest", "-v")  # a retry is logged at INFO
        stderr: list[str] = []
        reader = threading.Thread(target=lambda: stderr.extend(run.stderr), daemon=True)
        reader.start()
        try:
            wait_for(lambda: any("retrying in 20" in line for line in stderr), "the listing waits to retry", run)
            run.send_signal(signal.SIGINT)
            run.wait(10)  # not 20 s, three times over
        except subprocess.TimeoutExpired:
            run.kill()
            raise
        finally:
            reader.join(10)

    assert run.returncode == 128 + signal.SIGINT, stderr
    assert not any("Traceback" in line for line in stderr), stderr
    assert rig.peek("SELECT status, note FROM runs") == [("stopped", "stopped on request")]
    assert len(emulator.requests("oaiprovider")) == 1  # nothing asked after the stop
