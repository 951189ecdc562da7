"""Inspect and validate a master from its header alone: format, geometry, colour, pages, metadata, verdict.

Nothing here decodes pixels or touches libvips, so it is safe in any process (the parent of a worker
pool included) and fast on an 800 Mpx master. Corrupt pixel data is caught later, when the isolated
conversion process decodes with strict settings.
"""
from __future__ import annotations

import io
import logging
import re
import struct
import threading
import zlib
from contextlib import contextmanager
from dataclasses import astuple, dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import BinaryIO, Iterator

import numpy as np
from PIL import Image, ImageCms

from gcis_etl import formats
from gcis_etl.errors import RejectedMaster
from gcis_etl.metadata import MetadataSummary, Resolution, summarise
from gcis_etl.models import ImageInfo, Verdict
from gcis_etl.policy import ImagingPolicy, IsolationSettings

Image.MAX_IMAGE_PIXELS = None  # our own limit applies, from the header, before any decoding

_ICC_SPACE = {"rgb": "RGB", "grey": "GRAY", "bilevel": "GRAY", "cmyk": "CMYK", "lab": "LAB", "ycbcr": "RGB"}


class _Unreadable(Exception):
    """The header cannot be parsed: the file is corrupt or not what its signature claims."""


class _Unsupported(_Unreadable):
    """The header is read, and describes pixels no decoder here converts: the file may well be sound."""


@dataclass
class _Header:
    width: int
    height: int
    bands: int
    bit_depth: int
    interpretation: str
    sample_format: str = "uint"
    icc: bytes | None = None
    pages: int = 1
    compression: str | None = None
    compression_code: int | None = None
    alpha: bool = False
    extra_bands: int = 0
    whole_slide: bool = False
    dng: bool = False
    jpeg_process: str | None = None
    miniswhite: bool = False
    first_not_image: str | None = None  # TIFF: what the first IFD is when not the image (NewSubfileType)
    data_end: int = 0   # TIFF: where the image data runs to by the header, when the file is shorter (else 0)
    file_size: int = 0
    notes: list[str] = field(default_factory=list)


def inspect(path: str | Path, policy: ImagingPolicy | None = None,
            limits: IsolationSettings | None = None) -> ImageInfo:
    """Describe a master and give the policy's verdict, without decoding its pixels. The path is made absolute:
    the description (and a conversion child reusing it) must name the same file whatever the cwd becomes.
    exiftool reads its metadata here, in the caller's process, held to the isolation `limits` (the defaults when
    None): metadata inflating past them (a PNG's zTXt bomb) raises ConversionFailed, this master's failure. Raises
    OSError when there is no file to read (a missing file, a folder), where convert() answers FAILED. Only the
    header is read: `gcis-etl inspect` also decodes every pixel, which is check_decoding()."""
    policy = policy or ImagingPolicy()
    path = str(Path(path).absolute())
    fmt = formats.sniff(path)  # a FIFO or device raises OSError, as a folder does
    if fmt == "empty":
        return _reject(path, fmt, "zero-byte file (an interrupted upload or copy?)")
    warnings = [w for w in [formats.extension_mismatch(path, fmt)] if w]
    if fmt == "unknown":
        return _reject(path, fmt, "not an image: unrecognised content", warnings)
    if fmt not in policy.accepted_formats:
        what = "not an image" if fmt in ("OGG", "PDF", "RIFF") else "not an accepted master format"
        return _reject(path, fmt, f"{fmt}: {what}", warnings)
    try:
        header = _READERS[fmt](path)
    except _Unsupported as exc:
        return _reject(path, fmt, f"unsupported {fmt}: {exc}", warnings)
    except _Unreadable as exc:
        return _reject(path, fmt, f"corrupt or truncated {fmt} header: {exc}", warnings)
    if header.dng:
        fmt = "DNG"
    md = summarise(path, limits or IsolationSettings())
    info = ImageInfo(
        path=path, format=fmt, width=header.width, height=header.height, bands=header.bands,
        bit_depth=header.bit_depth, sample_format=header.sample_format, interpretation=header.interpretation,
        pages=header.pages, exif=md.exif, xmp=md.xmp, iptc=md.iptc,
        orientation=md.orientation or 1, alpha=header.alpha, extra_bands=header.extra_bands,
        compression=header.compression, whole_slide=header.whole_slide,
        resolution=astuple(md.resolution) if md.resolution else None)
    if md.orientation_invalid is not None:
        warnings.append(f"orientation {md.orientation_invalid!r} is not a valid EXIF orientation: ignored")
    if header.icc is None and header.interpretation in ("rgb", "ycbcr") and (said := _exif_adobe_rgb(md)):
        warnings.append(f"no embedded ICC profile; EXIF says Adobe RGB ({said}): converted as sRGB")
    return _judge(info, header, policy, warnings)


