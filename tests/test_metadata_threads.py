"""Each thread runs its own exiftool: a worker pool's threads inspect masters side by side, not one at a time
behind one process (2x36 inspects took twice as long as 36). A thread's exiftool ends with the thread."""
from __future__ import annotations

import threading

import psutil
import pyvips

from gcis_etl.inspection import inspect
from gcis_etl.metadata import exiftool_json


def exiftools() -> set[int]:
    return {p.pid for p in psutil.Process().children() if "exiftool" in " ".join(p.cmdline())}


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
