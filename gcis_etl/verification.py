"""Verify an access master before it is declared a success (and on demand: `gcis-etl verify`).

Structure is read with tifffile; pixels are decoded through libvips/libtiff, the same library iipsrv
reads with, so a file that passes here is one iipsrv can serve.
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from gcis_etl.codestream import packet_sequence_errors
from gcis_etl.formats import names_a_sequence, refuse_special, sniff
from gcis_etl.inspection import plain_complaint, tifffile_complaints
from gcis_etl.isolation import out_of_memory, refused_allocation
from gcis_etl.models import Level, VerifyReport
from gcis_etl.pyramid import levels_for

JPEG, YCBCR = 7, 6
@dataclass(frozen=True)
class Expectation:
    """What a particular conversion must have produced."""

    width: int | None = None
    height: int | None = None
    tile: int | None = None
    chroma: str | None = None
    metadata: dict = field(default_factory=dict)  # kept tag -> value, as exiftool reads the carried tags


def verify(path: str | Path, expect: Expectation | None = None) -> VerifyReport:
    """Check the access-master contract; returns errors and warnings rather than raising."""
    import tifffile
    expect = expect or Expectation()
    if not isinstance(expect, Expectation):  # the caller's mistake: the except below would call the file corrupt
        raise TypeError(f"expect: an Expectation, not {type(expect).__name__}")
    path = Path(path)
    cannot = unreadable(path)
    if cannot:
        return cannot
    errors: list[str] = []
    warnings: list[str] = []
    if names_a_sequence(path.name):
        errors.append("file name contains '_pyr_', which iipsrv 1.1 reads as a 3-D sequence marker")
    pages = []
    with tifffile_complaints() as complaints:
        try:
            with tifffile.TiffFile(path) as tf:
                pages = list(tf.pages)
                found = [Level(p.imagewidth, p.imagelength) for p in pages]
                icc = pages[0].tags.get(34675) if pages else None
                icc = bytes(icc.value) if icc is not None else None
                for i, p in enumerate(pages):
                    errors.extend(_page_errors(i, p, expect))
        except Exception as exc:  # tifffile raises many types on malformed files
            if not sniff(path).endswith("TIFF"):
                return VerifyReport(str(path), errors=(f"not a readable TIFF: {plain_complaint(str(exc))}",))
            complaints.append(plain_complaint(str(exc)))
    if complaints or not pages:
        details = list(dict.fromkeys(complaints)) or ["no image directory"]
        more = f" (and {len(details) - 3} more)" if len(details) > 3 else ""
        return VerifyReport(str(path), errors=(f"truncated or corrupt TIFF ({path.stat().st_size:,} bytes): "
                                               f"{'; '.join(details[:3])}{more}",))
    w0, h0 = found[0].width, found[0].height
    tile = expect.tile or (pages[0].tilewidth if pages[0].is_tiled else 256)
    wanted = levels_for(w0, h0, tile)
    if found != wanted:
        errors.append(f"levels {[(lv.width, lv.height) for lv in found]} differ from the ceil-halving pyramid "
                      f"{[(lv.width, lv.height) for lv in wanted]}")
    if expect.width is not None and (w0, h0) != (expect.width, expect.height):
        errors.append(f"full resolution is {w0}x{h0}, expected {expect.width}x{expect.height}")
    errors.extend(_icc_errors(icc))
    if not errors:
        errors.extend(_decode_errors(path, found, tile))
    if expect.metadata:
        errors.extend(metadata_differences(expect.metadata, path))
    return VerifyReport(str(path), errors=tuple(errors), warnings=tuple(warnings), width=w0, height=h0,
                        levels=tuple(found))


def unreadable(path: Path) -> VerifyReport | None:
    """The report on a path that cannot be read at all (missing, a folder, not permitted, a FIFO), else None."""
    try:
        refuse_special(path)
        with open(path, "rb"):
            return None
    except OSError as exc:
        return VerifyReport(str(path), errors=(f"cannot read {path}: {exc.strerror or exc}",))


def _page_errors(index: int, page, expect: Expectation) -> list[str]:
    errors = []
    where = f"level {index}"
    if not page.is_tiled:
        return [f"{where} is not tiled"]
    if page.tilewidth != page.tilelength or (expect.tile and page.tilewidth != expect.tile):
        errors.append(f"{where} tiles are {page.tilewidth}x{page.tilelength}, expected "
                      f"{expect.tile or 'square'}")
    if int(page.compression) != JPEG:
        errors.append(f"{where} compression is {page.compression.name}, expected JPEG")
    if page.samplesperpixel != 3 or page.bitspersample != 8:
        errors.append(f"{where} has {page.samplesperpixel} samples of {page.bitspersample} bits, expected 3 x 8")
    if expect.chroma:
        want = (2, 2) if expect.chroma == "4:2:0" else (1, 1)
        sub = page.tags.get(530)
        got = tuple(sub.value) if sub is not None else (2, 2)
        if int(page.photometric) != YCBCR or got != want:
            errors.append(f"{where} is photometric {page.photometric.name} subsampling {got}, expected YCbCr {want}")
    if index > 0 and not int(page.subfiletype) & 1:
        errors.append(f"{where} is not marked as a reduced-resolution image")
    return errors


def _icc_errors(icc: bytes | None) -> list[str]:
    from PIL import ImageCms
    if icc is None:
        return ["no ICC profile on the full-resolution level"]
    try:
        description = ImageCms.getProfileDescription(ImageCms.ImageCmsProfile(io.BytesIO(icc))) or ""
    except (OSError, ValueError, TypeError) as exc:
        return [f"ICC profile is unreadable: {exc}"]
    return [] if "sRGB" in description else [f"ICC profile is '{description.strip()}', expected sRGB"]


def _decode_errors(path: Path, levels: list[Level], tile: int) -> list[str]:
    """Decode the corner and centre tiles of every level, and the whole smallest level, through libtiff."""
    import pyvips

    from gcis_etl.decoding import vips_file
    errors = []
    for i, lv in enumerate(levels):
        try:
            page = vips_file(path, page=i, fail_on="warning", access="random")
            spots = {(0, 0), (lv.width - 1, lv.height - 1), (lv.width // 2, lv.height // 2)}
            for x, y in spots:
                x0, y0 = x // tile * tile, y // tile * tile
                page.crop(x0, y0, min(tile, lv.width - x0), min(tile, lv.height - y0)).avg()
            if i == len(levels) - 1:
                page.avg()
        except pyvips.Error as exc:
            if refused_allocation(exc):  # the limit's failure: the output was not checked, not found wrong
                raise out_of_memory() from None
            errors.append(f"level {i} does not decode: {str(exc.message).strip()}")
    return errors


def metadata_differences(expected: dict, path: Path) -> list[str]:
    """Kept tags that are missing from, or different in, the access master."""
    from gcis_etl.metadata import tag_values
    found = tag_values(path)
    errors = []
    for tag, value in expected.items():
        if tag not in found:
            errors.append(f"metadata tag {tag} was not kept")
        elif found[tag] != value:
            errors.append(f"metadata tag {tag} is {found[tag]!r}, master has {value!r}")
    return errors


# --- JPEG 2000 -------------------------------------------------------------------------------------
_HT_RSIZ = 0x4000  # Rsiz bit 14: the codestream uses HTJ2K (Part 15) capabilities
_CODESTREAM = "properties/contiguousCodestreamBox"
LOSSLESS = float("inf")  # min_psnr meaning "pixels identical"
_TRANSFORMS = {True: "5-3 reversible", False: "9-7 irreversible"}  # jpylyzer's names, by reversibility


@dataclass(frozen=True)
class Jp2Coding:
    """How a codestream's reduced resolutions are reproduced: asked for by the recipe, or read from it."""

    reversible: bool
    tile: tuple[int, int]  # tile width, height (the image size when it is one tile)