def _exif_adobe_rgb(md: MetadataSummary) -> str | None:
    """The EXIF tags that say an untagged master is Adobe RGB, as cameras in their Adobe RGB mode write them (DCF:
    ColorSpace Uncalibrated with InteropIndex R03; some write ColorSpace 2), or None. Its samples are taken as
    sRGB (mean CIEDE2000 2.2 on a photograph), and the access master's EXIF says sRGB: the warning keeps the
    evidence."""
    if md.colour_space == 0xFFFF and md.interop_index == "R03":
        return "ColorSpace Uncalibrated, InteropIndex R03"
    if md.colour_space == 2:
        return "ColorSpace 2"
    return None


def _non_square(resolution: Resolution) -> str:
    """The note on a master whose pixels are not square: IIIF's pixels are, and viewers drew such a master (a
    fax's 204x98 dpi page) squashed, so the conversion stretches its lower-resolution axis (colour.square_pixels)."""
    unit = {2: " dpi", 3: " pixels per cm"}.get(resolution.unit, " (no unit)")
    return f"non-square pixels {resolution.x:g}x{resolution.y:g}{unit}: resampled to square"


def _judge(info: ImageInfo, h: _Header, policy: ImagingPolicy, warnings: list[str]) -> ImageInfo:
    rejects: list[str] = []
    conversions: list[str] = []
    if h.data_end:
        rejects.append(f"truncated: image data runs to {h.data_end:,} bytes, the file has {h.file_size:,} "
                       "(an interrupted upload?)")
    resolution = Resolution.of(info.resolution)
    # info.resolution is the upright one; turned back (each turn is its own inverse), it squares the stored frame
    square = (resolution.upright(info.orientation).square_size(info.width, info.height) if resolution
              else (info.width, info.height))
    megapixels = square[0] * square[1] / 1e6
    if megapixels > policy.max_megapixels:
        squared = "" if square == (info.width, info.height) else f" (with square pixels {square[0]}x{square[1]})"
        rejects.append(f"{info.width}x{info.height}{squared} = {megapixels:,.6g} Mpx is over the "
                       f"{policy.max_megapixels:,.6g} Mpx limit (refused from the header, before decoding)")
    if h.dng and policy.reject_dng:
        rejects.append("camera raw (DNG) is not an accepted master format")
    if h.compression_code in policy.rejected_tiff_compressions:
        rejects.append(policy.rejected_tiff_compressions[h.compression_code])
    if h.jpeg_process:
        rejects.append(f"{h.jpeg_process} JPEG process is not supported by the decoders")
    if h.first_not_image:
        rejects.append(h.first_not_image)
    if h.pages > 1:
        if policy.multipage == "reject":
            rejects.append(f"{h.pages} full-resolution pages: ambiguous master (policy multipage=reject)")
        else:
            warnings.append(f"{h.pages} full-resolution pages: the first is used (policy multipage=first)")
    icc_desc = None
    if h.icc is not None:
        icc_desc, problem = _check_icc(h.icc, h.interpretation, policy.rendering_intent)
        if problem:
            rejects.append(problem)
    if h.whole_slide:
        conversions.append("main image of a whole-slide file")
    if h.interpretation == "cmyk":
        conversions.append("CMYK->sRGB")
        if h.icc is None:
            warnings.append(f"no embedded ICC profile: CMYK converted through "
                            f"{fallback_description(policy.cmyk_fallback_profile)} (imaging.cmyk_fallback_profile)")
    elif h.interpretation == "lab":
        conversions.append("Lab->sRGB")
    elif h.interpretation == "ycbcr":
        conversions.append("YCbCr->RGB")
    elif h.interpretation == "palette":
        conversions.append("expand palette")
    if icc_desc and h.interpretation != "lab" and not encodes_srgb(h.icc, policy):  # Lab ignores its profile
        conversions.append(f"ICC->sRGB ({icc_desc})")
        intent = input_intent(h.icc, policy.rendering_intent)
        if intent not in (None, policy.rendering_intent):  # None: rejected (_check_icc)
            warnings.append(f"ICC profile '{icc_desc}' has no {policy.rendering_intent} rendering intent: "
                            f"converted with its {intent} one, as LittleCMS does")
    if h.miniswhite:
        conversions.append("invert min-is-white")
    if h.bit_depth != 8 or h.sample_format != "uint":
        suffix = {"float": "f", "int": "s"}.get(h.sample_format, "")
        conversions.append(f"bit depth {h.bit_depth}{suffix}->8")
    if h.extra_bands:
        conversions.append(f"{policy.alpha} alpha/extra samples" if h.alpha else "drop extra samples")
    if info.orientation != 1:
        conversions.append(f"apply orientation {info.orientation}")
    if resolution and not resolution.square:
        conversions.append("resample to square pixels")
        warnings.append(_non_square(resolution))
    warnings.extend(h.notes)
    if rejects:
        verdict, reasons = Verdict.REJECT, rejects
    elif conversions:
        verdict, reasons = Verdict.ACCEPT_AFTER_CONVERSION, conversions
    else:
        verdict, reasons = Verdict.ACCEPT, []
    return replace(info, icc=icc_desc, verdict=verdict, reasons=tuple(reasons), warnings=tuple(warnings))


