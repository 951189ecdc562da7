"""Corpus files as the emulators' stored bytes: path, MIME type, size and digests from the real file."""
from __future__ import annotations

import csv
import hashlib
import zlib
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[1] / "corpus"

_MIME = {"TIFF": "image/tiff", "BigTIFF": "image/tiff", "JPEG": "image/jpeg", "PNG": "image/png",
         "JP2": "image/jp2", "J2K": "image/j2k"}


@lru_cache(maxsize=1)
def _formats() -> dict[str, str]:
    with open(CORPUS / "MANIFEST.csv", newline="") as f:
        return {row["local_path"]: row["format"] for row in csv.DictReader(f)}


@dataclass(frozen=True)
class CorpusFile:
    relative: str

    @property
    def path(self) -> Path:
        return CORPUS / self.relative

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def mime(self) -> str:
        """What a DAM would have recorded: taken from the corpus manifest, octet-stream for non-images."""
        return _MIME.get(_formats()[self.relative].split("(")[0].strip(), "application/octet-stream")

    @property
    def size(self) -> int:
        return self.path.stat().st_size

    def digest(self, algorithm: str) -> str:
        return _digest(self.path, algorithm)


@lru_cache(maxsize=None)
def _digest(path: Path, algorithm: str) -> str:
    if algorithm == "crc32":  # Rosetta records it; hashlib has none
        return f"{zlib.crc32(path.read_bytes()):08x}"
    return hashlib.new(algorithm, path.read_bytes()).hexdigest()


def utc(text: str) -> datetime:
    """'2024-01-10 09:00:00' as an aware UTC datetime (catalogue literals)."""
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc)
