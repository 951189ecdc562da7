"""Store keys: source identifiers made safe, and the configured templates that place objects in a store.

A key must never escape its store (``../``, absolute paths), break a URL or an HTTP header (control, space,
``?``, ``#``, ``%``...), or turn on iipsrv 1.1's 3-D sequence mode (``_pyr_`` anywhere in a file name).
Identifiers from a source can contain anything, so each one is escaped into a single key segment. The
escaping is injective (two different identifiers never share a key) and deterministic (the same identifier
always gives the same key, run after run):

- ``A-Z a-z 0-9 - .`` and ``_`` pass through;
- every other byte of the UTF-8 encoding (lone surrogates, such as undecodable file-name bytes, included)
  becomes ``~XX`` (upper-case hex), ``~`` itself included;
- a leading ``.`` becomes ``~2E`` (no hidden files, no ``.``/``..`` segments), and so does the ``_`` opening
  any ``_pyr_`` (case-insensitive).

The result only uses characters that are unreserved in URLs, so a key is also a valid URL path.
"""
from __future__ import annotations

import re
import string
from typing import Any, Sequence

from pydantic import field_validator

from gcis_etl.errors import StoreError
from gcis_etl.formats import names_a_sequence
from gcis_etl.settings import Settings

MAX_KEY_BYTES = 1024      # S3's limit on a key
MAX_SEGMENT_BYTES = 255   # a file name on Linux filesystems (iipsrv serves files)

_PLAIN = frozenset(string.ascii_letters + string.digits + "-._")
_SEGMENT = re.compile(r"[A-Za-z0-9._~-]+")
_PYR = re.compile(r"_(?=pyr_)", re.IGNORECASE)
_ESCAPE = re.compile(r"~[0-9A-F]{2}")


class UnsafeKey(StoreError):
    """A key or identifier that could escape or corrupt the key space; refused, never repaired silently."""


def escape_identifier(identifier: str) -> str:
    """One safe key segment for an arbitrary source identifier (see the module docstring for the rules)."""
    if not identifier:
        raise UnsafeKey("empty identifier cannot name a store object")
    escaped = "".join(chr(b) if chr(b) in _PLAIN else f"~{b:02X}" for b in identifier.encode("utf-8", "surrogatepass"))
    if escaped.startswith("."):
        escaped = "~2E" + escaped[1:]
    escaped = _PYR.sub("~5F", escaped)
    if len(escaped) > MAX_SEGMENT_BYTES:
        raise UnsafeKey(f"identifier {identifier[:60]!r}... is too long for a key segment "
                        f"({len(escaped)} bytes escaped, at most {MAX_SEGMENT_BYTES})")
    return escaped


def check_key(key: str) -> str:
    """Return `key` if every segment is safe, else raise UnsafeKey naming what is wrong."""
    if not key:
        raise UnsafeKey("empty key")
    if len(key.encode("utf-8")) > MAX_KEY_BYTES:
        raise UnsafeKey(f"key {key[:60]!r}... is longer than {MAX_KEY_BYTES} bytes")
    for segment in key.split("/"):
        if not segment:
            raise UnsafeKey(f"key {key!r} has an empty segment (leading, trailing or double '/')")
        if not _SEGMENT.fullmatch(segment):
            raise UnsafeKey(f"key {key!r}: segment {segment!r} has characters outside A-Z a-z 0-9 - . _ ~")
        if segment.startswith("."):
            raise UnsafeKey(f"key {key!r}: segment {segment!r} starts with '.'")
        if segment.count("~") != len(_ESCAPE.findall(segment)):
            raise UnsafeKey(f"key {key!r}: segment {segment!r} has a '~' that is not an escape")
        if len(segment) > MAX_SEGMENT_BYTES:
            raise UnsafeKey(f"key {key!r}: segment longer than {MAX_SEGMENT_BYTES} bytes")
        if names_a_sequence(segment):
            raise UnsafeKey(f"key {key!r}: '_pyr_' would switch iipsrv to 3-D sequence mode")
    return key


def check_prefix(prefix: str) -> str:
    """A store prefix is a key without the trailing slash, or empty."""
    prefix = prefix.strip("/")
    return check_key(prefix) if prefix else ""


# Placeholders each template may use; identifiers are escaped before they are substituted.
_FIELDS = {
    "image": {"pipeline", "object_id", "item_id", "sequence", "ext"},
    "manifest": {"pipeline", "object_id", "version"},
    "collection": {"pipeline", "version"},
}
_SAMPLE = {"pipeline": "p", "object_id": "o", "item_id": "i", "sequence": 1, "ext": "tif", "version": "3"}
# What keeps two things' keys apart: each template must use at least one placeholder of every group.
_DISTINCT = {
    "image": ((("object_id",), "two objects' images"), (("item_id", "sequence"), "the images of one object")),
    "manifest": ((("object_id",), "two objects' manifests"),),
    "collection": (),
}
_PER_VERSION = ("manifest", "collection")