def _check_icc(icc: bytes, interpretation: str, intent: str) -> tuple[str | None, str | None]:
    """The profile's description, and a rejection reason when it is corrupt, of the wrong colour space, or
    one LittleCMS builds no transform from (opened, but cut short or with a tag it cannot read: libvips dropped
    it and took the samples as sRGB while the result said 'ICC->sRGB'). Lab samples ignore their profile."""
    try:
        profile = ImageCms.ImageCmsProfile(io.BytesIO(icc))
    except (OSError, ValueError, TypeError) as exc:
        return None, f"embedded ICC profile is corrupt ({len(icc)} bytes: {exc}): needs review"
    description = _description(profile)
    space = profile.profile.xcolor_space.strip().upper()
    expected = _ICC_SPACE.get(interpretation)
    if expected and space != expected:
        return description, (f"embedded ICC profile '{description}' is for {space} but the pixels are "
                             f"{interpretation}: needs review")
    if interpretation != "lab" and input_intent(icc, intent) is None:
        return description, _unusable_profile(icc)
    return description, None


def _description(profile: ImageCms.ImageCmsProfile) -> str:
    return (ImageCms.getProfileDescription(profile) or "").strip() or "unnamed profile"


def _unusable_profile(icc: bytes) -> str:
    """The rejection of a master whose embedded profile LittleCMS builds no transform from (input_intent None),
    in inspection's verdict and from either engine, should one meet it (applied_intent)."""
    description = _description(ImageCms.ImageCmsProfile(io.BytesIO(icc)))
    return (f"embedded ICC profile '{description}' cannot be applied (LittleCMS builds no transform from it: "
            "damaged or incomplete): needs review")


LIBVIPS_CMYK = "Chemical proof"  # the description of libvips' built-in CMYK profile, which inspection does not load


