"""A folder tree of masters: the embedded default's source, grouped by folder or by a sidecar (grouping.py).

A file is listed (`changes(since)`) by the newest of its modification and status-change (ctime) times, so a
master moved or copied in with its old modification time (mv, cp -p, rsync -a, tar) is found; a folder's
object also by its folder's, so a file renamed or deleted in it re-lists the object. Only the size and the
modification time say whether a master changed (a chmod re-lists it, to be skipped). Directory symlinks are
not followed (no cycles, no tree pulled in by accident); file symlinks are (masters are often linked into a
harvest folder). A file named by a sidecar must be a relative path inside the root.

Object and item ids are paths, and they are text wherever they go (the ledger, store keys, manifests). A
folder or file named in bytes that are not UTF-8 (a Latin-1 `caf\\xe9` copied from an old server) makes
its object unreadable until it is renamed: which text was meant is unknown, and an id guessed now would
deposit the object a second time once the name is fixed. The unreadable object's id is the path with those
bytes escaped (`caf\\xe9`), the same in every run, so its failure is recorded, retried and reported like any.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from pydantic import Field

from connectors.base import SourceItem, SourceObject, UnreadableObject
from connectors.fetching import CHUNK_SIZE, Body
from connectors.grouping import Group, GroupedSource, GroupingSettings, StoredFile, natural_key
from connectors.retry import RetryBudget, RetryPolicy
from gcis_etl.errors import SourceError
from gcis_etl.settings import Settings


class FilesystemSettings(Settings):
    root: Path
    grouping: GroupingSettings = GroupingSettings()
    retry: RetryPolicy = Field(RetryPolicy(max_attempts=2, backoff_base_seconds=0.5),
                               description="a local file that fails verification is read once more")


class FilesystemSource(GroupedSource):
    def __init__(self, settings: FilesystemSettings, name: str = "filesystem"):
        self.name = name
        self.settings = settings
        self.grouping = settings.grouping
        self.retry = settings.retry
        self.root = settings.root.expanduser().resolve()

    def _build(self, group: Group) -> SourceObject | UnreadableObject:
        """The group's object, or an UnreadableObject (GroupedSource._build) if its folder or one of its files is
        not named in UTF-8."""
        names = ([group.id] if not _is_text(group.id) else
                 sorted((f.path for f in group.files if not _is_text(f.path)), key=natural_key))
        if names and not group.problems:
            group = replace(group, problems=(
                f"{', '.join(_printable(n) for n in names)} under {self.root}: not named in UTF-8; "
                f"rename it in UTF-8 (convmv -f latin1 -t utf8 converts Latin-1 names)",))
        return super()._build(group)

    def _listed_id(self, group_id: str) -> str:
        return _printable(group_id)

    def _files(self) -> Iterator[StoredFile]:
        if not self.root.is_dir():
            raise SourceError(f"{self.name}: root {self.root} is not a readable folder")
        stack = [(str(self.root), "")]  # a folder, and its path under the root as files' paths begin with it
        while stack:
            folder, relative = stack.pop()
            try:
                entries = list(os.scandir(folder))
                folder_changed = _changed(os.stat(folder))
            except OSError as exc:
                raise SourceError(f"{self.name}: cannot list {folder}: {exc.strerror}") from None
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append((entry.path, f"{relative}{entry.name}/"))
                elif entry.is_file():
                    stat = entry.stat()
                    changed = _changed(stat)
                    if entry.is_symlink():  # a link to an old master made now
                        changed = max(changed, _changed(entry.stat(follow_symlinks=False)))
                    modified = _utc(stat.st_mtime)
                    yield StoredFile(relative + entry.name, stat.st_size, modified,
                                     listed_at=changed if changed > modified else None,  # None: modified
                                     folder_listed_at=folder_changed)

    def _read(self, path: str) -> bytes:
        try:
            return (self.root / path).read_bytes()
        except OSError as exc:
            raise SourceError(f"{self.name}: cannot read {path}: {exc.strerror}") from None

    def _locate(self, path: str) -> str:
        return str(self.root / path)

    @contextmanager
    def _open(self, item: SourceItem, budget: RetryBudget) -> Iterator[Body]:
        path = Path(item.locator)
        if not path.is_relative_to(self.root) or ".." in path.parts:
            raise SourceError(f"{self.name}: {item.locator!r} is not a file of this source (root {self.root})")
        try:
            handle = open(path, "rb")
        except OSError as exc:
            raise SourceError(f"{self.name}: cannot read {item.id}: {exc.strerror}") from None
        with handle:
            yield Body(iter(lambda: handle.read(CHUNK_SIZE), b""), file=handle)


def _utc(timestamp: float) -> datetime:
    return datetime.fromtimestamp(timestamp, timezone.utc)


def _changed(stat: os.stat_result) -> datetime:
    """A move, a copy keeping times, utime or chmod leaves st_mtime as it was but sets st_ctime to now."""
    return _utc(max(stat.st_mtime, stat.st_ctime))


def _is_text(name: str) -> bool:
    """False for a name os.scandir decoded with surrogate escapes (bytes that are not UTF-8)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _printable(name: str) -> str:
    return os.fsencode(name).decode("utf-8", "backslashreplace")
