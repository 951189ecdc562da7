"""Test-side access to pixels: the normaliser's output, a decoded access master and LittleCMS's own transform
(tificc, the independent reference), as numpy arrays."""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pyvips
import tifffile

from gcis_etl.colour import normalise
from gcis_etl.decoding import open_master
from gcis_etl.inspection import inspect
from gcis_etl.policy import ImagingPolicy


def as_array(image: pyvips.Image) -> np.ndarray:
    return np.ndarray(buffer=image.write_to_memory(), dtype=np.uint8,
                      shape=(image.height, image.width, image.bands))


def normalised(path: Path, policy: ImagingPolicy | None = None, decoders: tuple[str, ...] | None = None) -> np.ndarray:
    """The 8-bit sRGB pixels the encoder receives (before JPEG)."""
    policy = policy or ImagingPolicy()
    info = inspect(path, policy)
    decoded = open_master(info, decoders or policy.decoders[info.format], policy.strict)
    return as_array(normalise(decoded.image, info, policy))


def decoded_level(path: Path, level: int = 0) -> np.ndarray:
    """One level of an access master decoded through libtiff (as iipsrv reads it)."""
    return as_array(pyvips.Image.new_from_file(str(path), page=level))


def tificc(master: Path, input_profile: str | Path, output_profile: Path, bpc: bool = False) -> np.ndarray:
    """LittleCMS's own transform of a TIFF to 8 bits, relative colorimetric, black-point compensation (-b) only
    when asked (as colour.py transforms by default); `input_profile` "*Lab" reads a CIELab TIFF as D50 Lab."""
    out = master.with_name(master.stem + (".tificc-bpc.tif" if bpc else ".tificc.tif"))
    subprocess.run(["tificc", "-w8", "-t1", *(["-b"] if bpc else []), f"-i{input_profile}", f"-o{output_profile}",
                    str(master), str(out)], check=True, capture_output=True)
    return tifffile.imread(out)


def patch_centres(pixels: np.ndarray, patch: int) -> np.ndarray:
    """Each flat patch's mean away from its edges, where JPEG's blocks and chroma subsampling blur neighbours."""
    rows, columns = pixels.shape[0] // patch, pixels.shape[1] // patch
    inner = pixels.reshape(rows, patch, columns, patch, -1)[:, patch // 4:-(patch // 4), :, patch // 4:-(patch // 4)]
    return inner.astype(np.float64).mean(axis=(1, 3))
