"""Stored files grouped into objects: the part shared by the filesystem and S3 sources.

Two ways to group, chosen by `grouping.mode` (auto = sidecar when one exists at the root, else folder):
- folder: every folder holding files is an object (id = its path under the root), its items the files
  directly in it in natural order (page2 before page10); a file at the root is an object of its own.
- sidecar: `objects.csv` or `objects.json` at the root names each object, its files in sequence, item
  labels and descriptive metadata; files it does not name are not harvested (and are counted in a warning).

Every regular file is an item except hidden ones (any path part starting with ".") and the sidecars:
deciding what is an image is the converter's business. An object's `modified` is the newest of its
files' modification times and of its sidecar entry (the entry's `modified` column when given, else the
sidecar file's own time, so editing the sidecar re-harvests its objects). It is listed (`changes(since)`)
by its `listed_at`, which also counts when its files were last moved or copied in (StoredFile.listed_at)
and, for a folder, when a file was added, renamed or deleted in it: whether an item changed stays a matter
of its size and modification time (work.fingerprint).
"""
from __future__ import annotations

import csv
import io
import json
import logging
import re
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Callable, Iterable, Iterator, Literal

from pydantic import Field

from connectors.base import FetchedFile, Fixity, LangValue, SourceItem, SourceObject, UnreadableObject
from connectors.errors import ObjectNotFound, SourceDataError
from connectors.fetching import Body, fetch_verified
from connectors.retry import RetryBudget, RetryPolicy
from connectors.timestamps import as_utc, within
from gcis_etl.errors import ConfigError, SourceError
from gcis_etl.settings import Settings, parse

log = logging.getLogger(__name__)

_RESERVED_COLUMNS = {"object_id", "file", "sequence", "label", "modified"}


class GroupingSettings(Settings):
    mode: Literal["auto", "folder", "sidecar"] = "auto"
    sidecar_names: tuple[str, ...] = Field(("objects.csv", "objects.json"), min_length=1,
                                           description="looked for at the root, in this order")


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


def is_hidden(path: str) -> bool:
    return any(part.startswith(".") for part in path.split("/"))


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
    objects: list[_JsonObject]


@dataclass(frozen=True)
class SidecarEntry:
    file: str
    sequence: int | None
    label: str | None
    where: str  # "objects.csv row 4", for error messages


@dataclass
class SidecarObject:
    id: str
    modified: datetime | None
    metadata: dict[str, list[LangValue]]
    entries: list[SidecarEntry]


def read_sidecar(name: str, data: bytes) -> tuple[list[SidecarObject], list[str]]:
    """Parse objects.csv / objects.json into objects and row problems (reported with grouping's own).

    A sidecar that cannot be read at all (encoding, JSON syntax, missing columns) is a SourceError at once.
    """
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise SourceError(f"{name}: not UTF-8 text") from None
    if name.lower().endswith(".json"):
        return _read_json(name, text)
    return _read_csv(name, text)


def _read_csv(name: str, text: str) -> tuple[list[SidecarObject], list[str]]:
    reader = csv.DictReader(io.StringIO(text))
    missing = {"object_id", "file"} - set(reader.fieldnames or ())
    if missing:
        raise SourceError(f"{name}: missing column(s) {', '.join(sorted(missing))} "
                          f"(columns: object_id, file, sequence, label, modified, then metadata columns)")
    objects: dict[str, SidecarObject] = {}
    problems = []
    for row_number, row in enumerate(reader, 2):
        where = f"{name} row {row_number}"
        if None in row:
            problems.append(f"{where}: more cells than columns")
            continue
        object_id, file = (row.get("object_id") or "").strip(), (row.get("file") or "").strip()
        if not object_id or not file:
            problems.append(f"{where}: object_id and file are required")
            continue
        sequence = (row.get("sequence") or "").strip()
        if sequence and not sequence.isdigit():
            problems.append(f"{where}: sequence must be a whole number, got {sequence!r}")
            continue
        modified = _timestamp(row.get("modified"), where, problems)
        obj = objects.setdefault(object_id, SidecarObject(object_id, None, {}, []))
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
    return list(objects.values()), problems


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
    problems = []
    for index, obj in enumerate(sidecar.objects):
        if obj.id in objects:
            problems.append(f"{name}: objects.{index}: object id {obj.id!r} appears twice")
            continue
        metadata: dict[str, list[LangValue]] = {}
        for key, raw in obj.metadata.items():
            field, _, language = key.partition("@")
            for value in raw if isinstance(raw, list) else [raw]:
                lang_value = (LangValue(value, language or None) if isinstance(value, str)
                              else LangValue(value.value, value.language or language or None))
                metadata.setdefault(field, []).append(lang_value)
        objects[obj.id] = SidecarObject(
            obj.id, as_utc(obj.modified) if obj.modified else None, metadata,
            [SidecarEntry(i.file, i.sequence, i.label, f"{name}: objects.{index}.items.{n}")
             for n, i in enumerate(obj.items)])
    return list(objects.values()), problems


def _timestamp(text: str | None, where: str, problems: list[str]) -> datetime | None:
    if not (text or "").strip():
        return None
    try:
        return as_utc(datetime.fromisoformat(text.strip()))
    except ValueError:
        problems.append(f"{where}: modified must be an ISO 8601 date-time, got {text.strip()!r}")
        return None


def _raise(problems: list[str]) -> None:
    if problems:
        shown = problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
        raise SourceError("\n".join(shown))


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


def _listed(files: Iterable[StoredFile], also: Iterable[datetime | None]) -> datetime:
    return max([t for f in files for t in (f.modified, f.listed_at) if t] + [t for t in also if t])