@lru_cache(maxsize=8)
def fallback_description(setting: str) -> str:
    """What imaging.cmyk_fallback_profile converts CMYK without a profile through, named for the master's warning:
    untagged CMYK has no one right colour, and libvips' built-in ('cmyk') puts a bluish cast in rich blacks,
    where print masters usually assume Coated FOGRA39 or SWOP."""
    if setting == "cmyk":
        return f"libvips' built-in '{LIBVIPS_CMYK}'"
    try:
        return f"'{_description(ImageCms.ImageCmsProfile(setting))}'"
    except (OSError, ValueError, TypeError):
        return setting


def encodes_srgb(icc: bytes, policy: ImagingPolicy) -> bool:
    """Whether an embedded profile is sRGB, so that 8-bit samples pass through untransformed.

    A description naming sRGB (policy.srgb_descriptions) is only a prefilter: "GIMP built-in Linear sRGB"
    has sRGB's primaries but a linear tone curve. The profile must also map a lattice of RGB colours to
    LittleCMS's sRGB unchanged within one level (relative colorimetric with black-point compensation, so
    that v4 sRGB profiles, whose black sits above v2's, still count)."""
    return _encodes_srgb(icc, policy.srgb_descriptions)


_ICC_INTENTS = {"perceptual": ImageCms.Intent.PERCEPTUAL, "relative": ImageCms.Intent.RELATIVE_COLORIMETRIC,
                "saturation": ImageCms.Intent.SATURATION, "absolute": ImageCms.Intent.ABSOLUTE_COLORIMETRIC}


# The Pillow mode a profile's colour space is transformed from, to test that LittleCMS builds a transform
_TEST_MODES = {"RGB": "RGB", "GRAY": "L", "CMYK": "CMYK"}


@lru_cache(maxsize=64)
def input_intent(icc: bytes, intent: str) -> str | None:
    """The rendering intent an embedded profile is applied with: the policy's when the profile supports it as
    input, else perceptual, as LittleCMS itself falls back (a LUT profile may hold only its A2B0 table).
    libvips' icc_transform drops a profile without the intent asked instead, and passed the pixels through
    unconverted. None when LittleCMS builds no transform to sRGB from it with either (a profile cut short,
    or a tag it cannot read, still opens): no engine can apply it. Cached: it runs for every master."""
    try:
        profile = ImageCms.ImageCmsProfile(io.BytesIO(icc))
    except (OSError, ValueError, TypeError):
        return intent  # unreadable: rejected by inspection as corrupt, or ignored by the engines as before
    for candidate in dict.fromkeys((intent, "perceptual")):
        if profile.profile.is_intent_supported(_ICC_INTENTS[candidate], ImageCms.Direction.INPUT) \
                and _links(profile, candidate):
            return candidate
    return None


def applied_intent(icc: bytes, intent: str) -> str:
    """input_intent, for an engine about to apply the profile: RejectedMaster where there is none (inspection
    rejects such a master first), rather than let libvips drop the profile (the samples taken as sRGB, a warning on
    the child's stderr) or ImageCms raise PyCMSError out of the conversion."""
    applied = input_intent(icc, intent)
    if applied is None:
        raise RejectedMaster(_unusable_profile(icc))
    return applied


def _links(profile: ImageCms.ImageCmsProfile, intent: str) -> bool:
    """Whether LittleCMS builds a transform from the profile to sRGB with this intent; a colour space no
    engine here transforms from (Lab's, which its samples ignore) is left to the colour-space check."""
    mode = _TEST_MODES.get(profile.profile.xcolor_space.strip().upper())
    if mode is None:
        return True
    try:
        ImageCms.buildTransform(profile, ImageCms.createProfile("sRGB"), mode, "RGB",
                                renderingIntent=_ICC_INTENTS[intent])
    except ImageCms.PyCMSError:
        return False
    return True


_LATTICE = np.stack(np.meshgrid(*[np.linspace(0, 255, 17).round().astype(np.uint8)] * 3, indexing="ij"),
                    axis=-1).reshape(1, -1, 3)


