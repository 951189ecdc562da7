"""Normalise any decoded master to upright, 8-bit, 3-band sRGB through LittleCMS (libvips' icc_* ops).

Grey masters are expanded to sRGB rather than kept grey: every access master then has the same
contract (3 bands, sRGB ICC) for iipsrv, viewers and verification, and the constant chroma of a grey
image costs almost nothing in JPEG.
"""
from __future__ import annotations

import struct
from functools import lru_cache

import numpy as np
import pyvips

from gcis_etl.inspection import applied_intent, encodes_srgb
from gcis_etl.metadata import Resolution
from gcis_etl.models import ImageInfo
from gcis_etl.policy import ImagingPolicy

SRGB = "srgb"  # libvips' built-in sRGB profile (LittleCMS-generated)
_INTENTS = {"perceptual": "perceptual", "relative": "relative", "saturation": "saturation",
            "absolute": "absolute"}
_COLOUR_BANDS = {"cmyk": 4, "b-w": 1, "grey16": 1, "lab": 3, "labs": 3, "labq": 3, "srgb": 3, "rgb": 3,
                 "rgb16": 3, "scrgb": 3, "xyz": 3, "multiband": 3}
LAB = ("lab", "labs", "labq")  # libvips interpretations of Lab samples
_MAX_ALPHA = {"uchar": 255, "char": 127, "ushort": 65535, "short": 32767, "float": 1.0, "double": 1.0}
_D50 = [96.422, 100.0, 82.521]  # the ICC PCS white, which TIFF and ICC Lab are relative to
_BRADFORD_D65_TO_D50 = [[1.047886, 0.022919, -0.050216], [0.029582, 0.990484, -0.017079],
                        [-0.009252, 0.015073, 0.751678]]
# libvips 8.14's icc_export packs float Lab as ICC v2 16-bit Lab (L* x 652.8, a* and b* x 256 + 32768) and has
# LittleCMS read it as v4 (TYPE_Lab_16: L* x 655.35, a* and b* x 257 + 32896): these gains and offsets make the
# one packing land on the other. L* above 65280 / 655.35 = 99.61 does not fit the v2 packing.
_LAB_V2_AS_V4 = ([65535 / 65280, 257 / 256, 257 / 256], [0, 0.5, 0.5])
_LAB_V2_MAX_L = 65280 / 655.35


def srgb_profile() -> bytes:
    """The ICC profile embedded in every access master."""
    return pyvips.Operation.call("profile_load", SRGB)


def orient(image: pyvips.Image, orientation: int) -> pyvips.Image:
    """Apply an EXIF orientation (1-8) so the pixels are upright, and drop the orientation field: libvips
    would otherwise write it into any file saved from the result (the JP2 path's reference TIFF), and a
    reader would turn the upright pixels once more."""
    ops = {2: ("fliphor",), 3: ("rot180",), 4: ("flipver",), 5: ("rot90", "fliphor"), 6: ("rot90",),
           7: ("rot270", "fliphor"), 8: ("rot270",)}.get(orientation, ())
    for op in ops:
        image = image.flip("horizontal") if op == "fliphor" else (
            image.flip("vertical") if op == "flipver" else image.rot(op.replace("rot", "d")))
    if image.get_typeof("orientation"):
        image = image.copy()
        image.remove("orientation")
    return image


def square_pixels(image: pyvips.Image, resolution: tuple[float, float, int] | None) -> pyvips.Image:
    """Non-square pixels (a fax's 204x98 dpi) resampled to square by stretching the lower-resolution axis:
    IIIF's pixels are square, and viewers drew such a master squashed. `resolution`: the upright one
    (ImageInfo.resolution); the output's resolution tags say the higher value (metadata.Resolution.squared)."""
    size = (image.width, image.height)
    width, height = Resolution.of(resolution).square_size(*size) if resolution else size
    return image if (width, height) == size else image.resize(width / image.width, vscale=height / image.height)


def layout(image: pyvips.Image, info: ImageInfo, policy: ImagingPolicy) -> pyvips.Image:
    """The master before colour management, as both PTIFF engines take it: upright, square pixels, unsigned
    samples of at most 16 bits, float kept only where no profile will be applied (RGB, grey without one), alpha
    flattened (or dropped), other extra bands dropped; Lab as float L*, a*, b* (_lab). Pixels are squared last,
    once the samples are uncoded (LabQ) and the alpha flattened."""
    return square_pixels(_samples(orient(image, info.orientation), info, policy), info.resolution)


def _samples(image: pyvips.Image, info: ImageInfo, policy: ImagingPolicy) -> pyvips.Image:
    if image.coding == "labq" or image.interpretation in LAB:
        return _lab(image, info.alpha, policy)
    if image.format in ("char", "short", "int"):
        image = _unsigned(image)
    if image.format == "uint":
        image = _sixteen_bits(image >> 16)
    image = _drop_extra_bands(image, info.alpha, policy)
    if image.format in ("float", "double") and (image.get_typeof("icc-profile-data") or image.interpretation == "cmyk"):
        image = _sixteen_bits(image.linear(65535, 0.5))  # 0..1 onto 0..65535, rounded
    return image


