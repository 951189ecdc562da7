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