@lru_cache(maxsize=64)
def _encodes_srgb(icc: bytes, descriptions: tuple[str, ...]) -> bool:
    try:
        profile = ImageCms.ImageCmsProfile(io.BytesIO(icc))
        description = ImageCms.getProfileDescription(profile) or ""
        if profile.profile.xcolor_space.strip() != "RGB" or not any(s in description for s in descriptions):
            return False
        transform = ImageCms.buildTransform(profile, ImageCms.createProfile("sRGB"), "RGB", "RGB",
                                            renderingIntent=ImageCms.Intent.RELATIVE_COLORIMETRIC,
                                            flags=ImageCms.Flags.BLACKPOINTCOMPENSATION)
        mapped = np.asarray(ImageCms.applyTransform(Image.fromarray(_LATTICE), transform))
    except (OSError, ValueError, TypeError, ImageCms.PyCMSError):
        return False
    return int(np.abs(mapped.astype(np.int16) - _LATTICE).max()) <= 1


def _reject(path: str, fmt: str, reason: str, warnings: list[str] | None = None) -> ImageInfo:
    return ImageInfo(path=path, format=fmt, verdict=Verdict.REJECT, reasons=(reason,),
                     warnings=tuple(warnings or ()))


_collecting = threading.local()  # the complaints list of a thread inside tifffile_complaints()


def _collect(record: logging.LogRecord) -> bool:
    """tifffile's logger filter, in the thread that logs: a record is kept for that thread's tifffile_complaints()
    when one is open, and passes on otherwise. One filter for good: adding and removing filters, or turning
    propagation off, per read would change the logger under other threads' reads."""
    complaints = getattr(_collecting, "complaints", None)
    if complaints is None:
        return True
    complaints.append(plain_complaint(record.getMessage()))
    return False


logging.getLogger("tifffile").addFilter(_collect)


@contextmanager
def tifffile_complaints() -> Iterator[list[str]]:
    """What tifffile logs in this thread meanwhile (what it skips in a damaged file and reads on), in plain
    words, collected as this file's findings instead of reaching the log or stderr."""
    outer = getattr(_collecting, "complaints", None)
    _collecting.complaints = complaints = []
    try:
        yield complaints
    finally:
        _collecting.complaints = outer


_REPR = re.compile(r"<[^<>]*>\s*")  # tifffile's object reprs: "<tifffile.TiffPages @135262> "
_RAISED = re.compile(r"raised \w+\((['\"])(.*)\1\)")  # "raised TiffFileError('...')"


def plain_complaint(message: str) -> str:
    return _RAISED.sub(r"\2", _REPR.sub("", message)).strip()


def structure_warning(complaint: str) -> str:
    """A master's warning for what tifffile said of its file (by inspection, or by a decoder reading it)."""
    return f"TIFF structure: {complaint}"


def _read_tiff(path: str) -> _Header:
    with tifffile_complaints() as complaints:
        try:
            header = _read_tiff_tags(path)
        except _Unreadable as exc:  # what tifffile skipped says why (a first directory past the end: cut short)
            raise type(exc)("; ".join(dict.fromkeys([*complaints, str(exc)]))) from None
    header.notes.extend(structure_warning(m) for m in complaints)
    return header


def _bit_depth(bits: int | tuple[int, ...]) -> int:
    """One depth for every band: tifffile gives a tuple where they differ (RGB 5-6-5, a damaged tag), which no
    decoder here converts."""
    if isinstance(bits, tuple):
        raise _Unsupported(f"its bands have different bit depths {bits} (packed RGB such as 5-6-5, or a damaged "
                           f"BitsPerSample tag), which no decoder here converts")
    return int(bits)


