"""Test-side access to pixels: the normaliser's output and a decoded access master, as numpy arrays."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyvips

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