def normalise(image: pyvips.Image, info: ImageInfo, policy: ImagingPolicy) -> pyvips.Image:
    """Upright 8-bit sRGB, alpha flattened (or dropped), extra bands dropped, with no profile attached."""
    image = _to_srgb(layout(image, info, policy), policy)
    if image.bands == 1:
        image = image.bandjoin([image, image])
    if image.format != "uchar":
        image = image.cast("uchar")
    image = image.copy(interpretation="srgb")
    if image.get_typeof("icc-profile-data"):
        image = image.copy()
        image.remove("icc-profile-data")
    return image


def _unsigned(image: pyvips.Image) -> pyvips.Image:
    """Signed samples are offset to the unsigned range (two's-complement midpoint becomes mid-grey). libvips
    reads 16-bit signed RGB as 'srgb', its 8-bit space: left so, the 16-bit samples were cast to 8 bits
    unscaled (clipped: a white access master), so 16-bit ones take the 16-bit spaces (_sixteen_bits)."""
    offset, target = {"char": (128, "uchar"), "short": (32768, "ushort"), "int": (2 ** 31, "uint")}[image.format]
    unsigned = (image + offset).cast(target).copy(interpretation=image.interpretation)
    return _sixteen_bits(unsigned) if target == "ushort" else unsigned


def _sixteen_bits(samples: pyvips.Image) -> pyvips.Image:
    """Samples already on the 16-bit scale, cast (clipped) to ushort and labelled as libvips' 16-bit spaces.

    uint32 keeps its top 16 bits: libvips' colour operations scale 8- and 16-bit samples to 8 bits but clip
    32-bit integers to 0..255. Float samples (0..1, as TIFF writers such as tifffile and ImageMagick hold them)
    meet a profile as 16 bits: libvips' icc_transform reads float on its 0..255 scale (a 0..1 RGB master came
    out black, a CMYK one white, with no profile embedded too: CMYK always meets one, embedded or the fallback)
    and Pillow ImageCms has no float mode. Float RGB or grey without a profile stays linear scRGB."""
    interpretation = {"b-w": "grey16", "srgb": "rgb16", "scrgb": "rgb16"}.get(samples.interpretation,
                                                                              samples.interpretation)
    return samples.cast("ushort").copy(interpretation=interpretation)


def _drop_extra_bands(image: pyvips.Image, alpha: bool, policy: ImagingPolicy) -> pyvips.Image:
    """Only a band the master declares alpha (inspection: TIFF ExtraSamples 1 or 2, PNG alpha or tRNS, JP2
    RGBA) is flattened: an unspecified one (a scanner's infrared channel) is data, and is dropped."""
    colour = _COLOUR_BANDS.get(image.interpretation, 3)
    if image.coding != "none" or image.bands <= colour:
        return image
    if not (alpha and policy.alpha == "flatten"):
        return image[:colour]
    max_alpha = _MAX_ALPHA.get(image.format, 255)
    if image.interpretation == "cmyk":
        background = [0] * colour  # paper white in CMYK
    else:
        background = [c * max_alpha / 255 for c in policy.background][:colour] if colour > 1 \
            else [policy.background[0] * max_alpha / 255]
    return _flatten(image[:colour + 1], background, max_alpha).copy(interpretation=image.interpretation)


def _flatten(image: pyvips.Image, background: list[float], max_alpha: float) -> pyvips.Image:
    """Colour over the background by its alpha, rounded: libvips flattens integer samples in integers and
    truncates (half a level darker on average, as much as 1.5 sRGB levels through a CMYK profile)."""
    flat = image.cast("float").flatten(background=background, max_alpha=max_alpha)
    return flat if image.format in ("float", "double") else (flat + 0.5).cast(image.format)


def _lab(image: pyvips.Image, alpha: bool, policy: ImagingPolicy) -> pyvips.Image:
    """Float L*, a*, b* (D50) with the alpha flattened on the background's Lab (or dropped): the one form both
    engines transform. libvips decodes TIFF Lab three ways: 8-bit CIELab as LabQ, whose 10-bit L* reads 255 as
    99.7 (the TIFF's bytes are taken here as they are); with an alpha, 8- and 16-bit CIELab as LabS, the alpha's
    unsigned 16 bits in a signed band (255 -> 65535 -> -1: flattened as such, the picture came out one flat
    colour); ICCLab as float Lab with a 0..1 alpha (decoding._icc_lab)."""
    if image.coding == "labq":
        raw = image.copy(coding="none")  # L* 0..255, signed a*, b*, and a byte of lower bits libvips leaves 0
        return raw[0].linear(100 / 255, 0).bandjoin(raw[1:3].copy(format="char").cast("float")).copy(
            interpretation="lab")
    lab = image[:3].copy(interpretation=image.interpretation).colourspace("lab")
    if image.bands == 3 or not (alpha and policy.alpha == "flatten"):
        return lab
    opacity = image[3].copy(format="ushort").linear(1 / 65535, 0) if image.format == "short" else image[3]
    return _flatten(lab.bandjoin(opacity), _lab_of(policy.background), 1.0).copy(interpretation="lab")


