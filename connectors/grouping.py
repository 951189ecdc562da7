"""Stored files grouped into objects: the part shared by the filesystem and S3 sources.

Two ways to group, chosen by `grouping.mode` (auto = sidecar when one exists at the root, else folder):
- folder: every folder holding files is an object (id = its path under the root), its items the files
  directly in it in natural order (page2 before page10); a file at the root is an object of its own.
- sidecar: `objects.csv` or `objects.json` at the root names each object, its files in sequence, item
  labels and descriptive metadata; files it does not name are not harvested (and are counted in a warning).
  A name matches a stored path as written, else by Unicode NFC normalisation (Mac uploads are NFD).

An object the store's names do not make (a sidecar row naming a missing file, a key both a root file and a folder)
is listed as an UnreadableObject in its place, so its failure is recorded and retried and the others go on.

Every regular file is an item except the sidecars and those `grouping.exclude` names (a pattern matching the file's
name or one of its folders': hidden ones, upload leftovers, desktop clutter; never the sidecar at the root): deciding
what is an image is the converter's business. An object's `modified` is the newest of its files' modification times
and of its sidecar entry (the entry's `modified` column when given, else the sidecar file's own time, so editing the
sidecar re-harvests its objects). It is listed (`changes(since)`) by its `listed_at`, which also counts when its
files were last moved or copied in (StoredFile.listed_at) and, for a folder, when a file was added, renamed or
deleted in it: whether an item changed stays a matter of its size and modification time (work.fingerprint).
"""
from __future__ import annotations

import csv
import fnmatch
import io
import json
import logging
import re
import unicodedata
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterable, Iterator, Literal

from pydantic import Field, field_validator

from connectors.base import FetchedFile, Fixity, LangValue, SourceItem, SourceObject, UnreadableObject
from connectors.errors import ObjectNotFound, SourceDataError
from connectors.fetching import Body, fetch_verified
from connectors.retry import RetryBudget, RetryPolicy
from connectors.timestamps import as_utc, within
from gcis_etl.errors import ConfigError, SourceError
from gcis_etl.settings import Settings, parse

log = logging.getLogger(__name__)

_RESERVED_COLUMNS = {"object_id", "file", "sequence", "label", "modified"}


# hidden files and folders (.DS_Store, .snapshot, rsync's temporaries), partial uploads and downloads (browsers,
# WinSCP), Office lock files and what Windows leaves in a folder it shows
EXCLUDED = (".*", "*.part", "*.filepart", "*.partial", "*.crdownload", "*.tmp", "~$*", "Thumbs.db", "desktop.ini")


class GroupingSettings(Settings):
    mode: Literal["auto", "folder", "sidecar"] = "auto"
    sidecar_names: tuple[str, ...] = Field(("objects.csv", "objects.json"), min_length=1,
                                           description="looked for at the root, in this order")
    exclude: tuple[str, ...] = Field(EXCLUDED, description="glob patterns of file and folder names not harvested, "
                                                           "matched regardless of case")

    @field_validator("exclude")
    @classmethod
    def _names(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        wrong = [p for p in patterns if not p or "/" in p]
        if wrong:
            raise ValueError(f"a pattern matches one file or folder name, with no '/' and not empty: got "
                             f"{', '.join(map(repr, wrong))}")
        return patterns

    def leaves_out(self, path: str) -> bool:
        """Whether `exclude` leaves the file or folder at `path` out. Never a sidecar at the root (an exclude of
        *.csv, a hidden sidecar name): mode auto would group by folder, every object id changed, silently."""
        return path not in self.sidecar_names and excluded(path, self.exclude)


@dataclass(frozen=True, slots=True)
class StoredFile:
    """A file as listed by its store: path relative to the source root (posix), size, mtime, fixity if known."""

    path: str
    size: int
    modified: datetime
    fixity: Fixity | None = None
    listed_at: datetime | None = None
    """When the file last changed in the store (None: `modified`): a master moved or copied in with its old
    modification time (mv, cp -p, rsync -a, tar) is new to the listing all the same."""
    folder_listed_at: datetime | None = None
    """When a file was last added, renamed or deleted in its folder, where the store has folders."""


def natural_key(text: str) -> tuple:
    """Sort key that orders embedded numbers by value: page2 < page10."""
    parts = re.split(r"(\d+)", text.casefold())
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts)), text


