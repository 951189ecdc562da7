"""The tifffile PTIFF path (recipe ptiff-tifffile-q90): the main path's output contract from another engine
(Pillow ImageCms colour, OpenCV reductions, tifffile/imagecodecs tiles), strip by strip in bounded memory."""
from __future__ import annotations

import io
import itertools
import json
import resource
import signal
import struct
import tempfile
import typing
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np
import pytest
import pyvips
import tifffile
from PIL import Image

from gcis_etl import imagecms_colour, tifffile_ptiff
from gcis_etl.colour import srgb_profile
from gcis_etl.conversion import convert
from gcis_etl.decoding import open_master
from gcis_etl.errors import ConfigError
from gcis_etl.iipsrv import Consumer, ServerSettings
from gcis_etl.imagecms_colour import TRANSFORM_PIXELS, srgb_strips
from gcis_etl.inspection import inspect
from gcis_etl.isolation import IsolatedProcess
from gcis_etl.metadata import STRUCTURAL_NAMES, carried_tags, exiftool_json
from gcis_etl.models import Level, Status
from gcis_etl.policy import ImagingPolicy
from gcis_etl.pyramid import shrink2
from gcis_etl.recipes import Interpolation, Recipe, load_recipe
from gcis_etl.settings import parse
from gcis_etl.tifffile_ptiff import INTERPOLATIONS, Halver, encode_tifffile_ptiff, tile_options
from gcis_etl.verification import Expectation, verify
from tests.conftest import CORPUS, corpus_entries
from tests.imaging import as_array, decoded_level, normalised
from tests.measures import luma, mean_delta_e, psnr
from tests.test_colour import pillow_srgb

RECIPE = "ptiff-tifffile-q90"
ACCEPTED = [e for e in corpus_entries() if e.expected != "reject"]  # what the main path converts


@pytest.fixture(scope="module")
def worker():
    with IsolatedProcess() as w:
        yield w


@pytest.fixture(scope="module")
def sixteen_bit(tmp_path_factory) -> dict[str, Path]:
    """16-bit Adobe RGB and ProPhoto masters whose samples use all 16 bits (noise below one 8-bit step)."""
    made = {}
    for name, source in (("adobe16", "icc-adobergb/example.tif"), ("prophoto16", "icc-prophoto/test_icc_prophoto.jpg")):
        image = pyvips.Image.new_from_file(str(CORPUS / source))
        noise = pyvips.Image.gaussnoise(image.width, image.height, sigma=80)
        master = (image.cast("float") * 257 + noise).cast("ushort").copy(interpretation="rgb16")
        master.set_type(pyvips.GValue.blob_type, "icc-profile-data", image.get("icc-profile-data"))
        made[name] = tmp_path_factory.mktemp("masters") / f"{name}.tif"
        master.tiffsave(str(made[name]), compression="none")
    return made


def _master(name: str, sixteen_bit: dict[str, Path]) -> Path:
    return sixteen_bit.get(name) or CORPUS / name


def strips_of(path: Path, policy: ImagingPolicy | None = None) -> np.ndarray:
    """The whole image as this path's colour stage produces it, band by band (before JPEG)."""
    policy = policy or ImagingPolicy()
    info = inspect(path, policy)
    strips = srgb_strips(open_master(info, policy.decoders[info.format], policy.strict).image, info, policy)
    with ThreadPoolExecutor(2) as pool:
        return np.concatenate(list(strips.bands(64, pool)))


