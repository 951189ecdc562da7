"""Verify an access master before it is declared a success (and on demand: `gcis-etl verify`).

Structure is read with tifffile; pixels are decoded through libvips/libtiff, the same library iipsrv
reads with, so a file that passes here is one iipsrv can serve.
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path

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


def verify(path: str | Path, expect: Expectation | None = None, decode: bool = True) -> VerifyReport:
    """Check the access-master contract; returns errors and warnings rather than raising."""
    import tifffile
    expect = expect or Expectation()
    path = Path(path)
    errors: list[str] = []
    warnings: list[str] = []
    if "_pyr_" in path.name:
        errors.append("file name contains '_pyr_', which iipsrv 1.1 reads as a 3-D sequence marker")
    try:
        with tifffile.TiffFile(path) as tf:
            pages = list(tf.pages)
            found = [Level(p.imagewidth, p.imagelength) for p in pages]
            icc = pages[0].tags.get(34675)
            icc = bytes(icc.value) if icc is not None else None
            for i, p in enumerate(pages):
                errors.extend(_page_errors(i, p, expect))
    except Exception as exc:  # tifffile raises many types on malformed files
        return VerifyReport(str(path), errors=(f"not a readable TIFF: {exc}",))
    w0, h0 = found[0].width, found[0].height
    tile = expect.tile or (pages[0].tilewidth if pages[0].is_tiled else 256)
    wanted = levels_for(w0, h0, tile)
    if found != wanted:
        errors.append(f"levels {[(lv.width, lv.height) for lv in found]} differ from the ceil-halving pyramid "
                      f"{[(lv.width, lv.height) for lv in wanted]}")
    if expect.width is not None and (w0, h0) != (expect.width, expect.height):
        errors.append(f"full resolution is {w0}x{h0}, expected {expect.width}x{expect.height}")
    errors.extend(_icc_errors(icc))
    if decode and not errors:
        errors.extend(_decode_errors(path, found, tile))
    if expect.metadata:
        errors.extend(metadata_differences(expect.metadata, path))
    return VerifyReport(str(path), errors=tuple(errors), warnings=tuple(warnings), width=w0, height=h0,
                        levels=tuple(found))


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
    errors = []
    for i, lv in enumerate(levels):
        try:
            page = pyvips.Image.new_from_file(str(path), page=i, fail_on="warning", access="random")
            spots = {(0, 0), (lv.width - 1, lv.height - 1), (lv.width // 2, lv.height // 2)}
            for x, y in spots:
                x0, y0 = x // tile * tile, y // tile * tile
                page.crop(x0, y0, min(tile, lv.width - x0), min(tile, lv.height - y0)).avg()
            if i == len(levels) - 1:
                page.avg()
        except pyvips.Error as exc:
            errors.append(f"level {i} does not decode: {str(exc.message).strip()}")
    return errors


def metadata_differences(expected: dict, path: Path) -> list[str]:
    """Kept tags that are missing from, or different in, the access master."""
    from gcis_etl.metadata import exiftool_json
    found = exiftool_json(path, "-a")
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
    metadata: dict = field(default_factory=dict)


def verify_jp2(path: str | Path, expect: Jp2Expectation) -> VerifyReport:
    """Structure with jpylyzer (the validator Bodleian uses), geometry, sRGB colour box, then pixels."""
    from jpylyzer import jpylyzer
    path = Path(path)
    errors: list[str] = []
    warnings: list[str] = []
    try:
        result = jpylyzer.checkOneFile(str(path), "jp2")
    except Exception as exc:  # jpylyzer raises on unreadable files
        return VerifyReport(str(path), errors=(f"jpylyzer cannot read the file: {exc}",))
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
             "plt": any(int(e.text) > 0 for e in result.iter("pltCount"))}
    wanted = {"size": (expect.width, expect.height), "components": 3, "bits": 8, "levels": expect.levels,
              "layers": expect.layers, "progression": expect.progression, "ht": expect.ht, "plt": expect.plt}
    errors.extend(f"{key} is {found[key]}, expected {wanted[key]}" for key in wanted if found[key] != wanted[key])
    if not errors:
        errors.extend(_jp2_pixel_errors(path, expect))
    if expect.metadata:
        errors.extend(metadata_differences(expect.metadata, path))
    width, height = found["size"]
    levels = tuple(Level(-(-width // 2 ** r), -(-height // 2 ** r)) for r in range((found["levels"] or 0) + 1)) \
        if width and height else ()
    return VerifyReport(str(path), errors=tuple(errors), warnings=tuple(warnings), width=width, height=height,
                        levels=levels)


def _int(result, xpath: str) -> int | None:
    text = result.findtext(xpath)
    return int(text) if text is not None and text.isdigit() else None


def _jp2_pixel_errors(path: Path, expect: Jp2Expectation) -> list[str]:
    """Decode with OpenJPEG (as iipsrv would): the lowest resolution with opj_decompress (Pillow cannot
    reduce small images that far), the full resolution through Pillow; compare with the normalised image."""
    import subprocess
    import tempfile

    import numpy as np
    from PIL import Image
    Image.MAX_IMAGE_PIXELS = None  # the pixel limit was applied to the master already
    with tempfile.TemporaryDirectory(prefix="gcis-jp2-") as scratch:
        lowest = Path(scratch) / "lowest.tif"
        proc = subprocess.run(["opj_decompress", "-i", str(path), "-o", str(lowest), "-r", str(expect.levels)],
                              capture_output=True, text=True, errors="replace", stdin=subprocess.DEVNULL)
        if proc.returncode or not lowest.is_file():
            return [f"lowest resolution does not decode: {(proc.stderr or proc.stdout).strip()[-200:]}"]
        with Image.open(lowest) as im:
            smallest = im.size
    try:
        with Image.open(path) as im:
            im.load()
            decoded = np.asarray(im.convert("RGB"))
    except (OSError, ValueError) as exc:
        return [f"does not decode: {exc}"]
    errors = []
    if smallest != (-(-expect.width // 2 ** expect.levels), -(-expect.height // 2 ** expect.levels)):
        errors.append(f"lowest resolution decodes as {smallest[0]}x{smallest[1]}")
    if expect.reference is None:
        return errors
    with Image.open(expect.reference) as ref:
        reference = np.asarray(ref.convert("RGB"))
    if expect.min_psnr == LOSSLESS:
        if not np.array_equal(decoded, reference):
            errors.append("lossless recipe but the decoded pixels differ from the normalised image")
        return errors
    psnr = luma_psnr(decoded, reference)
    if psnr < expect.min_psnr:
        errors.append(f"luma PSNR against the normalised image is {psnr:.1f} dB, below {expect.min_psnr:g} dB")
    return errors


def luma_psnr(a, b) -> float:
    """PSNR in dB of the BT.601 luma of two 8-bit RGB arrays of one shape (inf when identical)."""
    import numpy as np
    weights = np.array([0.299, 0.587, 0.114])
    squared = 0.0
    for y in range(0, a.shape[0], 256):  # row blocks: float copies of a large image would not fit
        diff = a[y:y + 256].astype(np.float64) @ weights - b[y:y + 256].astype(np.float64) @ weights
        squared += float(np.sum(diff * diff))
    mse = squared / (a.shape[0] * a.shape[1])
    return float("inf") if mse == 0 else float(10 * np.log10(255 ** 2 / mse))
