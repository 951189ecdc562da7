"""Unusual but valid masters, made at test time: extra samples that are not alpha, 32-bit integers, Lab with an
embedded Lab profile, half floats, a transparency-mask page, 12-bit samples, 16-bit planar-separate samples,
associated alpha, transposing orientations; and a decoder failing in an undocumented way."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest
import pyvips
import tifffile
from PIL import Image, ImageCms

from gcis_etl.conversion import check_decoding, convert
from gcis_etl.decoding import open_master
from gcis_etl.inspection import inspect
from gcis_etl.models import Status, Verdict
from gcis_etl.policy import ImagingPolicy
from tests.conftest import CORPUS
from tests.imaging import decoded_level, normalised
from tests.measures import luma, psnr

ORANGE = (200, 60, 30)
RECIPES = [("ptiff-jpeg-q90", "tif"), ("ptiff-tifffile-q90", "tif"), ("jp2-openjpeg-lossy", "jp2")]


def converted(master, tmp_path, recipe="ptiff-jpeg-q90", extension="tif") -> np.ndarray:
    """The access master's full-resolution pixels, as a viewer decodes them."""
    out = tmp_path / f"access.{extension}"
    result = convert(master, out, recipe)
    assert result.status is Status.CONVERTED, result.reason
    return pyvips.Image.new_from_file(str(out)).numpy()


def orange_with_extra(path, extrasample: int):
    """An orange RGB master whose fourth sample is 0 on the left half, full on the right."""
    rgb = np.empty((64, 128, 3), np.uint8)
    rgb[:] = ORANGE
    extra = np.zeros((64, 128), np.uint8)
    extra[:, 64:] = 255
    tifffile.imwrite(path, np.dstack([rgb, extra]), photometric="rgb", extrasamples=[extrasample])
    return path


@pytest.mark.parametrize("recipe,extension", RECIPES)
def test_an_unspecified_extra_sample_is_dropped_not_flattened(tmp_path, recipe, extension):
    """A scanner's infrared channel (ExtraSamples 0) is data, not opacity: where it is 0 the picture stays."""
    master = orange_with_extra(tmp_path / "rgbi.tif", extrasample=0)
    assert inspect(master).reasons == ("drop extra samples",)
    pixels = converted(master, tmp_path, recipe, extension).astype(int)
    assert np.abs(pixels[32, 16] - ORANGE).max() <= 4
    assert np.abs(pixels[32, 112] - ORANGE).max() <= 4


@pytest.mark.parametrize("extrasample", [1, 2])  # associated, unassociated
def test_declared_alpha_is_still_flattened(tmp_path, extrasample):
    master = orange_with_extra(tmp_path / "rgba.tif", extrasample)
    pixels = converted(master, tmp_path).astype(int)
    assert np.abs(pixels[32, 16] - 255).max() <= 2  # transparent: the policy's white background
    assert np.abs(pixels[32, 112] - ORANGE).max() <= 4


def test_a_png_transparent_palette_entry_is_flattened(tmp_path):
    """A tRNS chunk is PNG's alpha: the decoders give it an alpha band, and inspection must say so."""
    indices = np.zeros((64, 128), np.uint8)
    indices[:, 64:] = 1
    im = Image.fromarray(indices, "P")
    im.putpalette([0, 0, 255, *ORANGE] + [0] * 762)
    im.save(tmp_path / "p.png", transparency=bytes([0, 255]))
    info = inspect(tmp_path / "p.png")
    assert info.alpha and "flatten alpha/extra samples" in info.reasons
    pixels = normalised(tmp_path / "p.png").astype(int)
    assert pixels[32, 16].tolist() == [255, 255, 255]
    assert pixels[32, 112].tolist() == list(ORANGE)


