"""Every real file of the corpus ends as MANIFEST.csv says: converted and verified, or rejected with a reason."""
from __future__ import annotations

import pytest

from gcis_etl.conversion import check_decoding, convert
from gcis_etl.isolation import IsolatedProcess
from gcis_etl.models import Status, Verdict
from gcis_etl.recipes import load_recipe
from gcis_etl.verification import verify, verify_jp2_alone
from tests.conftest import corpus_entries

ENTRIES = corpus_entries()


@pytest.fixture(scope="module")
def worker():
    with IsolatedProcess() as w:
        yield w


def test_corpus_is_complete():
    assert len(ENTRIES) == 98
    assert all(e.path.exists() for e in ENTRIES)


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.row["local_path"] for e in ENTRIES])
def test_verdict_matches_manifest(entry, worker):
    info = check_decoding(entry.path, worker=worker)
    assert info.verdict.value == entry.expected, (info.reasons, info.warnings)
    if info.verdict is not Verdict.ACCEPT:
        assert info.reasons and all(r.strip() for r in info.reasons)


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.row["local_path"] for e in ENTRIES])
def test_conversion_outcome_matches_manifest(entry, worker, tmp_path):
    dst = tmp_path / "out" / "access.tif"
    result = convert(entry.path, dst, worker=worker)
    if entry.expected == "reject":
        assert result.status is Status.REJECTED, result
        assert result.reason and "\n" not in result.reason
        assert not dst.exists()
    else:
        assert result.status is Status.CONVERTED, result.reason
        report = verify(dst)
        assert report.ok, report.errors
        assert (report.width, report.height) == (result.width, result.height)
        assert result.sha256 and result.bytes == dst.stat().st_size
    assert not list(tmp_path.rglob(".*.partial"))


def test_wrong_extension_is_a_warning_not_a_failure(worker, tmp_path):
    entry = next(e for e in ENTRIES if e.row["local_path"].endswith("jpg-incorrect-extension.png"))
    result = convert(entry.path, tmp_path / "a.tif", worker=worker)
    assert result.ok
    assert result.info.format == "JPEG"
    assert any("extension .png" in w for w in result.warnings)


ACCEPTED = [e for e in ENTRIES if e.expected != "reject"]


@pytest.mark.parametrize("recipe", ["jp2-openjpeg-lossy", "jp2-grok-lossy"])
@pytest.mark.parametrize("entry", ACCEPTED, ids=[e.row["local_path"] for e in ACCEPTED])
def test_every_accepted_master_converts_with_the_lossy_jp2_recipes(entry, recipe, worker, tmp_path):
    """Their layer budgets are shared out by tile, so sizes matter (a 594x522 master failed with 512 tiles); the
    conversion verifies the JP2 against the normalised image, reduced resolution and regions."""
    result = convert(entry.path, tmp_path / "access.jp2", recipe, worker=worker)
    assert result.status is Status.CONVERTED, result.reason
    report = verify_jp2_alone(tmp_path / "access.jp2", load_recipe(recipe).jp2)
    assert report.ok, report.errors
    assert (report.width, report.height) == (result.width, result.height)


def test_a_tiff_cut_short_before_its_directory_is_rejected_saying_so(worker, tmp_path):
    """libvips writes a TIFF's directory after its pixels: a half-finished upload has none left to read."""
    import pyvips
    whole = tmp_path / "whole.tif"
    pyvips.Image.black(300, 200, bands=3).tiffsave(str(whole))
    data = whole.read_bytes()
    cut = tmp_path / "cut.tif"
    cut.write_bytes(data[:len(data) * 7 // 10])

    info = check_decoding(cut, worker=worker)

    offset = int.from_bytes(data[4:8], "little")
    assert info.verdict is Verdict.REJECT and info.reasons == (
        f"corrupt or truncated TIFF header: invalid offset to first page {offset}; no image directory in its "
        f"{cut.stat().st_size} bytes",), info.reasons