def _read_tiff_tags(path: str) -> _Header:
    import tifffile
    try:
        with tifffile.TiffFile(path) as tf:
            pages = list(tf.pages)
            if not pages:
                raise _Unreadable(f"no image directory in its {tf.filehandle.size} bytes")
            p = pages[0]
            whole_slide = any(getattr(tf, f"is_{k}", False) for k in ("svs", "ndpi", "scn", "bif", "philips"))
            full_res = 1 if whole_slide else sum(1 for q in pages if _is_image(q))
            tags = p.tags
            photometric = int(p.photometric)
            extrasamples = tuple(int(e) for e in (p.extrasamples or ()))
            icc_tag = tags.get(34675)
            header = _Header(
                width=p.imagewidth, height=p.imagelength, bands=p.samplesperpixel,
                bit_depth=_bit_depth(p.bitspersample),
                sample_format={1: "uint", 2: "int", 3: "float"}.get(int(p.sampleformat), "uint"),
                interpretation=_TIFF_PHOTOMETRIC.get(photometric, "multiband"),
                icc=bytes(icc_tag.value) if icc_tag is not None else None,
                pages=full_res, compression=tifffile.COMPRESSION(p.compression).name
                if p.compression in iter(tifffile.COMPRESSION) else str(p.compression),
                compression_code=int(p.compression), extra_bands=len(extrasamples),
                alpha=bool(extrasamples) and extrasamples[0] in (1, 2), whole_slide=whole_slide,
                dng=50706 in tags, miniswhite=photometric == 0, first_not_image=_not_the_image(p, pages),
                data_end=_data_end(pages, tf.filehandle.size), file_size=tf.filehandle.size)
    except (tifffile.TiffFileError, ValueError, IndexError, struct.error, OSError) as exc:
        raise _Unreadable(str(exc)) from None
    if header.interpretation == "ycbcr" and header.compression_code in (6, 7):
        header.interpretation = "rgb"  # JPEG-in-TIFF YCbCr is ordinary RGB once decoded
    if header.interpretation in ("grey", "bilevel") and header.bit_depth == 1:
        header.interpretation = "bilevel"
    if header.interpretation == "rgb" and header.bands > 3:
        header.extra_bands = header.extra_bands or header.bands - 3
    return header


def _data_end(pages: list, file_size: int) -> int:
    """Where the image data runs to by the header, when the file is shorter (else 0). A writer that puts the
    IFDs first (tifffile, Photoshop) leaves a readable header in a half-uploaded file: the decoder would read
    up to the cut (20-30 s on 1.5 GB) before failing, where the header alone shows it."""
    end = max((offset + count for page in pages for offset, count in zip(page.dataoffsets, page.databytecounts)),
              default=0)
    return end if end > file_size else 0


# NewSubfileType bits of an IFD that is not another image: reduced resolution (1), transparency mask (4)
_NOT_A_PAGE = 1 | 4


def _is_image(page) -> bool:
    return not int(page.subfiletype) & _NOT_A_PAGE


def _not_the_image(first, pages: list) -> str | None:
    """Why the first IFD cannot stand for the master, or None. Every decoder reads the first IFD: when a
    writer put a reduced-resolution copy (a preview) or a transparency mask there, the access master would be
    made of it, and verified, since verification compares it with the same decode."""
    if _is_image(first):
        return None
    kind = int(first.subfiletype)
    what = "a reduced-resolution copy" if kind & 1 else "a transparency mask"
    full = next((n for n, page in enumerate(pages) if _is_image(page)), None)
    where = (f"the full image is IFD {full} ({pages[full].imagewidth}x{pages[full].imagelength})"
             if full is not None else "no IFD holds the full image")
    return (f"the first TIFF IFD is {what} (NewSubfileType {kind}, {first.imagewidth}x{first.imagelength}); "
            f"{where}: re-save the master with the full image first")


_TIFF_PHOTOMETRIC = {0: "grey", 1: "grey", 2: "rgb", 3: "palette", 5: "cmyk", 6: "ycbcr", 8: "lab", 9: "lab",
                     10: "lab", 32844: "lab", 32845: "lab"}


def _read_jpeg(path: str) -> _Header:
    process, bits, components, w, h = _jpeg_frame(path)
    try:
        with Image.open(path) as im:
            icc = im.info.get("icc_profile")
    except (OSError, SyntaxError, ValueError) as exc:
        raise _Unreadable(str(exc)) from None
    interpretation = {1: "grey", 3: "rgb", 4: "cmyk"}.get(components, "multiband")
    unsupported = None
    if process == "lossless":
        unsupported = "lossless"
    elif bits != 8:
        unsupported = f"{bits}-bit"
    return _Header(width=w, height=h, bands=components, bit_depth=8 if unsupported else bits,
                   interpretation=interpretation, icc=icc, compression=f"JPEG {process}",
                   jpeg_process=unsupported)


