"""A folder tree of masters: the embedded default's source, grouped by folder or by a sidecar (grouping.py).

A file is listed (`changes(since)`) by the newest of its modification and status-change (ctime) times, so a
master moved or copied in with its old modification time (mv, cp -p, rsync -a, tar) is found; a folder's
object also by its folder's, so a file renamed or deleted in it re-lists the object. Only the size and the
modification time say whether a master changed (a chmod re-lists it, to be skipped). A file named by a sidecar
must be a relative path inside the root.

Links: a link to a file is followed wherever it points, outside the root too (masters are often linked into a
harvest folder from another volume), and lists as the file it links to; with `links: inside`, only to a file under
the root (a share others write to must not publish what a link reaches elsewhere): a link elsewhere fails its item,
naming it. A link to a folder is not followed (no cycles, no tree pulled in by accident): each listing warns naming
it, as its files are not harvested (mount or bind-mount the folder under the root, or link its files). A link that
cannot be followed (to nothing, such as a master on a volume not mounted, or a loop of links) is an item that cannot
be read: its object is unreadable with the link and its target named, so a master missing is a failure, not a page
left out. A root that is such a link fails its pipeline's run as a missing root does.

A file that cannot be read (its permissions) is found by the listing, as a folder that cannot be listed is: its
object is unreadable until it can be read, and the chmod that fixes it re-lists it. A FIFO, socket or device is
no master: each listing warns naming them, and one swapped in for a master after the listing fails its item
(fetching.open_regular) instead of waiting for a writer for ever.

Object and item ids are paths, and they are text wherever they go (the ledger, store keys, manifests). A
folder or file named in bytes that are not UTF-8 (a Latin-1 `caf\\xe9` copied from an old server) makes
its object unreadable until it is renamed: which text was meant is unknown, and an id guessed now would
deposit the object a second time once the name is fixed. The unreadable object's id is the path with those
bytes escaped (`caf\\xe9`), the same in every run, so its failure is recorded, retried and reported like any.
"""
from __future__ import annotations

import errno
import logging
import os
import stat as stats
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator, Literal

from pydantic import Field

from connectors.base import SourceItem, SourceObject, UnreadableObject
from connectors.fetching import CHUNK_SIZE, Body, open_regular
from connectors.grouping import Group, GroupedSource, GroupingSettings, StoredFile, natural_key
from connectors.retry import RetryBudget, RetryPolicy
from gcis_etl.durable import special_kind
from gcis_etl.errors import SourceError
from gcis_etl.settings import Settings

log = logging.getLogger(__name__)


class FilesystemSettings(Settings):
    root: Path
    links: Literal["anywhere", "inside"] = Field("anywhere", description="a link to a file is followed wherever "
                                                 "it points, or (inside) only to a file under the root")
    grouping: GroupingSettings = GroupingSettings()
    retry: RetryPolicy = Field(RetryPolicy(max_attempts=2, backoff_base_seconds=0.5),
                               description="a local file that fails verification is read once more")