@dataclass(frozen=True)
class Jp2Expectation:
    """What a JP2 conversion must have produced; `reference` is the uncompressed sRGB TIFF it was made from."""

    width: int
    height: int
    levels: int
    layers: int
    progression: str
    ht: bool = False
    plt: bool = False
    min_psnr: float = 30.0  # luma dB against the reference; float("inf") = lossless (pixels identical)
    reference: Path | None = None
    coding: Jp2Coding | None = None  # the transform and tiles asked for; None: whatever the codestream says
    metadata: dict = field(default_factory=dict)


def verify_jp2(path: str | Path, expect: Jp2Expectation, reduced: Callable[[], Any] | None = None,
               checked=None) -> VerifyReport:
    """Structure with jpylyzer (the validator Bodleian uses), geometry, sRGB colour box, pixels, metadata.
    exiftool reads the metadata beside jpylyzer, and so does the pixel check when the coding is expected;
    `reduced` may give the reference's reduction computed ahead (reduced_reference, e.g. beside the encoder),
    `checked` jpylyzer's result when it was read already."""
    from gcis_etl.isolation import beside
    path = Path(path)
    pixels = beside(jp2_pixel_errors, path, expect, expect.coding, reduced) if expect.coding else None
    kept = beside(metadata_differences, expect.metadata, path) if expect.metadata else None
    errors, warnings, found = _jp2_structure(_jpylyzer(path) if checked is None else checked, expect)
    pixel_errors = pixels.result() if pixels else None
    if not errors:  # without the coding expected, the pixels are modelled with the coding the codestream has
        errors.extend(pixel_errors if pixels else jp2_pixel_errors(path, expect, Jp2Coding(
            reversible=found["transform"] == _TRANSFORMS[True], tile=found["tile"])))
    if found.get("sop"):  # beside the pixels, not before them: OpenJPEG decodes such a file whatever the numbers
        errors.extend(packet_sequence_errors(path))
    errors.extend(kept.result() if kept else ())
    width, height = found.get("size", (None, None))
    levels = tuple(Level(_down(width, r), _down(height, r)) for r in range((found.get("levels") or 0) + 1)) \
        if width and height else ()
    return VerifyReport(str(path), errors=tuple(errors), warnings=tuple(warnings), width=width, height=height,
                        levels=levels)