def _jpeg_frame(path: str) -> tuple[str, int, int, int, int]:
    """Walk the JPEG markers to the frame header: (process, precision, components, width, height). Segment by
    segment, reading each marker and length and seeking past the rest, to the end of the file if need be:
    extended XMP and a chained ICC profile put megabytes of APP segments before it in valid masters."""
    with open(path, "rb") as f:
        pos = 2
        while len(head := _read_at(f, pos, 4)) == 4:
            if head[0] != 0xFF:
                raise _Unreadable(f"no JPEG marker at byte {pos}")
            marker = head[1]
            if marker == 0xFF:
                pos += 1
                continue
            (length,) = struct.unpack(">H", head[2:4])
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                frame = f.read(6)
                if len(frame) < 6:
                    break
                bits, height, width, components = struct.unpack(">BHHB", frame)
                if width == 0 or height == 0:
                    raise _Unreadable(f"frame header declares {width}x{height}")
                process = {0xC3: "lossless", 0xC7: "lossless", 0xCB: "lossless", 0xCF: "lossless",
                           0xC2: "progressive", 0xC6: "progressive", 0xCA: "progressive", 0xCE: "progressive"}
                return process.get(marker, "baseline"), bits, components, width, height
            if marker == 0xDA:
                break
            pos += 2 + length
    raise _Unreadable("no frame header (SOF) found")


def _read_at(f: BinaryIO, offset: int, size: int) -> bytes:
    f.seek(offset)
    return f.read(size)


_PNG_PROFILE_LIMIT = 64 << 20  # an iCCP chunk inflating past this holds no ICC profile (Pillow's cap: 1 MB)


def _read_png(path: str) -> _Header:
    """IHDR and what precedes the image data: the ICC profile (iCCP) and transparency (tRNS). Not by Pillow,
    which inflates every text chunk on the way and refused a valid master whose XMP inflates past 1 MB
    (MAX_TEXT_CHUNK) as corrupt, and a metadata bomb before exiftool could judge it under the isolation limits:
    text is metadata, exiftool's to read."""
    chunks = _png_chunks(path, keep=(b"IHDR", b"iCCP", b"gAMA", b"cHRM"))
    width, height, depth, colour_type = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    if width == 0 or height == 0:
        raise _Unreadable(f"IHDR declares {width}x{height}")
    bands, interpretation = {0: (1, "grey"), 2: (3, "rgb"), 3: (1, "palette"), 4: (2, "grey"),
                             6: (4, "rgb")}.get(colour_type, (0, "multiband"))
    # a tRNS chunk: the decoders give the image an alpha band
    alpha = colour_type in (4, 6) or b"tRNS" in chunks
    icc = _png_profile(chunks[b"iCCP"]) if b"iCCP" in chunks else None
    notes = [] if b"iCCP" in chunks or b"sRGB" in chunks else _png_colour_notes(chunks)
    return _Header(width=width, height=height, bands=bands, bit_depth=depth, interpretation=interpretation,
                   icc=icc, alpha=alpha, extra_bands=int(alpha), compression="deflate", notes=notes)


_SRGB_GAMMA = 45455  # gAMA's value for sRGB (1/2.2, x 100000)
_SRGB_CHROMATICITIES = (31270, 32900, 64000, 33000, 30000, 60000, 15000, 6000)  # cHRM's: white, red, green, blue


def _png_colour_notes(chunks: dict[bytes, bytes]) -> list[str]:
    """A warning when gAMA or cHRM describe other samples than sRGB's (linear light, Adobe RGB primaries) with
    no iCCP or sRGB chunk to say otherwise: no decoder here applies them, and the samples are taken as sRGB.
    gAMA within 1% and chromaticities within 0.01 of sRGB's pass, as writers round them."""
    found = []
    if len(gama := chunks.get(b"gAMA", b"")) == 4:
        (gamma,) = struct.unpack(">I", gama)
        if abs(gamma - _SRGB_GAMMA) > _SRGB_GAMMA / 100:
            found.append(f"gAMA {gamma / 100000:g} (sRGB's is 0.45455)")
    if len(chrm := chunks.get(b"cHRM", b"")) == 32:
        if any(abs(a - b) > 1000 for a, b in zip(struct.unpack(">8I", chrm), _SRGB_CHROMATICITIES)):
            found.append("cHRM chromaticities other than sRGB's")
    return [f"PNG {' and '.join(found)} with no iCCP or sRGB chunk: not applied, the samples taken as sRGB"] \
        if found else []