class FilesystemSource(GroupedSource):
    def __init__(self, settings: FilesystemSettings, name: str = "filesystem"):
        self.name = name
        self.settings = settings
        self.grouping = settings.grouping
        self.retry = settings.retry
        root = settings.root.expanduser()
        try:
            self.root = root.resolve()
        except (OSError, RuntimeError):  # a loop of links: the listing fails saying so, as for a missing root
            self.root = root.absolute()

    def _build(self, group: Group) -> SourceObject | UnreadableObject:
        """The group's object, or an UnreadableObject (GroupedSource._build) if its folder or one of its files is
        not named in UTF-8, or one of its files cannot be read (_UnreadableFile)."""
        names = ([group.id] if not _is_text(group.id) else
                 sorted((f.path for f in group.files if not _is_text(f.path)), key=natural_key))
        problems = ([f"{', '.join(_printable(n) for n in names)} under {self.root}: not named in UTF-8; rename it "
                     f"in UTF-8 (convmv -f latin1 -t utf8 converts Latin-1 names)"] if names else [])
        problems += [f.reason for f in sorted(group.files, key=lambda f: natural_key(f.path))
                     if isinstance(f, _UnreadableFile)]
        if problems and not group.problems:
            group = replace(group, problems=tuple(problems))
        return super()._build(group)

    def _listed_id(self, group_id: str) -> str:
        return _printable(group_id)

    def _files(self) -> Iterator[StoredFile]:
        try:
            is_folder = stats.S_ISDIR(os.stat(self.root).st_mode)
        except OSError as exc:
            is_folder, why = False, exc.strerror
        else:
            why = "not a folder"
        if not is_folder:
            raise SourceError(f"{self.name}: root {self.root} is not a readable folder ({why})")
        folder_links: list[str] = []
        specials: list[str] = []
        stack = [(str(self.root), "")]  # a folder, and its path under the root as files' paths begin with it
        while stack:
            folder, relative = stack.pop()
            try:
                folder_changed = _changed(os.stat(folder))
                entries = list(os.scandir(folder))
            except FileNotFoundError:
                if not relative:
                    raise SourceError(f"{self.name}: root {self.root} is gone") from None
                continue  # deleted since its parent was read
            except OSError as exc:
                if not relative:
                    raise SourceError(f"{self.name}: cannot list {folder}: {exc.strerror}") from None
                yield self._unlisted(relative, exc)
                continue
            for entry in entries:
                path = relative + entry.name
                if self.grouping.leaves_out(path):
                    continue  # an excluded folder is not walked (a .snapshot, a .git)
                if entry.is_dir(follow_symlinks=False):
                    stack.append((entry.path, path + "/"))
                    continue
                link = entry.is_symlink()
                if not (link or entry.is_file(follow_symlinks=False)):
                    specials.append(self._special(entry, path))
                    continue
                try:
                    stat = entry.stat()
                    own = entry.stat(follow_symlinks=False)
                except OSError as exc:
                    unreadable = self._unreadable(entry, path, exc, folder_changed)
                    if unreadable is not None:
                        yield unreadable
                    continue
                if stats.S_ISDIR(stat.st_mode):
                    folder_links.append(f"{_printable(path)} -> {_printable(os.readlink(entry.path))}")
                    continue
                if not stats.S_ISREG(stat.st_mode):
                    specials.append(self._special(entry, path))
                    continue
                changed = max(_changed(stat), _changed(own))  # a link to an old master made now is new
                if not os.access(entry.path, os.R_OK):  # a chmod that fixes it changes its ctime: re-listed
                    yield self._unreadable(entry, path, PermissionError(errno.EACCES, os.strerror(errno.EACCES)),
                                           folder_changed, changed)
                    continue
                modified = _utc(stat.st_mtime)
                yield StoredFile(path, stat.st_size, modified,
                                 listed_at=changed if changed > modified else None,  # None: modified
                                 folder_listed_at=folder_changed)
        if folder_links:
            log.warning("%s: %d link(s) to a folder under %s not followed, their files not harvested (mount the "
                        "folder under the root, or link its files): %s%s", self.name, len(folder_links), self.root,
                        ", ".join(folder_links[:5]), " ..." if len(folder_links) > 5 else "")
        if specials:
            log.warning("%s: %d FIFO(s), socket(s) or device(s) under %s not harvested, as they are no regular "
                        "files: %s%s", self.name, len(specials), self.root, ", ".join(specials[:5]),
                        " ..." if len(specials) > 5 else "")

    def _special(self, entry: os.DirEntry, path: str) -> str:
        """A FIFO, socket or device the walk found (or a link to one), named for the listing's warning."""
        try:
            kind = special_kind(entry.stat().st_mode)
            target = f" -> {_printable(os.readlink(entry.path))}" if entry.is_symlink() else ""
        except OSError as exc:
            return f"{_printable(path)} ({exc.strerror})"
        return f"{_printable(path)}{target} ({kind})"

    def _unlisted(self, relative: str, exc: OSError) -> _UnreadableFile:
        """A folder below the root that cannot be listed (its permissions): its object fails naming it, where one
        such folder stopped every run. It stands for the folder's files (a name no file has), so the folder's
        object is unreadable; its subfolders' objects cannot be seen until it can be listed."""
        try:
            changed = _changed(os.stat(self.root / relative))
        except OSError:
            changed = datetime.now(timezone.utc)
        reason = (f"{_printable(relative)} under {self.root} cannot be listed: {exc.strerror} (its files, and the "
                  f"objects of its subfolders, are not harvested until it can be)")
        return _UnreadableFile(relative + "*", 0, changed, folder_listed_at=changed, reason=reason)

    def _unreadable(self, entry: os.DirEntry, path: str, exc: OSError, folder_changed: datetime,
                    changed: datetime | None = None) -> _UnreadableFile | None:
        """A file the walk found but cannot stat or read, listed as such (its object unreadable), by when it
        `changed` (where it could be stat'ed) else by when its link did; None for a file deleted since its folder
        was read, which is gone."""
        where = f"{_printable(path)} under {self.root}"
        try:
            own = entry.stat(follow_symlinks=False)
            target = os.readlink(entry.path) if stats.S_ISLNK(own.st_mode) else None
        except FileNotFoundError:  # gone since its folder was read
            return None
        except OSError as err:  # a folder that may be read but not searched (r without x): none of its files
            return _UnreadableFile(path, 0, folder_changed, folder_listed_at=folder_changed,
                                   reason=f"{where} cannot be read: {err.strerror}")
        if target is None and isinstance(exc, FileNotFoundError):
            return None
        if target is None:
            reason = f"{where} cannot be read: {exc.strerror}"
        elif exc.errno == errno.ENOENT:
            reason = (f"{where} is a link to {_printable(target)}, which does not exist (a volume not mounted, a "
                      f"master moved or deleted?)")
        elif exc.errno == errno.ELOOP:
            reason = f"{where} is a link to {_printable(target)} in a loop of links (it leads back to itself)"
        else:
            reason = f"{where} is a link to {_printable(target)}, which cannot be read: {exc.strerror}"
        return _UnreadableFile(path, own.st_size, changed or _changed(own), folder_listed_at=folder_changed,
                               reason=reason)

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
            handle = open_regular(path)
        except OSError as exc:
            raise SourceError(f"{self.name}: cannot read {item.id}: {exc.strerror}") from None
        with handle:
            if self.settings.links == "inside":
                self._refuse_outside(item, handle.fileno())
            yield Body(iter(lambda: handle.read(CHUNK_SIZE), b""), file=handle)

    def _refuse_outside(self, item: SourceItem, fd: int) -> None:
        """links: inside, checked on the file opened (where its descriptor leads), not on the path before opening
        it: a link swapped in between would be read."""
        target = Path(os.path.realpath(f"/proc/self/fd/{fd}"))
        if not target.is_relative_to(self.root):
            raise SourceError(f"{self.name}: {_printable(item.id)} under {self.root} is a link to "
                              f"{_printable(str(target))}, outside the root (links: inside)")


@dataclass(frozen=True, slots=True)
class _UnreadableFile(StoredFile):
    """A file listed that cannot be read (a link to nothing, a loop of links): its object is unreadable."""

    reason: str = ""


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
