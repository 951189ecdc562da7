"""gcis_etl as a library, off its usual path: a recipe keeping no metadata, verify() given a recipe's name, a
path with a line break, a destination on a read-only filesystem, a conversion process that cannot start, a
master that is a FIFO or a device, and dir() of the package."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, TimeoutError, wait
from pathlib import Path

import pytest
import yaml

import gcis_etl
from gcis_etl.metadata import STRUCTURAL_NAMES
from gcis_etl.models import Status
from gcis_etl.recipes import recipe_files

CORPUS = Path(__file__).parent / "corpus"
RICH = CORPUS / "metadata-rich/ExifTool.jpg"  # EXIF (Artist, Make...), XMP, IPTC; 72 dpi
# What exiftool writes itself with the ExifIFD ColorSpace = sRGB every output carries (its mandatory EXIF tags),
# and the resolution rule's tags: all an output may hold beyond its structure when no metadata is kept.
WRITTEN = {"ExifVersion", "ComponentsConfiguration", "FlashpixVersion", "ColorSpace", "YCbCrPositioning",
           "XResolution", "YResolution", "ResolutionUnit"}


def _recipe(folder: Path, name: str, base: str, metadata: dict) -> gcis_etl.Recipe:
    recipe = yaml.safe_load(recipe_files()[base].read_text())
    (folder / f"{name}.yaml").write_text(yaml.safe_dump({**recipe, "name": name, "metadata": metadata}))
    return gcis_etl.load_recipe(folder / f"{name}.yaml")


def _tags(path: Path) -> dict:
    out = subprocess.run(["exiftool", "-j", "-G1", "-n", "-a", "-EXIF:all", "-XMP:all", "-IPTC:all", str(path)],
                         capture_output=True, text=True, check=True).stdout
    return {k: v for k, v in json.loads(out)[0].items() if k != "SourceFile"}


@pytest.mark.parametrize("base", ["ptiff-jpeg-q90", "ptiff-tifffile-q90", "jp2-openjpeg-lossy"])
@pytest.mark.parametrize("metadata", [{"keep": []}, {"keep": [], "exclude": []}], ids=["keep-none", "nor-exclude"])
def test_a_recipe_keeping_no_metadata_carries_none_of_the_masters(tmp_path, base, metadata):
    """`keep: []`: exiftool's -TagsFromFile naming no tag copies every tag, and its read-back compared them all
    (File:System:FileName included); nothing is copied and nothing expected back."""
    recipe = _recipe(tmp_path, "no-metadata", base, metadata)
    out = tmp_path / f"out{recipe.extension}"

    result = gcis_etl.convert(RICH, out, recipe)

    assert result.status is Status.CONVERTED, result.reason
    tags = _tags(out)
    carried = {k for k in tags if k.split(":")[0] in ("IFD0", "ExifIFD") and k.split(":")[1] not in STRUCTURAL_NAMES}
    assert {k.split(":")[1] for k in carried} <= WRITTEN, tags
    assert not [k for k in tags if k.startswith(("XMP", "IPTC", "GPS"))], tags
    assert (tags["IFD0:XResolution"], tags["IFD0:ResolutionUnit"]) == (72, 2)  # the resolution rule


def test_verify_takes_a_recipe_name_as_convert_does(tmp_path):
    hopper = CORPUS / "rgb8-tiff-uncompressed/hopper.tif"
    assert gcis_etl.convert(hopper, tmp_path / "a.tif").ok
    assert gcis_etl.convert(hopper, tmp_path / "a.jp2", "jp2-openjpeg-lossy").ok

    assert gcis_etl.verify(tmp_path / "a.tif", "ptiff-jpeg-q90").ok
    assert gcis_etl.verify(tmp_path / "a.jp2", "jp2-openjpeg-lossy").ok
    assert gcis_etl.verify(tmp_path / "a.tif", "ptiff-jpeg-q90-444").errors == (
        "level 0 is photometric YCBCR subsampling (2, 2), expected YCbCr (1, 1)",)
    # an expectation of the wrong kind is the caller's mistake, not a corrupt file
    with pytest.raises(TypeError, match="expect: an Expectation, not Jp2Parameters"):
        gcis_etl.verify(tmp_path / "a.tif", gcis_etl.load_recipe("jp2-openjpeg-lossy").jp2)


@pytest.mark.parametrize("recipe", ["ptiff-jpeg-q90", "jp2-openjpeg-lossy"])
def test_paths_with_a_line_break_convert_with_their_metadata(tmp_path, recipe):
    """exiftool -stay_open reads one argument per line: such a name reached it as two."""
    master = tmp_path / "scan\n1.jpg"
    shutil.copy(RICH, master)
    out = tmp_path / f"access\n1{gcis_etl.load_recipe(recipe).extension}"

    info = gcis_etl.inspect(master)
    result = gcis_etl.convert(master, out, recipe)

    assert (info.exif, info.xmp, info.iptc) == (True, True, True)
    assert result.status is Status.CONVERTED, result.reason
    assert _tags(out)["IFD0:Artist"] == "Phil Harvey"


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a read-only tmpfs needs root")
def test_a_destination_on_a_read_only_filesystem_says_to_make_it_writable(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)], check=True)
    try:
        result = gcis_etl.convert(CORPUS / "gray8/gray.tif", folder / "out.tif")
    finally:
        subprocess.run(["umount", str(folder)], check=True)

    assert (result.status, result.disk_full) == (Status.FAILED, True)
    assert result.reason == (f"cannot write {folder}: Read-only file system: make it writable (remount its "
                             f"filesystem read-write) or choose another folder")


def test_a_conversion_process_that_cannot_start_is_not_the_destinations_fault(tmp_path, monkeypatch):
    """Its Popen's PermissionError was reported as 'cannot write <dst>: Permission denied'."""
    python = tmp_path / "python"
    python.write_text("not a program")  # mode 644: nobody, root included, may execute it
    monkeypatch.setattr(sys, "executable", str(python))

    result = gcis_etl.convert(CORPUS / "gray8/gray.tif", tmp_path / "out.tif")

    assert (result.status, result.disk_full, result.cannot_start) == (Status.FAILED, False, True)
    assert result.reason == f"the conversion process could not be started: {python}: Permission denied"