def verify_jp2_alone(path: str | Path, asked=None) -> VerifyReport:
    """A JP2 checked on its own (`gcis-etl verify`), without the normalised image it was made from: jpylyzer,
    the sRGB colour box, and the reduced resolution and regions decoded (not compared). Levels, tiles and
    PLT are the file's own; `asked` (a recipe's Jp2Parameters) adds its layers, progression, block coder
    and wavelet."""
    path, unknown = Path(path), Jp2Expectation(0, 0, 0, 0, "")
    checked = _jpylyzer(path)
    _, _, found = _jp2_structure(checked, unknown)
    if not found:  # unreadable: verify_jp2 says why
        return verify_jp2(path, unknown, checked=checked)
    width, height = found["size"]
    own = Jp2Expectation(width=width or 0, height=height or 0, levels=found["levels"] or 0,
                         layers=found["layers"] or 0, progression=found["progression"] or "", ht=found["ht"],
                         plt=found["plt"])
    if asked is not None:
        own = replace(own, layers=asked.layers, progression=asked.progression, ht=asked.ht,
                      coding=Jp2Coding(reversible=asked.reversible, tile=found["tile"]))
    return verify_jp2(path, own, checked=checked)


def _jpylyzer(path: Path):
    """jpylyzer's result (an XML element), or why it could not read the file."""
    from jpylyzer import jpylyzer
    try:
        return jpylyzer.checkOneFile(str(path), "jp2")
    except Exception as exc:  # jpylyzer raises on unreadable files
        return f"jpylyzer cannot read the file: {exc}"