class KeyTemplates(Settings):
    """Where objects go inside a store (below the store's root or prefix).

    ``{version}`` is the IIIF Presentation major version, 3 or 2: templates for manifests and collections
    must use it when both versions are deposited, or the 2.1 document would overwrite the 3.0 one (the
    pipeline, which knows the versions, refuses such templates on load through `version_problems`).
    Collections live outside ``{pipeline}/``: any name there could also be an object id, and on a filesystem
    a file cannot share its name with a directory.
    """

    image: str = "{pipeline}/{object_id}/{item_id}.{ext}"
    manifest: str = "{pipeline}/{object_id}/manifest-v{version}.json"
    collection: str = "collections/{pipeline}-v{version}.json"

    @field_validator("image", "manifest", "collection")
    @classmethod
    def _valid_template(cls, template: str, info: Any) -> str:
        allowed = _FIELDS[info.field_name]
        used = _placeholders(template)
        unknown = used - allowed
        if unknown:
            raise ValueError(f"unknown placeholder(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
        try:
            check_key(template.format(**_SAMPLE))
        except (UnsafeKey, ValueError, IndexError) as exc:
            raise ValueError(f"template does not make a safe key: {exc}") from None
        for names, whose in _DISTINCT[info.field_name]:
            if not used & set(names):
                raise ValueError(f"must use {' or '.join(f'{{{name}}}' for name in names)}, "
                                 f"or {whose} would share one key and overwrite each other")
        return template

    def version_problems(self, versions: Sequence[str]) -> dict[str, str]:
        """Templates that would put the documents of two deposited IIIF versions on one key: field -> why."""
        if len(versions) < 2:
            return {}
        return {field: f"must use {{version}} when manifests.versions lists {', '.join(versions)}, "
                       "or one version's document overwrites the other's"
                for field in _PER_VERSION if "version" not in _placeholders(getattr(self, field))}

    def image_key(self, pipeline: str, object_id: str, item_id: str, sequence: int, ext: str) -> str:
        return self._render("image", pipeline=pipeline, object_id=object_id, item_id=item_id, sequence=sequence,
                            ext=ext)

    def image_prefix(self, pipeline: str) -> str:
        """What every image key of the pipeline starts with ("" when the template does not start with it)."""
        head = self.image.split("{", 1)[0]
        if not self.image.startswith(head + "{pipeline}"):
            return head
        return head + escape_identifier(pipeline) + self.image[len(head) + len("{pipeline}"):].split("{", 1)[0]

    def own_image_prefix(self, pipeline: str) -> str | None:
        """image_prefix when it names the pipeline, which no other pipeline's keys start with; None when the
        template does not start with {pipeline} (after fixed text), or what follows {pipeline} could go on a
        pipeline's name: "{pipeline}-{object_id}/" gives "museum-", which the keys of pipeline "museum-prints"
        start with too, and "{pipeline}{object_id}/" gives "museum", as "museum2/" does. Those images share
        their prefix with another pipeline's keyed alike in the store."""
        head = self.image.split("{", 1)[0]
        if not self.image.startswith(head + "{pipeline}"):
            return None
        after = self.image[len(head) + len("{pipeline}"):]
        return self.image_prefix(pipeline) if after[:1] not in _NAME_CHARACTERS else None

    def manifest_key(self, pipeline: str, object_id: str, version: int) -> str:
        return self._render("manifest", pipeline=pipeline, object_id=object_id, version=version)

    def collection_key(self, pipeline: str, version: int) -> str:
        return self._render("collection", pipeline=pipeline, version=version)

    def _render(self, field: str, **values: Any) -> str:
        """Only the values the template uses are escaped: an item id too long for a key segment must not stop a
        template that names items by {sequence} alone, the way out of that very problem."""
        template = getattr(self, field)
        safe = {}
        for name in _placeholders(template):
            value = values[name]
            try:
                safe[name] = escape_identifier(value) if isinstance(value, str) else int(value)
            except UnsafeKey as exc:
                raise UnsafeKey(f"{exc}: its {{{name}}} in store.keys.{field} ({template!r}){_instead(field, name)}"
                                ) from None
        try:
            return check_key(template.format(**safe))
        except UnsafeKey as exc:
            used = "item_id" if "item_id" in _placeholders(template) else ""
            raise UnsafeKey(f"{exc}: store.keys.{field} ({template!r}){_instead(field, used)}") from None


# What a pipeline's name may be made of (pipelines.PIPELINE_NAME: lower-case letters, digits, "-" and "_"), and
# the empty string (nothing after {pipeline}, or a placeholder); capitals too, as a store on a file system that
# ignores case takes them for the same letters.
_NAME_CHARACTERS = frozenset(string.ascii_letters + string.digits + "-_") | {"", "{"}


def _instead(field: str, name: str) -> str:
    """What a template whose identifier cannot name a key can use instead: only an item has a number to go by
    (an object's id names its manifests, which have no other)."""
    if field != "image" or name != "item_id":
        return ""
    return ("; {sequence} in place of {item_id} (an image's place in its object, as in "
            "\"{pipeline}/{object_id}/{sequence}.{ext}\") takes an item with any id")


def _placeholders(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
