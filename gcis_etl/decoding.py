"""Open a master as a libvips image, with Pillow and tifffile as fallbacks for encodings libvips 8.14 lacks.

Runs only inside the isolated conversion process: decoders crash on some real files.
A fallback is tried when a decoder cannot *open* a file (an unsupported encoding). Errors while reading
pixels mean corrupt data and are a rejection: a lenient fallback must not launder a corrupt master.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyvips

from gcis_etl import codestream, isolation
from gcis_etl.durable import DISK_MARGIN
from gcis_etl.errors import ConversionFailed, GcisError, RejectedMaster
from gcis_etl.models import ImageInfo

# libvips' operation cache would hand a conversion the load of the same path made by an earlier one in this
# long-lived process, and libvips 8.14's jp2kload cannot be read twice ("Need to decode the main header"):
# the second conversion of a JPEG 2000 master was rejected as corrupt. A conversion repeats no load anyway.
pyvips.cache_set_max(0)

# Orientations read bottom to top (vertical flips): libvips decodes such a master whole into a temp file first.
_BOTTOM_UP_ORIENTATIONS = {3, 4}
# Orientations that turn the image a quarter: each output row is a column of the master (_tiled).
_TRANSPOSING_ORIENTATIONS = {5, 6, 7, 8}
# The tiled intermediate's tile side: libvips caches the tiles it reads; at 256 (512) a 120 Mpx 16-bit master held
# 18 (60) MB more, and was no faster.
_TILE = 128
SAMPLE_BYTES = {"uchar": 1, "char": 1, "ushort": 2, "short": 2, "uint": 4, "int": 4, "float": 4, "double": 8,
                "complex": 8, "dpcomplex": 16}  # a libvips band format's sample


@dataclass
class Decoded:
    image: pyvips.Image
    decoder: str
    notes: tuple[str, ...] = ()


class CannotOpen(Exception):
    """This decoder does not support the file's encoding; the next one may."""


def open_master(info: ImageInfo, decoders: tuple[str, ...], strict: bool,
                vips_jpeg2000_origin: bool = False) -> Decoded:
    """The first decoder in `decoders` that opens the master; RejectedMaster when none can. No decoder to try
    says nothing about the master: a failure (retried once the configuration names one). libvips is not given
    the JPEG 2000 images it decodes wrongly (_vips_declines)."""
    if not decoders:
        raise ConversionFailed(f"no decoder to try for {info.format} (imaging.decoders)")
    failures: list[str] = []
    for name in decoders:
        declined = _vips_declines(info, vips_jpeg2000_origin) if name == "vips" else None
        if declined:
            failures.append(f"{name}: {declined}")
            continue
        try:
            image = _OPENERS[name](info, strict)
        except CannotOpen as exc:
            failures.append(f"{name}: {exc}")
            continue
        except (GcisError, MemoryError):  # the master's data, or the limits (memory, disk)
            raise
        except Exception as exc:  # a decoder library failing in a way it does not document: the master needs review
            raise RejectedMaster(f"decoder {name} failed on this master ({type(exc).__name__}: {_first_line(exc)}): "
                                 f"needs review") from None
        notes = tuple(f"fell back to {name}: {f}" for f in failures)
        return Decoded(image=image, decoder=name, notes=notes)
    raise RejectedMaster("no decoder can read the image data: " + "; ".join(failures))


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[-1] if text else type(exc).__name__


def _open_vips(info: ImageInfo, strict: bool) -> pyvips.Image:
    tiled, separate = _tiff_layout(info.path) if info.format in ("TIFF", "BigTIFF") else (False, False)
    if tiled and separate:
        raise CannotOpen("libvips cannot read tiled planar-separate TIFF")
    quarter = info.orientation in _TRANSPOSING_ORIENTATIONS
    rewritten = quarter and not tiled  # a tiled TIFF is itself read at random tile by tile
    access = "random" if (quarter or info.orientation in _BOTTOM_UP_ORIENTATIONS) and not rewritten else "sequential"
    try:
        image = vips_file(info.path, access=access, fail_on="warning" if strict else "none")
    except pyvips.Error as exc:
        raise CannotOpen(_first_line(exc)) from None
    if rewritten:
        image = _tiled(image)
    if info.interpretation == "lab" and image.interpretation == "multiband":
        return _icc_lab(image, info)
    return image


