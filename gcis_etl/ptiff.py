"""The pyramidal TIFF encoder: a normalised libvips image streamed into tiled JPEG levels, one page each.

libvips' own tiffsave writes RGB-coded (not subsampled) JPEG tiles at quality >= 90, 3.5x larger and
1.8x slower than 4:2:0; here libvips decodes, converts colour and streams rows, and libjpeg-turbo
(through simplejpeg) encodes each tile with the recipe's chroma subsampling.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np
import pyvips
import simplejpeg

from gcis_etl import tiff
from gcis_etl.isolation import pixel_error
from gcis_etl.jpegtables import JpegTables
from gcis_etl.models import Level
from gcis_etl.pyramid import PyramidEncoder
from gcis_etl.recipes import Recipe

# Rows fetched from libvips per request: the pipeline's float intermediates (icc_transform works in
# float Lab) scale with it. Measured on 120 Mpx: 256 rows -> 289 MB peak, 128 -> ~250 MB at the same
# CPU time, 64 -> ~230 MB but ~10% more CPU.
FETCH_ROWS = 128
PHOTOMETRIC_YCBCR = 6
COMPRESSION_JPEG = 7
SOFTWARE = "gcis-etl"


@dataclass(frozen=True)
class EncodedFile:
    levels: tuple[Level, ...]
    bigtiff: bool
    bytes: int


def encode_ptiff(image: pyvips.Image, out_path: Path, recipe: Recipe, icc: bytes,
                 metadata_tags: Callable[[], list[tiff.Tag]]) -> EncodedFile:
    """Write `image` (8-bit, 3 bands) as a page pyramid readable by iipsrv 1.1 (not fsync'ed: the
    caller does that beside verification).
    `metadata_tags` is asked for once the tiles are written, so the metadata can be read meanwhile."""
    width, height, bands, tile = image.width, image.height, image.bands, recipe.tile
    jpeg = partial(simplejpeg.encode_jpeg, quality=recipe.quality, colorspace="RGB",
                   colorsubsampling=recipe.chroma.replace(":", ""), fastdct=recipe.fast_dct)
    tables = JpegTables()

    def encode(tile: np.ndarray) -> bytes:
        return tables.abbreviate(jpeg(tile))

    with open(out_path, "wb") as f:
        writer = tiff.TiffFileWriter(f)
        writer.start()
        pyramid = PyramidEncoder(width, height, bands, tile, encode, writer, threads=encode_threads(recipe))
        region = pyvips.Region.new(image)
        try:
            for y in range(0, height, FETCH_ROWS):
                rows = min(FETCH_ROWS, height - y)
                try:
                    data = region.fetch(0, y, width, rows)
                except pyvips.Error as exc:
                    raise pixel_error(exc) from None
                pyramid.add_rows(np.ndarray(buffer=data, dtype=np.uint8, shape=(rows, width, bands)))
        except BaseException:
            pyramid.abort()
            raise
        states = pyramid.close()
        carried = metadata_tags()
        ifds = [level_tags(i, st.level, st.offsets, st.counts, recipe, icc, carried, tables.tables)
                for i, st in enumerate(states)]
        bigtiff = writer.finish(ifds)
        size = writer.size
    return EncodedFile(levels=tuple(st.level for st in states), bigtiff=bigtiff, bytes=size)


def encode_threads(recipe: Recipe) -> int:
    """A conversion uses as many cores as libvips was given threads (isolation.vips_concurrency). With one,
    the default for one conversion process per core, tiles are encoded in the decoding thread (0): a thread
    beside it would have each process compete for a second core, and the pool would scale less than
    linearly with its processes. With more, the recipe's encode_threads run beside the decoder."""
    return recipe.encode_threads if pyvips.concurrency_get() > 1 else 0


def level_tags(index: int, level: Level, offsets: list[int], counts: list[int], recipe: Recipe,
               icc: bytes, metadata_tags: list[tiff.Tag], jpeg_tables: bytes | None) -> list[tiff.Tag]:
    """The IFD of pyramid level `index`, whose tiles are already written (classic or BigTIFF alike)."""
    sub = (2, 2) if recipe.chroma == "4:2:0" else (1, 1)
    tags = [
        tiff.Tag(254, tiff.LONG, (0 if index == 0 else 1,)),
        tiff.Tag(256, tiff.LONG, (level.width,)),
        tiff.Tag(257, tiff.LONG, (level.height,)),
        tiff.Tag(258, tiff.SHORT, (8, 8, 8)),
        tiff.Tag(259, tiff.SHORT, (COMPRESSION_JPEG,)),
        tiff.Tag(262, tiff.SHORT, (PHOTOMETRIC_YCBCR,)),
        tiff.Tag(277, tiff.SHORT, (3,)),
        tiff.Tag(284, tiff.SHORT, (1,)),
        tiff.Tag(322, tiff.LONG, (recipe.tile,)),
        tiff.Tag(323, tiff.LONG, (recipe.tile,)),
        tiff.Tag(324, tiff.OFFSETS, offsets),
        tiff.Tag(325, tiff.OFFSETS, counts),
        tiff.Tag(530, tiff.SHORT, sub),
        tiff.Tag(532, tiff.RATIONAL, (0, 1, 255, 1, 128, 1, 255, 1, 128, 1, 255, 1)),
    ]
    if jpeg_tables:
        tags.append(tiff.Tag(347, tiff.UNDEFINED, jpeg_tables))
    if index == 0:
        tags.append(tiff.ascii_tag(305, SOFTWARE))
        tags.append(tiff.Tag(34675, tiff.UNDEFINED, icc))
        codes = {t.code for t in tags}
        tags.extend(t for t in metadata_tags if t.code not in codes)
    return tags