def _jp2_structure(result, expect: Jp2Expectation) -> tuple[list[str], list[str], dict]:
    """jpylyzer's verdict (see _jpylyzer) and what it reads of the header and codestream, against what is
    expected."""
    if isinstance(result, str):
        return [result], [], {}
    errors: list[str] = []
    warnings: list[str] = []
    failed = sorted({e.tag for e in result.find("tests").iter() if e.text == "False"})
    rsiz = int(result.findtext(f"{_CODESTREAM}/siz/rsiz") or 0)
    if failed == ["rsizIsValid"] and expect.ht and rsiz & _HT_RSIZ:
        warnings.append("HTJ2K codestream in a JP2 (Part 1) wrapper: jpylyzer's rsiz test fails; "
                        "Part 15 decoders read it")
    elif result.findtext("isValid") != "True":
        errors.append(f"jpylyzer: not a valid JP2 (failed tests: {', '.join(failed) or 'none reported'})")
    colour = f"{result.findtext('properties/jp2HeaderBox/colourSpecificationBox/meth')} " \
             f"{result.findtext('properties/jp2HeaderBox/colourSpecificationBox/enumCS')}"
    if colour != "Enumerated sRGB":
        errors.append(f"colour box is {colour}, expected Enumerated sRGB")
    header = "properties/jp2HeaderBox/imageHeaderBox"
    found = {"size": (_int(result, f"{header}/width"), _int(result, f"{header}/height")),
             "components": _int(result, f"{header}/nC"), "bits": _int(result, f"{header}/bPCDepth"),
             "levels": _int(result, f"{_CODESTREAM}/cod/levels"), "layers": _int(result, f"{_CODESTREAM}/cod/layers"),
             "progression": result.findtext(f"{_CODESTREAM}/cod/order"), "ht": bool(rsiz & _HT_RSIZ),
             "plt": any(int(e.text) > 0 for e in result.iter("pltCount")),
             "sop": result.findtext(f"{_CODESTREAM}/cod/sop") == "yes",
             "transform": result.findtext(f"{_CODESTREAM}/cod/transformation"),
             "tile": (_int(result, f"{_CODESTREAM}/siz/xTsiz") or expect.width,
                      _int(result, f"{_CODESTREAM}/siz/yTsiz") or expect.height)}
    wanted = {"size": (expect.width, expect.height), "components": 3, "bits": 8, "levels": expect.levels,
              "layers": expect.layers, "progression": expect.progression, "ht": expect.ht, "plt": expect.plt}
    if expect.coding:
        wanted |= {"transform": _TRANSFORMS[expect.coding.reversible], "tile": expect.coding.tile}
    errors.extend(f"{key} is {found[key]}, expected {wanted[key]}" for key in wanted if found[key] != wanted[key])
    return errors, warnings, found


def _int(result, xpath: str) -> int | None:
    text = result.findtext(xpath)
    return int(text) if text is not None and text.isdigit() else None


# Pixels are checked without decoding the full resolution (which cost more than the encoder on 40 Mpx):
# one reduced resolution is decoded whole and compared with the reference reduced by the same wavelet,
# tile by tile, and full-resolution regions at the corners and the centre are decoded alone (the decoder
# reads only their code-blocks) and compared with the reference's pixels.
REDUCED_PIXELS = 2 ** 18  # the reduced resolution decoded whole: the first one at or under ~0.26 Mpx
REGION = 256              # side of the full-resolution regions
BLOCK = 8                 # the reduced comparison is made per 8x8 block, so a local defect is not averaged away
_LUMA = (0.299, 0.587, 0.114)  # BT.601 weights of R, G, B
REDUCED_MIN_PSNR = 30.0   # worst block; the model of a reversible transform is float, off by rounding only
_LOWPASS = {  # analysis low-pass filters of JPEG 2000 Part 1 (DC gain 1)
    True: (-1 / 8, 2 / 8, 6 / 8, 2 / 8, -1 / 8),
    False: (0.026748757411, -0.016864118443, -0.078223266529, 0.266864118443, 0.602949018236,
            0.266864118443, -0.078223266529, -0.016864118443, 0.026748757411)}


def reduction(width: int, height: int, levels: int) -> int:
    """The resolution reduction decoded whole: the first with at most REDUCED_PIXELS, at most `levels`."""
    r = 0
    while r < levels and _down(width, r) * _down(height, r) > REDUCED_PIXELS:
        r += 1
    return r


