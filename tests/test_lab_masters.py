"""Lab masters with an alpha, and the rounding of every flatten, against references computed here: numpy for
the flatten, LittleCMS's own TIFF applier (tificc) for Lab -> sRGB."""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import pyvips
import tifffile

from gcis_etl.colour import srgb_profile
from gcis_etl.conversion import convert
from tests.imaging import decoded_level, normalised
from tests.measures import mean_delta_e
from tests.test_colour import _lab_ramp
from tests.test_tifffile_path import strips_of

PHOTOMETRIC = {"cielab": 8, "icclab": 9}


def _opacity(kind: str, shape: tuple[int, int]) -> np.ndarray:
    """0..1: opaque, or a ramp from transparent (top row) to opaque (bottom row), across the L* ramp."""
    if kind == "opaque":
        return np.ones(shape)
    return np.repeat(np.linspace(0, 1, shape[0])[:, None], shape[1], 1)


def _stored(lab: np.ndarray, photometric: str, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """L* and a*, b* as the TIFF stores them, as floats before rounding: CIELab a*, b* signed, ICCLab offset."""
    full, scale = (255, 1) if bits == 8 else (65535, 256)
    ab = lab[..., 1:] * scale + (0 if photometric == "cielab" else (full + 1) // 2)
    return lab[..., :1] / 100 * full, ab


def write_lab_alpha(path: Path, lab: np.ndarray, opacity: np.ndarray, photometric: str, bits: int,
                    associated: bool) -> None:
    """A Lab TIFF with an alpha extra sample; associated (premultiplied): the samples as stored times alpha."""
    full = 255 if bits == 8 else 65535
    L, ab = _stored(lab, photometric, bits)
    alpha = np.round(opacity * full)
    if associated:
        L, ab = L * alpha[..., None] / full, ab * alpha[..., None] / full
    dtype, signed = (np.uint8, np.int8) if bits == 8 else (np.uint16, np.int16)
    L, ab = np.round(L).astype(dtype), np.round(ab)
    ab = ab.astype(signed).view(dtype) if photometric == "cielab" else ab.astype(dtype)
    tifffile.imwrite(path, np.concatenate([L, ab, alpha.astype(dtype)[..., None]], -1),
                     photometric=PHOTOMETRIC[photometric], extrasamples=[1 if associated else 2])


def tificc(master: Path) -> np.ndarray:
    """LittleCMS's own D50 Lab -> sRGB of a Lab TIFF (relative colorimetric)."""
    profile, out = master.with_name("srgb.icc"), master.with_name(master.stem + ".tificc.tif")
    profile.write_bytes(srgb_profile())
    subprocess.run(["tificc", "-w8", "-t1", "-i*Lab", f"-o{profile}", str(master), str(out)], check=True,
                   capture_output=True)
    return tifffile.imread(out)[..., :3]


def tificc_srgb(lab: np.ndarray, folder: Path) -> np.ndarray:
    """tificc of float Lab, through a 16-bit CIELab TIFF."""
    L = np.round(lab[..., 0] / 100 * 65535).astype(np.uint16)
    ab = np.round(lab[..., 1:] * 256).astype(np.int16).view(np.uint16)
    tifffile.imwrite(folder / "reference-lab.tif", np.dstack([L, ab]), photometric="cielab")
    return tificc(folder / "reference-lab.tif")


def flattened_on_white(lab: np.ndarray, opacity: np.ndarray) -> np.ndarray:
    """The picture over white (L* 100, a* = b* = 0) by its alpha, in Lab."""
    return lab * opacity[..., None] + np.array([100.0, 0, 0]) * (1 - opacity[..., None])


def _decoded(path: Path) -> np.ndarray:
    if path.suffix == ".jp2":
        image = pyvips.Image.new_from_file(str(path))
        return np.ndarray(buffer=image.write_to_memory(), dtype=np.uint8, shape=(image.height, image.width, 3))
    return decoded_level(path)


CASES = [("cielab", 8, False), ("cielab", 16, False), ("cielab", 8, True), ("cielab", 16, True),
         ("icclab", 8, False), ("icclab", 16, True)]


@pytest.mark.parametrize("recipe, suffix", [("ptiff-jpeg-q90", ".tif"), ("jp2-openjpeg-lossless", ".jp2")])
@pytest.mark.parametrize("alpha", ["opaque", "ramp"])
@pytest.mark.parametrize("photometric, bits, associated", CASES)
def test_a_lab_master_with_alpha_is_the_picture_flattened_on_white(photometric, bits, associated, alpha, recipe,
                                                                 suffix, tmp_path):
    """libvips reads Lab with an alpha as LabS, the alpha on the unsigned 16-bit scale in a signed band (255 ->
    -1), and divides associated alpha on the wrong scale: every recipe deposited one flat colour."""
    lab = _lab_ramp()
    opacity = _opacity(alpha, lab.shape[:2])
    master = tmp_path / "lab-alpha.tif"
    write_lab_alpha(master, lab, opacity, photometric, bits, associated)
    result = convert(master, tmp_path / f"access{suffix}", recipe)
    assert result.ok, result.reason
    ours = _decoded(tmp_path / f"access{suffix}")
    reference = tificc_srgb(flattened_on_white(lab, opacity), tmp_path)
    assert ours.shape == reference.shape
    assert reference.std() > 30  # the picture, not a flat colour
    # JPEG adds its own error; the lossless JP2 holds the normalised pixels, with the libvips path's Lab bias
    assert mean_delta_e(ours, reference) <= (2.0 if suffix == ".tif" else 1.0)
    if alpha == "ramp":  # the transparent top row is the white background, over L* 0 to 100
        assert ours[0].min() >= 245, ours[0].min()


@pytest.mark.parametrize("engine", ["vips", "tifffile"])
def test_every_flatten_rounds(engine, tmp_path):
    """Every 8-bit value under every alpha, flattened on white, is the nearest level to the exact value:
    libvips' integer flatten truncated (value 1 under alpha 128 is 127.5: it gave 127)."""
    value, alpha = np.meshgrid(np.arange(256), np.arange(256), indexing="ij")
    rgba = np.dstack([value, value, value, alpha]).astype(np.uint8)
    tifffile.imwrite(tmp_path / "rgba.tif", rgba, photometric="rgb", extrasamples=[2])
    expected = np.floor(value * alpha / 255 + 255 * (255 - alpha) / 255 + 0.5).astype(np.uint8)
    ours = normalised(tmp_path / "rgba.tif") if engine == "vips" else strips_of(tmp_path / "rgba.tif")
    assert ours[1, 128, 0] == 128  # 127.502
    assert np.array_equal(ours[..., 0], expected), np.argwhere(ours[..., 0] != expected)[:5]

