"""gcis_etl used as a library: interrupted calls, a reused worker after os.chdir, what reaches the caller's
stderr, tifffile's log under threads, verify under the limits given, the answers for a missing master or an
output nowhere to go, and a harvest of several pipelines."""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

import gcis_etl
from gcis_etl.isolation import IsolatedProcess
from gcis_etl.locks import pipeline_lock
from gcis_etl.models import Status, Verdict
from gcis_etl.policy import IsolationSettings
from gcis_etl.progress import Progress

CORPUS = Path(__file__).parent / "corpus"
ROTATED = CORPUS / "exif-orientation/Landscape_6.jpg"  # stored 450x600, EXIF orientation 6: upright 600x450
OTHER = CORPUS / "jpeg-baseline/jpg-rgb-594x522x8-baseline.jpg"
NOISY = CORPUS / "corrupt/crash-1185209cf7655b5aed8ae5e77784dfdd18ab59e9.tif"  # tifffile complains reading it
QUIET = CORPUS / "rgb8-tiff-lzw/hopper_lzw.tif"
STRIPS = CORPUS / "truncated/tiff_overflow_rows_per_strip.tif"  # tifffile complains in the decoding child too

# The interrupt of a Jupyter kernel or a Celery soft time limit: a signal handler raising in the main thread
# while it waits for exiftool. exiftool is held in its read of a file named gcis-held* by a composite tag of
# its own config (it waits for a file), so the signal certainly lands before its answer; the answer comes
# after, and the next call in that thread must not take it for its own.
_INTERRUPTED = """
import json, signal, sys, threading, time
from pathlib import Path
import gcis_etl
held_master, held, released, master, out = map(Path, sys.argv[1:])

class Interrupted(BaseException):
    pass

def interrupt(signum, frame):
    raise Interrupted()

def act():
    while not held.exists():
        time.sleep(0.01)
    signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)

signal.signal(signal.SIGUSR1, interrupt)
threading.Thread(target=act).start()
try:
    gcis_etl.inspect(held_master)
    interrupted = False
except Interrupted:
    interrupted = True
released.touch()
info = gcis_etl.inspect(master)
result = gcis_etl.convert(master, out)
print(json.dumps({"interrupted": interrupted, "orientation": info.orientation, "status": result.status.value,
                  "size": [result.width, result.height], "reason": result.reason}))
"""


def test_an_interrupted_exiftool_read_is_not_answered_to_the_next_call(tmp_path):
    home = tmp_path / "exiftool"
    home.mkdir()
    held, released = tmp_path / "held", tmp_path / "released"
    (home / ".ExifTool_config").write_text(
        "%Image::ExifTool::UserDefined = ('Image::ExifTool::Composite' => { GcisHeld => {\n"
        f"    Require => 'FileName', ValueConv => q{{ if ($val =~ /gcis-held/) {{ open(my $f, '>', '{held}');\n"
        f"    close($f); select(undef, undef, undef, 0.05) until -e '{released}' }} 1 }} }} }});\n1;\n")
    held_master = tmp_path / "gcis-held.jpg"
    shutil.copy(ROTATED, held_master)
    done = subprocess.run([sys.executable, "-c", _INTERRUPTED, str(held_master), str(held), str(released),
                           str(ROTATED), str(tmp_path / "out.tif")],
                          env={**os.environ, "EXIFTOOL_HOME": str(home)}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout.splitlines()[-1])
    assert outcome["interrupted"]
    assert outcome["orientation"] == 6
    assert (outcome["status"], outcome["size"]) == ("converted", [600, 450]), outcome["reason"]