# --- the output contract -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [e.row["local_path"] for e in ACCEPTED] + ["adobe16", "prophoto16"])
def test_master_converts_to_a_verified_tifffile_pyramid(name, sixteen_bit, worker, tmp_path):
    """Every master the main path accepts (16-bit, CMYK, Adobe RGB, grey, Lab, float, ...), and 16-bit Adobe RGB
    and ProPhoto: interchangeable per recipe, nothing the main path converts is refused here."""
    dst = tmp_path / "a.tif"
    result = convert(_master(name, sixteen_bit), dst, RECIPE, worker=worker)
    assert result.status is Status.CONVERTED, result.reason
    report = verify(dst, Expectation(width=result.width, height=result.height, tile=256, chroma="4:2:0"))
    assert report.ok, report.errors
    assert result.levels == len(report.levels) and result.bytes == dst.stat().st_size
    with tifffile.TiffFile(dst) as tf:
        for page in tf.pages:
            assert page.is_tiled and (page.tilewidth, page.tilelength) == (256, 256)
            assert page.compression == 7 and page.photometric == 6 and tuple(page.tags[530].value) == (2, 2)
            assert 347 not in page.tags  # tifffile's tiles are complete JPEG streams: no shared JPEGTables
        assert tf.pages[0].tags[34675].value == srgb_profile()
        assert tf.pages[0].tags[305].value == "gcis-etl"


def test_recipe_is_its_own():
    recipe, main = load_recipe(RECIPE), load_recipe("ptiff-jpeg-q90")
    assert recipe.encoder == "tifffile" and recipe.interpolation == "area"
    assert recipe.digest != main.digest
    assert main.interpolation is None and "interpolation" not in main.model_dump(exclude_none=True)
    assert set(INTERPOLATIONS) == set(typing.get_args(Interpolation))