def _lab_of(srgb: tuple[int, int, int]) -> list[float]:
    """An sRGB colour as D50 Lab: libvips' sRGB -> XYZ is D65-relative, adapted to D50 as ICC profiles are
    (Bradford), so white is L* 100, a* = b* = 0."""
    xyz = pyvips.Image.new_from_array([list(srgb)]).cast("uchar").bandfold().copy(interpretation="srgb") \
        .colourspace("xyz").recomb(pyvips.Image.new_from_array(_BRADFORD_D65_TO_D50))
    return list(xyz.copy(interpretation="xyz").XYZ2Lab(temp=_D50)(0, 0))


def _to_srgb(image: pyvips.Image, policy: ImagingPolicy) -> pyvips.Image:
    cms = dict(intent=_INTENTS[policy.rendering_intent], black_point_compensation=policy.black_point_compensation,
               depth=8)
    interpretation = image.interpretation
    if interpretation in LAB:  # float Lab (_lab): an embedded Lab profile would take them as device values
        return _lab_to_srgb(image, cms)
    embedded = image.get_typeof("icc-profile-data") != 0
    if embedded and not is_srgb(image, policy):
        cms["intent"] = _INTENTS[applied_intent(image.get("icc-profile-data"), policy.rendering_intent)]
        return image.icc_transform(SRGB, embedded=True, **cms)
    if interpretation == "cmyk":
        return image.icc_transform(SRGB, input_profile=policy.cmyk_fallback_profile, **cms)
    if interpretation in ("srgb", "rgb") and image.format == "uchar":
        return image
    if image.format in ("float", "double") and image.bands == 1:
        image = image.bandjoin([image, image]).copy(interpretation="scrgb")  # linear 0..1, as float RGB is
    if interpretation in ("multiband",) or image.bands not in (1, 3):
        image = image[:3] if image.bands >= 3 else image[0]
    return image.colourspace("srgb")


def _lab_to_srgb(lab: pyvips.Image, cms: dict) -> pyvips.Image:
    """D50 Lab through LittleCMS as tificc transforms it: handed to icc_export packed so that LittleCMS reads
    the L*, a*, b* given (_LAB_V2_AS_V4; as libvips packs it, the result was a mean CIEDE2000 0.58 off tificc,
    darker and greener, white 253, 254, 254). The near-whites that packing cannot carry (L* > 99.61, which
    it clamped to a grey 253) take the output profile's own matrix and curves (_by_matrix) instead."""
    if (pyvips.version(0), pyvips.version(1)) >= (8, 15):  # Lab goes to LittleCMS as float there (libvips #3373)
        return lab.icc_export(output_profile=SRGB, **cms)
    exported = lab.linear(*_LAB_V2_AS_V4).copy(interpretation="lab").icc_export(output_profile=SRGB, **cms)
    return (lab[0] > _LAB_V2_MAX_L).ifthenelse(_by_matrix(lab), exported)


def _by_matrix(lab: pyvips.Image) -> pyvips.Image:
    """D50 Lab -> XYZ -> linear RGB by the inverse of the sRGB profile's D50 colorant matrix -> its tone curve,
    each channel clipped to 0..1 first, as LittleCMS applies a matrix/TRC output profile (every intent alike)."""
    colorants, inverse_curve = _matrix_shaper()
    linear = lab.Lab2XYZ(temp=_D50).recomb(pyvips.Image.new_from_array(np.linalg.inv(colorants) / 100))
    return linear.linear(65535, 0.5).cast("ushort").maplut(inverse_curve).copy(interpretation="srgb")


@lru_cache(maxsize=1)
def _matrix_shaper() -> tuple[np.ndarray, pyvips.Image]:
    """The sRGB profile's colorants (XYZ = M x linear RGB) and a 16-bit linear -> 8-bit encoded table that
    inverts its tone curve (a 'curv' table, shared by the three channels), read from the profile itself."""
    profile = srgb_profile()
    count = struct.unpack(">I", profile[128:132])[0]
    tags = {}
    for entry in range(132, 132 + 12 * count, 12):
        signature, offset, size = struct.unpack(">4sII", profile[entry:entry + 12])
        tags[signature] = profile[offset:offset + size]
    colorants = np.array([struct.unpack(">3i", tags[t][8:20]) for t in (b"rXYZ", b"gXYZ", b"bXYZ")]).T / 65536
    points = struct.unpack(">I", tags[b"rTRC"][8:12])[0]
    curve = np.array(struct.unpack(f">{points}H", tags[b"rTRC"][12:12 + 2 * points])) / 65535
    encoded = np.interp(np.arange(65536) / 65535, curve, np.linspace(0, 1, points))
    table = pyvips.Image.new_from_array(np.rint(encoded * 255).astype(np.uint8)[None, :])
    return colorants, table


def is_srgb(image: pyvips.Image, policy: ImagingPolicy) -> bool:
    """8-bit samples with an embedded profile that encodes sRGB (inspection.encodes_srgb): no transform is
    needed, and inspection gives the same verdict from the header."""
    return image.format == "uchar" and encodes_srgb(image.get("icc-profile-data"), policy)