def vips_file(path: str | os.PathLike, **options) -> pyvips.Image:
    """The file at `path` opened by libvips with its loader's `options`. pyvips hands libvips a name as UTF-8 and
    reads back libvips' messages, which quote it, as UTF-8: a name that is not (Latin-1 bytes on disk, in Python
    a str with surrogate escapes) raised UnicodeEncodeError, and as bytes UnicodeDecodeError on its first error,
    so a good master was rejected ("needs review") and its output failed. Such a file is given to libvips by
    descriptor, which libvips duplicates and keeps for the image's life."""
    name = os.fspath(path)
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return _by_descriptor(name, **options)
    return pyvips.Image.new_from_file(name, **options)


def _by_descriptor(name: str | bytes, **options) -> pyvips.Image:
    with open(name, "rb") as f:
        source = pyvips.Source.new_from_descriptor(f.fileno())
    return pyvips.Image.new_from_source(source, "", **options)


def _tiled(image: pyvips.Image) -> pyvips.Image:
    """`image` decoded top to bottom into an uncompressed tiled TIFF in scratch, and opened from there: turned a
    quarter, an output band is a band of the master's columns, here a column of tiles read as needed. Opened
    at random, a strip-based master (TIFF, JPEG, PNG) was decoded whole into a libvips temp file mapped into
    memory, and the columns touched all of it: peak RSS grew by the uncompressed size (120 Mpx 16-bit: 829
    MB, 216 upright), and the address space with it. The file is removed once open: libvips keeps its
    descriptor for the image's life. Decoding the master happens here, so its errors are pixel errors, and a
    crash is libvips' reading pixels (the next decoder is tried)."""
    isolation.reading_pixels("vips")
    across, down = -(-image.width // _TILE), -(-image.height // _TILE)  # edge tiles are written whole
    needs = (across * down * (_TILE * _TILE * image.bands * SAMPLE_BYTES[image.format] + 16)  # + offset, count
             + DISK_MARGIN)
    with isolation.scratch() as folder:
        path = Path(folder, "decoded.tif")
        try:
            with isolation.disk_checked(Path(folder), needs=needs):
                image.tiffsave(path, tile=True, tile_width=_TILE, tile_height=_TILE, compression="none",
                               bigtiff=True)
        except pyvips.Error as exc:
            raise isolation.pixel_error(exc) from None
        tiled = _by_descriptor(path, access="random").copy(interpretation=image.interpretation)
    return tiled


def _tiff_layout(path: str) -> tuple[bool, bool]:
    """Whether a TIFF's first page is tiled, and has separate planes. Tiled, libvips reads it at random tile by
    tile: a quarter turn needs no intermediate (_tiled; 100 Mpx 16-bit: 1.4 s direct, 2.9 s through one). Tiled
    with separate planes, libvips (8.14 to 8.17 at least: libvips/libvips#4615) opens its header but fails on its
    first pixel ("tiff2vips: tiled separate planes not supported"), which would read as corrupt data: the
    header routes such a valid master to the next decoder instead."""
    import tifffile
    try:
        with tifffile.TiffFile(path) as tif:
            page = tif.pages[0]
            return page.is_tiled, page.is_tiled and page.planarconfig == tifffile.PLANARCONFIG.SEPARATE
    except Exception:  # a header tifffile cannot read: libvips says what is wrong with it
        return False, False


def _vips_declines(info: ImageInfo, vips_jpeg2000_origin: bool) -> str | None:
    """Why libvips is not given this master (the next decoder is), or None."""
    if info.interpretation == "lab" and info.alpha and _associated_alpha(info.path):
        return ("libvips 8.14 divides Lab by its associated alpha on the wrong scale (8-bit CIELab came out "
                "as one flat colour)")
    if info.format not in ("JP2", "J2K"):
        return None
    if not vips_jpeg2000_origin and _jpeg2000_origin(info.path) != (0, 0):
        return ("libvips 8.14 decodes a JPEG 2000 image whose origin is not 0,0 into wrong pixels, or crashes "
                "(imaging.vips_decodes_jpeg2000_origin)")
    if _jp2_colour_space(info.path) == _SYCC:
        return "libvips 8.14 (with OpenJPEG 2.5.0) decodes sYCC JPEG 2000 samples as RGB: wrong colours"
    return None


_SYCC = 18  # JP2 colr box, enumerated colour space


def _associated_alpha(path: str) -> bool:
    import tifffile
    with tifffile.TiffFile(path) as tif:
        return tuple(tif.pages[0].extrasamples or ())[:1] == (tifffile.EXTRASAMPLE.ASSOCALPHA,)


def _jpeg2000_origin(path: str) -> tuple[int, int]:
    """The image origin of a JPEG 2000 codestream (raw, or in a JP2's jp2c box): libvips 8.14's jp2kload
    returns garbage that changes from run to run for any other than 0,0, and verification, which compares
    the output with the same decode, cannot tell (the corpus's Bretagne2_4.j2k, origin 150,300: most runs
    segfault, some deposit noise). (0, 0) when the header cannot be read: libvips says what is wrong with it."""
    with open(path, "rb") as f:
        siz = f.read(24)[4:] if codestream.find(f) else b""  # Lsiz (2), Rsiz (2), Xsiz, Ysiz, XOsiz, YOsiz (4 each)
    if len(siz) < 20:
        return 0, 0
    return struct.unpack(">II", siz[12:20])


def _jp2_colour_space(path: str) -> int | None:
    """The enumerated colour space of a JP2's colr box (jp2h/colr, method 1), or None: libvips 8.14 with
    Debian's OpenJPEG 2.5.0 does not learn sYCC (18) from the header, and decodes Y, Cb, Cr as R, G, B (a
    strong colour cast), where OpenJPEG's own decoder and Pillow's (OpenJPEG 2.5.4) convert them to RGB."""
    with open(path, "rb") as f:
        header = codestream.box(f, b"jp2h")
        if header is None or codestream.box(f, b"colr", None if header < 0 else f.tell() + header) is None:
            return None
        colr = f.read(7)  # METH (1), PREC (1), APPROX (1), EnumCS (4)
    return struct.unpack(">I", colr[3:7])[0] if len(colr) == 7 and colr[0] == 1 else None


def _icc_lab(image: pyvips.Image, info: ImageInfo) -> pyvips.Image:
    """libvips 8.14 decodes TIFF CIELab (8) but passes other Lab encodings through as plain bands, which
    would then be taken for RGB. ICCLab (9: L* 0..max, a* and b* unsigned, offset by 128 or 32768) is
    rescaled to libvips' float Lab, an alpha after it on 0..1; any other is rejected."""
    import tifffile
    with tifffile.TiffFile(info.path) as tif:
        photometric = int(tif.pages[0].photometric)
    if photometric != 9 or image.bands < 3 or image.format not in ("uchar", "ushort"):
        raise RejectedMaster(f"Lab encoding (TIFF photometric {photometric}, {image.bands} x {image.format}) "
                             f"is not supported by the decoders")
    full, offset, scale = (255, 128, 1) if image.format == "uchar" else (65535, 32768, 256)
    lab = image[:3].cast("float").linear([100 / full, 1 / scale, 1 / scale], [0, -offset / scale, -offset / scale])
    if image.bands > 3:
        lab = lab.bandjoin(image[3:].cast("float").linear(1 / full, 0))
    return lab.copy(interpretation="lab")


def _open_pillow(info: ImageInfo, strict: bool) -> pyvips.Image:
    from PIL import ImageFile
    ImageFile.LOAD_TRUNCATED_IMAGES = not strict
    with open(info.path, "rb") as f:  # not the path: see _pillow_load
        im, tags = _pillow_load(f)
    icc = im.info.get("icc_profile")
    if im.mode in ("P", "PA", "1", "LA", "La", "RGBa", "YCbCr", "LAB", "HSV"):
        im = im.convert("RGBA" if ("A" in im.mode or "transparency" in im.info) else "RGB")
    array = np.asarray(im)  # 1- to 8-bit samples on the full 8-bit range: Pillow scales 1- to 7-bit ones itself
    if im.mode.startswith("I;16"):  # but not these: a TIFF's 12-bit grey comes on 0..4095, MinIsWhite unturned
        array = _stored_samples(array.astype(np.uint16), info.bit_depth, tags.get(262) == 0)
    return _from_array(array, info, icc)


def _pillow_load(f):
    """The image Pillow decodes from the open file `f`, and its TIFF tags (else {}).

    From a file, not its path: Pillow memory-maps an uncompressed single-strip L, I;16, RGBA or CMYK image
    opened by path with the size its Orientation 5-8 turned, so read its rows with the wrong stride
    (scrambled). Planar-separate samples wider than 8 bits Pillow reads as 8-bit ones, and "unknown raw mode"
    is a layout it lacks (tiled planar-separate associated alpha), not corrupt data: both go to the next
    decoder."""
    from PIL import Image
    try:
        im = Image.open(f)
    except (OSError, SyntaxError, ValueError) as exc:
        raise CannotOpen(_first_line(exc)) from None
    tags = getattr(im, "tag_v2", {})  # a TIFF's; Pillow's load edits it in place
    if tags.get(284) == 2 and max(tags.get(258, (8,))) > 8:
        raise CannotOpen(f"Pillow reads planar-separate {max(tags[258])}-bit samples as 8-bit")
    stated = tags.get(274)
    try:
        im.load()
    except ValueError as exc:
        if str(exc).startswith("unknown raw mode"):
            raise CannotOpen(f"Pillow lacks this layout ({_first_line(exc)})") from None
        raise RejectedMaster(f"corrupt or truncated image data: {_first_line(exc)}") from None
    except (OSError, SyntaxError) as exc:
        raise RejectedMaster(f"corrupt or truncated image data: {_first_line(exc)}") from None
    if stated is not None and 274 not in tags:  # Pillow turned the TIFF upright as it loaded
        im = _as_stored(im, stated)
    return im, tags


def _as_stored(im, orientation: int):
    """A TIFF Pillow turned by its Orientation tag, turned back: the orientation step turns every decoder's
    pixels as stored, and turned twice they came out rotated (or flipped) wrongly."""
    from PIL import Image
    T = Image.Transpose
    undo = {2: T.FLIP_LEFT_RIGHT, 3: T.ROTATE_180, 4: T.FLIP_TOP_BOTTOM, 5: T.TRANSPOSE, 6: T.ROTATE_90,
            7: T.TRANSVERSE, 8: T.ROTATE_270}.get(orientation)
    return im.transpose(undo) if undo is not None else im


def _open_tifffile(info: ImageInfo, strict: bool) -> pyvips.Image:
    import tifffile
    try:
        with tifffile.TiffFile(info.path) as tif:
            page = tif.pages[0]
            array, axes, icc = page.asarray(), page.axes, page.iccprofile
            photometric, colormap, extrasamples = page.photometric, page.colormap, page.extrasamples
    except Exception as exc:  # tifffile/imagecodecs raise many types for unsupported encodings
        raise CannotOpen(_first_line(exc)) from None
    if axes.startswith("S"):  # planar-separate samples come plane by plane
        array = np.moveaxis(array, 0, -1)
    if info.interpretation == "lab":
        return _lab(array, photometric, extrasamples)
    if photometric == tifffile.PHOTOMETRIC.PALETTE:  # tifffile gives the indices, not their colours
        if colormap is None or array.ndim != 2 or array.dtype.kind != "u":
            raise CannotOpen(f"palette image of {array.dtype} samples, {array.ndim} axes")
        return _from_array(np.moveaxis(colormap.astype(np.uint16)[:, array], 0, -1), info, icc)
    array = _stored_samples(array, info.bit_depth, photometric == tifffile.PHOTOMETRIC.MINISWHITE)
    if extrasamples and extrasamples[0] == tifffile.EXTRASAMPLE.ASSOCALPHA:
        array = _unassociated(array, array.shape[-1] - len(extrasamples))
    return _from_array(array, info, icc)


def _lab(array: np.ndarray, photometric: int, extrasamples: tuple[int, ...]) -> pyvips.Image:
    """TIFF Lab samples as libvips' float Lab, an alpha after it on 0..1: CIELab's (8) a*, b* are signed,
    ICCLab's (9) unsigned, offset by half the range. Associated alpha is divided out of the samples as stored,
    as libvips does for other colour."""
    import tifffile
    if photometric not in (tifffile.PHOTOMETRIC.CIELAB, tifffile.PHOTOMETRIC.ICCLAB) or array.ndim != 3 \
            or array.shape[-1] < 3 or array.dtype not in (np.uint8, np.uint16):
        raise CannotOpen(f"Lab encoding (TIFF photometric {int(photometric)}, {array.dtype}) is not supported")
    full, scale = (255, 1) if array.dtype == np.uint8 else (65535, 256)
    cielab = photometric == tifffile.PHOTOMETRIC.CIELAB
    samples = array.astype(np.float32)
    if cielab:
        samples[..., 1:3] = array.view(np.int8 if full == 255 else np.int16)[..., 1:3]
    if extrasamples and extrasamples[0] == tifffile.EXTRASAMPLE.ASSOCALPHA:
        alpha = samples[..., 3:4]
        samples[..., :3] = np.divide(samples[..., :3] * full, alpha, out=np.zeros_like(samples[..., :3]),
                                     where=alpha > 0)
    offset = 0 if cielab else (full + 1) // 2
    lab = np.concatenate([samples[..., :1] * (100 / full), (samples[..., 1:3] - offset) / scale,
                          samples[..., 3:] / full], axis=-1)
    return pyvips.Image.new_from_array(np.ascontiguousarray(lab, dtype=np.float32)).copy(interpretation="lab")


def _stored_samples(array: np.ndarray, bit_depth: int | None, min_is_white: bool) -> np.ndarray:
    """Samples as a TIFF stores them (tifffile's; Pillow's in its 16-bit modes) turned MinIsBlack and onto the
    full range, as libvips reads them: 1- to 7-bit onto 0..255, 9- to 15-bit onto 0..65535. A 12-bit grey
    master came out nearly black when its 0..4095 were taken for 16-bit samples."""
    if min_is_white:
        array = _black_is_zero(array, bit_depth)
    if array.dtype.kind in "ub" and bit_depth and bit_depth not in (8, 16) and array.dtype.itemsize <= 2:
        full = 255 if bit_depth < 8 else 65535
        array = (array.astype(np.float32) * (full / (2 ** bit_depth - 1))).round()
        array = array.astype(np.uint8 if full == 255 else np.uint16)
    return array


def _unassociated(array: np.ndarray, colour: int) -> np.ndarray:
    """Associated (premultiplied) colour divided by its alpha, the band after it, as libvips and Pillow give it:
    the flattening takes alpha as unassociated, and premultiplied colour came out multiplied by it twice (too
    dark). Colour where alpha is 0 is 0."""
    if array.dtype.kind not in "uf":
        raise CannotOpen(f"associated alpha with {array.dtype} samples")
    full = 1.0 if array.dtype.kind == "f" else np.iinfo(array.dtype).max
    alpha = array[..., colour:colour + 1].astype(np.float32)
    scale = np.divide(np.float32(full), alpha, out=np.zeros_like(alpha), where=alpha > 0)
    colours = np.clip(array[..., :colour] * scale, 0, full)
    if array.dtype.kind == "u":
        colours = colours.round()
    return np.concatenate([colours.astype(array.dtype), array[..., colour:]], axis=-1)


def _black_is_zero(array: np.ndarray, bit_depth: int | None) -> np.ndarray:
    """MinIsWhite grey (a scanner's bilevel and 4-bit pages) turned to MinIsBlack, as libvips reads it:
    tifffile returns the samples as stored, and an access master made of them would be a negative."""
    if array.dtype == np.bool_:
        return ~array
    if array.dtype.kind != "u" or not bit_depth:
        raise CannotOpen(f"MinIsWhite grey with {array.dtype} samples")
    return array.dtype.type(2 ** bit_depth - 1) - array


def _from_array(array: np.ndarray, info: ImageInfo, icc: bytes | None) -> pyvips.Image:
    """A vips image from decoded samples on the full range of 8/16-bit, or float.

    Lab samples would be labelled RGB here: the fallbacks leave Lab to libvips."""
    if info.interpretation == "lab":
        raise CannotOpen("Lab samples are decoded by libvips only")
    if array.ndim == 2:
        array = array[:, :, None]
    if array.dtype == np.float16:  # half floats (TIFF SampleFormat 3, 16 bits): libvips has no such format
        array = array.astype(np.float32)
    image = pyvips.Image.new_from_array(np.ascontiguousarray(array))
    colour_bands = 4 if info.interpretation == "cmyk" else (1 if array.shape[2] <= 2 else 3)
    sixteen = array.dtype == np.uint16
    interpretation = {1: "grey16" if sixteen else "b-w", 3: "rgb16" if sixteen else "srgb", 4: "cmyk"}[colour_bands]
    if array.dtype.kind == "f":
        interpretation = "scrgb" if colour_bands == 3 else "b-w"
    image = image.copy(interpretation=interpretation)
    if icc:
        image = image.copy()
        image.set_type(pyvips.GValue.blob_type, "icc-profile-data", icc)
    return image


_OPENERS = {"vips": _open_vips, "pillow": _open_pillow, "tifffile": _open_tifffile}