@pytest.mark.parametrize("data, message", [
    ({"encoder": "ptiff", "interpolation": "cubic"}, "interpolation: applies only to encoder tifffile, not ptiff"),
    ({"encoder": "tifffile", "fast_dct": True}, "fast_dct: imagecodecs (encoder tifffile) has no fast DCT"),
    ({"encoder": "tifffile", "interpolation": "bicubic"}, "interpolation"),
    ({"encoder": "tifffile", "jp2": {"rates": [2]}}, "jp2: applies only to the encoders"),
])
def test_recipe_errors_name_the_problem(data, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse(Recipe, {"name": "x", **data}, "x.yaml")


def test_default_interpolation_is_area():
    assert parse(Recipe, {"name": "x", "encoder": "tifffile"}, "x.yaml").interpolation == "area"


# --- agreement with the main path and the JP2 path ------------------------------------------------------

@pytest.mark.parametrize("name", ["rgb16-tiff/rgb-3c-16b.tiff", "adobe16", "cmyk-tiff-icc/fogra-0-100-100-0.tif",
                                  "icc-adobergb/example.tif", "gray8/gray.tif", "jpeg-baseline/flowers.jpeg"])
def test_vips_tifffile_and_openjpeg_agree(name, sixteen_bit, worker, tmp_path):
    master = _master(name, sixteen_bit)
    outputs = {"vips": tmp_path / "v.tif", "tifffile": tmp_path / "t.tif", "openjpeg": tmp_path / "j.jp2"}
    for (label, dst), recipe in zip(outputs.items(), ("ptiff-jpeg-q90", RECIPE, "jp2-openjpeg-lossy")):
        result = convert(master, dst, recipe, worker=worker)
        assert result.ok, f"{label}: {result.reason}"
    with Image.open(outputs["openjpeg"]) as im:
        jp2 = np.asarray(im.convert("RGB"))
    pixels = {"vips": decoded_level(outputs["vips"]), "tifffile": decoded_level(outputs["tifffile"]), "openjpeg": jp2}
    for a, b in itertools.combinations(pixels, 2):
        assert psnr(luma(pixels[a]), luma(pixels[b])) >= 35, (a, b)


def test_every_level_agrees_with_the_main_path(worker, tmp_path):
    master = CORPUS / "jpeg-gainmap-ultrahdr/ultra-hdr.jpg"
    assert convert(master, tmp_path / "v.tif", "ptiff-jpeg-q90", worker=worker).ok
    result = convert(master, tmp_path / "t.tif", RECIPE, worker=worker)
    assert result.ok and result.levels == 5
    for level in range(result.levels):
        ours, main = decoded_level(tmp_path / "t.tif", level), decoded_level(tmp_path / "v.tif", level)
        assert psnr(luma(ours), luma(main)) >= 38, level


def test_iipsrv_serves_it_as_it_serves_the_main_paths(worker, tmp_path):
    """iipsrv 1.1 (the consumer) reads tifffile's pages, complete JPEG tiles and the rewritten IFD chain:
    same info.json, and tiles of two levels that agree with the main path's."""
    images = tmp_path / "images"
    master = CORPUS / "jpeg-gainmap-ultrahdr/ultra-hdr.jpg"
    for recipe, name in ((RECIPE, "t.tif"), ("ptiff-jpeg-q90", "v.tif")):
        assert convert(master, images / name, recipe, worker=worker).ok
    server = ServerSettings(port=0, run_dir=tmp_path / "run", access_log=tmp_path / "run" / "access.log")
    with Consumer(server, images) as consumer:
        def get(path: str) -> bytes:
            with urllib.request.urlopen(f"{consumer.iiif_url}/{path}", timeout=30) as response:
                return response.read()
        served = {name: json.loads(get(f"{name}/info.json")) for name in ("t.tif", "v.tif")}
        assert {k: served["t.tif"][k] for k in ("width", "height", "tiles")} == \
            {k: served["v.tif"][k] for k in ("width", "height", "tiles")} and served["t.tif"]["width"] == 3840
        for region in ("0,0,256,256/256,", "512,512,512,512/256,", "full/240,"):
            ours, main = (np.asarray(Image.open(io.BytesIO(get(f"{name}/{region}/0/default.jpg"))).convert("RGB"))
                          for name in ("t.tif", "v.tif"))
            assert ours.shape == main.shape and psnr(luma(ours), luma(main)) >= 35, region


@pytest.mark.parametrize("name", ["icc-adobergb/example.tif", "icc-prophoto/test_icc_prophoto.jpg",
                                  "cmyk-tiff-icc/fogra-0-100-100-0.tif"])
@pytest.mark.parametrize("part_pixels", [TRANSFORM_PIXELS, 1000])
def test_colour_is_pillow_imagecms(name, part_pixels, monkeypatch):
    """8-bit: exactly what Pillow's own profileToProfile makes of the whole image, strips notwithstanding,
    and whether a band is transformed whole or in parts of a few rows (the last one shorter)."""
    monkeypatch.setattr(imagecms_colour, "TRANSFORM_PIXELS", part_pixels)
    assert np.array_equal(strips_of(CORPUS / name), pillow_srgb(CORPUS / name))


@pytest.mark.parametrize("name, limit", [("adobe16", 0.5), ("prophoto16", 0.75), ("lab-tiff/hopper.Lab.tif", 0.75),
                                         ("cmyk-tiff/cmyk-3c-8b.tiff", 0.01), ("icc-adobergb/example.tif", 0.01)])
def test_colour_against_the_main_path(name, limit, sixteen_bit):
    """16-bit masters are rounded to 8 bits before the transform (Pillow has no 16-bit RGB mode); the main
    path transforms in float. Measured mean CIEDE2000: 0.36 Adobe RGB, 0.56 ProPhoto (out-of-gamut dark
    blues clip differently), 0.62 Lab (Pillow's 8-bit Lab); 0 for 8-bit RGB and CMYK."""
    master = _master(name, sixteen_bit)
    assert mean_delta_e(strips_of(master), normalised(master)) <= limit


def test_16_bit_samples_are_rounded_to_8_bits_before_the_transform(tmp_path):
    """100.78 in 8-bit terms (25900 / 257) is transformed as 101, not truncated to 100."""
    adobe = pyvips.Image.new_from_file(str(CORPUS / "icc-adobergb/example.tif")).get("icc-profile-data")

    def flat(value: int, interpretation: str, fmt: str) -> np.ndarray:
        image = (pyvips.Image.black(16, 16, bands=3) + value).cast(fmt).copy(interpretation=interpretation)
        image.set_type(pyvips.GValue.blob_type, "icc-profile-data", adobe)
        path = tmp_path / f"{value}.tif"
        image.tiffsave(str(path), compression="none")
        return strips_of(path)

    sixteen = flat(25900, "rgb16", "ushort")
    assert np.array_equal(sixteen, flat(101, "srgb", "uchar"))
    assert not np.array_equal(sixteen, flat(100, "srgb", "uchar"))


def test_grey_master_with_a_grey_profile(tmp_path):
    """Mode L through a GRAY profile: mid-grey in a linear (gamma 1.0) space is sRGB 188, as on the main path."""
    master = (pyvips.Image.black(64, 32) + 128).cast("uchar").copy(interpretation="b-w")
    master.set_type(pyvips.GValue.blob_type, "icc-profile-data", _grey_profile(gamma=1.0))
    master.tiffsave(str(tmp_path / "grey.tif"), compression="none")
    ours = strips_of(tmp_path / "grey.tif")
    assert ours.shape == (32, 64, 3) and np.all(ours == 188)  # 255 * sRGB-encode(128 / 255)
    assert np.array_equal(ours, normalised(tmp_path / "grey.tif"))


def _grey_profile(gamma: float) -> bytes:
    """A minimal ICC v2 monitor profile of a grey space with the given gamma (D50 white)."""
    def s15(value: float) -> bytes:
        return struct.pack(">i", round(value * 65536))
    d50 = s15(0.9642) + s15(1.0) + s15(0.8249)
    text = b"test grey"
    tags = {b"desc": b"desc" + bytes(4) + struct.pack(">I", len(text) + 1) + text + bytes(1 + 8 + 3 + 67),
            b"wtpt": b"XYZ " + bytes(4) + d50,
            b"kTRC": b"curv" + bytes(4) + struct.pack(">IH", 1, round(gamma * 256)),
            b"cprt": b"text" + bytes(4) + b"none\0"}
    table, data, start = b"", b"", 128 + 4 + 12 * len(tags)
    for signature, body in tags.items():
        table += signature + struct.pack(">II", start + len(data), len(body))
        data += body + bytes(-len(body) % 4)
    header = (struct.pack(">I", start + len(data)) + b"lcms" + struct.pack(">I", 0x02100000) + b"mntrGRAYXYZ "
              + bytes(12) + b"acsp" + bytes(28) + d50 + bytes(48))
    return header + struct.pack(">I", len(tags)) + table + data


# --- tifffile's photometric ------------------------------------------------------------------------------

def test_photometric_rgb_keeps_colours_and_ycbcr_corrupts_them(tmp_path):
    """tifffile's photometric describes the array: with 'ycbcr' the RGB samples are stored as if they were
    YCbCr, a valid file with wrong colours. Ours ('rgb') is within JPEG tolerance."""
    bars = np.zeros((256, 512, 3), np.uint8)
    for i, colour in enumerate([(220, 30, 30), (30, 200, 40), (30, 40, 220), (240, 220, 40)]):
        bars[:, i * 128:(i + 1) * 128] = colour
    ours = tile_options(load_recipe(RECIPE))
    errors = {}
    for label, options in (("ours", ours), ("ycbcr", {**ours, "photometric": "ycbcr"})):
        tifffile.imwrite(tmp_path / f"{label}.tif", bars, **options)
        errors[label] = mean_delta_e(as_array(pyvips.Image.new_from_file(str(tmp_path / f"{label}.tif"))), bars)
    assert errors["ours"] < 2.0 and errors["ycbcr"] > 20, errors


# --- the pyramid -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("interpolation", sorted(INTERPOLATIONS))
@pytest.mark.parametrize("width, height", [(301, 203), (256, 256), (7, 9)])
def test_halving_band_by_band_equals_resizing_the_whole_level(interpolation, width, height):
    rng = np.random.default_rng(width * height)
    level = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    produced = []
    halver = Halver(width, height, INTERPOLATIONS[interpolation], produced.append)
    y = 0
    while y < height:
        n = int(rng.integers(1, 40))
        halver.add(level[y:y + n])
        y += n
    padded = np.pad(level, ((0, height % 2), (0, width % 2), (0, 0)), mode="edge")
    whole = cv2.resize(padded, (padded.shape[1] // 2, padded.shape[0] // 2),
                       interpolation=INTERPOLATIONS[interpolation])
    assert np.array_equal(np.concatenate(produced), whole)


def test_area_halving_is_the_main_paths_box_shrink():
    level = np.random.default_rng(1).integers(0, 256, (97, 131, 3), dtype=np.uint8)
    produced = []
    halver = Halver(131, 97, INTERPOLATIONS["area"], produced.append)
    for y in range(0, 97, 32):
        halver.add(level[y:y + 32])
    assert np.array_equal(np.concatenate(produced), shrink2(level))


def test_interpolation_is_the_recipes(worker, tmp_path):
    """On fine texture a box average (area) and Lanczos differ far more than JPEG Q90 blurs either."""
    master = tmp_path / "texture.png"
    texture = np.random.default_rng(3).integers(0, 256, (300, 400, 3), dtype=np.uint8)
    Image.fromarray(texture).save(master)
    references = {name: cv2.resize(texture, (200, 150), interpolation=INTERPOLATIONS[name])
                  for name in ("area", "lanczos4")}
    for name in references:
        recipe = parse(Recipe, {**load_recipe(RECIPE).model_dump(), "name": "x", "interpolation": name}, "x.yaml")
        assert convert(master, tmp_path / f"{name}.tif", recipe, worker=worker).ok
        level = luma(decoded_level(tmp_path / f"{name}.tif", 1))
        other = "lanczos4" if name == "area" else "area"
        assert psnr(level, luma(references[name])) > psnr(level, luma(references[other])) + 3, name


# --- metadata, BigTIFF, bad input, memory ------------------------------------------------------------------

@pytest.mark.parametrize("name", ["metadata-rich/Canon.jpg", "metadata-rich/ExifTool.jpg", "metadata-rich/GPS.jpg",
                                  "metadata-rich/iptc.jpg", "metadata-rich/XMP.jpg"])
def test_metadata_is_the_main_paths(name, worker, tmp_path):
    """The same carried tags reach IFD0 (and its EXIF/GPS sub-IFDs) through tifffile's file."""
    assert convert(CORPUS / name, tmp_path / "v.tif", "ptiff-jpeg-q90", worker=worker).ok
    assert convert(CORPUS / name, tmp_path / "t.tif", RECIPE, worker=worker).ok
    main, ours = (_kept(tmp_path / f) for f in ("v.tif", "t.tif"))
    assert main and ours == main
    assert exiftool_json(tmp_path / "t.tif").get("EXIF:ColorSpace") == 1  # as the main path writes it


def _kept(path: Path) -> dict:
    """EXIF/XMP/IPTC tags of an access master, without the ones that describe the file itself."""
    return {k: v for k, v in exiftool_json(path).items()
            if k.split(":")[0] in ("EXIF", "XMP", "IPTC") and k.split(":")[-1] not in STRUCTURAL_NAMES}


def test_bigtiff_output_keeps_its_metadata(monkeypatch, tmp_path):
    """BigTIFF is chosen before tifffile writes (from the uncompressed size); forced here on a small master."""
    monkeypatch.setattr(tifffile_ptiff, "BIGTIFF_FROM", 0)
    policy, master = ImagingPolicy(), CORPUS / "jpeg-baseline/flowers.jpeg"
    info = inspect(master, policy)
    strips = srgb_strips(open_master(info, ("vips",), True).image, info, policy)
    recipe = load_recipe(RECIPE)
    carried = carried_tags(inspect(CORPUS / "metadata-rich/ExifTool.jpg"), recipe.metadata.keep,
                           recipe.metadata.exclude, tmp_path)
    encoded = encode_tifffile_ptiff(strips, tmp_path / "big.tif", recipe, srgb_profile(), lambda: carried.tags, tmp_path)
    assert encoded.bigtiff and len(encoded.levels) == 4 and (tmp_path / "big.tif").read_bytes()[:4] == b"II+\x00"
    report = verify(tmp_path / "big.tif", Expectation(width=info.width, height=info.height, tile=256, chroma="4:2:0",
                                                      metadata=carried.values))
    assert report.ok, report.errors
    tags = exiftool_json(tmp_path / "big.tif")
    assert tags["EXIF:Artist"] == "Phil Harvey" and tags["EXIF:ColorSpace"] == 1
    assert tags["XMP:Title"] == "Test IPTC picture"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.tif"]  # the spilled levels are gone


def test_corrupt_master_is_rejected_and_nothing_is_written(worker, tmp_path):
    dst = tmp_path / "out" / "a.tif"
    result = convert(CORPUS / "truncated/truncated.jpg", dst, RECIPE, worker=worker)
    assert result.status is Status.REJECTED and "corrupt or truncated" in result.reason
    assert not dst.exists() and not list(dst.parent.glob(".*partial"))


def test_memory_stays_bounded_on_a_large_master(tmp_path):
    """Tall Adobe RGB masters of 17 and 33 Mpx (50 and 100 MB uncompressed): the conversion process grows by
    a working set set by the width (it holds bands of rows, never the image; a whole-image version grows by
    about 4x the master), so doubling the master's height adds almost nothing."""
    photo = pyvips.Image.new_from_file(str(CORPUS / "jpeg-gainmap-ultrahdr/ultra-hdr.jpg"))
    icc = pyvips.Image.new_from_file(str(CORPUS / "icc-adobergb/example.tif")).get("icc-profile-data")
    growth, uncompressed_mb = {}, {}
    for copies in (2, 4):
        master = tmp_path / f"large{copies}.tif"
        large = photo.replicate(1, copies)
        large.set_type(pyvips.GValue.blob_type, "icc-profile-data", icc)
        large.tiffsave(str(master), compression="none")
        uncompressed_mb[copies] = large.width * large.height * 3 / 1e6
        with IsolatedProcess() as fresh:  # its peak RSS is over its life: warm it up on a small master first
            warm = convert(CORPUS / "icc-adobergb/example.tif", tmp_path / "warm.tif", RECIPE, worker=fresh)
            result = convert(master, tmp_path / f"large{copies}-out.tif", RECIPE, worker=fresh)
        assert warm.ok and result.ok, (warm.reason, result.reason)
        growth[copies] = result.peak_rss_mb - warm.peak_rss_mb
    added = uncompressed_mb[4] - uncompressed_mb[2]
    assert growth[4] - growth[2] < 0.1 * added, f"grew {growth[2]:.0f} then {growth[4]:.0f} MB"
    assert growth[4] < 0.6 * uncompressed_mb[4], f"grew {growth[4]:.0f} MB on a {uncompressed_mb[4]:.0f} MB master"


def test_an_alpha_costs_little_more_memory_than_the_colour_bands(tmp_path):
    """16-bit RGBA and the same RGB, 8192 x 1024: libvips flattens the alpha in float (16 bytes a pixel at that
    step, every step holding the piece fetched), so pieces are sized by that widest pixel. When they were 4 Mpx
    whatever the pipeline, RGBA grew 3.2x as much as RGB (508 against 157 MB; 830 MB on a 120 Mpx master);
    now 1.35x (117 against 87 MB)."""
    samples = np.random.default_rng(1).integers(0, 65536, (1024, 8192, 4), dtype=np.uint16)
    growth = {}
    for name, pixels, extra in (("rgba", samples, {"extrasamples": [2]}), ("rgb", samples[..., :3], {})):
        master = tmp_path / f"{name}.tif"
        tifffile.imwrite(master, pixels, photometric="rgb", rowsperstrip=64, **extra)
        with IsolatedProcess() as fresh:  # its peak RSS is over its life: warm it up on a small master first
            warm = convert(CORPUS / "icc-adobergb/example.tif", tmp_path / "warm.tif", RECIPE, worker=fresh)
            result = convert(master, tmp_path / f"{name}-out.tif", RECIPE, worker=fresh)
        assert warm.ok and result.ok, (warm.reason, result.reason)
        growth[name] = result.peak_rss_mb - warm.peak_rss_mb
    assert growth["rgba"] < 2 * growth["rgb"], f"RGBA grew {growth['rgba']:.0f} MB, RGB {growth['rgb']:.0f} MB"


def _encoded_levels(master: Path, out: Path) -> list[np.ndarray]:
    """encode_tifffile_ptiff in this process (so that a test can change its constants); every level's pixels."""
    policy = ImagingPolicy()
    info = inspect(master, policy)
    strips = srgb_strips(open_master(info, ("vips",), True).image, info, policy)
    encode_tifffile_ptiff(strips, out, load_recipe(RECIPE), srgb_profile(), lambda: [], out.parent)
    with tifffile.TiffFile(out) as tf:
        return [page.asarray() for page in tf.pages]


def test_pieces_of_fewer_rows_than_a_tile_make_the_same_pyramid(monkeypatch, sixteen_bit, tmp_path):
    """On a wide level rows are fetched, halved and read back from scratch a few at a time (37 here: tile rows
    and level ends fall inside pieces) and put together into tile rows: the pyramid is the same."""
    master = tmp_path / "tall.tif"
    tall = pyvips.Image.new_from_file(str(sixteen_bit["adobe16"])).replicate(2, 4)  # 3 levels, 4 tile rows
    tall.tiffsave(str(master), compression="none")
    whole = _encoded_levels(master, tmp_path / "whole.tif")
    monkeypatch.setattr(tifffile_ptiff, "PIECE_BYTES", 37 * tall.width * 6)  # 16-bit RGB is fetched as it is
    assert tifffile_ptiff.piece_rows(Level(tall.width, tall.height), 256, 6) == 37
    pieces = _encoded_levels(master, tmp_path / "pieces.tif")
    assert len(whole) == len(pieces) > 2
    for level, (a, b) in enumerate(zip(whole, pieces)):
        assert np.array_equal(a, b), level


def test_a_wide_level_is_fetched_in_pieces_of_a_bounded_size():
    """What bounds memory on wide masters: a tile row is fetched whole while it fits PIECE_BYTES at the
    pipeline's widest pixel, and beyond that in fewer rows (a 200,000-column 16-bit master held 1.97 GB as
    whole tile rows, 1.22 GB in 4 Mpx pieces; the main path 1.32 GB: measured, see README, not asserted here,
    as peak RSS varies by tens of MB from run to run)."""
    budget = tifffile_ptiff.PIECE_BYTES
    for pixel_bytes in (3, 6, 16):
        whole = budget // (256 * pixel_bytes)  # the widest level fetched a tile row at a time
        assert tifffile_ptiff.piece_rows(Level(whole, 10000), 256, pixel_bytes) == 256
        for width in (whole + 1, 60000, 200000):
            rows = tifffile_ptiff.piece_rows(Level(width, 10000), 256, pixel_bytes)
            assert 1 <= rows < 256 and rows * width * pixel_bytes <= budget
        assert tifffile_ptiff.piece_rows(Level(budget, 10), 256, pixel_bytes) == 1


def limit_file_size(megabytes: int) -> None:
    """Files the conversion process writes stop at `megabytes` (EFBIG, "File too large"), as a full temp
    filesystem stops them (ENOSPC) without needing one."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (megabytes * 2 ** 20, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def test_scratch_that_cannot_be_written_is_named_not_the_destination(tmp_path):
    """A flat 2000 x 2000 master: its JPEG pages take a few kB, level 1 spilled uncompressed to scratch 3 MB."""
    master = tmp_path / "flat.tif"
    tifffile.imwrite(master, np.full((2000, 2000, 3), 128, np.uint8), photometric="rgb")
    with IsolatedProcess() as worker:
        worker.call(limit_file_size, 1)
        result = convert(master, tmp_path / "out" / "a.tif", RECIPE, worker=worker)
    assert result.status is Status.FAILED
    assert result.reason == (f"cannot write scratch files in {tempfile.gettempdir()}: File too large "
                             "(the system temp dir: TMPDIR sets where it is)")
