"""Local files that survive a crash and are identified by content: directory fsync and SHA-256."""
from __future__ import annotations

import errno
import hashlib
import os
import secrets
import stat
from pathlib import Path
from typing import IO

CHUNK = 4 * 1024 * 1024
# A write the filesystem refuses whatever the file: every other write there fails the same way until someone
# frees space or remounts it, so the work that needs it stops instead of failing item after item.
DISK_REFUSES_WRITES = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
# Free space under which a failed write is taken for the disk's when the tool that failed says nothing of why
# (exiftool: "Error writing image data") and removed what it wrote; and kept free when a master is fetched.
DISK_MARGIN = 1 << 20


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
    fd, tmp = temporary(path)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def temporary(path: Path) -> tuple[int, Path]:
    """A new file beside `path`, open for writing, to be renamed over it: its mode is the umask's (0666 & ~umask),
    as the ledger's and the lock files' are, not mkstemp's 0600: what goes through it (run and migration
    reports) holds what the ledger holds, and no secret."""
    tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp


def room(folder: Path) -> tuple[int, bool]:
    """The free bytes (for an unprivileged user) of the filesystem `folder` is on, or would be on once made, and
    whether it is mounted read-only."""
    folder = next(path for path in (folder, *folder.parents) if path.exists())
    fs = os.statvfs(folder)
    return fs.f_bavail * fs.f_frsize, bool(fs.f_flag & os.ST_RDONLY)


_SPECIAL = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
            (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def special_kind(mode: int) -> str | None:
    """What a FIFO, device or socket is, in words (None for anything else): opening a FIFO waits for a writer, for
    ever if none comes, and a device or socket is no master."""
    return next((what for test, what in _SPECIAL if test(mode)), None)
