"""JPEG 2000 recipes: exact encoder argument vectors, real opj_compress / grk_compress runs on corpus masters,
the Grok PLT+rate crash, kdu_compress when installed, and agreement between the PTIFF and the JP2."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import pyvips
from PIL import Image

from gcis_etl.conversion import convert
from gcis_etl.errors import ConfigError, ConversionFailed
from gcis_etl.isolation import IsolatedProcess
from gcis_etl.jp2 import GROK_PLT_WITH_RATES, build_command, kdu_compress_path, run_encoder
from gcis_etl.metadata import exiftool_json
from gcis_etl.models import Status
from gcis_etl.recipes import Recipe, load_recipe
from gcis_etl.settings import parse
from tests.measures import luma, psnr

CORPUS = Path(__file__).parent / "corpus"
MASTERS = ["rgb16-tiff/rgb-3c-16b.tiff", "cmyk-tiff-icc/fogra-0-100-100-0.tif", "icc-adobergb/example.tif",
           "gray8/gray.tif", "jpeg-baseline/flowers.jpeg"]
IN, OUT = Path("/s/in.tif"), Path("/s/out.jp2")
BENCH = ["Clevels=6", "Clayers=6", "Cprecincts={256,256},{256,256},{128,128}", "Stiles={512,512}", "Corder=RPCL",
         "ORGgen_plt=yes", "ORGtparts=R", "Cblk={64,64}", "-jp2_space", "sRGB", "Cuse_sop=yes", "Cuse_eph=yes",
         "-flush_period", "1024"]
STRUCTURE = ["-n", "7", "-b", "64,64", "-p", "RPCL", "-c", "[256,256],[256,256],[128,128]", "-t", "512,512"]
LAYERS = ["-r", "256,128,64,32,16,8"]  # 3 bits per pixel halving over 6 layers, as 24-bit ratios
EXPECTED = {
    "jp2-kakadu-bench": ["kdu_compress", "-i", str(IN), "-o", str(OUT), *BENCH, "-rate", "3"],
    "jp2-kakadu-lossless": ["kdu_compress", "-i", str(IN), "-o", str(OUT), *BENCH, "Creversible=yes", "-rate", "-"],
    "jp2-kakadu-lossy": ["kdu_compress", "-i", str(IN), "-o", str(OUT), "-rate", "1.5", "Creversible=yes",
                         "Clayers=1", "Clevels=7", "Cprecincts={256,256},{256,256},{128,128}", "Corder=RPCL",
                         "ORGgen_plt=yes", "ORGtparts=R", "Cblk={64,64}", "-jp2_space", "sRGB", "Cuse_sop=yes"],
    "jp2-kakadu-htj2k": ["kdu_compress", "-i", str(IN), "-o", str(OUT), "Cmodes=HT", "Clevels=6", "Clayers=1",
                         "Cprecincts={256,256},{256,256},{128,128}", "Stiles={512,512}", "Corder=RPCL",
                         "ORGgen_plt=yes", "ORGtparts=R", "Cblk={64,64}", "-jp2_space", "sRGB", "Cuse_sop=yes",
                         "Cuse_eph=yes", "-flush_period", "1024", "-rate", "3"],
    "jp2-openjpeg-lossy": ["opj_compress", "-i", str(IN), "-o", str(OUT), *STRUCTURE, "-TP", "R", "-SOP", "-EPH",
                           "-I", *LAYERS, "-PLT"],
    "jp2-openjpeg-lossless": ["opj_compress", "-i", str(IN), "-o", str(OUT), *STRUCTURE, "-TP", "R", "-SOP",
                              "-EPH", "-PLT"],
    "jp2-grok-lossy": ["grk_compress", "-i", str(IN), "-o", str(OUT), *STRUCTURE, "-u", "R", "-S", "-E", "-I",
                       *LAYERS],
    "jp2-grok-htj2k": ["grk_compress", "-i", str(IN), "-o", str(OUT), *STRUCTURE, "-u", "R", "-S", "-E",
                       "-M", "64", "-L"],
}
REAL = ["jp2-openjpeg-lossy", "jp2-openjpeg-lossless", "jp2-grok-lossy", "jp2-grok-htj2k"]


@pytest.fixture(scope="module")
def worker():
    with IsolatedProcess() as w:
        yield w


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_argument_vector(name):
    assert list(build_command(load_recipe(name), IN, OUT).argv) == EXPECTED[name]


def test_kakadu_vectors_carry_the_seed_parameters_verbatim():
    bench = build_command(load_recipe("jp2-kakadu-bench"), IN, OUT).argv
    seed = ('Clevels=6 Clayers=6 Cprecincts={256,256},{256,256},{128,128} Stiles={512,512} Corder=RPCL '
            'ORGgen_plt=yes ORGtparts=R Cblk={64,64} -jp2_space sRGB Cuse_sop=yes Cuse_eph=yes -flush_period 1024 '
            '-rate 3').split()
    assert list(bench[5:]) == seed
    getty = build_command(load_recipe("jp2-kakadu-lossy"), IN, OUT).argv
    assert list(getty[5:10]) == ["-rate", "1.5", "Creversible=yes", "Clayers=1", "Clevels=7"]
    assert getty[-1] == "Cuse_sop=yes"
    assert "Cmodes=HT" in build_command(load_recipe("jp2-kakadu-htj2k"), IN, OUT).argv


@pytest.mark.parametrize("data, message", [
    ({"encoder": "openjpeg", "quality": 80, "jp2": {"rates": [2]}}, "quality: apply only to encoder ptiff"),
    ({"encoder": "grok"}, "jp2: parameters are required for encoder grok"),
    ({"encoder": "ptiff", "jp2": {"rates": [2]}}, "jp2: applies only to the encoders"),
    ({"encoder": "openjpeg", "jp2": {}}, "lossless coding (no rates) needs reversible: true"),
    ({"encoder": "openjpeg", "jp2": {"layers": 3, "rates": [2]}}, "needs one rate per layer (3), got 1"),
    ({"encoder": "kakadu", "jp2": {"rates": [2], "kdu_args": ["Clevels=5"]}}, "Clevels=5 disagrees with jp2.levels"),
    ({"encoder": "openjpeg", "extension": ".tif", "jp2": {"rates": [2]}}, "extension must be .jp2"),
])
def test_recipe_errors_name_the_problem(data, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse(Recipe, {"name": "x", **data}, "x.yaml")


@pytest.mark.parametrize("name", REAL)
def test_real_encoders_convert_corpus_masters(name, worker, tmp_path):
    for master in MASTERS:
        dst = tmp_path / f"{Path(master).stem}.jp2"
        result = convert(CORPUS / master, dst, name, worker=worker)
        assert result.status is Status.CONVERTED, f"{master}: {result.reason}"
        assert result.levels == 7 and result.sha256 and dst.stat().st_size == result.bytes
        with Image.open(dst) as im:
            assert im.size == (result.width, result.height) and im.mode == "RGB"
        tags = exiftool_json(dst)
        assert tags.get("Jpeg2000:ColorSpace") == 16  # enumerated sRGB in the colour specification box
    assert not list(tmp_path.glob(".*partial"))


def test_metadata_travels_into_the_jp2(worker, tmp_path):
    master = CORPUS / "metadata-rich/Canon.jpg"
    result = convert(master, tmp_path / "canon.jp2", "jp2-openjpeg-lossy", worker=worker)
    assert result.ok, result.reason
    source, found = exiftool_json(master), exiftool_json(tmp_path / "canon.jp2")
    for tag in ("EXIF:Make", "EXIF:Model", "EXIF:DateTimeOriginal", "EXIF:ExposureTime"):
        assert found[tag] == source[tag]
    assert found["EXIF:ColorSpace"] == 1


def test_verification_catches_lossy_pixels_under_a_lossless_recipe(tmp_path):
    from gcis_etl.verification import Jp2Expectation, verify_jp2
    source, out = tmp_path / "in.tif", tmp_path / "lossy.jp2"
    image = pyvips.Image.new_from_file(str(CORPUS / "jpeg-baseline/flowers.jpeg"))
    image.tiffsave(str(source), compression="none", strip=True)
    run_encoder(build_command(load_recipe("jp2-openjpeg-lossy"), source, out).argv, timeout=60)
    expect = Jp2Expectation(width=image.width, height=image.height, levels=6, layers=6, progression="RPCL",
                            plt=True, reference=source)
    assert verify_jp2(out, expect).ok
    lossless = verify_jp2(out, Jp2Expectation(**{**expect.__dict__, "min_psnr": float("inf")}))
    assert "lossless recipe but the decoded pixels differ from the normalised image" in lossless.errors


@pytest.mark.parametrize("master", MASTERS)
def test_ptiff_and_openjpeg_agree(master, worker, tmp_path):
    ptiff = convert(CORPUS / master, tmp_path / "p.tif", "ptiff-jpeg-q90", worker=worker)
    jp2 = convert(CORPUS / master, tmp_path / "j.jp2", "jp2-openjpeg-lossy", worker=worker)
    assert ptiff.ok and jp2.ok, (ptiff.reason, jp2.reason)
    assert psnr(luma(_ptiff_pixels(tmp_path / "p.tif")), luma(_jp2_pixels(tmp_path / "j.jp2"))) >= 35


def _ptiff_pixels(path: Path) -> np.ndarray:
    page = pyvips.Image.new_from_file(str(path), page=0)
    return np.ndarray(buffer=page.write_to_memory(), dtype=np.uint8, shape=(page.height, page.width, page.bands))


def _jp2_pixels(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def test_grok_plt_with_rates_is_dropped_with_a_warning(worker, tmp_path):
    command = build_command(load_recipe("jp2-grok-lossy"), IN, OUT)
    assert "-L" not in command.argv and not command.plt and command.warnings == (GROK_PLT_WITH_RATES,)
    result = convert(CORPUS / "jpeg-baseline/flowers.jpeg", tmp_path / "g.jp2", "jp2-grok-lossy", worker=worker)
    assert result.ok, result.reason
    assert GROK_PLT_WITH_RATES in result.warnings


def test_an_encoder_crash_is_a_clear_failure(tmp_path):
    """The combination the recipe layer avoids, run on purpose: grk_compress 10.0.5 dies of SIGSEGV."""
    source = tmp_path / "in.tif"
    pyvips.Image.new_from_file(str(CORPUS / "jpeg-baseline/flowers.jpeg")).tiffsave(str(source), compression="none")
    argv = (shutil.which("grk_compress"), "-i", str(source), "-o", str(tmp_path / "x.jp2"), "-n", "6", "-c",
            "[256,256],[256,256],[128,128]", "-t", "512,512", "-p", "RPCL", "-S", "-E", "-u", "R", "-I", "-r", "8",
            "-L")
    with pytest.raises(ConversionFailed, match="grk_compress crashed: SIGSEGV"):
        run_encoder(argv, timeout=60)


def test_kakadu_without_kdu_compress_fails_with_the_reason(monkeypatch, tmp_path):
    monkeypatch.setenv("GCIS_KDU_COMPRESS", str(tmp_path / "no-such-kdu_compress"))
    result = convert(CORPUS / "jpeg-baseline/flowers.jpeg", tmp_path / "k.jp2", "jp2-kakadu-bench")
    assert result.status is Status.FAILED
    assert "kdu_compress not installed" in result.reason
    assert not (tmp_path / "k.jp2").exists()


@pytest.mark.parametrize("name", ["jp2-kakadu-bench", "jp2-kakadu-lossy", "jp2-kakadu-lossless", "jp2-kakadu-htj2k"])
def test_kakadu_real_run(name, worker, tmp_path):
    if kdu_compress_path() is None:
        pytest.skip("kdu_compress is not installed (licensed; set GCIS_KDU_COMPRESS)")
    for master in MASTERS:
        result = convert(CORPUS / master, tmp_path / f"{Path(master).stem}.jp2", name, worker=worker)
        assert result.status is Status.CONVERTED, f"{master}: {result.reason}"


def test_verification_rejects_a_jp2_that_is_not_srgb(tmp_path):
    """An ICC-carrying (Adobe RGB) JP2 from grk_compress: the colour box is not enumerated sRGB."""
    from gcis_etl.verification import Jp2Expectation, verify_jp2
    master = CORPUS / "icc-adobergb/example.tif"
    source = tmp_path / "adobe.tif"
    pyvips.Image.new_from_file(str(master)).cast("uchar").tiffsave(str(source), compression="none")
    out = tmp_path / "adobe.jp2"
    subprocess.run(["grk_compress", "-i", str(source), "-o", str(out), "-n", "3"], check=True, capture_output=True)
    with Image.open(out) as im:
        width, height = im.size
    report = verify_jp2(out, Jp2Expectation(width=width, height=height, levels=2, layers=1, progression="LRCP"))
    assert any("colour box is" in e for e in report.errors), report.errors
