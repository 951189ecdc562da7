"""Each thread runs its own exiftool: a worker pool's threads inspect masters side by side, not one at a time
behind one process (2x36 inspects took twice as long as 36). A thread's exiftool ends with the thread."""
from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pyvips

from gcis_etl.errors import ConversionFailed
from gcis_etl.inspection import inspect
from gcis_etl.metadata import exiftool_json


def exiftools() -> set[int]:
    """This process's running exiftool children. A child another test left unreaped (a zombie: its command
    line cannot be read) or one that ends meanwhile is none of them."""
    found = set()
    for child in psutil.Process().children():
        try:
            if "exiftool" in " ".join(child.cmdline()):
                found.add(child.pid)
        except psutil.Error:
            continue
    return found


def test_a_thread_does_not_wait_for_another_threads_exiftool(tmp_path):
    """One thread's exiftool is held (its -if condition waits for a file); another thread's inspect still
    completes. Behind one shared process it waited until the file appeared (here: not before the join gave up)."""
    master = tmp_path / "m.jpg"
    pyvips.Image.black(8, 6, bands=3).jpegsave(str(master))
    release = tmp_path / "release"
    hold = f'until (-e "{release}") {{ select(undef, undef, undef, 0.05) }} 1'
    held = threading.Thread(target=exiftool_json, args=(master, "-if", hold), daemon=True)
    held.start()
    found = []
    other = threading.Thread(target=lambda: found.append((inspect(master), exiftools())))
    other.start()
    other.join(30)
    try:
        assert found, "the second thread waited for the first thread's exiftool"
        info, during = found[0]
        assert (info.width, info.height) == (8, 6)
        assert len(during) >= 2  # the held thread's, and the inspecting thread's own
        assert during - exiftools(), "a thread's exiftool outlived the thread"
    finally:
        release.touch()  # let the held exiftool, and so the thread, go whatever happened
        held.join(60)
        other.join(60)


def wait_until(condition):
    deadline = time.monotonic() + 30
    while not (value := condition()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
    return value


def test_an_exiftool_killed_mid_answer_fails_the_read_instead_of_waiting_for_ever(tmp_path):
    """A signal to every process of the service's cgroup (systemd's KillMode=control-group) reaches the
    threads' exiftool processes whatever their session: the read in hand must end, as a failure of the item
    (not {}: no answer is not 'no metadata'), and the next read starts another exiftool."""
    master = tmp_path / "m.jpg"
    pyvips.Image.black(8, 6, bands=3).jpegsave(str(master))
    hold = f'until (-e "{tmp_path / "never"}") {{ select(undef, undef, undef, 0.05) }} 1'
    before = exiftools()
    outcome = []

    def read() -> None:
        try:
            outcome.append(exiftool_json(master, "-if", hold))
        except ConversionFailed as exc:
            outcome.append(exc)
        outcome.append(exiftool_json(master))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    started = wait_until(lambda: exiftools() - before)
    for pid in started:
        os.kill(pid, signal.SIGTERM)
    reader.join(60)  # a hang guard, not a timing assertion
    assert not reader.is_alive(), "the read waited for ever for the killed exiftool's answer"
    failure, after = outcome
    assert isinstance(failure, ConversionFailed) and "SIGTERM" in str(failure), failure
    assert after["File:ImageWidth"] == 8  # read by a new exiftool
