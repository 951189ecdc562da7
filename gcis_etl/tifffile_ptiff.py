"""The tifffile PTIFF encoder (recipe encoder `tifffile`): a second engine for the same access master.

Rows come from imagecms_colour (LittleCMS through Pillow ImageCms), a band at a time. Each level is one
tifffile page written from a tile iterator, its tiles JPEG-compressed by tifffile/imagecodecs. tifffile
writes pages one after the other, while the pyramid is made top-down in one pass: the next level is made
piece by piece with cv2.resize (the recipe's interpolation) and spilled uncompressed to scratch until its
page is written. Rows are fetched, transformed, halved and read back in pieces of at most PIECE_BYTES at the
widest step of their making, put together into the tile rows tifffile needs: memory is one 8-bit tile row
and a few pieces whatever the master's height, and grows with its width only by the tile row (3 x tile
bytes a column). Scratch holds at most ~0.31x the master's uncompressed 8-bit size (levels 1 and 2).

tifffile cannot write the EXIF and GPS sub-IFDs: once it has written the file, its IFD chain is read back
and written again after the tiles by tiff.TiffFileWriter, with the carried metadata in IFD0 as on the
main path (the first chain stays behind as a few unreferenced kilobytes).
"""
from __future__ import annotations

import os
import tempfile
from contextlib import ExitStack, closing
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

import cv2
import numpy as np
import tifffile

from gcis_etl import tiff
from gcis_etl.isolation import in_scratch
from gcis_etl.errors import ConversionFailed
from gcis_etl.imagecms_colour import SrgbStrips
from gcis_etl.models import Level
from gcis_etl.ptiff import SOFTWARE, EncodedFile
from gcis_etl.pyramid import levels_for
from gcis_etl.recipes import Recipe

INTERPOLATIONS = {"area": cv2.INTER_AREA, "linear": cv2.INTER_LINEAR, "cubic": cv2.INTER_CUBIC,
                  "lanczos4": cv2.INTER_LANCZOS4, "nearest": cv2.INTER_NEAREST}
SUBSAMPLING = {"4:2:0": (2, 2), "4:4:4": (1, 1)}
BIGTIFF_FROM = 2 ** 32 - 2 ** 25  # uncompressed bytes of all levels; tifffile's own threshold
# Bytes of a piece (rows fetched and colour-transformed, or read back from scratch, at once) at the widest
# step of its making (SrgbStrips.pixel_bytes; 3 read back from scratch). Every libvips step holds the piece
# in its own buffer: a 12,000-column tile row (3 Mpx) cost 40 MB a Mpx on 8-bit RGB but 220 on 16-bit
# RGBA, flattened in float (770 MB peak). At 4 MB a 120 Mpx master peaks at 190-290 MB; smaller pieces
# cost CPU (+30% at 200,000 columns, 16-bit: 3 rows where 4 Mpx pieces had 20).
PIECE_BYTES = 2 ** 22
ENCODE_BUFFER = 2 ** 25  # bytes of tiles tifffile copies out and compresses in one pass (its buffersize)
_OFFSET_TAGS, _PLACEHOLDERS = (324, 325), (282, 283, 296)


def tile_options(recipe: Recipe) -> dict:
    """tifffile.TiffWriter.write arguments for a page of JPEG tiles.

    photometric='rgb' says what the array holds: tifffile then has libjpeg convert RGB to YCbCr (subsampled
    as the recipe says) and tags the page YCbCr. 'ycbcr' would store the RGB samples as if they were YCbCr:
    a valid file with wrong colours (tests/test_tifffile_path.py shows it)."""
    return {"tile": (recipe.tile, recipe.tile), "compression": "jpeg", "compressionargs": {"level": recipe.quality},
            "photometric": "rgb", "subsampling": SUBSAMPLING[recipe.chroma], "metadata": None}