def excluded(path: str, patterns: tuple[str, ...]) -> bool:
    """Whether a pattern of `patterns` (grouping.exclude) matches a part of `path`: its name or a folder's."""
    matches = _exclusion(patterns)
    return matches is not None and any(matches(part) for part in path.split("/"))


@lru_cache(maxsize=16)
def _exclusion(patterns: tuple[str, ...]) -> Callable[[str], object] | None:
    if not patterns:
        return None
    return re.compile("|".join(fnmatch.translate(p) for p in patterns), re.IGNORECASE).match


# --- sidecar ----------------------------------------------------------------------------------------------

class _JsonItem(Settings):
    file: str
    sequence: int | None = None
    label: str | None = None


class _JsonValue(Settings):
    value: str
    language: str | None = None


class _JsonObject(Settings):
    id: str = Field(min_length=1)
    modified: datetime | None = None
    metadata: dict[str, str | _JsonValue | list[str | _JsonValue]] = Field(default_factory=dict)
    items: list[_JsonItem] = Field(min_length=1)


class _JsonSidecar(Settings):
    objects: list[dict[str, Any]]


@dataclass(frozen=True)
class SidecarEntry:
    file: str
    sequence: int | None
    label: str | None
    where: str  # "objects.csv row 4", for error messages


@dataclass
class SidecarObject:
    id: str
    modified: datetime | None = None
    metadata: dict[str, list[LangValue]] = field(default_factory=dict)
    entries: list[SidecarEntry] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """What is wrong with its rows: the object is listed as unreadable, the others go on."""


def read_sidecar(name: str, data: bytes) -> list[SidecarObject]:
    """Parse objects.csv / objects.json into objects, each with the problems of its own rows.

    A sidecar that cannot be read at all (encoding, JSON syntax, missing columns), or a row or entry that names no
    object, is a SourceError for the whole listing: the objects it would name are unknown, and listing the others
    as if complete could deposit one of them without a page.
    """
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise SourceError(f"{name}: not UTF-8 text") from None
    objects, unattributed = (_read_json if name.lower().endswith(".json") else _read_csv)(name, text)
    if unattributed:
        raise SourceError(_summary(unattributed, 20, "\n"))
    return objects


def _read_csv(name: str, text: str) -> tuple[list[SidecarObject], list[str]]:
    reader = csv.DictReader(io.StringIO(text))
    missing = {"object_id", "file"} - set(reader.fieldnames or ())
    if missing:
        raise SourceError(f"{name}: missing column(s) {', '.join(sorted(missing))} "
                          f"(columns: object_id, file, sequence, label, modified, then metadata columns)")
    objects: dict[str, SidecarObject] = {}
    unattributed = []
    for row_number, row in enumerate(reader, 2):
        where = f"{name} row {row_number}"
        if None in row:  # its cells are shifted (an unquoted comma): its object_id cell may name another object
            unattributed.append(f"{where}: more cells than columns")
            continue
        object_id, file = (row.get("object_id") or "").strip(), (row.get("file") or "").strip()
        if not object_id:
            unattributed.append(f"{where}: object_id is required")
            continue
        obj = objects.setdefault(object_id, SidecarObject(object_id))
        sequence = (row.get("sequence") or "").strip()
        if not file:
            obj.problems.append(f"{where}: file is required")
            continue
        if sequence and not sequence.isdigit():
            obj.problems.append(f"{where}: sequence must be a whole number, got {sequence!r}")
            continue
        modified = _timestamp(row.get("modified"), where, obj.problems)
        if modified and (obj.modified is None or modified > obj.modified):
            obj.modified = modified
        obj.entries.append(SidecarEntry(file, int(sequence) if sequence else None,
                                         (row.get("label") or "").strip() or None, where))
        for column, value in row.items():
            value = (value or "").strip()
            if column not in _RESERVED_COLUMNS and value:
                key, _, language = column.partition("@")
                values = obj.metadata.setdefault(key.strip(), [])
                if LangValue(value, language.strip() or None) not in values:
                    values.append(LangValue(value, language.strip() or None))
    return list(objects.values()), unattributed