def _ramp16(bands: int) -> np.ndarray:
    ramp = (np.mgrid[0:16, 0:256][1] * 257).astype(np.uint16)
    return ramp if bands == 1 else np.dstack([ramp, ramp[:, ::-1], ramp // 2])


@pytest.mark.parametrize("decoder", ["vips", "tifffile"])
@pytest.mark.parametrize("bands", [1, 3])
def test_32_bit_unsigned_samples_come_out_as_their_top_16_bits(tmp_path, bands, decoder):
    """A uint32 master spanning its type's range looks like the 16-bit master of its top bits, not 0/255."""
    ramp16 = _ramp16(bands)
    photometric = "minisblack" if bands == 1 else "rgb"
    tifffile.imwrite(tmp_path / "u16.tif", ramp16, photometric=photometric)
    tifffile.imwrite(tmp_path / "u32.tif", ramp16.astype(np.uint32) * 65536 + 12345, photometric=photometric)
    expected = normalised(tmp_path / "u16.tif", decoders=(decoder,))
    assert len(np.unique(expected)) > 200  # a real ramp
    np.testing.assert_array_equal(normalised(tmp_path / "u32.tif", decoders=(decoder,)), expected)


def test_32_bit_signed_samples_are_offset_like_16_bit_ones(tmp_path):
    """Signed samples go to the unsigned range by the two's-complement offset (as 8- and 16-bit ones do):
    the type's minimum is black, 0 mid-grey, its maximum white."""
    ramp16 = _ramp16(1)
    tifffile.imwrite(tmp_path / "u16.tif", ramp16, photometric="minisblack")
    signed = (ramp16.astype(np.int64) * 65537 - 2 ** 31).astype(np.int32)
    tifffile.imwrite(tmp_path / "s32.tif", signed, photometric="minisblack")
    np.testing.assert_array_equal(normalised(tmp_path / "s32.tif"), normalised(tmp_path / "u16.tif"))


@pytest.mark.parametrize("photometric", ["minisblack", "rgb"])
@pytest.mark.parametrize("bits", [8, 16])
def test_signed_samples_convert_like_their_unsigned_twins(bits, photometric, tmp_path):
    """16-bit signed RGB came out white: libvips labels it with its 8-bit space, sRGB, and the offset samples
    were cast to 8 bits unscaled."""
    unsigned, signed = (np.uint8, np.int8) if bits == 8 else (np.uint16, np.int16)
    ramp = (_ramp16(3 if photometric == "rgb" else 1) >> (16 - bits)).astype(unsigned)
    tifffile.imwrite(tmp_path / "u.tif", ramp, photometric=photometric)
    tifffile.imwrite(tmp_path / "s.tif", (ramp.astype(np.int32) - 2 ** (bits - 1)).astype(signed),
                     photometric=photometric)
    expected = normalised(tmp_path / "u.tif")
    assert len(np.unique(expected)) > 200  # a real ramp
    np.testing.assert_array_equal(normalised(tmp_path / "s.tif"), expected)


@pytest.mark.parametrize("decoder", ["pillow", "tifffile"])
@pytest.mark.parametrize("photometric", ["minisblack", "miniswhite"])
@pytest.mark.parametrize("bits", [1, 4, 8, 16])
def test_fallback_decoders_read_low_bit_and_min_is_white_grey_as_libvips_does(bits, photometric, decoder, tmp_path):
    """A master libvips cannot open goes to Pillow or tifffile. They came out wrong without an error: tifffile
    kept MinIsWhite samples as stored (a negative); Pillow's 1- and 4-bit samples, already on 0..255, were
    scaled again (wrapping round), and its 16-bit MinIsWhite was not turned."""
    column = np.mgrid[0:16, 0:256][1]
    samples = {1: (column % 2).astype(bool), 4: (column % 16).astype(np.uint8), 8: column.astype(np.uint8),
               16: (column * 257).astype(np.uint16)}[bits]
    tifffile.imwrite(tmp_path / "grey.tif", samples, photometric=photometric,
                     **({"bitspersample": 4} if bits == 4 else {}))
    expected = normalised(tmp_path / "grey.tif", decoders=("vips",))
    zero = 255 if photometric == "miniswhite" else 0  # what a sample of 0 shows
    assert expected[0, 0, 0] == zero and len(np.unique(expected)) == min(2 ** bits, 256)  # libvips is right
    np.testing.assert_array_equal(normalised(tmp_path / "grey.tif", decoders=(decoder,)), expected)


@pytest.mark.parametrize("decoder", ["pillow", "tifffile"])
@pytest.mark.parametrize("master", ["palette/palette-1c-4b.tiff", "palette/palette-1c-8b.tiff"])
def test_fallback_decoders_give_a_palette_image_its_colours(master, decoder):
    """tifffile returns a palette image's indices: they came out as a grey ramp of indices."""
    expected = normalised(CORPUS / master, decoders=("vips",))
    assert len(np.unique(expected.reshape(-1, 3), axis=0)) > 8  # colours, the comparison can tell
    np.testing.assert_array_equal(normalised(CORPUS / master, decoders=(decoder,)), expected)


@pytest.mark.parametrize("compression", [None, "lzw"])
@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_decoder_turns_a_tiff_upright_once(orientation, compression, tmp_path):
    """Pillow turns a TIFF by its Orientation tag as it loads: turned again by the orientation step, a master
    decoded by Pillow came out rotated or flipped wrongly."""
    rgb = np.zeros((16, 32, 3), np.uint8)
    rgb[:4, :8] = 255
    rgb[..., 1] = np.arange(32)[None, :] * 8
    tifffile.imwrite(tmp_path / "o.tif", rgb, photometric="rgb", compression=compression)
    subprocess.run(["exiftool", "-q", "-overwrite_original", f"-IFD0:Orientation#={orientation}",
                    str(tmp_path / "o.tif")], check=True)
    expected = normalised(tmp_path / "o.tif", decoders=("vips",))
    upright = {1: rgb, 3: rgb[::-1, ::-1], 6: np.rot90(rgb, -1), 8: np.rot90(rgb)}
    if orientation in upright:
        np.testing.assert_array_equal(expected, upright[orientation])  # libvips turns it right
    for decoder in ("pillow", "tifffile"):
        np.testing.assert_array_equal(normalised(tmp_path / "o.tif", decoders=(decoder,)), expected)


def test_a_tiff_whose_first_ifd_is_a_preview_is_rejected_with_where_the_image_is(tmp_path):
    """Every decoder reads the first IFD: a 16x8 preview written before the 128x64 image was converted, and
    verified, as the access master."""
    full = np.random.default_rng(1).integers(0, 256, (64, 128, 3), np.uint8)
    with tifffile.TiffWriter(tmp_path / "m.tif") as tif:
        tif.write(full[::8, ::8], photometric="rgb", subfiletype=1)  # NewSubfileType: reduced resolution
        tif.write(full, photometric="rgb")
    info = inspect(tmp_path / "m.tif")
    assert info.verdict is Verdict.REJECT
    assert info.reasons == ("the first TIFF IFD is a reduced-resolution copy (NewSubfileType 1, 16x8); the full "
                            "image is IFD 1 (128x64): re-save the master with the full image first",)
    assert convert(tmp_path / "m.tif", tmp_path / "out.tif").status is Status.REJECTED


def _lab_master(path, profile: bool):
    """A CIELab (photometric 8) orange master, with or without an embedded Lab (D50 identity) profile."""
    rgb = np.empty((32, 32, 3), np.uint8)
    rgb[:] = ORANGE
    lab = pyvips.Image.new_from_array(rgb).copy(interpretation="srgb").colourspace("lab").numpy()
    samples = np.dstack([np.round(lab[..., 0] * 2.55).astype(np.uint8),
                         np.round(lab[..., 1:]).astype(np.int8).view(np.uint8)])
    icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("LAB")).tobytes()
    tifffile.imwrite(path, samples, photometric=8, extratags=[(34675, 7, len(icc), icc, True)] if profile else [])
    return path


def test_lab_with_an_embedded_lab_profile_converts_like_lab_without_one(tmp_path):
    with_icc = _lab_master(tmp_path / "lab-icc.tif", profile=True)
    reference = normalised(_lab_master(tmp_path / "lab.tif", profile=False))
    assert np.abs(reference[16, 16].astype(int) - ORANGE).max() <= 8  # the reference itself is right
    np.testing.assert_array_equal(normalised(with_icc), reference)
    assert inspect(with_icc).reasons == ("Lab->sRGB",)  # the profile is not applied, so not announced


def test_half_float_master_converts_like_its_float32_twin(tmp_path):
    ramp = (np.mgrid[0:16, 0:256][1] / 255).astype(np.float16)
    tifffile.imwrite(tmp_path / "f16.tif", ramp, photometric="minisblack")
    tifffile.imwrite(tmp_path / "f32.tif", ramp.astype(np.float32), photometric="minisblack")
    assert check_decoding(tmp_path / "f16.tif").verdict is Verdict.ACCEPT_AFTER_CONVERSION
    assert convert(tmp_path / "f16.tif", tmp_path / "f16-access.tif").status is Status.CONVERTED
    np.testing.assert_array_equal(normalised(tmp_path / "f16.tif"), normalised(tmp_path / "f32.tif"))


def test_a_decoder_failing_unexpectedly_rejects_the_master(tmp_path):
    """64-bit integer samples: only tifffile opens them, and libvips cannot take its array (ValueError).
    The master is rejected with the decoder's reason, not left to end as an internal error to retry."""
    samples = np.zeros((16, 16), np.uint64)
    tifffile.imwrite(tmp_path / "u64.tif", samples, photometric="minisblack")
    result = convert(tmp_path / "u64.tif", tmp_path / "access.tif")
    assert result.status is Status.REJECTED
    assert "decoder tifffile failed on this master (ValueError" in result.reason
    assert check_decoding(tmp_path / "u64.tif").verdict is Verdict.REJECT


def test_a_transparency_mask_page_is_not_a_page(tmp_path):
    """NewSubfileType 4 marks a mask of the image before it, as 1 marks a reduced-resolution copy."""
    rgb = np.empty((32, 48, 3), np.uint8)
    rgb[:] = ORANGE
    with tifffile.TiffWriter(tmp_path / "masked.tif") as tw:
        tw.write(rgb, photometric="rgb")
        tw.write(np.ones((32, 48), bool), photometric="mask", subfiletype=4)
    info = inspect(tmp_path / "masked.tif")
    assert info.pages == 1 and info.verdict is Verdict.ACCEPT, info.reasons
    with tifffile.TiffWriter(tmp_path / "two.tif") as tw:  # the rule still counts a real second page
        tw.write(rgb, photometric="rgb")
        tw.write(rgb, photometric="rgb")
    assert inspect(tmp_path / "two.tif").verdict is Verdict.REJECT


def _tiled_planar(path) -> np.ndarray:
    """A valid tiled planar-separate (RRR..GGG..BBB) RGB master of flat 16x16 patches; returns its pixels."""
    pixels = np.random.default_rng(3).integers(0, 256, (3, 5, 3), np.uint8).repeat(16, 0).repeat(16, 1)
    tifffile.imwrite(path, np.moveaxis(pixels, 2, 0), photometric="rgb", planarconfig="separate", tile=(32, 32),
                     metadata=None)
    with tifffile.TiffFile(path) as tif:
        assert tif.pages[0].is_tiled and tif.pages[0].planarconfig == tifffile.PLANARCONFIG.SEPARATE
    return pixels


def test_a_tiled_planar_separate_master_goes_to_the_next_decoder(tmp_path):
    """libvips opens its header but cannot read its pixels, which looked like corrupt data: the header sends
    it on to Pillow (then tifffile), as the other encodings libvips lacks."""
    pixels = _tiled_planar(tmp_path / "planar.tif")
    assert check_decoding(tmp_path / "planar.tif").verdict is Verdict.ACCEPT
    result = convert(tmp_path / "planar.tif", tmp_path / "access.tif")
    assert result.status is Status.CONVERTED and result.decoder == "pillow", result.reason
    centres = np.s_[8::16, 8::16]  # JPEG Q90 blurs the patches' edges
    access = pyvips.Image.new_from_file(str(tmp_path / "access.tif")).numpy()
    assert np.abs(access[centres].astype(int) - pixels[centres]).max() <= 8
    for decoder in ("pillow", "tifffile"):
        np.testing.assert_array_equal(normalised(tmp_path / "planar.tif", decoders=(decoder,)), pixels)


def test_vips_alone_says_it_cannot_read_the_encoding_rather_than_corrupt(tmp_path):
    _tiled_planar(tmp_path / "planar.tif")
    policy = ImagingPolicy(decoders={"TIFF": ("vips",)})
    result = convert(tmp_path / "planar.tif", tmp_path / "access.tif", policy=policy)
    assert result.status is Status.REJECTED
    assert "libvips cannot read tiled planar-separate TIFF" in result.reason and "corrupt" not in result.reason


@pytest.mark.parametrize("suffix", [".jp2", ".j2k"])
def test_a_jpeg2000_master_whose_origin_is_not_0_0_is_decoded_right(tmp_path, suffix):
    """libvips 8.14 decodes a JPEG 2000 image with an image offset (SIZ XOsiz/YOsiz) into noise that changes from
    run to run (verification, comparing with that same decode, passed it), or crashes, or here rejects it as
    corrupt ("Bottom position of the decoded area ... is outside the image area"): such masters go to Pillow."""
    y, x = np.mgrid[0:240, 0:320]
    pixels = np.dstack([x * 255 // 319, y * 255 // 239, (x + y) * 255 // 558]).astype(np.uint8)
    tifffile.imwrite(tmp_path / "source.tif", pixels, photometric="rgb")
    master = tmp_path / f"offset{suffix}"
    subprocess.run(["opj_compress", "-i", str(tmp_path / "source.tif"), "-o", str(master), "-d", "150,300"],
                   check=True, capture_output=True)  # lossless: the master's pixels are the source's
    result = convert(master, tmp_path / "a.tif")
    assert result.ok and result.decoder == "pillow", result.reason
    assert any("origin is not 0,0" in w for w in result.warnings)
    assert psnr(luma(decoded_level(tmp_path / "a.tif")), luma(pixels)) >= 40.0


@pytest.mark.parametrize("decoder", ["pillow", "tifffile"])
def test_12_bit_grey_is_scaled_to_the_full_range_by_either_fallback(tmp_path, decoder):
    """libvips cannot open 12-bit samples; Pillow gives them on 0..4095 in its 16-bit mode, and taken for 16-bit
    samples the master came out nearly black."""
    q12 = np.mgrid[0:16, 0:256][1] * 4095 // 255
    tifffile.imwrite(tmp_path / "grey12.tif", q12.astype(np.uint16), photometric="minisblack", bitspersample=12)
    pixels = normalised(tmp_path / "grey12.tif", decoders=(decoder,)).astype(int)
    expected = np.round(q12 * 255 / 4095)
    assert np.abs(pixels - expected[..., None]).max() <= 1


def _ramps16(bands: int) -> np.ndarray:
    """16-bit ramps, one per band, each a different direction: a band read as 8-bit halves shows at once."""
    y, x = np.mgrid[0:32, 0:64]
    ramps = [x * 1040, y * 2114, (x + y) * 693, (63 - x) * 1040][:bands]
    return np.dstack(ramps).astype(np.uint16)


@pytest.mark.parametrize("tile", [(16, 16), None], ids=["tiled", "strips"])
@pytest.mark.parametrize("bands", [3, 4])
def test_16_bit_planar_separate_samples_go_past_pillow(tmp_path, bands, tile):
    """Pillow reads each 16-bit plane of a planar-separate TIFF as 8-bit samples (wrong pixels, no error): it
    declines such masters, and tifffile reads them. (libvips declines tiled planar-separate ones.)"""
    samples = _ramps16(bands)
    tifffile.imwrite(tmp_path / "sep.tif", np.moveaxis(samples, 2, 0), photometric="rgb", planarconfig="separate",
                     tile=tile, extrasamples=[2] if bands == 4 else None, metadata=None)
    info = inspect(tmp_path / "sep.tif")
    assert open_master(info, ("pillow", "tifffile"), strict=True).decoder == "tifffile"
    pixels = normalised(tmp_path / "sep.tif", decoders=("pillow", "tifffile")).astype(int)
    colour, alpha = samples[..., :3] / 65535, (samples[..., 3:] / 65535 if bands == 4 else 1)
    expected = np.round((colour * alpha + (1 - alpha)) * 255)  # flattened on the policy's white
    assert np.abs(pixels - expected).max() <= 1


def _premultiplied(path, bands: int, bits: int, **layout) -> np.ndarray:
    """A master with associated (premultiplied) alpha; returns it flattened on white, computed here."""
    full = 2 ** bits - 1
    y, x = np.mgrid[0:32, 0:64]
    colour = np.dstack([x * full // 63, y * full // 31, (x + y) * full // 94])[..., :bands - 1]
    alpha = (x * full // 63 * (y >= 8))[..., None]  # a fully transparent band at the top
    stored = np.round(colour * alpha / full)
    dtype = np.uint8 if bits == 8 else np.uint16
    samples = np.dstack([stored, alpha]).astype(dtype)
    photometric = "rgb" if bands == 4 else "minisblack"
    if layout.get("planarconfig") == "separate":
        samples = np.moveaxis(samples, 2, 0)
    tifffile.imwrite(path, samples, photometric=photometric, extrasamples=[1], metadata=None, **layout)
    flattened = (stored + full - alpha) * 255 / full  # premultiplied colour over white
    return np.round(flattened if bands == 4 else np.repeat(flattened, 3, axis=2))


@pytest.mark.parametrize("bands,bits,layout", [
    (4, 8, {}), (4, 16, {}), (2, 8, {"planarconfig": "separate", "tile": (16, 16)})],
    ids=["rgba8", "rgba16", "greya8-tiled-separate"])
def test_tifffile_unpremultiplies_associated_alpha(tmp_path, bands, bits, layout):
    """tifffile gives premultiplied samples as stored, and flattening multiplied them by alpha again: too dark."""
    expected = _premultiplied(tmp_path / "assoc.tif", bands, bits, **layout)
    pixels = normalised(tmp_path / "assoc.tif", decoders=("tifffile",)).astype(int)
    assert np.abs(pixels - expected).max() <= 1


@pytest.mark.parametrize("bits", [8, 16])
def test_tiled_planar_separate_associated_alpha_is_not_taken_for_corrupt(tmp_path, bits):
    """Pillow opens it but has no raw mode to load it with ("unknown raw mode"): that was rejected as corrupt
    data, and tifffile, which reads it, was never tried."""
    expected = _premultiplied(tmp_path / "assoc.tif", 4, bits, planarconfig="separate", tile=(16, 16))
    policy = ImagingPolicy()
    info = inspect(tmp_path / "assoc.tif", policy)
    assert open_master(info, policy.decoders["TIFF"], strict=True).decoder == "tifffile"
    pixels = normalised(tmp_path / "assoc.tif", policy).astype(int)
    assert np.abs(pixels - expected).max() <= 1


_UPRIGHT = {5: lambda a: a.swapaxes(0, 1), 6: lambda a: np.rot90(a, -1), 7: lambda a: a[::-1, ::-1].swapaxes(0, 1),
            8: lambda a: np.rot90(a)}


@pytest.mark.parametrize("kind", ["grey8", "grey16", "rgba8"])
@pytest.mark.parametrize("orientation", [5, 6, 7, 8])
def test_pillow_turns_a_single_strip_tiff_with_a_transposing_orientation_right(tmp_path, orientation, kind):
    """Pillow memory-maps an uncompressed single-strip L, I;16 or RGBA TIFF opened by its path, with the size
    already turned by Orientation 5-8: the rows were read with the wrong stride and the master came out
    scrambled (RGB, which it does not map, was right)."""
    stored = np.random.default_rng(5).integers(0, 256, (16, 40, 3), np.uint8)
    samples = {"grey8": stored[..., 0], "grey16": stored[..., 0].astype(np.uint16) * 257,
               "rgba8": np.dstack([stored, np.full((16, 40), 255, np.uint8)])}[kind]
    tifffile.imwrite(tmp_path / "o.tif", samples, photometric="rgb" if kind == "rgba8" else "minisblack",
                     extrasamples=[2] if kind == "rgba8" else None, rowsperstrip=16, metadata=None,
                     extratags=[(274, 3, 1, orientation, True)])
    expected = _UPRIGHT[orientation](stored if kind == "rgba8" else np.repeat(stored[..., :1], 3, axis=2))
    np.testing.assert_array_equal(normalised(tmp_path / "o.tif", decoders=("pillow",)), expected)
