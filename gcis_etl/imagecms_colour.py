"""Colour for the tifffile encoder: LittleCMS through Pillow ImageCms, applied strip by strip.

The main path converts colour inside libvips (colour.py). This second engine decodes through the same
decoding.py and lays the image out the same way (upright, unsigned samples, alpha flattened, extra bands
dropped), then builds one ImageCms transform (source profile -> the same sRGB profile, the policy's intent)
and applies it to each strip as it is read: the master is never whole in memory.

Which masters are transformed, and from which profile, follows the main path: an embedded profile unless
it encodes sRGB already (inspection.encodes_srgb, 8-bit); CMYK without one through policy.cmyk_fallback_profile;
Lab through a Lab (D50) profile. A master with none of these needs no colour management on either path: its
samples are brought to 8-bit sRGB by colour.normalise, exactly as on the main path.

Pillow has no 16-bit RGB or CMYK mode: 16-bit samples are rounded to 8 bits (x / 257) before the transform
(float samples with an embedded profile arrive as 16-bit: colour.layout).
The main path transforms 16 bits in float; on 16-bit masters the two differ by a mean CIEDE2000 of 0.36
(Adobe RGB) and 0.56 (ProPhoto, whose out-of-gamut dark blues clip differently), below what JPEG Q90 adds;
8-bit masters come out identical (tests/test_tifffile_path.py). Lab goes through Pillow's 8-bit Lab: identical
to LittleCMS's tificc on 8- and 16-bit Lab twins, as the main path is within rounding (colour._lab_to_srgb).

Cost: Pillow gives LittleCMS 4-byte pixels (TYPE_RGBA_8 for every RGB mode), whose generic pixel formatters
take over half of the transform's time; the same transform inside libvips (3-byte pixels) costs ~60% as much.
Around that floor nothing is spent on unpacking, repacking or copying the unused fourth byte (see _apply).
"""
from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterator

import cv2
import numpy as np
import pyvips
from PIL import Image, ImageCms

from gcis_etl.colour import LAB, is_srgb, layout, normalise, srgb_profile
from gcis_etl.decoding import SAMPLE_BYTES
from gcis_etl.inspection import applied_intent
from gcis_etl.isolation import pixel_error
from gcis_etl.models import ImageInfo
from gcis_etl.policy import ImagingPolicy

_INTENTS = {"perceptual": ImageCms.Intent.PERCEPTUAL, "relative": ImageCms.Intent.RELATIVE_COLORIMETRIC,
            "saturation": ImageCms.Intent.SATURATION, "absolute": ImageCms.Intent.ABSOLUTE_COLORIMETRIC}
_MODES = {1: "L", 3: "RGBX", 4: "CMYK"}                         # colour bands -> Pillow mode
_PROFILE_SPACES = {"L": "GRAY", "RGBX": "RGB", "CMYK": "CMYK"}  # Pillow mode -> ICC colour space it needs
# Pixels per ImageCms call: Pillow holds them as 4 bytes each, and LittleCMS runs ~25% faster on 2 MB
# (cache-sized) parts than on a 256-row band of a 14,600-pixel-wide master (15 MB).
TRANSFORM_PIXELS = 512 * 1024


