"""What masters are acceptable and how they are normalised: product policy as settings, not code."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator

from gcis_etl.formats import FORMAT_NAMES
from gcis_etl.settings import Settings

Level = Annotated[int, Field(ge=0, le=255)]  # an 8-bit sample


class ImagingPolicy(Settings):
    """Defaults are the product's policy (see tests/corpus/README.md); every rule can be changed per pipeline."""

    accepted_formats: tuple[str, ...] = ("TIFF", "BigTIFF", "JPEG", "PNG", "JP2", "J2K")
    max_megapixels: float = Field(1000.0, gt=0, description="checked from the header, before decoding")
    multipage: Literal["reject", "first"] = "reject"
    strict: bool = Field(True, description="reject data that decoders only warn about (corrupt JPEG data)")
    rejected_tiff_compressions: dict[int, str] = {6: "obsolete TIFF 'old-style' JPEG compression (6)"}
    reject_dng: bool = True
    alpha: Literal["flatten", "drop"] = "flatten"
    background: tuple[Level, Level, Level] = Field((255, 255, 255), description="sRGB 0..255 that alpha is "
                                                  "flattened onto")
    rendering_intent: Literal["perceptual", "relative", "saturation", "absolute"] = "relative"
    black_point_compensation: bool = Field(
        False, description="LittleCMS black-point compensation (Photoshop's default with relative colorimetric): "
                           "a CMYK master's paper black maps to sRGB black instead of a dark grey; off as tificc "
                           "without -b. Matrix RGB profiles (Adobe RGB, ProPhoto) have a zero black: no change")
    srgb_descriptions: tuple[str, ...] = Field(
        ("sRGB",), description="an embedded profile whose description contains one of these is a candidate for "
                               "sRGB; it passes 8-bit samples through untransformed only if LittleCMS also "
                               "maps an RGB lattice through it to sRGB unchanged (within one level)")
    cmyk_fallback_profile: str = Field("cmyk", description="profile for CMYK without one: 'cmyk' is libvips' built-in, "
                                                        "else the path of an .icc file")
    decoders: dict[str, tuple[Literal["vips", "pillow", "tifffile"], ...]] = {
        "TIFF": ("vips", "pillow", "tifffile"),
        "BigTIFF": ("vips", "tifffile"),
        "JPEG": ("vips", "pillow"),
        "PNG": ("vips", "pillow"),
        "JP2": ("vips", "pillow"),
        "J2K": ("vips", "pillow"),
    }
    vips_decodes_jpeg2000_origin: bool = Field(
        False, description="libvips 8.14 decodes a JPEG 2000 image whose origin is not 0,0 into wrong pixels that "
                           "change from run to run (or crashes): such masters go to the next decoder; true only "
                           "with a libvips that decodes them right")

    @field_validator("accepted_formats", "decoders")
    @classmethod
    def _known_formats(cls, names):
        """Formats are named as sniffing names them ('TIFF', not 'tiff' or 'tif'): another name matches no
        master (accepted_formats' entries, decoders' keys)."""
        unknown = [name for name in names if name not in FORMAT_NAMES]
        if unknown:
            raise ValueError(f"unknown format {', '.join(map(repr, unknown))}: formats are named as they are "
                             f"recognised from content ({', '.join(FORMAT_NAMES)})")
        return names

    @field_validator("decoders")
    @classmethod
    def _decoders_to_try(cls, decoders):
        """A format with no decoder to try would have every master of it rejected, as if unreadable."""
        for name, order in decoders.items():
            if not order or len(set(order)) != len(order):
                raise ValueError(f"{name}: list each decoder at most once, and at least one of them "
                                 f"(got {list(order)})")
        return decoders

    @field_validator("cmyk_fallback_profile")
    @classmethod
    def _profile_exists(cls, value: str) -> str:
        if value != "cmyk" and not Path(value).is_file():  # libvips would fall back to its own, silently
            raise ValueError(f"no such file: {value} ('cmyk' is libvips' built-in profile)")
        return value


class IsolationSettings(Settings):
    """Limits of the child process that decodes and encodes (one bad master must not take down a batch)."""

    timeout_seconds: float = Field(1800, gt=0)
    metadata_timeout_seconds: float = Field(
        300, gt=0, description="time one exiftool command on a master's metadata may take (the read in the "
                               "caller's process, each in the conversion process): past it exiftool is killed "
                               "and that master fails, 'exiftool timed out'")
    memory_limit_mb: int = Field(8192, gt=0, description="address-space limit of the conversion process")
    encoder_memory_limit_mb: int = Field(16384, gt=0, description="resident memory an external JPEG 2000 encoder "
                                                                  "may reach before it is killed")
    max_jobs_per_process: int = Field(200, gt=0, description="recycle the child after this many conversions")
    max_rss_mb: int = Field(2048, gt=0, description="recycle the child when its RSS grows past this")
    vips_concurrency: int = Field(1, ge=1, description="threads a conversion process uses: libvips', and above 1 "
                                                       "the recipe's encode_threads beside the decoder and the "
                                                       "work beside the encoder (exiftool, verification)")
