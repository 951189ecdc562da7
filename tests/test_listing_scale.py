"""A grouped source at scale: a listing builds only the objects it yields, and a batch asked for by id lists the store
once however many of its ids are gone. Small real folder trees; the counts are observed through a subclass of the
real source, whose own code runs unchanged."""
from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

import pytest

from connectors.base import UnreadableObject, described
from connectors.errors import ObjectNotFound
from connectors.filesystem import FilesystemSettings, FilesystemSource
from tests.emulators import FAST_RETRY
from tests.test_connector_filesystem import moment

JAN = datetime(2024, 1, 1, tzinfo=timezone.utc)
FUTURE, LATER = datetime(2100, 1, 1, tzinfo=timezone.utc), datetime(2101, 1, 1, tzinfo=timezone.utc)


class Counting(FilesystemSource):
    """The filesystem source, counting its listings and the items it builds (each is located once)."""

    def __init__(self, root: Path, mode: str = "folder"):
        super().__init__(FilesystemSettings(root=root, grouping={"mode": mode}, retry=FAST_RETRY), name="fs-test")
        self.listings = self.located = 0

    def _files(self):
        self.listings += 1
        return super()._files()

    def _locate(self, path: str) -> str:
        self.located += 1
        return super()._locate(path)


def make(root: Path, *paths: str, modified: datetime = JAN) -> None:
    for path in paths:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(b"")
        os.utime(root / path, (modified.timestamp(),) * 2)


def test_a_window_of_folders_comes_oldest_listed_first_ties_in_natural_order_and_only_its_objects_are_built(tmp_path):
    make(tmp_path, "old/1.tif", "older/1.tif", "older/2.tif")  # listed (made) before the window
    since = moment()
    make(tmp_path, "x/p10.tif", "x/p2.tif")  # made now with an old mtime: listed now
    moment()
    make(tmp_path, "loose.tif")  # a file at the root is an object of its own
    make(tmp_path, "obj10/a.tif", "obj9/a.tif", modified=FUTURE)  # listed at the same time: by natural order
    make(tmp_path, "late/1.tif", modified=LATER)  # after the window
    source = Counting(tmp_path)
    listed = list(source.changes(since, until=datetime(2100, 6, 1, tzinfo=timezone.utc)))
    assert [o.id for o in listed] == ["x", "loose.tif", "obj9", "obj10"]
    assert [i.id for i in listed[0].items] == ["x/p2.tif", "x/p10.tif"]
    assert [o.modified for o in listed] == [JAN, JAN, FUTURE, FUTURE]
    assert listed[0].listed_at > since and listed[2].listed_at is None  # listed by its mtime, FUTURE
    assert source.listings == 1 and source.located == 5  # the items of the four objects yielded, no others'

    source.located = 0
    assert list(source.changes(datetime(2200, 1, 1, tzinfo=timezone.utc))) == []  # nothing changed since
    assert source.located == 0


def test_a_window_of_sidecar_objects_counts_their_rows_and_the_sidecar_times_as_before(tmp_path):
    make(tmp_path, "f/1.tif", "f/2.tif", "g/1.tif", "h/1.tif")
    since = moment()
    (tmp_path / "objects.csv").write_text(
        "object_id,file,sequence,label,modified\n"
        "A,f/2.tif,2,Verso,\n"  # no time of its own: listed when the sidecar was written
        "A,f/1.tif,1,Recto,\n"
        "B,g/1.tif,,,2100-01-01T00:00:00Z\n"  # its own time, in the window
        "C,h/1.tif,,,2024-01-01T00:00:00Z\n"  # its own time and old files: before the window
        "D,k/1.tif,,,2024-01-01T00:00:00Z\n")  # its file is made after the sidecar
    moment()
    make(tmp_path, "k/1.tif")
    source = Counting(tmp_path, mode="sidecar")
    listed = list(source.changes(since))
    assert [o.id for o in listed] == ["A", "D", "B"]
    assert [(i.id, i.sequence, i.label) for i in listed[0].items] == [("f/1.tif", 1, "Recto"), ("f/2.tif", 2, "Verso")]
    assert [o.modified for o in listed] == [datetime.fromtimestamp((tmp_path / "objects.csv").stat().st_mtime,
                                                                   timezone.utc), JAN, FUTURE]
    assert source.located == 4  # C's item was not built


def test_a_batch_with_gone_ids_is_listed_once_and_each_gone_id_stands_in_its_place(tmp_path):
    """As the harvester's revisit asks (connectors.base.described): it asked `get` again after each id the source
    does not have, and each call listed the store."""
    make(tmp_path, "a/1.tif", "b/1.tif", "c/1.tif", "c/2.tif")
    source = Counting(tmp_path)
    batch = list(described(source, ["a", "gone-1", "b", "gone-2", "c"]))
    assert [(o.id, isinstance(o, UnreadableObject) and o.gone) for o in batch] == [
        ("a", False), ("gone-1", True), ("b", False), ("gone-2", True), ("c", False)]
    assert [o.reason for o in batch if isinstance(o, UnreadableObject)] == ["fs-test: no object 'gone-1'",
                                                                             "fs-test: no object 'gone-2'"]
    assert [i.id for i in batch[-1].items] == ["c/1.tif", "c/2.tif"]
    assert source.listings == 1 and source.located == 4

    with pytest.raises(ObjectNotFound, match="no object 'gone-1'"):  # get raises at its turn, after those before
        list(source.get(["a", "gone-1", "c"]))
    make(tmp_path, "c/3.tif")  # a later call lists the store afresh, even one after a call that stopped at a gone id
    assert [len(o.items) for o in source.get(["c"])] == [3] and source.listings == 3
