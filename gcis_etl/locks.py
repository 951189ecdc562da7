"""One run per pipeline at a time: a non-blocking flock, released by the kernel however the holder dies."""
from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from gcis_etl.errors import ConfigError, GcisError


class LockHeld(GcisError):
    """Another run of the pipeline holds its lock (cron started the next run before the last one ended)."""


class LockUnusable(ConfigError):
    """The lock file cannot be made or locked (its folder read-only, not this user's, its disk full): no run can
    start until the deployment changes, so it is reported and exits like a configuration error."""


_TODO = {  # what to do, by the errno of a lock file that cannot be made or locked
    errno.EROFS: "its filesystem is mounted read-only: mount it read-write, or move the folder to one that is",
    errno.EACCES: "make its folder writable by this user",
    errno.EPERM: "make its folder writable by this user",
    errno.ENOSPC: "free space on its filesystem",
    errno.EDQUOT: "free space under this user's quota there",
    errno.ENOLCK: "its filesystem does not support file locks (NFS without lockd?): move the folder to a local disk",
}


class RunLock:
    def __init__(self, path: Path, what: str):
        self.path = path
        self.what = what
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        try:
            self._fd = self._take()
        except OSError as exc:
            todo = _TODO.get(exc.errno, "check that its folder is there and writable by this user")
            raise LockUnusable(f"lock {self.path} for {self.what} cannot be taken ({exc.strerror or exc}): {todo}; "
                               f"nothing was done") from None
        return self

    def _take(self) -> int:
        """The lock file, created if need be, locked and holding our pid."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:  # the file is closed however taking it fails (held, or a filesystem without locks)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
                where = f"pid {holder}; lock {self.path}" if holder else \
                    f"lock {self.path}, held by a process that did not record its pid"
                raise LockHeld(f"{self.what} is already running ({where}): nothing was done") from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def held(self) -> bool:
        """Whether a run holds the lock now, for `gcis-etl status`. Takes it shared for an instant (a run starting
        in that instant would find it held) and never creates the lock file: looking changes nothing."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def pipeline_lock(state_dir: Path, pipeline: str) -> RunLock:
    """The lock every run of a pipeline takes: harvests, retries and migrations alike."""
    return RunLock(state_dir / "locks" / f"{pipeline}.lock", f"pipeline {pipeline!r}")