def test_a_reused_worker_converts_relative_paths_of_the_callers_cwd(tmp_path, monkeypatch):
    first, second = tmp_path / "first", tmp_path / "second"
    for folder, master in ((first, OTHER), (second, ROTATED)):
        folder.mkdir()
        shutil.copy(master, folder / "master.jpg")
    with IsolatedProcess() as worker:
        monkeypatch.chdir(first)
        assert gcis_etl.convert("master.jpg", "out.tif", worker=worker).ok
        monkeypatch.chdir(second)  # the worker's child still runs in `first`
        result = gcis_etl.convert("master.jpg", "out.tif", worker=worker)
    assert result.status is Status.CONVERTED, result.reason
    assert (result.width, result.height) == (600, 450)  # second's master, upright: not first's 594x522
    assert result.output == str(second / "out.tif")
    assert gcis_etl.verify(second / "out.tif").width == 600
    assert sorted(p.name for p in first.iterdir()) == ["master.jpg", "out.tif"]  # no .partial left there


def test_conversion_children_leave_the_callers_stderr_alone(capfd, tmp_path):
    """tifffile's complaints in the child become the master's warnings (once, with inspection's own), never
    lines on the stderr the child inherits (under --log-json every line there is JSON)."""
    info = gcis_etl.check_decoding(STRIPS)
    structure = [w for w in info.warnings if w.startswith("TIFF structure: ")]
    assert structure and len(structure) == len(set(structure))
    assert gcis_etl.convert(STRIPS, tmp_path / "out.tif").status is Status.REJECTED
    assert capfd.readouterr().err == ""


def test_tifffile_complaints_stay_with_the_thread_and_master_they_are_about():
    """One thread's TIFF warnings are never another master's, and tifffile's log keeps working for the rest of
    the process while masters are inspected in threads."""
    noisy_alone = set(gcis_etl.inspect(NOISY).warnings)
    assert any(w.startswith("TIFF structure: ") for w in noisy_alone)
    logger = logging.getLogger("tifffile")
    received: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            received.append(record.getMessage())

    keep, stop = Keep(logging.WARNING), threading.Event()
    logger.addHandler(keep)

    def chatter() -> int:  # another part of the program logging through tifffile's logger meanwhile
        sent = 0
        while not stop.is_set():
            logger.warning("not about any master %d", sent)
            sent += 1
            time.sleep(0.0005)  # lets the inspecting threads run between records
        return sent

    try:
        with ThreadPoolExecutor(5) as pool:
            sent = pool.submit(chatter)
            infos = list(pool.map(gcis_etl.inspect, [NOISY, QUIET] * 100))
            stop.set()
            sent = sent.result()
    finally:
        logger.removeHandler(keep)
    assert [i.warnings for i in infos if i.path == str(QUIET)] == [()] * 100
    assert all(set(i.warnings) == noisy_alone for i in infos if i.path == str(NOISY))
    assert received == [f"not about any master {n}" for n in range(sent)]
    assert logger.propagate


def test_verify_reports_a_missing_file_or_a_folder_and_takes_a_recipe(tmp_path):
    missing = gcis_etl.verify(tmp_path / "missing.tif")
    assert not missing.ok and missing.errors == (f"cannot read {tmp_path / 'missing.tif'}: No such file or directory",)
    folder = gcis_etl.verify(tmp_path)
    assert not folder.ok and folder.errors == (f"cannot read {tmp_path}: Is a directory",)
    out = tmp_path / "out.tif"
    assert gcis_etl.convert(OTHER, out, recipe="ptiff-jpeg-q90-444").ok
    assert gcis_etl.verify(out, gcis_etl.load_recipe("ptiff-jpeg-q90-444")).ok
    chroma = gcis_etl.verify(out, gcis_etl.load_recipe("ptiff-jpeg-q90"))  # 4:2:0, the file is 4:4:4
    assert not chroma.ok and all("expected YCbCr (2, 2)" in e for e in chroma.errors)
    kind = gcis_etl.verify(out, gcis_etl.load_recipe("jp2-openjpeg-lossy"))
    assert kind.errors == (f"{out} is not a JP2, and recipe jp2-openjpeg-lossy makes JP2 files",)