def _png_chunks(path: str, keep: tuple[bytes, ...]) -> dict[bytes, bytes]:
    """The chunks before the image data (IDAT) by type: the data of those in `keep` (the first of a type), b""
    for the others, whose data is only read in blocks for its checksum. Every checksum is checked, as Pillow
    did: a damaged header is the master's rejection here, before any decoder."""
    chunks: dict[bytes, bytes] = {}
    with open(path, "rb") as f:
        pos = 8
        while len(head := _read_at(f, pos, 8)) == 8:
            length, kind = struct.unpack(">I4s", head)
            name = kind.decode("latin-1")
            if pos == 8 and (kind != b"IHDR" or length < 13):
                break
            if kind == b"IDAT":
                return chunks
            kept = kind in keep and kind not in chunks
            if kept and length > _PNG_PROFILE_LIMIT:
                raise _Unreadable(f"{name} chunk of {length:,} bytes")
            data, crc, left = bytearray(), zlib.crc32(kind), length
            while left:
                block = f.read(min(left, 1 << 20))
                if not block:
                    raise _Unreadable(f"cut short in its {name} chunk")
                crc, left = zlib.crc32(block, crc), left - len(block)
                if kept:
                    data += block
            stored = f.read(4)
            if len(stored) < 4 or struct.unpack(">I", stored)[0] != crc:
                raise _Unreadable(f"bad checksum in its {name} chunk")
            chunks.setdefault(kind, bytes(data))
            pos += 12 + length
    raise _Unreadable(f"cut short at byte {pos:,}, before the image data" if pos > 8 else "no IHDR chunk")


def _png_profile(chunk: bytes) -> bytes | None:
    """An iCCP chunk's profile (name, NUL, compression method 0, deflated profile); None when it does not
    inflate, as Pillow and libpng ignore it."""
    name_end = chunk.find(b"\0")
    if name_end < 0 or chunk[name_end + 1:name_end + 2] != b"\0":
        raise _Unreadable("iCCP chunk: no profile name, or an unknown compression method")
    inflate = zlib.decompressobj()
    try:
        profile = inflate.decompress(chunk[name_end + 2:], _PNG_PROFILE_LIMIT)
    except zlib.error:
        return None
    if inflate.unconsumed_tail:
        raise _Unreadable(f"iCCP chunk inflates past {_PNG_PROFILE_LIMIT >> 20} MB")
    return profile


def _read_jpeg2000(path: str) -> _Header:
    try:
        with Image.open(path) as im:
            mode, (width, height) = im.mode, im.size
            icc = im.info.get("icc_profile")
    except (OSError, SyntaxError, ValueError, struct.error) as exc:
        raise _Unreadable(str(exc)) from None
    bands, interpretation, depth, alpha = {
        "L": (1, "grey", 8, False), "LA": (2, "grey", 8, True), "RGB": (3, "rgb", 8, False),
        "RGBA": (4, "rgb", 8, True), "I;16": (1, "grey", 16, False), "YCbCr": (3, "ycbcr", 8, False),
    }.get(mode, (len(mode), "multiband", 8, False))
    return _Header(width=width, height=height, bands=bands, bit_depth=depth, interpretation=interpretation,
                   icc=icc, alpha=alpha, extra_bands=int(alpha), compression="JPEG 2000")


_READERS = {"TIFF": _read_tiff, "BigTIFF": _read_tiff, "JPEG": _read_jpeg, "PNG": _read_png,
            "JP2": _read_jpeg2000, "J2K": _read_jpeg2000}