def regions(width: int, height: int, tile: tuple[int, int] | None = None) -> list[tuple[int, int, int, int]]:
    """Full-resolution regions (x0, y0, x1, y1): the four corners and the centre; with `tile`, the whole
    tiles that hold the corner pixels and the centre one (OpenJPEG 2.5.0 decodes an HTJ2K region that is not
    a whole tile wrongly)."""
    if tile:
        w, h = tile
        points = [(0, 0), (width - 1, 0), (0, height - 1), (width - 1, height - 1), (width // 2, height // 2)]
        spots = [(x // w * w, y // h * h) for x, y in points]
    else:
        w, h = min(REGION, width), min(REGION, height)
        xs, ys = (0, (width - w) // 2, width - w), (0, (height - h) // 2, height - h)
        spots = [(xs[0], ys[0]), (xs[2], ys[0]), (xs[0], ys[2]), (xs[2], ys[2]), (xs[1], ys[1])]
    return [(x, y, min(width, x + w), min(height, y + h)) for x, y in dict.fromkeys(spots)]


def jp2_pixel_errors(path: Path, expect: Jp2Expectation, coding: Jp2Coding,
                     reduced: Callable[[], Any] | None = None) -> list[str]:
    """Decode with OpenJPEG, in-process as iipsrv does, one reduced resolution whole and full-resolution
    regions. `reduced`: the reference's reduced_reference, when it was computed ahead."""
    r = reduction(expect.width, expect.height, expect.levels)
    lossless = expect.min_psnr == LOSSLESS
    spots = regions(expect.width, expect.height, coding.tile if expect.ht else None) if r else []
    decoded, *pieces = [_decoded(path, r, None)] + [_decoded(path, 0, spot) for spot in spots]
    if isinstance(decoded, str):
        return [f"reduction {r} does not decode: {decoded}"]
    size = (_down(expect.width, r), _down(expect.height, r))
    if decoded.shape[1::-1] != size:
        return [f"reduction {r} decodes as {decoded.shape[1]}x{decoded.shape[0]}, expected {size[0]}x{size[1]}"]
    if expect.reference is None:  # nothing to compare with: decoding is what can be checked
        return [f"region {x0},{y0},{x1},{y1} does not decode: {piece}"
                for (x0, y0, x1, y1), piece in zip(spots, pieces) if isinstance(piece, str)]
    reference = _reference_pixels(expect.reference)
    if reference.shape[1::-1] != (expect.width, expect.height):
        return [f"the reference is {reference.shape[1]}x{reference.shape[0]}, expected {expect.width}x{expect.height}"]
    if r == 0:  # a small image: the whole of it has been decoded
        return _difference(decoded, reference, lossless, expect.min_psnr, "the decoded pixels")
    model = reduced() if reduced else wavelet_reduced(reference, r, coding)
    errors = _difference(decoded, model, False, REDUCED_MIN_PSNR, f"reduction {r}", block=BLOCK)
    for (x0, y0, x1, y1), piece in zip(spots, pieces):
        where = f"region {x0},{y0},{x1},{y1}"
        if isinstance(piece, str):
            errors.append(f"{where} does not decode: {piece}")
        elif piece.shape[:2] != (y1 - y0, x1 - x0):
            errors.append(f"{where} decodes as {piece.shape[1]}x{piece.shape[0]}")
        else:
            errors.extend(_difference(piece, reference[y0:y1, x0:x1], lossless, expect.min_psnr, where))
    return errors


def reduced_reference(expect: Jp2Expectation):
    """The reference as a decoder will show the reduction jp2_pixel_errors decodes whole (None when that is
    the full resolution), for the coding expected: it can be computed before the JP2 exists."""
    r = reduction(expect.width, expect.height, expect.levels)
    return wavelet_reduced(_reference_pixels(expect.reference), r, expect.coding) if r else None


def _decoded(path: Path, reduce: int, area: tuple[int, int, int, int] | None):
    """The decoded RGB pixels, or the decoder's complaint."""
    from gcis_etl.openjpeg import DecodeError, decode_rgb
    try:
        return decode_rgb(path, reduce, area)
    except DecodeError as exc:
        return str(exc)


def _reference_pixels(reference: Path):
    """The uncompressed reference TIFF, mapped rather than read: only parts of it are looked at twice."""
    import tifffile
    try:
        return tifffile.memmap(reference, mode="r")
    except ValueError:  # not memory-mappable (e.g. compressed): read it
        return tifffile.imread(reference)


def _difference(decoded, reference, lossless: bool, min_psnr: float, what: str, block: int | None = None):
    """Lossless: identical pixels. Lossy: luma PSNR, over the whole or (`block`) in the worst block."""
    if lossless:
        return [] if (decoded == reference).all() else [f"lossless recipe but {what} differ from the normalised image"]
    psnr = _worst_block_psnr(decoded, reference, block) if block else luma_psnr(decoded, reference)
    if psnr >= min_psnr:
        return []
    worst = f" in its worst {block}x{block} block" if block else ""
    return [f"luma PSNR of {what} against the normalised image is {psnr:.1f} dB{worst}, below {min_psnr:g} dB"]


def _worst_block_psnr(a, b, block: int) -> float:
    import numpy as np
    weights = np.array(_LUMA, np.float32)
    diff = np.asarray(a, np.float32) @ weights - np.asarray(b, np.float32) @ weights
    h, w = diff.shape
    padded = np.zeros((-(-h // block) * block, -(-w // block) * block), np.float32)
    counts = np.zeros_like(padded)
    padded[:h, :w], counts[:h, :w] = diff * diff, 1
    sums = padded.reshape(padded.shape[0] // block, block, -1, block).sum(axis=(1, 3))
    return _psnr(float((sums / counts.reshape(sums.shape[0], block, -1, block).sum(axis=(1, 3))).max()))


def wavelet_reduced(reference, r: int, coding: Jp2Coding):
    """The reference as a JPEG 2000 decoder shows it `r` resolutions down: the analysis low-pass applied r
    times per tile, with the whole-sample symmetric extension at tile edges (OpenCV's BORDER_REFLECT_101),
    keeping the samples at even coordinates of the whole image (a tile may start at an odd one). Float: exact
    for the 9-7 wavelet up to quantisation, within rounding for 5-3 (measured: 60.7 and 42.5 dB against
    opj_decompress -r 4 on the 40 Mpx bench master)."""
    import numpy as np
    kernel = np.array(_LOWPASS[coding.reversible], np.float32)
    height, width = reference.shape[:2]
    out = np.empty((_down(height, r), _down(width, r), 3), np.float32)
    tw, th = coding.tile
    for y in range(0, height, th):
        band = np.asarray(reference[y:y + th])
        for x in range(0, width, tw):
            tile = band[:, x:x + tw]
            for k in range(r):
                tile = _lowpass(tile, kernel, _down(y, k) % 2, _down(x, k) % 2)
            out[_down(y, r):_down(y, r) + tile.shape[0], _down(x, r):_down(x, r) + tile.shape[1]] = tile
    return np.clip(np.rint(out), 0, 255)


def _down(coordinate: int, r: int) -> int:
    """A full-resolution coordinate `r` resolutions down (JPEG 2000's ceil(x / 2^r))."""
    return -(-coordinate // 2 ** r)


def _lowpass(tile, kernel, y_odd: int, x_odd: int):
    """The low band of a tile whose first row and column are at odd coordinates when y_odd and x_odd are 1:
    the samples at even ones are kept. A single sample along an axis is its own low band (or none)."""
    import cv2
    import numpy as np
    if min(tile.shape[:2]) <= 1:  # cv2 cannot reflect a single sample
        tile = np.asarray(tile, np.float32)
        if 0 in tile.shape[:2]:
            return tile[y_odd::2, x_odd::2]
        kx = kernel if tile.shape[1] > 1 else np.ones(1, np.float32)
        ky = kernel if tile.shape[0] > 1 else np.ones(1, np.float32)
    else:
        kx = ky = kernel
    filtered = cv2.sepFilter2D(np.ascontiguousarray(tile), cv2.CV_32F, kx, ky, borderType=cv2.BORDER_REFLECT_101)
    return filtered.reshape(tile.shape[0], tile.shape[1], -1)[y_odd::2, x_odd::2]


def luma_psnr(a, b) -> float:
    """PSNR in dB of the BT.601 luma of two 8-bit RGB arrays of one shape (inf when identical)."""
    import numpy as np
    weights = np.array(_LUMA)
    squared = 0.0
    for y in range(0, a.shape[0], 256):  # row blocks: float copies of a large image would not fit
        diff = a[y:y + 256].astype(np.float64) @ weights - b[y:y + 256].astype(np.float64) @ weights
        squared += float(np.sum(diff * diff))
    return _psnr(squared / (a.shape[0] * a.shape[1]))


def _psnr(mse: float) -> float:
    import numpy as np
    return float("inf") if mse == 0 else float(10 * np.log10(255 ** 2 / mse))