class Halver:
    """A level's rows in, the next level's rows out (to `sink`), band by band.

    The output equals cv2.resize of the whole level to half size, the level first padded to even sizes by
    repeating its last row and column (as pyramid.shrink2 does): each output row is computed from a slice
    that starts on an even row and carries HALO rows of context each side, which covers the widest OpenCV
    kernel (Lanczos4, 8 taps) at an exact 2x reduction. Holds at most what it is given plus 2 x HALO rows."""

    HALO = 4

    def __init__(self, width: int, height: int, interpolation: int, sink: Callable[[np.ndarray], object]):
        self.width, self.height, self.interpolation, self.sink = width, height, interpolation, sink
        self.received = 0
        self.emitted = 0      # output rows written to the sink
        self.start = 0        # level row of self.held's first row
        self.held: np.ndarray | None = None

    def add(self, rows: np.ndarray) -> None:
        if self.width % 2:
            rows = np.concatenate([rows, rows[:, -1:]], axis=1)
        self.received += rows.shape[0]
        if self.received > self.height:
            raise ValueError(f"{self.received} rows given for a level of {self.height}")
        final = self.received == self.height
        if final and self.height % 2:
            rows = np.concatenate([rows, rows[-1:]], axis=0)
        held = rows if self.held is None else np.concatenate([self.held, rows], axis=0)
        available = self.start + held.shape[0]
        # output row j reads level rows 2j - HALO .. 2j + 1 + HALO
        end = available // 2 if final else max(self.emitted, (available - self.HALO) // 2)
        if end > self.emitted:
            first = max(0, 2 * self.emitted - self.HALO)
            last = min(available, 2 * end + self.HALO)
            src = held[first - self.start:last - self.start]
            half = cv2.resize(src, (src.shape[1] // 2, src.shape[0] // 2), interpolation=self.interpolation)
            offset = first // 2
            self.sink(half.reshape(half.shape[0], half.shape[1], -1)[self.emitted - offset:end - offset])
            self.emitted = end
        keep_from = max(0, 2 * self.emitted - self.HALO)
        self.held = held[keep_from - self.start:]
        self.start = keep_from


def encode_tifffile_ptiff(strips: SrgbStrips, out_path: Path, recipe: Recipe, icc: bytes,
                          metadata_tags: Callable[[], list[tiff.Tag]], scratch: Path) -> EncodedFile:
    """Write the master as a page pyramid with tifffile, metadata transplanted (not fsync'ed: the
    caller does that beside verification).
    `metadata_tags` is asked for once the pixels are written, so the metadata can be read meanwhile."""
    levels = levels_for(strips.width, strips.height, recipe.tile)
    bigtiff = sum(lv.width * lv.height * 3 for lv in levels) >= BIGTIFF_FROM
    interpolation = INTERPOLATIONS[recipe.interpolation]
    threads = recipe.encode_threads
    with ExitStack() as stack:
        pool = stack.enter_context(ThreadPoolExecutor(threads, thread_name_prefix="imagecms"))
        reader = stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="read-ahead"))
        tif = stack.enter_context(tifffile.TiffWriter(out_path, bigtiff=bigtiff, byteorder="<"))
        pieces = _read_ahead(strips.bands(piece_rows(levels[0], recipe.tile, strips.pixel_bytes), pool), reader)
        source = None
        for index, level in enumerate(levels):
            spill = stack.enter_context(closing(_Spill(scratch))) if index + 1 < len(levels) else None
            halver = Halver(level.width, level.height, interpolation, spill.write) if spill else None
            tif.write(_tiles(_tile_rows(pieces, level, recipe.tile, halver), level, recipe.tile),
                      shape=(level.height, level.width, 3), dtype=np.uint8, subfiletype=0 if index == 0 else 1,
                      iccprofile=icc if index == 0 else None, software=SOFTWARE if index == 0 else False,
                      maxworkers=threads, buffersize=min(level.width * recipe.tile * 3, ENCODE_BUFFER),
                      **tile_options(recipe))
            if source is not None:
                source.close()  # this level's spill is written out: its space is freed
            if spill is not None:
                next_level = levels[index + 1]
                pieces, source = spill.pieces(next_level, piece_rows(next_level, recipe.tile, 3)), spill
    size = _rewrite_ifds(out_path, metadata_tags(), bigtiff)
    return EncodedFile(levels=tuple(levels), bigtiff=bigtiff, bytes=size)


