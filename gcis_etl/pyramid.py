"""Streaming pyramid: full-resolution rows in, JPEG tiles of every level out, in bounded memory.

Rows arrive top to bottom. Each level keeps less than one tile-row of pixels; a completed tile-row is
encoded (in worker threads overlapping the decoder, or with threads=0 in the caller's thread) and box-shrunk
2x into the next level. Memory is a few tile-rows per level whatever the master's height: 300 Mpx stream
like 3.
"""
from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import cv2
import numpy as np

from gcis_etl.isolation import InCallerThread
from gcis_etl.models import Level
from gcis_etl.tiff import TiffFileWriter

TileEncoder = Callable[[np.ndarray], bytes]
# Tile-rows encoding at once, beyond which the oldest is written first: what bounds the encoded bytes held.
_IN_FLIGHT = 4


def levels_for(width: int, height: int, tile: int) -> list[Level]:
    """Ceil-halving until the level fits one tile: the sizes iipsrv and IIIF clients compute."""
    levels = [Level(width, height)]
    while width > tile or height > tile:
        width, height = (width + 1) // 2, (height + 1) // 2
        levels.append(Level(width, height))
    return levels


def shrink2(rows: np.ndarray) -> np.ndarray:
    """2x2 box average with ceil sizes (the last odd row/column is averaged with itself)."""
    if rows.shape[0] % 2:
        rows = np.concatenate([rows, rows[-1:]], axis=0)
    if rows.shape[1] % 2:
        rows = np.concatenate([rows, rows[:, -1:]], axis=1)
    small = cv2.resize(rows, (rows.shape[1] // 2, rows.shape[0] // 2), interpolation=cv2.INTER_AREA)
    return small.reshape(small.shape[0], small.shape[1], rows.shape[2])


@dataclass
class _LevelState:
    level: Level
    pending: list[np.ndarray] = field(default_factory=list)
    pending_rows: int = 0
    next_row: int = 0
    offsets: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)


class PyramidEncoder:
    """Feeds rows through every level and appends encoded tiles to a TiffFileWriter."""

    def __init__(self, width: int, height: int, bands: int, tile: int, encode: TileEncoder,
                 writer: TiffFileWriter, threads: int = 1):
        self.tile, self.bands, self.encode, self.writer = tile, bands, encode, writer
        self.levels = [_LevelState(lv) for lv in levels_for(width, height, tile)]
        for st in self.levels:
            n = -(-st.level.width // tile) * -(-st.level.height // tile)
            st.offsets, st.counts = [0] * n, [0] * n
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="tile-encode") if threads else InCallerThread()
        self._queue: deque[tuple[_LevelState, int, Future]] = deque()

    def add_rows(self, rows: np.ndarray) -> None:
        if rows.ndim == 2:
            rows = rows[:, :, None]
        self._feed(0, rows, final=False)

    def close(self) -> list[_LevelState]:
        """Flush every level's remainder, wait for the encoders, and return per-level tile offsets."""
        try:
            self._feed(0, None, final=True)
            while self._queue:
                self._drain_one()
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)
        return self.levels

    def abort(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _feed(self, index: int, rows: np.ndarray | None, final: bool) -> None:
        st = self.levels[index]
        if rows is not None and rows.shape[0]:
            st.pending.append(rows)
            st.pending_rows += rows.shape[0]
        while st.pending_rows >= self.tile or (final and st.pending_rows):
            block = np.concatenate(st.pending, axis=0) if len(st.pending) > 1 else st.pending[0]
            chunk, rest = block[:self.tile], block[self.tile:]
            st.pending = [rest] if rest.shape[0] else []
            st.pending_rows = rest.shape[0]
            self._submit(st, chunk)
            if index + 1 < len(self.levels):
                self._feed(index + 1, shrink2(chunk), final=False)
        if final and index + 1 < len(self.levels):
            self._feed(index + 1, None, final=True)

    def _submit(self, st: _LevelState, chunk: np.ndarray) -> None:
        row = st.next_row
        st.next_row += 1
        self._queue.append((st, row, self._pool.submit(self._encode_row, chunk)))
        while len(self._queue) > _IN_FLIGHT:
            self._drain_one()

    def _drain_one(self) -> None:
        st, row, fut = self._queue.popleft()
        across = -(-st.level.width // self.tile)
        for col, data in enumerate(fut.result()):
            st.offsets[row * across + col] = self.writer.append(data)
            st.counts[row * across + col] = len(data)

    def _encode_row(self, chunk: np.ndarray) -> list[bytes]:
        t = self.tile
        pad_rows, pad_cols = t - chunk.shape[0], -chunk.shape[1] % t
        if pad_rows or pad_cols:
            chunk = np.pad(chunk, ((0, pad_rows), (0, pad_cols), (0, 0)), mode="edge")
        return [self.encode(np.ascontiguousarray(chunk[:, x:x + t])) for x in range(0, chunk.shape[1], t)]