def test_a_master_that_is_not_a_regular_file_is_refused_at_once(tmp_path):
    """A FIFO: reading it waited for a writer for ever. A device read as a zero-byte master."""
    fifo = tmp_path / "scan.tif"
    os.mkfifo(fifo)
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(gcis_etl.convert, fifo, tmp_path / "out.tif")
        try:
            result = future.result(timeout=30)
        except TimeoutError:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # let the reader go: the test fails, not hangs
            raise
    device = gcis_etl.convert("/dev/null", tmp_path / "out.tif")

    assert (result.status, result.reason) == (
        Status.FAILED, f"cannot read {fifo}: it is a FIFO (named pipe), not a regular file")
    assert (device.status, device.reason) == (
        Status.FAILED, "cannot read /dev/null: it is a character device, not a regular file")
    with pytest.raises(OSError, match="not a regular file"):
        gcis_etl.inspect(fifo)


def test_an_access_master_that_is_a_fifo_is_refused_by_verify_at_once(tmp_path):
    """verify() waited out the isolation time limit, then blamed the master's size; the CLI's --recipe check read
    it in the CLI process itself, for ever."""
    fifo = tmp_path / "access.tif"
    os.mkfifo(fifo)
    refused = f"cannot read {fifo}: it is a FIFO (named pipe), not a regular file"
    cli = [str(Path(sys.executable).parent / "gcis-etl"), "verify", "--recipe", "ptiff-jpeg-q90", str(fifo)]
    with ThreadPoolExecutor(2) as pool:
        verified = pool.submit(gcis_etl.verify, fifo)
        command = pool.submit(subprocess.run, cli, capture_output=True, text=True, cwd=tmp_path)
        _, waiting = wait([verified, command], timeout=30)
        while not (verified.done() and command.done()):  # let the readers go: the test fails, not hangs
            with contextlib.suppress(OSError):  # no reader at this moment
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            time.sleep(0.05)

    assert not waiting, "a reader of the FIFO waited for a writer"
    assert verified.result().errors == (refused,)
    assert command.result().returncode == 1, command.result().stderr
    assert f"error: {refused}" in command.result().stdout


def test_dir_lists_the_names_loaded_on_first_use():
    assert set(gcis_etl.__all__) <= set(dir(gcis_etl))


def test_every_front_door_name_resolves():
    assert {name for name in gcis_etl.__all__ if getattr(gcis_etl, name, None) is None} == set()


def test_the_command_line_imports_no_imaging_before_its_signal_handling():
    """A Ctrl-C in the first moments of a command was a KeyboardInterrupt traceback: the command line's import
    pulled in numpy, pyvips and the imaging modules (~0.2 s) before its entry could install exit_on_signals."""
    heavy = ("numpy", "pyvips", "gcis_etl.conversion", "gcis_etl.harvesting")
    loaded = subprocess.run([sys.executable, "-c", "import sys, gcis_etl.cli; "
                             f"print(' '.join(m for m in {heavy!r} if m in sys.modules))"],
                            capture_output=True, text=True, check=True).stdout.split()
    assert loaded == []