def group_by_folder(files: Iterable[StoredFile], source_name: str) -> list[Group]:
    folders: dict[str, list[StoredFile]] = {}
    for f in files:
        parent = str(PurePosixPath(f.path).parent)
        folders.setdefault(f.path if parent == "." else parent, []).append(f)
    # A store of keys (S3) may hold both a key `a` and keys `a/...`: the root file `a` and the folder `a`.
    duplicate = next((i for i, members in folders.items() if len(members) > 1 and any(f.path == i for f in members)),
                     None)
    if duplicate is not None:
        raise SourceError(f"{source_name}: {duplicate!r} is both a folder and a file at the root")
    return [Group(object_id, members, _listed(members, (f.folder_listed_at for f in members if f.path != object_id)))
            for object_id, members in folders.items()]


def group_by_sidecar(files: Iterable[StoredFile], sidecar: StoredFile,
                     parsed: tuple[list[SidecarObject], list[str]]) -> list[Group]:
    entries, problems = parsed
    by_path = {f.path: f for f in files}
    claimed: dict[str, str] = {}
    groups = []
    for obj in entries:
        sequences = [e.sequence for e in obj.entries]
        if any(s is None for s in sequences) and any(s is not None for s in sequences):
            problems.append(f"{obj.entries[0].where}: object {obj.id!r} gives a sequence for some files only")
            continue
        if len(set(sequences)) != len(sequences) and sequences[0] is not None:
            problems.append(f"{obj.entries[0].where}: object {obj.id!r} repeats a sequence number")
            continue
        members, labels = [], []
        for entry in sorted(obj.entries, key=lambda e: e.sequence or 0):
            path = _relative(entry.file)
            if path is None:
                problems.append(f"{entry.where}: file {entry.file!r} must be a relative path inside the source")
            elif path not in by_path:
                problems.append(f"{entry.where}: file {entry.file!r} does not exist (or is hidden)")
            elif path in claimed:
                problems.append(f"{entry.where}: file {entry.file!r} already belongs to object {claimed[path]!r}")
            else:
                claimed[path] = obj.id
                members.append(by_path[path])
                labels.append(entry.label)
        entry_modified = obj.modified or sidecar.modified
        groups.append(Group(obj.id, members, _listed(members, [entry_modified, None if obj.modified else
                                                               sidecar.listed_at]),
                            labels, obj.metadata, entry_modified))
    _raise(problems)
    unclaimed = sorted(set(by_path) - set(claimed), key=natural_key)
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
    yields. `get` raising at an id it cannot give keeps that listing for the call that asks for the ids after it
    (the harvester's revisit: harvesting.Harvest._by_id), and for no other, so k objects gone from a batch cost
    one listing, not k + 1."""

    name: str
    grouping: GroupingSettings
    retry: RetryPolicy
    lists_in_modified_order = True  # the whole store is listed, then sorted (an unreadable object keeps its time)
    modified_order_setting = None
    _continuation: tuple[list[str], dict[str, Group]] | None = None
    """The ids after the one `get` raised at, and the listing it had: the next `get` takes it if it asks for them."""

    @abstractmethod
    def _files(self) -> Iterator[StoredFile]:
        """Every regular file under the root, hidden ones included (they are filtered here)."""

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
        return build(group, self._locate)

    def _listed_id(self, group_id: str) -> str:
        """The id the object of a group is listed and asked for under (that of `_build`'s object)."""
        return group_id

    def reachable(self) -> None:
        """Raise as listing would when the store cannot be listed now: its first page alone (Source.reachable)."""
        next(iter(self._files()), None)

    def _groups(self) -> list[Group]:
        """Every object of the store, unbuilt; what is wrong with its grouping is raised before any is built."""
        files = [f for f in self._files() if not is_hidden(f.path)]
        sidecar = next((f for n in self.grouping.sidecar_names for f in files if f.path == n), None)
        if self.grouping.mode == "sidecar" and sidecar is None:
            raise SourceError(f"{self.name}: grouping.mode is sidecar but none of "
                              f"{', '.join(self.grouping.sidecar_names)} exists at the root")
        others = [f for f in files if f.path not in self.grouping.sidecar_names]
        if sidecar is not None and self.grouping.mode != "folder":
            return group_by_sidecar(others, sidecar, read_sidecar(sidecar.path, self._read(sidecar.path)))
        return group_by_folder(others, self.name)

    def changes(self, since: datetime | None = None,
                until: datetime | None = None) -> Iterator[SourceObject | UnreadableObject]:
        self._continuation = None
        since = as_utc(since) if since else None
        until = as_utc(until) if until else None
        chosen = [g for g in self._groups() if within(g.listed_at, since, until)]
        chosen.sort(key=lambda g: (g.listed_at, natural_key(g.id)))
        for group in chosen:
            yield self._build(group)

    def get(self, object_ids: Iterable[str]) -> Iterator[SourceObject]:
        continuation, self._continuation = self._continuation, None
        object_ids = list(object_ids)
        index = continuation[1] if continuation and continuation[0] == object_ids else None
        for n, object_id in enumerate(object_ids):
            if index is None:
                index = {self._listed_id(g.id): g for g in self._groups()}
            obj = self._build(index[object_id]) if object_id in index else None
            if not isinstance(obj, SourceObject):
                if n + 1 < len(object_ids):
                    self._continuation = (object_ids[n + 1:], index)
                if obj is None:
                    raise ObjectNotFound(f"{self.name}: no object {object_id!r}")
                raise SourceDataError(obj.reason)
            yield obj

    def fetch(self, item: SourceItem, dest_dir: Path) -> FetchedFile:
        return fetch_verified(item, Path(dest_dir), lambda budget: self._open(item, budget), self.retry)
