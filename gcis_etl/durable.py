"""Local files that survive a crash and are identified by content: directory fsync and SHA-256."""
from __future__ import annotations

import errno
import hashlib
import os
import tempfile
from pathlib import Path
from typing import IO

CHUNK = 4 * 1024 * 1024
# A write the filesystem refuses whatever the file: every other write there fails the same way until someone
# frees space or remounts it, so the work that needs it stops instead of failing item after item.
DISK_REFUSES_WRITES = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def fsync_path(path: str | Path) -> None:
    """Make what was written to the file `path` durable, or, for a directory, the renames in it (a rename is
    in the directory, not the file). Opened read-only: Linux flushes a file through any descriptor."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_stream(f: IO[bytes]) -> str:
    digest = hashlib.sha256()
    for chunk in iter(lambda: f.read(CHUNK), b""):
        digest.update(chunk)
    return digest.hexdigest()


def sha256_file(path: str | Path) -> str:
    with open(path, "rb") as f:
        return sha256_stream(f)


def atomic_write(path: Path, text: str) -> None:
    """Replace `path` with `text` so a reader sees the old or the new content, never a part of it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
