"""gcis_etl as a library, as a walk through it used it: file names that are not UTF-8, a LocalStore with a relative
root after os.chdir, one worker shared by threads, and recipe errors that name the key at fault."""
from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

import gcis_etl
from gcis_etl.isolation import IsolatedProcess
from gcis_etl.models import Status, Verdict
from gcis_etl.stores import LocalStore, LocalStoreSettings

CORPUS = Path(__file__).parent / "corpus"
GREY = CORPUS / "gray8/gray.tif"
CORRUPT = CORPUS / "corrupt-but-decodable/corrupt.jpg"  # inspect() accepts it; its data is corrupt


def latin1(folder: Path, name: str) -> Path:
    """`name` with a Latin-1 'é' (byte 0xe9, not UTF-8) before its suffix, as Python holds such a name read from
    disk (a surrogate escape)."""
    stem, suffix = os.path.splitext(name)
    return folder / os.fsdecode(stem.encode() + b"\xe9" + suffix.encode())


@pytest.fixture(scope="module")
def worker():
    with IsolatedProcess() as w:
        yield w


def test_a_master_and_an_output_named_in_latin1_convert_and_verify(tmp_path, worker):
    """pyvips gives libvips a name as UTF-8: inspect() accepted such a master, but check_decoding() and convert()
    rejected it ("decoder vips failed on this master (UnicodeEncodeError ...): needs review"), and an output so
    named made convert() raise UnicodeEncodeError from the child."""
    master = latin1(tmp_path, "caf.tif")
    shutil.copy(GREY, master)
    assert gcis_etl.check_decoding(master, worker=worker).verdict is Verdict.ACCEPT
    for source, output in ((master, tmp_path / "out.tif"), (GREY, latin1(tmp_path, "out.tif"))):
        result = gcis_etl.convert(source, output, worker=worker)
        assert result.status is Status.CONVERTED, result.reason
        report = gcis_etl.verify(output, "ptiff-jpeg-q90")
        assert report.ok, report.errors


def test_a_corrupt_master_named_in_latin1_is_rejected_for_its_data(tmp_path, worker):
    """Not for its name ("needs review"), and not with libvips' message, which may quote the name, failing to
    decode."""
    plain, named = tmp_path / "corrupt.jpg", latin1(tmp_path, "corrupt.jpg")
    shutil.copy(CORRUPT, plain)
    shutil.copy(CORRUPT, named)
    expected = gcis_etl.check_decoding(plain, worker=worker)
    assert expected.verdict is Verdict.REJECT
    assert gcis_etl.check_decoding(named, worker=worker).reasons == expected.reasons
    result = gcis_etl.convert(named, tmp_path / "out.tif", worker=worker)
    assert result.status is Status.REJECTED and "Unicode" not in result.reason


def test_a_jp2_output_named_in_latin1_is_written(tmp_path, worker):
    output = latin1(tmp_path, "out.jp2")
    result = gcis_etl.convert(GREY, output, "jp2-openjpeg-lossy", worker=worker)
    assert result.status is Status.CONVERTED, result.reason


def test_a_local_store_with_a_relative_root_stays_where_it_was_made(tmp_path, monkeypatch):
    """The root followed the current folder: after os.chdir, exists() said no and put() wrote a second store."""
    monkeypatch.chdir(tmp_path)
    store = LocalStore(LocalStoreSettings(root="store"))
    store.check(create=True)
    store.put("p/a.tif", GREY)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert store.exists("p/a.tif")
    store.put("p/b.tif", GREY)
    assert sorted(p.name for p in (tmp_path / "store/p").iterdir()) == ["a.tif", "b.tif"]
    assert not (tmp_path / "elsewhere/store").exists()


def test_one_worker_shared_by_threads_serves_each_of_them(tmp_path):
    """Jobs and answers of several threads went over one socket (one thread's answer taken by another, unpickling
    errors); and the child, which dies with the thread that started it, was killed (SIGKILL) when that thread
    ended while another's job ran."""
    results = {}
    with IsolatedProcess() as shared:
        def convert(i: int) -> None:
            results[i] = gcis_etl.convert(GREY, tmp_path / f"{i}.tif", worker=shared)

        threads = [threading.Thread(target=convert, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    assert sorted(results) == [0, 1, 2, 3]
    assert [(r.status, r.reason) for r in results.values()] == [(Status.CONVERTED, None)] * 4


@pytest.mark.parametrize("yaml_text, error", [
    ("extension: tif", "extension: must be a dot and lower-case letters or digits (.tif, .jp2) (got 'tif')"),
    ("chroma: 4:2:2", "chroma: YAML reads an unquoted 4:2:2 as the number 14522: write it quoted, '4:2:2'"),
    ("interpolation: cubic", "interpolation: applies only to encoder tifffile, not ptiff (got 'cubic')"),
    ("jp2: {rates: [2]}", "jp2: applies only to the encoders kakadu, openjpeg, grok"),
    ("encoder: openjpeg\njp2: {rates: [2]}\ntile: 512\nchroma: '4:4:4'",
     "chroma: applies only to encoder ptiff or tifffile, not openjpeg (got '4:4:4')\n"
     "{path}: tile: applies only to encoder ptiff or tifffile, not openjpeg (got 512)"),
    ("encoder: openjpeg\njp2: {rates: [2], levels: 9, tiles: [256, 256]}",
     "jp2.tiles: openjpeg needs tiles of at least 2^levels = 512 a side for 9 levels, got [256, 256]"),
])
def test_recipe_errors_name_the_key_at_fault(tmp_path, yaml_text, error):
    """A check across keys came out as '<top>: extension must be ...'; an unquoted 4:2:2 as
    '(got 14522)', a number never written."""
    path = tmp_path / "r.yaml"
    path.write_text(f"name: r\n{yaml_text}\n")
    with pytest.raises(gcis_etl.ConfigError) as raised:
        gcis_etl.load_recipe(path)
    assert str(raised.value).startswith(f"{path}: " + error.format(path=path))
    assert "<top>" not in str(raised.value)


def test_load_recipe_takes_the_folder_as_a_str(tmp_path):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes/mine.yaml").write_text("name: mine\nquality: 80\n")
    assert gcis_etl.load_recipe("mine", folder=str(tmp_path)).quality == 80
