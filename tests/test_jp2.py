"""JPEG 2000 recipes: exact encoder argument vectors, real opj_compress / grk_compress runs on corpus masters,
the Grok PLT+rate crash, kdu_compress when installed, and agreement between the PTIFF and the JP2."""
from __future__ import annotations

import re
import shutil
import struct
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import pyvips
from PIL import Image

from gcis_etl.conversion import convert
from gcis_etl.errors import ConfigError, ConversionFailed
from gcis_etl.inspection import inspect
from gcis_etl.isolation import IsolatedProcess
from gcis_etl.jp2 import (GROK_PLT_WITH_RATES, GROK_SOP_WITH_TILE_PARTS, build_command, fit_to_image,
                          kdu_compress_path, metadata_carrier, run_encoder)
from gcis_etl.metadata import carrier_copy, exiftool_json, exiftool_run, write_carrier
from gcis_etl.models import Status
from gcis_etl.policy import IsolationSettings
from gcis_etl.recipes import Recipe, load_recipe
from gcis_etl.settings import parse
from gcis_etl.verification import (LOSSLESS, Jp2Coding, Jp2Expectation, jp2_pixel_errors, reduced_reference,
                                   reduction, regions, verify_jp2)
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
    "jp2-grok-lossy": ["grk_compress", "-i", str(IN), "-o", str(OUT), *STRUCTURE, "-u", "R", "-E", "-I", *LAYERS],
    "jp2-grok-htj2k": ["grk_compress", "-i", str(IN), "-o", str(OUT), *STRUCTURE, "-u", "R", "-E", "-M", "64", "-L"],
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
    ({"encoder": "openjpeg", "quality": 80, "jp2": {"rates": [2]}}, "quality: applies only to encoder ptiff"),
    ({"encoder": "grok"}, "jp2: parameters are required for encoder grok"),
    ({"encoder": "ptiff", "jp2": {"rates": [2]}}, "jp2: applies only to the encoders"),
    ({"encoder": "openjpeg", "jp2": {}}, "lossless coding (no rates) needs reversible: true"),
    ({"encoder": "openjpeg", "jp2": {"layers": 3, "rates": [2]}}, "needs one rate per layer (3), got 1"),
    ({"encoder": "kakadu", "jp2": {"rates": [2], "kdu_args": ["Clevels=5"]}}, "Clevels=5 disagrees with jp2.levels"),
    ({"encoder": "kakadu", "jp2": {"rates": [2], "kdu_args": ["Creversible=yes", "Stiles={512,512}"]}},
     "Creversible=yes disagrees with jp2.reversible: False"),
    ({"encoder": "kakadu", "jp2": {"rates": [2], "tiles": [1024, 512], "kdu_args": ["Stiles={1024,512}"]}},
     "Stiles={1024,512} disagrees with jp2.tiles: [1024, 512]"),
    ({"encoder": "kakadu", "jp2": {"rates": [2], "kdu_args": ["Clevels=6"]}},
     "Stiles=none (one tile) disagrees with jp2.tiles: [512, 512]"),
    ({"encoder": "openjpeg", "extension": ".tif", "jp2": {"rates": [2]}}, "extension: must be .jp2 for encoder openjpeg (got '.tif')"),
    ({"encoder": "openjpeg", "jp2": {"rates": [2], "tiles": [0, 0]}}, "tiles must be positive sizes"),
    ({"encoder": "openjpeg", "jp2": {"rates": [2], "code_block": [128, 128]}}, "4096 in area, got [128, 128]"),
    ({"encoder": "openjpeg", "jp2": {"rates": [2], "code_block": [4, 2048]}}, "1024 a side and 4096 in area"),
    ({"encoder": "openjpeg", "jp2": {"rates": [-1], "reversible": True}}, "rates must be positive"),
])
def test_recipe_errors_name_the_problem(data, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
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


@pytest.mark.parametrize("name", ["jp2-openjpeg-lossless", "jp2-grok-htj2k"])
def test_work_beside_the_encoder_makes_the_same_jp2(name, tmp_path):
    """With two threads, exiftool and the reference's reduction run beside the encoder and verification beside
    jpylyzer; with one, in sequence. The access master is the same file."""
    master = CORPUS / "metadata-rich/ExifTool.jpg"
    results = {}
    for threads in (1, 2):
        with IsolatedProcess(IsolationSettings(vips_concurrency=threads)) as child:
            results[threads] = convert(master, tmp_path / f"{threads}.jp2", name, worker=child)
        assert results[threads].ok, results[threads].reason
    assert results[1].sha256 == results[2].sha256
    assert exiftool_json(tmp_path / "2.jp2")["EXIF:Make"] == exiftool_json(master)["EXIF:Make"]


@pytest.mark.parametrize("recipe", ["jp2-openjpeg-lossy", "jp2-grok-htj2k"])
def test_the_appended_metadata_boxes_make_the_file_exiftool_writes(recipe, tmp_path):
    """metadata_carrier takes exiftool's boxes from a 1-pixel JP2; appended to the real codestream's file they
    give, byte for byte, what exiftool makes of that file when it writes the same tags into it itself."""
    master, recipe = CORPUS / "metadata-rich/ExifTool.jpg", load_recipe(recipe)
    keep, exclude = recipe.metadata.keep, recipe.metadata.exclude
    source, encoded = tmp_path / "in.tif", tmp_path / "encoded.jp2"
    pyvips.Image.new_from_file(str(CORPUS / "jpeg-baseline/flowers.jpeg")).tiffsave(str(source), compression="none",
                                                                                    strip=True)
    run_encoder(build_command(recipe, source, encoded).argv, timeout=60)
    info = inspect(master)
    boxes = metadata_carrier(info, keep, exclude, tmp_path).boxes
    assert box_types(boxes) == [b"uuid"] * 3  # EXIF, IPTC and XMP
    direct = tmp_path / "direct.jp2"
    shutil.copy(encoded, direct)
    carrier = write_carrier(info, keep, exclude, tmp_path / "own-carrier.tif")
    exiftool_run("-m", "-q", "-n", "-overwrite_original", *carrier_copy(carrier, keep, exclude), str(direct))
    assert encoded.read_bytes() + boxes == direct.read_bytes()


def box_types(data: bytes) -> list[bytes]:
    """The types of the top-level JP2 boxes in `data`, walked by their lengths."""
    types, at = [], 0
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        assert length >= 8, f"box {kind!r} at {at} has length {length}"
        types.append(kind)
        at += length
    return types


def test_verification_catches_lossy_pixels_under_a_lossless_recipe(tmp_path):
    source, out = tmp_path / "in.tif", tmp_path / "lossy.jp2"
    image = pyvips.Image.new_from_file(str(CORPUS / "jpeg-baseline/flowers.jpeg"))
    image.tiffsave(str(source), compression="none", strip=True)
    run_encoder(build_command(load_recipe("jp2-openjpeg-lossy"), source, out).argv, timeout=60)
    expect = Jp2Expectation(width=image.width, height=image.height, levels=6, layers=6, progression="RPCL",
                            plt=True, reference=source)
    assert verify_jp2(out, expect).ok
    lossless = verify_jp2(out, Jp2Expectation(**{**expect.__dict__, "min_psnr": float("inf")}))
    assert any(e.startswith("lossless recipe but region") for e in lossless.errors), lossless.errors


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


def test_htj2k_output_decodes_exactly_with_an_independent_ht_decoder(worker, tmp_path):
    """The grok HTJ2K recipe's codestream, read by OpenJPH (the HT block coder's reference implementation, in
    imagecodecs) rather than OpenJPEG: the master's pixels, exactly (OpenJPEG 2.5.0 misreads any HT region
    smaller than a tile)."""
    import imagecodecs
    master = _detailed_master(tmp_path, 1100, 700)  # 3x2 tiles of 512, edges of 76 and 188
    result = convert(master, tmp_path / "ht.jp2", "jp2-grok-htj2k", worker=worker)
    assert result.ok, result.reason
    decoded = imagecodecs.htj2k_decode(_codestream((tmp_path / "ht.jp2").read_bytes()))
    source = pyvips.Image.new_from_file(str(master))
    expected = np.ndarray(buffer=source.write_to_memory(), dtype=np.uint8, shape=(source.height, source.width, 3))
    assert decoded.shape == expected.shape and (decoded == expected).all()


def _codestream(jp2: bytes) -> bytes:
    """The contiguous codestream box's content (ISO/IEC 15444-1 I.4: 32-bit length, type, 64-bit XLBox if 1,
    0 for 'to the end')."""
    at = 0
    while at < len(jp2):
        length, kind = int.from_bytes(jp2[at:at + 4], "big"), jp2[at + 4:at + 8]
        header = 8
        if length == 1:
            length, header = int.from_bytes(jp2[at + 8:at + 16], "big"), 16
        end = len(jp2) if length == 0 else at + length
        if kind == b"jp2c":
            return jp2[at + header:end]
        at = end
    raise AssertionError("no jp2c box")


def test_grok_plt_with_rates_is_dropped_with_a_warning(worker, tmp_path):
    command = build_command(load_recipe("jp2-grok-lossy"), IN, OUT)
    assert "-L" not in command.argv and not command.plt and command.warnings == (GROK_PLT_WITH_RATES,)
    result = convert(CORPUS / "jpeg-baseline/flowers.jpeg", tmp_path / "g.jp2", "jp2-grok-lossy", worker=worker)
    assert result.ok, result.reason
    assert GROK_PLT_WITH_RATES in result.warnings


@pytest.mark.parametrize("name", ["jp2-grok-lossy", "jp2-grok-htj2k"])
def test_grok_reads_the_grok_recipes_jp2s_as_openjpeg_does(name, worker, tmp_path):
    """grk_compress 10.0.5 misnumbers the packets' SOP markers when tile-parts are split by resolution: Grok's
    own decoder read the recipes' JP2s as garbage (13.5 dB) while OpenJPEG, which ignores the numbers, read them
    right. The Grok recipes have no SOP markers now; a recipe asking for both loses its SOP with a warning."""
    master = _detailed_master(tmp_path, 1100, 700)
    result = convert(master, tmp_path / "g.jp2", name, worker=worker)
    assert result.ok, result.reason
    decoded = {}
    for tool in ("grk_decompress", "opj_decompress"):
        out = tmp_path / f"{tool}.tif"
        subprocess.run([tool, "-i", str(tmp_path / "g.jp2"), "-o", str(out)], check=True, capture_output=True)
        decoded[tool] = np.asarray(Image.open(out).convert("RGB"))
    assert psnr(luma(decoded["grk_decompress"]), luma(decoded["opj_decompress"])) >= 50.0
    recipe = load_recipe(name)
    asking = recipe.model_copy(update={"jp2": recipe.jp2.model_copy(update={"sop": True})})
    command = build_command(asking, IN, OUT)
    assert "-S" not in command.argv and command.warnings[0] == GROK_SOP_WITH_TILE_PARTS


def test_verification_catches_misnumbered_packets(kodim_jp2s, tmp_path):
    """The file grk_compress 10.0.5 makes with SOP markers and tile-parts by resolution (-S -u R): OpenJPEG
    decodes it right, jpylyzer passes it, Grok reads garbage. Verification follows the SOP numbers itself."""
    reference, made = kodim_jp2s
    out = tmp_path / "grok-sop.jp2"
    argv = build_command(load_recipe("jp2-grok-htj2k"), reference, out, size=(768, 512)).argv
    run_encoder((*argv, "-S"), timeout=60)
    expect = _expectation(reference, True, ht=True)
    report = verify_jp2(out, expect)
    assert [e for e in report.errors if "SOP" in e] == [
        "packet sequence numbers (SOP) of tile 0 skip from 3 to 6: a decoder that follows them reads the file wrongly"]
    run_encoder(argv, timeout=60)  # the recipe's own (no SOP): sound
    assert verify_jp2(out, expect).ok
    assert verify_jp2(made["jp2-openjpeg-lossless"], _expectation(reference, True)).ok  # OpenJPEG's SOP: sound


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
    assert result.reason == f"GCIS_KDU_COMPRESS is {tmp_path / 'no-such-kdu_compress'}, which is not an executable file"
    assert not (tmp_path / "k.jp2").exists()
    monkeypatch.delenv("GCIS_KDU_COMPRESS")
    if shutil.which("kdu_compress") is None:
        unset = convert(CORPUS / "jpeg-baseline/flowers.jpeg", tmp_path / "k.jp2", "jp2-kakadu-bench")
        assert unset.reason == "kdu_compress not installed (set GCIS_KDU_COMPRESS to its path)"


@pytest.mark.parametrize("name", ["jp2-kakadu-bench", "jp2-kakadu-lossy", "jp2-kakadu-lossless", "jp2-kakadu-htj2k"])
def test_kakadu_real_run(name, worker, tmp_path):
    if kdu_compress_path() is None:
        pytest.skip("kdu_compress is not installed (licensed; set GCIS_KDU_COMPRESS)")
    for master in MASTERS:
        result = convert(CORPUS / master, tmp_path / f"{Path(master).stem}.jp2", name, worker=worker)
        assert result.status is Status.CONVERTED, f"{master}: {result.reason}"


def test_verification_rejects_a_jp2_that_is_not_srgb(tmp_path):
    """An ICC-carrying (Adobe RGB) JP2 from grk_compress: the colour box is not enumerated sRGB."""
    master = CORPUS / "icc-adobergb/example.tif"
    source = tmp_path / "adobe.tif"
    pyvips.Image.new_from_file(str(master)).cast("uchar").tiffsave(str(source), compression="none")
    out = tmp_path / "adobe.jp2"
    subprocess.run(["grk_compress", "-i", str(source), "-o", str(out), "-n", "3"], check=True, capture_output=True)
    with Image.open(out) as im:
        width, height = im.size
    report = verify_jp2(out, Jp2Expectation(width=width, height=height, levels=2, layers=1, progression="LRCP"))
    assert any("colour box is" in e for e in report.errors), report.errors


# --- sampled verification: one reduced resolution whole, full-resolution regions at the corners and centre ---
KODIM = CORPUS / "rgb8-tiff-lzw/kodim02-lzw.tif"  # 768x512: reduction 1, regions leave the top middle unsampled


@pytest.fixture(scope="module")
def kodim_jp2s(tmp_path_factory):
    """kodim02 as the normalised reference TIFF and as lossless and lossy JP2s made from it."""
    folder = tmp_path_factory.mktemp("kodim")
    reference = folder / "reference.tif"
    pyvips.Image.new_from_file(str(KODIM)).tiffsave(str(reference), compression="none", strip=True)
    made = {}
    for name in ("jp2-openjpeg-lossless", "jp2-openjpeg-lossy"):
        made[name] = folder / f"{name}.jp2"
        run_encoder(build_command(load_recipe(name), reference, made[name], size=(768, 512)).argv, timeout=60)
    return reference, made


def _expectation(reference: Path, lossless: bool, **changes) -> Jp2Expectation:
    return Jp2Expectation(**{**dict(width=768, height=512, levels=6, layers=1 if lossless else 6,
                                    progression="RPCL", plt=True, reference=reference,
                                    min_psnr=LOSSLESS if lossless else 30.0), **changes})


def _altered(reference: Path, folder: Path, x0: int, y0: int, size: int, change) -> Path:
    pixels = np.array(Image.open(reference))
    pixels[y0:y0 + size, x0:x0 + size] = change(pixels[y0:y0 + size, x0:x0 + size])
    path = folder / f"altered-{x0}-{y0}-{size}.tif"
    Image.fromarray(pixels).save(path)
    return path


def test_sampling_decodes_a_reduced_resolution_and_five_regions():
    assert reduction(768, 512, 6) == 1 and reduction(8433, 4743, 6) == 4 and reduction(64, 56, 5) == 0
    assert reduction(100_000, 100_000, 6) == 6  # never more than the levels there are
    assert regions(768, 512) == [(0, 0, 256, 256), (512, 0, 768, 256), (0, 256, 256, 512), (512, 256, 768, 512),
                                 (256, 128, 512, 384)]
    # HTJ2K: whole tiles (OpenJPEG 2.5.0 decodes a part of an HT tile wrongly; the centre shares tile 0,0)
    assert regions(1000, 1000, (512, 512)) == [(0, 0, 512, 512), (512, 0, 1000, 512), (0, 512, 512, 1000),
                                               (512, 512, 1000, 1000)]
    # edge tiles narrower than a region (241 and 135 px) are the ones checked, not their neighbours
    assert regions(8433, 4743, (512, 512)) == [(0, 0, 512, 512), (8192, 0, 8433, 512), (0, 4608, 512, 4743),
                                               (8192, 4608, 8433, 4743), (4096, 2048, 4608, 2560)]


def test_htj2k_verification_checks_the_narrow_corner_tile(tmp_path):
    """1100x700 in 512 tiles: the bottom-right tile is 76x188, narrower than the 256 px regions. Four pixels
    one level off there (invisible at reduced resolution) fail the lossless HTJ2K recipe."""
    master = _detailed_master(tmp_path, 1100, 700)
    reference, out = tmp_path / "reference.tif", tmp_path / "ht.jp2"
    pyvips.Image.new_from_file(str(master)).tiffsave(str(reference), compression="none", strip=True)
    command = build_command(load_recipe("jp2-grok-htj2k"), reference, out, size=(1100, 700))
    run_encoder(command.argv, timeout=60)
    expect = Jp2Expectation(width=1100, height=700, levels=command.levels, layers=1, progression="RPCL", ht=True,
                            plt=True, min_psnr=LOSSLESS, reference=reference,
                            coding=Jp2Coding(reversible=True, tile=(512, 512)))
    assert verify_jp2(out, expect).ok
    altered = _altered(reference, tmp_path, 1090, 690, 2, lambda patch: patch ^ 1)
    report = verify_jp2(out, replace(expect, reference=altered))
    assert report.errors == ("lossless recipe but region 1024,512,1100,700 differ from the normalised image",)


@pytest.mark.parametrize("name", ["jp2-openjpeg-lossless", "jp2-openjpeg-lossy"])
def test_sampled_verification_passes_the_jp2_of_the_reference(kodim_jp2s, name):
    reference, made = kodim_jp2s
    assert verify_jp2(made[name], _expectation(reference, name.endswith("lossless"))).ok


@pytest.mark.parametrize("name", ["jp2-openjpeg-lossless", "jp2-openjpeg-lossy"])
def test_a_region_outside_the_sampled_regions_is_caught_by_the_reduced_resolution(kodim_jp2s, tmp_path, name):
    """The JP2 differs from its reference in a 64x64 region no full-resolution sample covers (top middle)."""
    reference, made = kodim_jp2s
    assert not any(x0 <= 300 < x1 and y0 <= 20 < y1 for x0, y0, x1, y1 in regions(768, 512))
    altered = _altered(reference, tmp_path, 300, 20, 64, lambda patch: 255 - patch)
    report = verify_jp2(made[name], _expectation(altered, name.endswith("lossless")))
    assert [e for e in report.errors if e.startswith("luma PSNR of reduction 1")], report.errors


def test_a_small_difference_in_a_sampled_region_fails_a_lossless_recipe(kodim_jp2s, tmp_path):
    """Four pixels one level off in the centre region: invisible at reduced resolution, not lossless."""
    reference, made = kodim_jp2s
    altered = _altered(reference, tmp_path, 380, 250, 2, lambda patch: patch ^ 1)
    report = verify_jp2(made["jp2-openjpeg-lossless"], _expectation(altered, True))
    assert report.errors == ("lossless recipe but region 256,128,512,384 differ from the normalised image",)


def test_a_truncated_codestream_fails(kodim_jp2s, tmp_path):
    reference, made = kodim_jp2s
    for name, lossless in (("jp2-openjpeg-lossless", True), ("jp2-openjpeg-lossy", False)):
        data = made[name].read_bytes()
        truncated = tmp_path / f"truncated-{name}.jp2"
        truncated.write_bytes(data[:len(data) * 6 // 10])
        expect = _expectation(reference, lossless)
        assert not verify_jp2(truncated, expect).ok
        # the pixel check alone (the structure check runs first and stops at the missing end of codestream)
        coding = Jp2Coding(reversible=lossless, tile=(512, 512))
        assert jp2_pixel_errors(truncated, expect, coding), name


def test_a_wrong_level_count_fails(kodim_jp2s, tmp_path):
    reference, _ = kodim_jp2s
    out = tmp_path / "three-levels.jp2"
    argv = list(build_command(load_recipe("jp2-openjpeg-lossless"), reference, out).argv)
    argv[argv.index("-n") + 1] = "4"
    run_encoder(tuple(argv), timeout=60)
    report = verify_jp2(out, _expectation(reference, True))
    assert "levels is 3, expected 6" in report.errors
    assert verify_jp2(out, _expectation(reference, True, levels=3)).ok


def test_a_coding_other_than_the_one_asked_for_fails(kodim_jp2s, tmp_path):
    """The reduction computed ahead assumes the recipe's transform and tiles: the codestream must have them."""
    reference, made = kodim_jp2s
    asked = Jp2Coding(reversible=True, tile=(512, 512))
    assert verify_jp2(made["jp2-openjpeg-lossless"], _expectation(reference, True, coding=asked)).ok
    out = tmp_path / "tiles-256.jp2"
    argv = list(build_command(load_recipe("jp2-openjpeg-lossless"), reference, out, size=(768, 512)).argv)
    argv[argv.index("-t") + 1] = "256,256"
    run_encoder(tuple(argv), timeout=60)
    report = verify_jp2(out, _expectation(reference, True, coding=asked))
    assert report.errors == ("tile is (256, 256), expected (512, 512)",)
    lossy = verify_jp2(made["jp2-openjpeg-lossy"], _expectation(reference, False, coding=asked))
    assert lossy.errors == ("transform is 9-7 irreversible, expected 5-3 reversible",)


def test_a_reduction_computed_ahead_is_the_one_compared(kodim_jp2s):
    reference, made = kodim_jp2s
    expect = _expectation(reference, False, coding=Jp2Coding(reversible=False, tile=(512, 512)))
    model = reduced_reference(expect)
    assert verify_jp2(made["jp2-openjpeg-lossy"], expect, lambda: model).ok
    report = verify_jp2(made["jp2-openjpeg-lossy"], expect, lambda: 255 - model)
    assert [e for e in report.errors if e.startswith("luma PSNR of reduction 1")], report.errors


@pytest.mark.parametrize("tiles, r", [((512, 512), 2), ((259, 173), 3)])
def test_the_reduced_reference_reproduces_a_lossless_decode(kodim_jp2s, tiles, r, tmp_path):
    """The float model of the 5-3 transform against opj_decompress -r of a lossless JP2: rounding only, also
    with tiles that start at odd coordinates of some resolutions (259 and 173 are odd, 518 and 346 are not)."""
    from gcis_etl.verification import wavelet_reduced
    reference, made = kodim_jp2s
    jp2 = made["jp2-openjpeg-lossless"]
    if tiles != (512, 512):
        jp2 = tmp_path / "odd-tiles.jp2"
        run_encoder(("opj_compress", "-i", str(reference), "-o", str(jp2), "-n", "7", "-t", f"{tiles[0]},{tiles[1]}"),
                    timeout=60)
    subprocess.run(["opj_decompress", "-quiet", "-i", str(jp2), "-o", str(tmp_path / "reduced.ppm"), "-r", str(r)],
                   check=True, capture_output=True)
    decoded = np.asarray(Image.open(tmp_path / "reduced.ppm").convert("RGB"))
    model = wavelet_reduced(np.asarray(Image.open(reference)), r, Jp2Coding(reversible=True, tile=tiles))
    assert decoded.shape == model.shape == (-(-512 // 2 ** r), 768 // 2 ** r, 3)
    assert psnr(luma(decoded), luma(model)) >= 40


def test_a_jpeg2000_master_converts_again_in_the_same_conversion_process(worker, tmp_path):
    """libvips' operation cache handed the second conversion the first one's spent jp2kload: "corrupt"."""
    master = CORPUS / "jpeg2000/example.jp2"
    for n, recipe in enumerate(("jp2-openjpeg-lossy", "jp2-openjpeg-lossy", "ptiff-jpeg-q90")):
        result = convert(master, tmp_path / f"{n}{load_recipe(recipe).extension}", recipe, worker=worker)
        assert result.status is Status.CONVERTED, (n, result.reason)


# --- small masters and orientation ---
SMALL = ["png/png-rgb-64x56x8.png", "metadata-rich/Canon.jpg"]  # 64x56 and 8x8


def test_small_images_get_fewer_levels_and_layer_budgets_above_the_markers():
    recipe = load_recipe("jp2-grok-lossy")
    fit = fit_to_image(recipe, (64, 56))
    assert fit.levels == 5 and fit.ratios[-1] == 1.0 and list(fit.ratios) == sorted(fit.ratios, reverse=True)
    assert len(fit.ratios) == 6 and fit.ratios[0] < 8 and len(fit.notes) == 2 and fit.tiles == (512, 512)
    assert fit_to_image(recipe, (8, 8)).ratios == (1.0,) * 6 and fit_to_image(recipe, (8, 8)).levels == 3
    big = build_command(recipe, IN, OUT, size=(4000, 3000))
    assert list(big.argv) == EXPECTED["jp2-grok-lossy"] and big.levels == 6  # edges of 416 and 440: the recipe's


@pytest.mark.parametrize("size, levels, noted", [
    ((20001, 37), 5, True), ((37, 20001), 5, True),  # the shorter side's 5 levels: smallest levels 626x2, 2x626
    ((16385, 100), 6, True),  # 6 levels (100 allows no more): 257x2
    ((16500, 300), 7, False), ((20000, 15000), 7, False),  # 6 levels would leave 258x5, 313x235: one more
    ((16000, 300), 6, False), ((16384, 16384), 6, False),  # 250x5, 256x256: the recipe's 6
    ((140000, 2000), 9, True),  # 10 would be wanted: its 512 tiles and last 128 precincts allow 9 (-n 11 failed)
])
def test_a_jp2_gets_the_levels_that_bring_its_smallest_within_iipsrvs_tiles_or_a_note(size, levels, noted):
    """iipsrv 1.1 makes up levels below a JP2's smallest one until it fits in 256x256, and fails on them (a 16500x300
    JP2 of 6 levels crashed it on full/128,): more levels where the shorter side allows them, else a note."""
    fit = fit_to_image(load_recipe("jp2-openjpeg-lossy"), size)
    assert fit.levels == levels
    assert any("iipsrv 1.1 lists sizes below it that it cannot render" in note for note in fit.notes) == noted


@pytest.mark.parametrize("size, tiles", [
    ((594, 522), (512, 522)),      # a 10-row bottom edge: its tiles grow; the 82-column right edge is kept
    ((1030, 1030), (515, 515)),    # edges of 6: two tiles a side, three pixels larger
    ((1054, 1300), (527, 512)),    # edges of 30 and 276: kept as strips, but the corner tile has 8280 pixels
    ((1049, 1300), (525, 512)),    # an edge of 25: too thin a strip
    ((1124, 1124), (562, 512)),    # edges of 100: a 100x100 corner; one axis is enough
    ((8433, 4743), (512, 512)),    # the bench master: edges of 241 and 135 and their corner are kept
    ((1300, 770), (512, 512)),     # edges of 276 and 258: kept
    ((300, 200), (512, 512)),      # under one tile
])
def test_lossy_recipes_grow_tiles_rather_than_leave_a_small_edge_tile(size, tiles):
    """The least a kept edge or corner tile may have: 4x its markers' bytes in the last layer; for these
    recipes (7 resolutions, 6 layers, tile-parts: 1232 bytes a tile; last layer 3 bpp) 13141 pixels."""
    for name in ("jp2-openjpeg-lossy", "jp2-grok-lossy"):
        command = build_command(load_recipe(name), IN, OUT, size=size)
        assert command.argv[command.argv.index("-t") + 1] == f"{tiles[0]},{tiles[1]}" and command.tiles == tiles
        assert any("tiles instead of 512x512" in w for w in command.warnings) == (tiles != (512, 512))
    for name in ("jp2-openjpeg-lossless", "jp2-grok-htj2k"):  # no rates shared out by tile: the recipe's tiles
        assert build_command(load_recipe(name), IN, OUT, size=size).tiles == (512, 512)


def _detailed_master(folder: Path, width: int, height: int) -> Path:
    """A photograph's detail (the corpus's 594x522, repeated) over the whole of a master of the given size."""
    photo = pyvips.Image.new_from_file(str(CORPUS / THIN_EDGES))
    path = folder / f"detailed-{width}x{height}.tif"
    photo.replicate(-(-width // photo.width), -(-height // photo.height)).crop(0, 0, width, height).tiffsave(str(path))
    return path


THIN_EDGES = "jpeg-baseline/jpg-rgb-594x522x8-baseline.jpg"  # 512 tiles leave edges of 82 and 10 pixels


@pytest.mark.parametrize("name", ["jp2-openjpeg-lossy", "jp2-grok-lossy"])
@pytest.mark.parametrize("size", [None, (1030, 1030), (1124, 1124)])
def test_thin_edge_tiles_no_longer_lose_their_pixels(name, size, worker, tmp_path):
    """With 512 tiles, opj_compress left the 10-row bottom edge of the 594x522 photograph flat (17.9 dB, failed
    verification) and grk_compress gave up; 1030x1030 is fitted with 515 tiles, which start at odd coordinates
    of the reduced resolution that verification models; 1124x1124 leaves a 100x100 corner tile."""
    master = CORPUS / THIN_EDGES if size is None else _detailed_master(tmp_path, *size)
    result = convert(master, tmp_path / "out.jp2", name, worker=worker)
    assert result.status is Status.CONVERTED, result.reason
    assert any("tiles instead of 512x512" in w for w in result.warnings), result.warnings
    source = pyvips.Image.new_from_file(str(master))
    expected = np.ndarray(buffer=source.write_to_memory(), dtype=np.uint8, shape=(source.height, source.width, 3))
    decoded = _jp2_pixels(tmp_path / "out.jp2")
    edge = source.height // 512 * 512
    assert psnr(luma(expected[edge:]), luma(decoded[edge:])) >= 35  # the rows a thin edge tile held


@pytest.mark.parametrize("name", ["jp2-grok-lossy", "jp2-openjpeg-lossy"])
@pytest.mark.parametrize("master", SMALL)
def test_small_masters_convert_with_the_lossy_recipes(name, master, worker, tmp_path):
    """grk_compress failed these ("failed to compress image"); opj_compress made 14.9 dB of 64x56."""
    result = convert(CORPUS / master, tmp_path / "small.jp2", name, worker=worker)
    assert result.status is Status.CONVERTED, result.reason
    assert any("layer rates raised" in w for w in result.warnings), result.warnings
    source = pyvips.Image.new_from_file(str(CORPUS / master)).colourspace("srgb")
    expected = np.ndarray(buffer=source.write_to_memory(), dtype=np.uint8,
                          shape=(source.height, source.width, source.bands))
    assert psnr(luma(expected), luma(_jp2_pixels(tmp_path / "small.jp2"))) >= 35


@pytest.mark.parametrize("master", ["exif-orientation/hopper_orientation_5.jpg", "exif-orientation/tif-rotated.tif",
                                    "exif-orientation/jpg-xmp-orientation-90.jpg"])
@pytest.mark.parametrize("name", ["jp2-openjpeg-lossless", "jp2-grok-lossy"])
def test_oriented_masters_are_encoded_upright(master, name, worker, tmp_path):
    """libvips wrote the master's Orientation tag into the encoders' TIFF although the pixels were turned
    already: the reference read back transposed (lossless failure; a crash on non-square images)."""
    result = convert(CORPUS / master, tmp_path / "upright.jp2", name, worker=worker)
    assert result.status is Status.CONVERTED, result.reason
    ptiff = convert(CORPUS / master, tmp_path / "upright.tif", "ptiff-jpeg-q90", worker=worker)
    assert ptiff.ok and (ptiff.width, ptiff.height) == (result.width, result.height)
    assert psnr(luma(_ptiff_pixels(tmp_path / "upright.tif")), luma(_jp2_pixels(tmp_path / "upright.jp2"))) >= 30