def _read_json(name: str, text: str) -> tuple[list[SidecarObject], list[str]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SourceError(f"{name}: not valid JSON: {exc}") from None
    try:
        sidecar = parse(_JsonSidecar, {"objects": data} if isinstance(data, list) else data, name)
    except ConfigError as exc:
        raise SourceError(str(exc)) from None
    objects: dict[str, SidecarObject] = {}
    unattributed = []
    for index, raw in enumerate(sidecar.objects):
        object_id = raw.get("id")
        try:
            obj = parse(_JsonObject, raw, name, prefix=f"objects.{index}")
        except ConfigError as exc:  # an entry is an object's own when it names the object
            if isinstance(object_id, str) and object_id:
                objects.setdefault(object_id, SidecarObject(object_id)).problems.extend(str(exc).splitlines())
            else:
                unattributed.extend(str(exc).splitlines())
            continue
        if obj.id in objects:
            objects[obj.id].problems.append(f"{name}: objects.{index}: object id {obj.id!r} appears twice")
            continue
        metadata: dict[str, list[LangValue]] = {}
        for key, value_or_values in obj.metadata.items():
            field_name, _, language = key.partition("@")
            for value in value_or_values if isinstance(value_or_values, list) else [value_or_values]:
                lang_value = (LangValue(value, language or None) if isinstance(value, str)
                              else LangValue(value.value, value.language or language or None))
                metadata.setdefault(field_name, []).append(lang_value)
        objects[obj.id] = SidecarObject(
            obj.id, as_utc(obj.modified) if obj.modified else None, metadata,
            [SidecarEntry(i.file, i.sequence, i.label, f"{name}: objects.{index}.items.{n}")
             for n, i in enumerate(obj.items)])
    return list(objects.values()), unattributed


def _timestamp(text: str | None, where: str, problems: list[str]) -> datetime | None:
    if not (text or "").strip():
        return None
    try:
        return as_utc(datetime.fromisoformat(text.strip()))
    except ValueError:
        problems.append(f"{where}: modified must be an ISO 8601 date-time, got {text.strip()!r}")
        return None


def _summary(problems: list[str], most: int, separator: str) -> str:
    shown = problems[:most] + ([f"... and {len(problems) - most} more"] if len(problems) > most else [])
    return separator.join(shown)


# --- grouping ---------------------------------------------------------------------------------------------

@dataclass(slots=True)
class Group:
    """An object of the store before it is built: its files and the time it is listed by. A whole store's groups
    are held, filtered by the window and sorted, and only the objects yielded are built: their SourceItems, and
    the natural order of a folder's files, cost far more than the files listed."""

    id: str
    files: list[StoredFile]
    listed_at: datetime
    """connectors.base.listed_at of the object once built: the newest of its files' times (modified, listed_at)
    and of the times it is also listed by (its folder's, its sidecar entry's or sidecar's)."""
    labels: list[str | None] | None = None
    """A sidecar object's item labels, its files then in sequence; None: a folder's, in natural order once built."""
    metadata: dict[str, list[LangValue]] | None = None
    entry_modified: datetime | None = None
    """The sidecar entry's `modified`, else the sidecar's own time, so editing the sidecar re-harvests its objects."""
    problems: tuple[str, ...] = ()
    """Why the store's names make no object of it: it is listed as an UnreadableObject in its place."""


def _listed(files: Iterable[StoredFile], also: Iterable[datetime | None]) -> datetime:
    return max([t for f in files for t in (f.modified, f.listed_at) if t] + [t for t in also if t])


def group_by_folder(files: Iterable[StoredFile]) -> list[Group]:
    """A store of keys (S3) may hold both a key `a` and keys `a/...`: the root file `a` and the folder `a` would be
    one object `a`. It is unreadable until one is renamed, rather than either taken for the object `a` (the other
    left out unseen) or both merged into one manifest, and the listing goes on."""
    folders: dict[str, list[StoredFile]] = {}
    for f in files:
        parent = str(PurePosixPath(f.path).parent)
        folders.setdefault(f.path if parent == "." else parent, []).append(f)
    groups = []
    for object_id, members in folders.items():
        both = len(members) > 1 and any(f.path == object_id for f in members)
        groups.append(Group(object_id, members, _listed(members, (f.folder_listed_at for f in members
                                                                  if f.path != object_id)),
                            problems=(f"{object_id!r} is both a file at the root and a folder: rename the file (or "
                                      "the folder) so that each is an object of its own",) if both else ()))
    return groups


class _StoredPaths:
    """The store's files by path, for a sidecar's names. A name is the stored path itself, else the one stored
    path equal to it under Unicode NFC: a sidecar typed in NFC names files uploaded from a Mac, whose names are
    NFD, and the item keeps the stored path, by which it is fetched."""

    def __init__(self, files: Iterable[StoredFile]):
        self.by_path = {f.path: f for f in files}
        self._by_nfc: dict[str, list[str]] | None = None  # made at the first name not found as it is

    def find(self, name: str) -> tuple[StoredFile | None, str | None]:
        """The file a sidecar names, or why there is none."""
        path = _relative(name)
        if path is None:
            return None, f"file {name!r} must be a relative path inside the source"
        if path in self.by_path:
            return self.by_path[path], None
        if self._by_nfc is None:
            self._by_nfc = {}
            for stored in self.by_path:
                self._by_nfc.setdefault(unicodedata.normalize("NFC", stored), []).append(stored)
        same = self._by_nfc.get(unicodedata.normalize("NFC", path), [])
        if len(same) == 1:
            return self.by_path[same[0]], None
        if same:
            return None, (f"file {name!r} may be any of {', '.join(map(repr, sorted(same)))}, which differ only in "
                          "Unicode normalisation: rename all but one")
        return None, f"file {name!r} does not exist (or is hidden)"


def group_by_sidecar(files: Iterable[StoredFile], sidecar: StoredFile, objects: list[SidecarObject]) -> list[Group]:
    """What is wrong with an object's rows (a file missing, hidden, outside the source or another object's; its
    sequence numbers mixed or repeated) makes that object unreadable with every such row named, and the others go
    on: a master deleted by another team must not stop every run until the sidecar is edited. Its files found are
    still its own, so no other object takes them."""
    stored = _StoredPaths(files)
    claimed: dict[str, str] = {}
    groups = []
    for obj in objects:
        problems = list(obj.problems)
        sequences = [e.sequence for e in obj.entries]
        if any(s is None for s in sequences) and any(s is not None for s in sequences):
            problems.append(f"{obj.entries[0].where}: object {obj.id!r} gives a sequence for some files only")
        elif len(set(sequences)) != len(sequences) and sequences[0] is not None:
            problems.append(f"{obj.entries[0].where}: object {obj.id!r} repeats a sequence number")
        members, labels = [], []
        for entry in sorted(obj.entries, key=lambda e: e.sequence or 0):
            found, problem = stored.find(entry.file)
            if found is not None and found.path in claimed:
                found, problem = None, f"file {entry.file!r} already belongs to object {claimed[found.path]!r}"
            if found is None:
                problems.append(f"{entry.where}: {problem}")
                continue
            claimed[found.path] = obj.id
            members.append(found)
            labels.append(entry.label)
        entry_modified = obj.modified or sidecar.modified
        groups.append(Group(obj.id, members, _listed(members, [entry_modified, None if obj.modified else
                                                               sidecar.listed_at]),
                            labels, obj.metadata, entry_modified, tuple(problems)))
    unclaimed = sorted(set(stored.by_path) - set(claimed), key=natural_key)
    if unclaimed:
        log.warning("%s names no object for %d file(s), which are not harvested: %s%s", sidecar.path,
                    len(unclaimed), ", ".join(unclaimed[:5]), " ..." if len(unclaimed) > 5 else "")
    return groups


def build(group: Group, locate: Callable[[str], str]) -> SourceObject:
    """The object a group stands for, its items located in the store."""
    members = (zip(group.files, group.labels) if group.labels is not None else
               ((f, None) for f in sorted(group.files, key=lambda f: natural_key(f.path))))
    items = tuple(SourceItem(id=f.path, sequence=n, original_name=PurePosixPath(f.path).name, size=f.size,
                             modified=f.modified, fixity=f.fixity, label=label, locator=locate(f.path))
                  for n, (f, label) in enumerate(members, 1))
    modified = max([f.modified for f in group.files] + ([group.entry_modified] if group.entry_modified else []))
    return SourceObject(id=group.id, modified=modified, items=items,
                        metadata={k: tuple(v) for k, v in (group.metadata or {}).items()},
                        listed_at=group.listed_at if group.listed_at > modified else None)


def _relative(path: str) -> str | None:
    if "\\" in path or path.startswith("/"):
        return None
    parts = PurePosixPath(path).parts
    if not parts or any(p in ("..", ".") for p in parts):
        return None
    return "/".join(parts)


class GroupedSource(ABC):
    """A store of files seen through the grouping above; subclasses list, read and open files.

    Each listing (`changes`, `get`) lists the store once, groups its files, and builds only the objects it
    yields. A batch asked for by id (`described`, which connectors.base.described takes) is one listing however many
    of its objects are gone."""

    name: str
    grouping: GroupingSettings
    retry: RetryPolicy
    lists_in_modified_order = True  # the whole store is listed, then sorted (an unreadable object keeps its time)
    modified_order_setting = None

    @abstractmethod
    def _files(self) -> Iterator[StoredFile]:
        """Every regular file under the root, those grouping.exclude names may be included (they are filtered
        here)."""

    @abstractmethod
    def _read(self, path: str) -> bytes:
        """The bytes of a small file (the sidecar) at `path` under the root."""

    @abstractmethod
    def _locate(self, path: str) -> str:
        """The item locator (absolute path, S3 key) of a file at `path` under the root."""

    @abstractmethod
    def _open(self, item: SourceItem, budget: RetryBudget) -> AbstractContextManager[Body]:
        """The item's bytes as a Body, for fetching.fetch_verified."""

    def _build(self, group: Group) -> SourceObject | UnreadableObject:
        """The object of a group, or an UnreadableObject in its place where the store's names do not make one."""
        if group.problems:
            return UnreadableObject(self._listed_id(group.id), group.listed_at,
                                    f"{self.name}: {_summary(list(group.problems), 10, '; ')}")
        return build(group, self._locate)

    def _listed_id(self, group_id: str) -> str:
        """The id the object of a group is listed and asked for under (that of `_build`'s object)."""
        return group_id

    def reachable(self) -> None:
        """Raise as listing would when the store cannot be listed now: its first page alone (Source.reachable)."""
        next(iter(self._files()), None)

    def _groups(self) -> list[Group]:
        """Every object of the store, unbuilt; what is wrong with the grouping as a whole is raised before any is
        built, what is wrong with one object is its Group's problems."""
        files = [f for f in self._files() if not self.grouping.leaves_out(f.path)]
        sidecar = next((f for n in self.grouping.sidecar_names for f in files if f.path == n), None)
        if self.grouping.mode == "sidecar" and sidecar is None:
            raise SourceError(f"{self.name}: grouping.mode is sidecar but none of "
                              f"{', '.join(self.grouping.sidecar_names)} exists at the root")
        others = [f for f in files if f.path not in self.grouping.sidecar_names]
        if sidecar is not None and self.grouping.mode != "folder":
            return group_by_sidecar(others, sidecar, read_sidecar(sidecar.path, self._read(sidecar.path)))
        return group_by_folder(others)

    def changes(self, since: datetime | None = None,
                until: datetime | None = None) -> Iterator[SourceObject | UnreadableObject]:
        since = as_utc(since) if since else None
        until = as_utc(until) if until else None
        chosen = [g for g in self._groups() if within(g.listed_at, since, until)]
        chosen.sort(key=lambda g: (g.listed_at, natural_key(g.id)))
        for group in chosen:
            yield self._build(group)

    def described(self, object_ids: Iterable[str]) -> Iterator[SourceObject | UnreadableObject]:
        """The objects named, in order, from one listing made at the first: one gone or unreadable stands in its
        place (connectors.base.described), with no listing date, as an object asked for by id has none."""
        index: dict[str, Group] | None = None
        for object_id in object_ids:
            if index is None:
                index = {self._listed_id(g.id): g for g in self._groups()}
            group = index.get(object_id)
            if group is None:
                yield UnreadableObject(object_id, None, f"{self.name}: no object {object_id!r}", gone=True)
                continue
            obj = self._build(group)
            yield replace(obj, modified=None) if isinstance(obj, UnreadableObject) else obj

    def get(self, object_ids: Iterable[str]) -> Iterator[SourceObject]:
        for obj in self.described(object_ids):
            if isinstance(obj, UnreadableObject):
                raise (ObjectNotFound if obj.gone else SourceDataError)(obj.reason)
            yield obj

    def fetch(self, item: SourceItem, dest_dir: Path) -> FetchedFile:
        return fetch_verified(item, Path(dest_dir), lambda budget: self._open(item, budget), self.retry)
