"""What `gcis-etl convert` shows while it runs (a conversion of minutes must not look hung), and the library's
on_stage under it: the stages as they begin, a live line on a terminal, a log line per stage with -v."""
from __future__ import annotations

import logging
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gcis_etl.conversion import convert
from gcis_etl.isolation import IsolatedProcess
from gcis_etl.models import Status
from gcis_etl.progress import ConversionLine
from tests.conftest import CORPUS, run_on_a_terminal

GCIS = str(Path(sys.executable).with_name("gcis-etl"))
FLOWERS = CORPUS / "jpeg-baseline/flowers.jpeg"


@pytest.mark.parametrize(("recipe", "output", "encoding"), [
    ("jp2-openjpeg-lossy", "f.jp2", ["encoding with opj_compress"]),
    ("ptiff-jpeg-q90", "f.tif", []),  # libvips encodes as it reads the pixels: one stage
])
def test_convert_tells_each_stage_as_it_begins(tmp_path, recipe, output, encoding):
    stages: list[str] = []
    result = convert(FLOWERS, tmp_path / output, recipe, on_stage=stages.append)
    assert result.status is Status.CONVERTED, result.reason
    assert stages == ["inspecting", "starting the conversion", "reading pixels with vips", *encoding,
                      "verifying the output"]


def test_a_stage_listener_that_raises_fails_neither_the_conversion_nor_its_process(tmp_path, caplog):
    """The listener runs in the parent while the child works: raised out of the wait for the child's answer, it
    killed the child and failed a good master for its display."""
    def broken(stage: str) -> None:
        raise RuntimeError(f"display gone at {stage}")

    with IsolatedProcess() as worker, caplog.at_level(logging.WARNING, logger="gcis_etl.isolation"):
        worker.start()
        child = worker.pid
        result = convert(FLOWERS, tmp_path / "f.jp2", "jp2-openjpeg-lossy", worker=worker, on_stage=broken)
        assert result.status is Status.CONVERTED, result.reason
        assert worker.pid == child  # its answer read, not killed under it
    failed = [record for record in caplog.records if "listener of the conversion's stages failed" in record.message]
    assert "'encoding with opj_compress'" in [record.message.split(" on ")[-1] for record in failed]
    assert all(record.exc_info for record in failed)


def test_convert_on_a_terminal_shows_the_stage_and_erases_the_line_before_the_result(tmp_path):
    run, shown = run_on_a_terminal([GCIS, "convert", "-r", "jp2-openjpeg-lossy", str(FLOWERS),
                                    str(tmp_path / "f.jp2")], text=True)
    stdout = run.stdout.read()
    assert run.wait() == 0, shown
    assert stdout.startswith(f"converted {FLOWERS} -> ")
    live, _, warnings = shown.partition("    warning:")  # the recipe's rates raised for a small image
    drawn = re.findall(r"\r(flowers\.jpeg: [^\r]*?) *(?=\r)", live)
    stages = [line.split(", ")[0].removeprefix("flowers.jpeg: ") for line in drawn]
    assert list(dict.fromkeys(stages)) == ["inspecting", "starting the conversion", "reading pixels with vips",
                                           "encoding with opj_compress", "verifying the output"]
    assert live.endswith(f"\r{' ' * len(drawn[-1])}\r"), repr(live[-200:])  # erased: the warning starts a clean line
    assert "flowers.jpeg" not in warnings


def test_convert_without_a_terminal_shows_nothing_new_and_logs_each_stage_with_v(tmp_path):
    quiet = subprocess.run([GCIS, "convert", str(FLOWERS), str(tmp_path / "f.tif")], capture_output=True,
                           text=True, timeout=120)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    told = subprocess.run([GCIS, "convert", "-v", str(FLOWERS), str(tmp_path / "g.tif")], capture_output=True,
                          text=True, timeout=120)
    assert told.returncode == 0, told.stderr
    assert re.fullmatch(r"(INFO flowers\.jpeg: .* \(\d+ s elapsed\)\n)+", told.stderr), told.stderr
    assert [line.split(": ", 1)[1].split(" (")[0] for line in told.stderr.splitlines()] == [
        "inspecting", "starting the conversion", "reading pixels with vips", "verifying the output"]
    assert told.stdout.startswith("converted ")


def test_the_conversion_line_is_redrawn_each_tick_without_a_new_stage(capsys):
    with ConversionLine("m.tif", live=True, log_stages=False, tick_seconds=0.05) as line:
        line.stage("encoding with grk_compress")
        shown = ""
        for _ in range(1200):  # a minute at most, on a loaded machine; a few ticks on an idle one
            shown += capsys.readouterr().err
            if shown.count("\rm.tif: encoding with grk_compress, ") >= 3:
                break
            time.sleep(0.05)
    assert shown.count("\rm.tif: encoding with grk_compress, ") >= 3, repr(shown)
    erased = capsys.readouterr().err
    last = (shown + erased).rpartition("\rm.tif: ")[2].split("\r")[0]  # the line last drawn, whatever its age
    assert erased.endswith(f"\r{' ' * len('m.tif: ' + last)}\r"), repr(erased)