def piece_rows(level: Level, tile: int, pixel_bytes: int) -> int:
    """Rows a piece of the level has: a tile row, or as many rows of it as PIECE_BYTES allows at `pixel_bytes`
    a pixel."""
    return max(1, min(tile, PIECE_BYTES // (pixel_bytes * level.width)))


def _read_ahead(pieces: Iterator[np.ndarray], reader: ThreadPoolExecutor) -> Iterator[np.ndarray]:
    """The next piece is fetched and colour-transformed in `reader` while tifffile compresses this one."""
    pending = reader.submit(next, pieces, None)
    while (piece := pending.result()) is not None:
        pending = reader.submit(next, pieces, None)
        yield piece


def _tile_rows(pieces: Iterator[np.ndarray], level: Level, tile: int, halver: Halver | None) -> Iterator[np.ndarray]:
    """The level's tile rows (the last one shorter), put together from pieces of any number of rows: a piece
    that holds a whole tile row is used as it is. Each piece goes to `halver` as it comes."""
    done, band, filled = 0, None, 0
    for piece in pieces:
        if halver is not None:
            halver.add(piece)
        while len(piece):
            rows = min(tile, level.height - done)
            if band is None and len(piece) >= rows:
                band, piece, filled = piece[:rows], piece[rows:], rows
            else:
                if band is None:
                    band = np.empty((rows, level.width, 3), np.uint8)
                taken = piece[:rows - filled]
                band[filled:filled + len(taken)] = taken
                piece, filled = piece[len(taken):], filled + len(taken)
            if filled == rows:
                yield band
                done, band, filled = done + rows, None, 0


def _tiles(rows: Iterator[np.ndarray], level: Level, tile: int) -> Iterator[np.ndarray]:
    """The level's tiles in row-major order, edge tiles padded by repeating their last row and column
    (tifffile would pad with black, which JPEG smears into the image's edge)."""
    for band in rows:
        for x in range(0, level.width, tile):
            piece = band[:, x:x + tile]
            if piece.shape[0] < tile or piece.shape[1] < tile:
                piece = np.pad(piece, ((0, tile - piece.shape[0]), (0, tile - piece.shape[1]), (0, 0)), mode="edge")
            yield piece


class _Spill:
    """A level kept uncompressed in scratch until its page is written; its I/O errors name the scratch folder
    (a full temp filesystem is not the destination's)."""

    def __init__(self, folder: Path):
        with in_scratch():
            self.file: BinaryIO = tempfile.TemporaryFile(dir=folder)

    def write(self, rows: np.ndarray) -> None:
        with in_scratch():
            self.file.write(rows)

    def pieces(self, level: Level, rows: int) -> Iterator[np.ndarray]:
        """The level's rows read back, `rows` at a time."""
        with in_scratch():
            self.file.seek(0)
        for y in range(0, level.height, rows):
            n = min(rows, level.height - y)
            with in_scratch():
                piece = np.fromfile(self.file, np.uint8, n * level.width * 3)
            yield piece.reshape(n, level.width, 3)

    def close(self) -> None:
        self.file.close()


def _rewrite_ifds(path: Path, metadata_tags: list[tiff.Tag], bigtiff: bool) -> int:
    """Append tifffile's IFD chain again, with the carried metadata in IFD0, and point the header at it.

    tifffile's XResolution/YResolution 1/1 without unit are placeholders and are dropped: the master's
    resolution, when it has one, is among the carried tags. As on the main path, a carried tag never
    replaces one the encoder wrote (Software). The header is rewritten in place; in a classic TIFF that
    overwrites the first bytes after it, which tifffile fills with its first IFD, unreferenced from then on."""
    chain, first = _read_chain(path)
    if first != (16 if bigtiff else 8):
        raise ConversionFailed(f"tifffile wrote its first IFD at offset {first}: cannot rewrite the header")
    chain = [[t for t in tags if t.code not in _PLACEHOLDERS] for tags in chain]
    written = {t.code for t in chain[0]}
    chain[0] += [t for t in metadata_tags if t.code not in written]
    with open(path, "r+b") as f:
        f.seek(0, os.SEEK_END)
        writer = tiff.TiffFileWriter(f, size=f.tell())
        writer.finish(chain, force_bigtiff=bigtiff)
        return writer.size


def _read_chain(path: Path) -> tuple[list[list[tiff.Tag]], int]:
    """Every IFD's entries as tiff.Tag (raw values), and the offset of the first IFD."""
    chain = []
    with tifffile.TiffFile(path) as tf:
        fh = tf.filehandle
        for page in tf.pages:
            tags = []
            for tag in page.tags.values():
                typ = int(tag.dtype)
                fh.seek(tag.valueoffset)
                values = tiff.decode_values(typ, fh.read(tiff.field_size(typ, tag.count)), "<")
                tags.append(tiff.Tag(tag.code, tiff.OFFSETS if tag.code in _OFFSET_TAGS else typ, values))
            chain.append(tags)
        first = tf.pages.first.offset
    return chain, first