@dataclass(frozen=True)
class SrgbStrips:
    """A master's rows as 8-bit sRGB: fetched from libvips, through `transform` when one is needed."""

    image: pyvips.Image
    transform: ImageCms.ImageCmsTransform | None = None
    mode: str = "RGBX"  # the Pillow mode of the transform's input; 3-band samples are expanded to RGBX
    pixel_bytes: int = 3  # a pixel's bytes at the widest step of the libvips pipeline a fetch runs (_widest)

    @property
    def width(self) -> int:
        return self.image.width

    @property
    def height(self) -> int:
        return self.image.height

    def bands(self, rows: int, pool: ThreadPoolExecutor) -> Iterator[np.ndarray]:
        """Consecutive bands of `rows` rows, top to bottom, each (n, width, 3) uint8; a band is transformed
        in cache-sized parts by the pool's threads (ImageCms releases the GIL). A 16-bit fetch is let go once
        rounded to 8 bits, before the band it becomes is allocated."""
        region = pyvips.Region.new(self.image)
        image = self.image
        dtype = {"uchar": np.uint8, "ushort": np.uint16, "float": np.float32}[image.format]
        for y in range(0, image.height, rows):
            n = min(rows, image.height - y)
            try:
                data = region.fetch(0, y, image.width, n)
            except pyvips.Error as exc:
                raise pixel_error(exc) from None
            samples = np.ndarray(buffer=data, dtype=dtype, shape=(n, image.width, image.bands))
            if self.transform is None:
                yield samples
                continue
            samples = _pillow_samples(samples)
            del data
            band = np.empty((n, image.width, 3), np.uint8)
            step = max(1, TRANSFORM_PIXELS // image.width)
            for _ in pool.map(self._apply, [(samples[i:i + step], band[i:i + step]) for i in range(0, n, step)]):
                pass
            yield band

    def _apply(self, part: tuple[np.ndarray, np.ndarray]) -> None:
        """Transform `samples` into `out` (a slice of the band) through a 4-byte RGBX buffer Pillow maps
        without copying. RGB is transformed in place: Pillow then neither unpacks nor repacks the pixels nor
        copies the unused fourth byte, which together cost as much as a third of LittleCMS's own time."""
        samples, out = part
        height, width = samples.shape[:2]
        rgbx = np.empty((height, width, 4), np.uint8)
        target = Image.frombuffer("RGBX", (width, height), rgbx, "raw", "RGBX", 0, 1)
        if self.mode == "RGBX":
            cv2.cvtColor(samples, cv2.COLOR_RGB2RGBA, dst=rgbx)
            self.transform.apply_in_place(target)
        else:
            strip = Image.frombuffer(self.mode, (width, height), np.ascontiguousarray(samples), "raw", self.mode, 0, 1)
            self.transform.apply(strip, target)
        cv2.cvtColor(rgbx, cv2.COLOR_RGBA2RGB, dst=out)


def srgb_strips(image: pyvips.Image, info: ImageInfo, policy: ImagingPolicy) -> SrgbStrips:
    """How the decoded master's rows become sRGB on this path: the transform to apply, if any."""
    laid = layout(image, info, policy)
    widest = _widest(image, laid, info, policy)
    interpretation = laid.interpretation
    if interpretation in LAB:  # float Lab (colour.layout)
        return SrgbStrips(laid, _transform(ImageCms.createProfile("LAB"), "LAB", policy), "LAB", widest)
    if laid.format not in ("uchar", "ushort") or laid.bands not in _MODES:
        return SrgbStrips(normalise(image, info, policy), pixel_bytes=widest)
    mode = "CMYK" if interpretation == "cmyk" and laid.bands == 4 else _MODES[laid.bands]
    profile = _embedded(laid, mode, policy)
    if profile is None and mode == "CMYK":
        profile = _profile(pyvips.Operation.call("profile_load", policy.cmyk_fallback_profile))
    if profile is None:
        return SrgbStrips(normalise(image, info, policy), pixel_bytes=widest)
    return SrgbStrips(laid, _transform(profile, mode, policy), mode, widest)


def _widest(image: pyvips.Image, laid: pyvips.Image, info: ImageInfo, policy: ImagingPolicy) -> int:
    """A pixel's bytes at the widest step libvips runs for a fetch, decoded master to sRGB: every step holds
    the fetched area in its own buffer, so this sets what a fetch of so many pixels costs. An alpha is
    flattened in float over the colour bands and the alpha (colour._flatten): 16 bytes for RGBA of any depth."""
    steps = [image.bands * SAMPLE_BYTES[image.format], laid.bands * SAMPLE_BYTES[laid.format], 3]
    if info.alpha and policy.alpha == "flatten":
        steps.append(4 * (laid.bands + 1))
    return max(steps)


def _embedded(image: pyvips.Image, mode: str, policy: ImagingPolicy) -> ImageCms.ImageCmsProfile | None:
    """The embedded profile when it applies: readable, for the image's colour space, and not sRGB already.
    RejectedMaster when LittleCMS builds no transform from it (inspection rejects such a master first; here
    buildTransform raised PyCMSError out of the conversion).

    libvips, on the main path, likewise ignores a profile that does not match the image's bands."""
    if not image.get_typeof("icc-profile-data") or is_srgb(image, policy):
        return None
    icc = image.get("icc-profile-data")
    try:
        profile = _profile(icc)
    except (OSError, ValueError, TypeError):
        return None
    if profile.profile.xcolor_space.strip() != _PROFILE_SPACES[mode]:
        return None
    applied_intent(icc, policy.rendering_intent)  # RejectedMaster where LittleCMS builds no transform from it
    return profile


def _profile(data: bytes) -> ImageCms.ImageCmsProfile:
    return ImageCms.ImageCmsProfile(io.BytesIO(data))


def _transform(source: ImageCms.ImageCmsProfile, mode: str, policy: ImagingPolicy) -> ImageCms.ImageCmsTransform:
    flags = ImageCms.Flags.BLACKPOINTCOMPENSATION if policy.black_point_compensation else ImageCms.Flags.NONE
    return ImageCms.buildTransform(source, _profile(srgb_profile()), mode, "RGBX",
                                   renderingIntent=_INTENTS[policy.rendering_intent], flags=flags)


def _pillow_samples(samples: np.ndarray) -> np.ndarray:
    """Samples in the 8-bit layout Pillow reads: 16-bit rounded to 8 bits; float Lab (L 0..100) as Pillow's
    raw LAB, L scaled to 0..255 and a, b as signed bytes."""
    if samples.dtype == np.uint16:  # round(x / 257) in one SIMD pass; x / 257 is never a tie
        return cv2.convertScaleAbs(samples, alpha=1 / 257).reshape(samples.shape)
    if samples.dtype == np.float32:
        lab = np.empty(samples.shape, np.uint8)
        lab[..., 0] = np.clip(np.rint(samples[..., 0] * 2.55), 0, 255)
        lab[..., 1:] = np.clip(np.rint(samples[..., 1:]), -128, 127).astype(np.int8).view(np.uint8)
        return lab
    return samples