def test_verify_runs_under_the_isolation_settings_given_and_says_when_it_could_not_finish(tmp_path):
    """The configured limits apply (here less time than loading libvips takes): the file is then unverified,
    neither valid nor invalid, which a report could not say."""
    out = tmp_path / "out.tif"
    assert gcis_etl.convert(OTHER, out).ok
    assert gcis_etl.verify(out, isolation_settings=IsolationSettings(timeout_seconds=60)).ok
    with pytest.raises(gcis_etl.ConversionFailed, match="timed out"):
        gcis_etl.verify(out, isolation_settings=IsolationSettings(timeout_seconds=0.01))


def test_convert_fails_a_missing_master_and_an_output_nowhere_to_go(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for master, why in (("missing.jpg", "No such file or directory"), (".", "Is a directory")):
        result = gcis_etl.convert(master, "out.tif")
        assert result.status is Status.FAILED
        assert result.reason == f"cannot read {Path(master).absolute()}: {why}"
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir.tif").mkdir()
    for dst, reason in (("afile/out.tif", f"cannot write {tmp_path}/afile/out.tif: {tmp_path}/afile is a file, "
                                          "not a folder"),
                        ("adir.tif", f"cannot write {tmp_path}/adir.tif: it is a folder (name the output file)"),
                        ("", "no output path given (an empty name)")):
        result = gcis_etl.convert(OTHER, dst)
        assert (result.status, result.reason) == (Status.FAILED, reason)
        assert result.info.verdict is Verdict.ACCEPT
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir.tif", "afile"]


def _two_pipelines(tmp_path: Path):
    """archive and museum, one object of one master each, from folders into local stores."""
    names = ("archive", "museum")
    for name in names:
        (tmp_path / "masters" / name / "object-1").mkdir(parents=True)
        shutil.copy(OTHER, tmp_path / "masters" / name / "object-1" / "p1.jpg")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"pipelines": {
        name: {"source": {"kind": "filesystem", "root": f"masters/{name}"},
               "store": {"kind": "local", "root": f"store/{name}"}} for name in names}}))
    return gcis_etl.load_config(tmp_path / "config.yaml")


def test_harvest_pipelines_passes_over_a_locked_pipeline_and_runs_the_next(tmp_path):
    """What `gcis-etl harvest` does, from a script: a pipeline whose lock another run holds is not run (exit 3,
    saying why), and the one after it still is; the command would exit with the higher code."""
    config = _two_pipelines(tmp_path)
    with pipeline_lock(config.state_dir, "archive"):  # another run of archive
        outcomes = list(gcis_etl.harvest_pipelines(config))
    archive, museum = outcomes
    assert (archive.name, archive.exit_code, archive.report) == ("archive", 3, None)
    assert archive.message == (f"pipeline 'archive' is already running (pid {os.getpid()}; lock "
                               f"{config.state_dir / 'locks' / 'archive.lock'}): nothing was done")
    assert (museum.name, museum.exit_code, museum.message) == ("museum", 0, None)
    assert (museum.report.status, museum.report.counts["deposited"]) == ("completed", 1)
    assert max(outcome.exit_code for outcome in outcomes) == 3
    assert not (tmp_path / "store" / "archive").exists()


def test_harvest_pipelines_takes_the_callers_own_event_as_its_stop(tmp_path):
    """A plain threading.Event, as harvest() takes: set while the first pipeline starts, that run takes no
    item and is recorded stopped, the next is not started, and says so, and both exit 1, as a run that did not
    complete (no signal to report: not 130). It used to fail at the end of the first run: an Event has no exit
    code."""
    config = _two_pipelines(tmp_path)
    stop = threading.Event()

    def progress_for(name: str) -> Progress:
        stop.set()
        return Progress()

    archive, museum = gcis_etl.harvest_pipelines(config, stop=stop, progress_for=progress_for)
    assert (archive.name, archive.exit_code, archive.message) == ("archive", 1, None)
    assert (archive.report.status, archive.report.counts["deposited"]) == ("stopped", 0)
    assert (museum.name, museum.exit_code, museum.report) == ("museum", 1, None)
    assert museum.message == "museum: not started: the harvest was stopped by its caller"
    assert not [path for path in (tmp_path / "store").rglob("*") if path.is_file()]
