"""The filesystem source: folder and sidecar grouping, changes by when files changed, verified fetch."""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from connectors import open_source
from connectors.base import SourceObject, UnreadableObject
from connectors.errors import FetchIntegrityError, ObjectNotFound, SourceDataError
from connectors.filesystem import FilesystemSource
from gcis_etl.config import load_config
from gcis_etl.errors import ConfigError, SourceError
from gcis_etl.harvesting import OBJECT, harvest
from gcis_etl.ledger import Ledger
from tests.emulators import FAST_RETRY
from tests.emulators.catalogue import CORPUS

JAN, MAR, JUN, JUL = (datetime(2024, m, 1, tzinfo=timezone.utc) for m in (1, 3, 6, 7))

TREE = {
    "ms-001/page10.tif": "rgb8-tiff-lzw/hopper_lzw.tif",
    "ms-001/page2.tif": "rgb8-tiff-uncompressed/hopper.tif",
    "ms-001/page1.jpg": "jpeg-baseline/flowers.jpeg",
    "ms-001/notes.txt": "SOURCES.md",
    "ms-001/.DS_Store": "README.md",
    "ms-002/a.png": "png/png-rgb-64x56x8.png",
    "ms-002/sub/b.tif": "gray8/gray.tif",
    "loose.jpg": "gray8/hopper_gray.jpg",
    ".trash/old.tif": "gray8/gray.tif",
}


def build(root: Path, tree: dict[str, str] = TREE, when: datetime = JAN) -> Path:
    for relative, corpus in tree.items():
        target = root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(CORPUS / corpus, target)
        touch(target, when)
    return root


def touch(path: Path, when: datetime) -> None:
    os.utime(path, (when.timestamp(), when.timestamp()))


def source(root: Path, **overrides) -> FilesystemSource:
    return open_source("filesystem", {"root": str(root), "retry": FAST_RETRY, **overrides}, name="fs-test")


def test_each_folder_is_an_object_with_its_files_in_natural_order(tmp_path):
    objects = {o.id: o for o in source(build(tmp_path)).changes(None)}
    assert sorted(objects) == ["loose.jpg", "ms-001", "ms-002", "ms-002/sub"]
    assert [i.id for i in objects["ms-001"].items] == ["ms-001/notes.txt", "ms-001/page1.jpg", "ms-001/page2.tif",
                                                       "ms-001/page10.tif"]
    assert [i.sequence for i in objects["ms-001"].items] == [1, 2, 3, 4]
    page2 = objects["ms-001"].items[2]
    assert page2.original_name == "page2.tif" and page2.size == (CORPUS / TREE["ms-001/page2.tif"]).stat().st_size
    assert page2.modified == JAN and page2.fixity is None and page2.locator == str(tmp_path / "ms-001/page2.tif")
    assert [i.id for i in objects["ms-002"].items] == ["ms-002/a.png"]
    assert [i.id for i in objects["loose.jpg"].items] == ["loose.jpg"]


def moment() -> datetime:
    """A time after what was done before and before what is done after, as file times (a coarse clock) say."""
    time.sleep(0.05)
    at = datetime.now(timezone.utc)
    time.sleep(0.05)
    return at


def test_changes_follow_when_files_changed_oldest_first(tmp_path):
    root = build(tmp_path)
    since = moment()
    touch(root / "ms-002/sub/b.tif", JUN)
    between = moment()
    touch(root / "ms-001/page2.tif", MAR)
    fs = source(root)
    changed = list(fs.changes(since))
    assert [o.id for o in changed] == ["ms-002/sub", "ms-001"]  # in the order they changed, not by their mtimes
    assert [o.modified for o in changed] == [JUN, MAR]  # what the item's version is judged by
    assert len(changed[1].items) == 4  # the whole object, not just the changed file
    assert [o.id for o in fs.changes(since, until=between)] == ["ms-002/sub"]


def test_a_master_moved_or_copied_in_with_its_old_time_is_listed(tmp_path):
    root = build(tmp_path / "masters")
    staged = build(tmp_path / "staging", {"ms-003/a.tif": "gray8/gray.tif", "b.tif": "gray8/gray.tif"})
    since = moment()
    (staged / "ms-003").rename(root / "ms-003")  # mv
    shutil.copy2(staged / "b.tif", root / "ms-002/b.tif")  # cp -p, rsync -a
    (root / "loose2.tif").symlink_to(staged / "b.tif")  # a link made now to a master modified long ago
    changed = {o.id: o for o in source(root).changes(since)}
    assert sorted(changed) == ["loose2.tif", "ms-002", "ms-003"]
    assert all(o.modified == JAN and o.listed_at > since for o in changed.values())
    assert changed["ms-002"].items[1].modified == JAN


def test_a_file_renamed_deleted_or_chmodded_relists_its_folder_but_not_the_other_root_files(tmp_path):
    root = build(tmp_path, {name: "gray8/gray.tif" for name in ("a/1.tif", "a/2.tif", "b/1.tif", "b/2.tif",
                                                               "c/1.tif", "loose.tif")})
    since = moment()
    (root / "a/2.tif").rename(root / "a/3.tif")
    (root / "b/2.tif").unlink()
    (root / "c/1.tif").chmod(0o600)
    shutil.copyfile(root / "loose.tif", root / "new.tif")  # a file at the root is an object of its own
    changed = {o.id: o for o in source(root).changes(since)}
    assert sorted(changed) == ["a", "b", "c", "new.tif"]
    assert [i.id for i in changed["a"].items] == ["a/1.tif", "a/3.tif"] and len(changed["b"].items) == 1
    assert all(o.modified == JAN and o.listed_at > since for o in (changed["a"], changed["b"], changed["c"]))


def test_explicit_ids(tmp_path):
    fs = source(build(tmp_path))
    assert [o.id for o in fs.get(["ms-002/sub", "loose.jpg"])] == ["ms-002/sub", "loose.jpg"]
    with pytest.raises(ObjectNotFound, match="no object 'ms-404'"):
        list(fs.get(["ms-404"]))


def test_fetch_copies_and_verifies_the_size(tmp_path):
    root = build(tmp_path / "masters")
    fs = source(root)
    (obj,) = fs.get(["ms-001"])
    fetched = fs.fetch(obj.items[2], tmp_path / "scratch")
    assert fetched.path.read_bytes() == (CORPUS / TREE["ms-001/page2.tif"]).read_bytes()
    assert fetched.path.parent == tmp_path / "scratch" and not fetched.fixity_verified
    with open(root / "ms-001/page10.tif", "ab") as grown:
        grown.write(b"appended after listing")
    with pytest.raises(FetchIntegrityError, match=r"more than the \d+ bytes listed arrived: it grew while it was "
                                                  r"read \(still being written\?\)"):
        fs.fetch(obj.items[3], tmp_path / "scratch")
    assert sorted(p.name for p in (tmp_path / "scratch").iterdir()) == [fetched.path.name]


CSV = """object_id,file,sequence,label,title@en,title@fr,creator
2019.M.1,ms-001/page2.tif,2,Verso,Irises,Iris,Unknown
2019.M.1,ms-001/page1.jpg,1,Recto,Irises,Iris,Unknown
2019.M.1,ms-001/page10.tif,10,Detail,,,Studio
84.PA.1,ms-002/a.png,,,Bust,,
"""


def test_a_csv_sidecar_names_objects_sequences_labels_and_metadata(tmp_path, caplog):
    root = build(tmp_path)
    (root / "objects.csv").write_text(CSV)
    touch(root / "objects.csv", JAN)
    with caplog.at_level(logging.WARNING, logger="connectors"):
        objects = {o.id: o for o in source(root).changes(None)}
    assert sorted(objects) == ["2019.M.1", "84.PA.1"]
    irises = objects["2019.M.1"]
    assert [(i.id, i.sequence, i.label) for i in irises.items] == [
        ("ms-001/page1.jpg", 1, "Recto"), ("ms-001/page2.tif", 2, "Verso"), ("ms-001/page10.tif", 3, "Detail")]
    assert {k: [(v.value, v.language) for v in vs] for k, vs in irises.metadata.items()} == {
        "title": [("Irises", "en"), ("Iris", "fr")], "creator": [("Unknown", None), ("Studio", None)]}
    assert "names no object for 3 file(s)" in caplog.text and "ms-001/notes.txt, ms-002/sub/b.tif" in caplog.text


def test_editing_the_sidecar_changes_its_objects_unless_rows_carry_their_own_time(tmp_path):
    root = build(tmp_path)
    since = moment()
    (root / "objects.csv").write_text(CSV)
    touch(root / "objects.csv", JUN)  # or moved in with an old time: the sidecar's own change counts
    assert [o.modified for o in source(root).changes(since)] == [JUN, JUN]
    since = moment()
    later = since + timedelta(hours=1)
    header = "object_id,file,sequence,label,"
    (root / "objects.csv").write_text(CSV.replace(header, header + "modified,")
                                      .replace("Verso,", f"Verso,{later.isoformat()},")
                                      .replace("Recto,", "Recto,,").replace("Detail,", "Detail,,")
                                      .replace("84.PA.1,ms-002/a.png,,,", "84.PA.1,ms-002/a.png,,,2024-01-01,"))
    touch(root / "objects.csv", JUN)
    assert [(o.id, o.modified) for o in source(root).changes(since)] == [("2019.M.1", later)]


def test_a_json_sidecar_is_equivalent(tmp_path):
    root = build(tmp_path)
    (root / "objects.json").write_text(json.dumps({"objects": [
        {"id": "2019.M.1", "metadata": {"title": [{"value": "Irises", "language": "en"}], "title@fr": "Iris",
                                        "creator": ["Unknown", "Studio"]},
         "items": [{"file": "ms-001/page2.tif", "sequence": 2, "label": "Verso"},
                   {"file": "ms-001/page1.jpg", "sequence": 1, "label": "Recto"}]},
        {"id": "84.PA.1", "modified": "2024-07-01T00:00:00+00:00", "items": [{"file": "ms-002/a.png"}]}]}))
    objects = {o.id: o for o in source(root).changes(None)}
    assert [i.label for i in objects["2019.M.1"].items] == ["Recto", "Verso"]
    assert {k: [(v.value, v.language) for v in vs] for k, vs in objects["2019.M.1"].metadata.items()} == {
        "title": [("Irises", "en"), ("Iris", "fr")], "creator": [("Unknown", None), ("Studio", None)]}
    assert objects["84.PA.1"].modified == JUL


def test_every_sidecar_problem_is_reported_with_its_row_against_its_object_and_the_others_are_listed(tmp_path):
    root = build(tmp_path)
    (root / "objects.csv").write_text(
        "object_id,file,sequence,label,modified\n"
        "a,ms-001/page1.jpg,1,,\n"
        "a,ms-001/missing.tif,2,,\n"
        "b,../../etc/passwd,1,,\n"
        "c,ms-001/page1.jpg,1,,\n"
        "d,ms-002/a.png,x,,\n"
        "e,ms-001/page2.tif,1,,\n"
        "e,ms-001/page10.tif,1,,yesterday\n"
        "f,ms-001/.DS_Store,,,\n"
        "g,loose.jpg,,,\n")
    fs = source(root)
    listed = {o.id: o for o in fs.changes(None)}
    assert isinstance(listed.pop("g"), SourceObject)
    assert {i: o.reason for i, o in listed.items() if isinstance(o, UnreadableObject)} == {
        "a": "fs-test: objects.csv row 3: file 'ms-001/missing.tif' does not exist (or is hidden)",
        "b": "fs-test: objects.csv row 4: file '../../etc/passwd' must be a relative path inside the source",
        "c": "fs-test: objects.csv row 5: file 'ms-001/page1.jpg' already belongs to object 'a'",
        "d": "fs-test: objects.csv row 6: sequence must be a whole number, got 'x'",
        "e": "fs-test: objects.csv row 8: modified must be an ISO 8601 date-time, got 'yesterday'; "
             "objects.csv row 7: object 'e' repeats a sequence number",
        "f": "fs-test: objects.csv row 9: file 'ms-001/.DS_Store' does not exist (or is hidden)"}
    with pytest.raises(SourceDataError, match="row 3: file 'ms-001/missing.tif' does not exist"):
        list(fs.get(["a"]))


def test_a_sidecar_that_cannot_be_read_or_a_row_naming_no_object_stops_the_listing(tmp_path):
    root = build(tmp_path)
    (root / "objects.csv").write_text("id,path\nx,y\n")
    with pytest.raises(SourceError, match="objects.csv: missing column\\(s\\) file, object_id"):
        list(source(root).changes(None))
    (root / "objects.csv").write_text("object_id,file,title\na,loose.jpg,x\n,ms-002/a.png,y\n"
                                      "b,ms-001/page1.jpg,Irises, I\n")
    with pytest.raises(SourceError) as raised:  # either row may belong to an object that would be listed incomplete
        list(source(root).changes(None))
    assert str(raised.value) == "objects.csv row 3: object_id is required\nobjects.csv row 4: more cells than columns"
    (root / "objects.csv").unlink()
    (root / "objects.json").write_text('{"objects": [{"id": "x", "items": [{"path": "loose.jpg"}]}, '
                                       '{"items": [{"file": "loose.jpg"}]}]}')
    with pytest.raises(SourceError, match="^objects.json: objects.1.id: Field required$"):
        list(source(root).changes(None))
    (root / "objects.json").write_text('{"objects": [{"id": "x", "items": [{"path": "loose.jpg"}]}, '
                                       '{"id": "y", "items": [{"file": "loose.jpg"}]}]}')
    x, y = sorted(source(root).changes(None), key=lambda o: o.id)
    assert isinstance(y, SourceObject) and isinstance(x, UnreadableObject)
    assert x.reason == ("fs-test: objects.json: objects.0.items.0.file: Field required; "
                        "objects.json: objects.0.items.0.path: unknown key (keys here: file, label, sequence)")


def test_grouping_mode_is_configuration(tmp_path):
    root = build(tmp_path)
    (root / "objects.csv").write_text(CSV)
    folders = source(root, grouping={"mode": "folder"})
    assert sorted(o.id for o in folders.changes(None)) == ["loose.jpg", "ms-001", "ms-002", "ms-002/sub"]
    assert "objects.csv" not in {i.id for o in folders.changes(None) for i in o.items}
    (root / "objects.csv").unlink()
    with pytest.raises(SourceError, match="grouping.mode is sidecar but none of objects.csv, objects.json exists"):
        list(source(root, grouping={"mode": "sidecar"}).changes(None))


def test_a_missing_root_and_bad_settings_are_clear_errors(tmp_path):
    with pytest.raises(SourceError, match="is not a readable folder"):
        list(source(tmp_path / "nowhere").changes(None))
    with pytest.raises(ConfigError, match="grouping.mode: Input should be 'auto', 'folder' or 'sidecar'"):
        source(tmp_path, grouping={"mode": "by-date"})
    with pytest.raises(ConfigError, match="config.yaml: root: Field required"):
        open_source("filesystem", {}, "fs")


def test_linked_masters_are_followed_and_foreign_locators_refused(tmp_path):
    root = build(tmp_path / "harvest", {"ms-001/page1.jpg": "jpeg-baseline/flowers.jpeg"})
    (root / "ms-001/page2.tif").symlink_to(CORPUS / "gray8/gray.tif")
    fs = source(root)
    (obj,) = fs.get(["ms-001"])
    assert [i.id for i in obj.items] == ["ms-001/page1.jpg", "ms-001/page2.tif"]
    assert fs.fetch(obj.items[1], tmp_path / "scratch").path.read_bytes() == (CORPUS / "gray8/gray.tif").read_bytes()
    forged = replace(obj.items[0], locator=str(root / ".." / "elsewhere.tif"))
    with pytest.raises(SourceError, match="is not a file of this source"):
        fs.fetch(forged, tmp_path / "scratch")


def latin1_tree(root: Path) -> Path:
    """`plain/p1.tif`, a folder named `café` in Latin-1 (not UTF-8) with a master in it, and a folder `mixed`
    whose second master is named `pé.tif` in Latin-1."""
    build(root, {"plain/p1.tif": "gray8/gray.tif", "mixed/p1.tif": "gray8/gray.tif"})
    for folder, name in ((b"caf\xe9", b"p1.tif"), (b"mixed", b"p\xe9.tif")):
        path = os.fsencode(root) + b"/" + folder
        os.makedirs(path, exist_ok=True)
        shutil.copyfile(CORPUS / "gray8/gray.tif", os.fsdecode(path + b"/" + name))
        touch(Path(os.fsdecode(path + b"/" + name)), JAN)
    return root


def test_a_folder_or_file_not_named_in_utf8_makes_its_object_unreadable_under_an_escaped_id(tmp_path):
    before = moment()
    fs = source(latin1_tree(tmp_path / "masters"))
    after = moment()
    listed = {o.id: o for o in fs.changes(None)}
    assert sorted(listed) == ["caf\\xe9", "mixed", "plain"]  # every id is text: the ledger can store it
    assert isinstance(listed["plain"], SourceObject)
    for object_id, named in (("caf\\xe9", "caf\\xe9"), ("mixed", "mixed/p\\xe9.tif")):
        unreadable = listed[object_id]
        assert isinstance(unreadable, UnreadableObject) and before < unreadable.modified < after  # as listed
        assert unreadable.reason == (f"fs-test: {named} under {tmp_path / 'masters'}: not named in UTF-8; rename it "
                                     f"in UTF-8 (convmv -f latin1 -t utf8 converts Latin-1 names)")
        with pytest.raises(SourceDataError, match="not named in UTF-8"):  # asked again by the same id
            list(fs.get([object_id]))
    assert [o.id for o in fs.get(["plain"])] == ["plain"]


def test_a_harvest_records_the_object_not_named_in_utf8_as_failed_and_deposits_the_others(tmp_path):
    latin1_tree(tmp_path / "masters")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "pipelines": {"fs": {
        "source": {"kind": "filesystem", "root": str(tmp_path / "masters")},
        "store": {"kind": "local", "root": str(tmp_path / "store")},
        "manifests": {"manifest_base_url": "https://iiif.example.org/store",
                      "image_service_base_url": "https://iiif.example.org/iiif"}}}}))
    config = load_config(tmp_path / "config.yaml")
    report = harvest(config, "fs")
    assert report.status == "completed" and report.counts["deposited"] == 1
    assert sorted((p.object_id, p.item_id, p.outcome) for p in report.problems) == [
        ("caf\\xe9", OBJECT, "failed"), ("mixed", OBJECT, "failed")]
    with Ledger.open(config) as ledger:
        assert {(r.object_id, r.item_id, r.status) for r in ledger.items("fs")} == {
            ("caf\\xe9", OBJECT, "failed"), ("mixed", OBJECT, "failed"), ("plain", "plain/p1.tif", "deposited")}
    assert harvest(config, "fs").counts["failed"] == 2  # the next run retries them under the same ids


def linked_tree(root: Path) -> Path:
    """`plain/p1.tif`; `loop/` whose `a.tif` and `b.tif` link to each other, beside a master; a root link
    `dangling.tif` to a volume not mounted; `ms/` with a master and `ms/more`, a link to a folder of masters
    outside the root."""
    build(root, {"plain/p1.tif": "gray8/gray.tif", "loop/c.tif": "gray8/gray.tif", "ms/p1.tif": "gray8/gray.tif"})
    build(root.parent / "outside", {"p2.tif": "gray8/gray.tif"})
    (root / "loop/a.tif").symlink_to("b.tif")
    (root / "loop/b.tif").symlink_to("a.tif")
    (root / "dangling.tif").symlink_to("/nonexistent/volume/x.tif")
    (root / "ms/more").symlink_to("../../outside")
    return root


def test_a_link_that_cannot_be_followed_makes_its_object_unreadable_naming_the_link_and_its_target(tmp_path):
    root = linked_tree(tmp_path / "masters")
    fs = source(root)
    listed = {o.id: o for o in fs.changes(None)}
    assert sorted(listed) == ["dangling.tif", "loop", "ms", "plain"]
    assert {i: o.reason for i, o in listed.items() if isinstance(o, UnreadableObject)} == {
        "loop": f"fs-test: loop/a.tif under {root} is a link to b.tif in a loop of links (it leads back to itself); "
                f"loop/b.tif under {root} is a link to a.tif in a loop of links (it leads back to itself)",
        "dangling.tif": f"fs-test: dangling.tif under {root} is a link to /nonexistent/volume/x.tif, which does not "
                        f"exist (a volume not mounted, a master moved or deleted?)"}
    with pytest.raises(SourceDataError, match="a loop of links"):  # asked again by its id
        list(fs.get(["loop"]))
    (root / "dangling.tif").unlink()
    (root / "dangling.tif").symlink_to(root / "plain/p1.tif")  # the volume mounted, as it were
    assert [i.id for o in fs.get(["dangling.tif"]) for i in o.items] == ["dangling.tif"]


def test_a_link_to_a_folder_is_not_followed_and_each_listing_says_so(tmp_path, caplog):
    root = linked_tree(tmp_path / "masters")
    with caplog.at_level(logging.WARNING, logger="connectors"):
        (ms,) = source(root).get(["ms"])
    assert [i.id for i in ms.items] == ["ms/p1.tif"]
    assert (f"fs-test: 1 link(s) to a folder under {root} not followed, their files not harvested (mount the folder "
            f"under the root, or link its files): ms/more -> ../../outside") in caplog.text


def test_a_root_that_is_a_loop_of_links_fails_the_listing_as_a_missing_root_does(tmp_path):
    (tmp_path / "loop").symlink_to("loop")
    fs = source(tmp_path / "loop")  # opened, as a missing root is: the volume may be mounted by the next run
    with pytest.raises(SourceError, match=f"^fs-test: root {tmp_path / 'loop'} is not a readable folder "
                                          r"\(Too many levels of symbolic links\)$"):
        list(fs.changes(None))
    with pytest.raises(SourceError, match=r"is not a readable folder \(No such file or directory\)$"):
        list(source(tmp_path / "nowhere").changes(None))


def test_a_harvest_fails_the_objects_with_broken_links_and_the_pipeline_whose_root_is_a_loop_alone(tmp_path):
    linked_tree(tmp_path / "masters")
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "pipelines": {
        name: {"source": {"kind": "filesystem", "root": str(tmp_path / root)},
               "store": {"kind": "local", "root": str(tmp_path / "store")},
               "manifests": {"manifest_base_url": "https://iiif.example.org/store",
                             "image_service_base_url": "https://iiif.example.org/iiif"}}
        for name, root in (("good", "masters"), ("looped", "loop"))}}))
    gcis = str(Path(sys.executable).with_name("gcis-etl"))
    checked = subprocess.run([gcis, "--config", str(tmp_path / "config.yaml"), "config", "check"],
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stderr
    run = subprocess.run([gcis, "--config", str(tmp_path / "config.yaml"), "harvest"], capture_output=True,
                         text=True, timeout=300)
    assert "Traceback" not in run.stderr + run.stdout
    assert f"root {tmp_path / 'loop'} is not a readable folder (Too many levels of symbolic links)" in run.stderr
    with Ledger.open(load_config(tmp_path / "config.yaml")) as ledger:
        assert {(r.object_id, r.item_id, r.status) for r in ledger.items("good")} == {
            ("dangling.tif", OBJECT, "failed"), ("loop", OBJECT, "failed"), ("ms", "ms/p1.tif", "deposited"),
            ("plain", "plain/p1.tif", "deposited")}


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root's setpriv to drop the capabilities that let root read any folder")
def test_a_folder_that_cannot_be_listed_fails_its_object_alone(tmp_path):
    """One folder without read permission stopped every run ("cannot list …: Permission denied"), nothing of
    the other objects harvested; the files of one without search permission were left out without a word. The harvest runs without the capabilities that let root read any folder."""
    root = tmp_path / "masters"
    for name in ("o1", "o2", "o3", "o4"):
        (root / name).mkdir(parents=True)
        shutil.copy(CORPUS / "gray8/gray.tif", root / name / "p1.tif")
    (root / "o2" / "sub").mkdir()
    (root / "o2").chmod(0)
    (root / "o4").chmod(0o644)  # its names can be read, its files not reached (no search permission)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "pipelines": {
        "perm": {"source": {"kind": "filesystem", "root": str(root)},
                 "store": {"kind": "local", "root": str(tmp_path / "store")},
                 "manifests": {"manifest_base_url": "https://iiif.example.org/store",
                               "image_service_base_url": "https://iiif.example.org/iiif"}}}}))
    gcis = str(Path(sys.executable).with_name("gcis-etl"))
    try:
        run = subprocess.run(["setpriv", "--bounding-set", "-dac_override,-dac_read_search", gcis, "--config",
                              str(tmp_path / "config.yaml"), "harvest"], capture_output=True, text=True, timeout=300)
    finally:
        (root / "o2").chmod(0o755)
        (root / "o4").chmod(0o755)
    assert run.returncode == 1 and "Traceback" not in run.stderr + run.stdout, run.stderr
    with Ledger.open(load_config(tmp_path / "config.yaml")) as ledger:
        items = {(r.object_id, r.item_id): (r.status, r.reason) for r in ledger.items("perm")}
    assert {key: status for key, (status, _) in items.items()} == {
        ("o1", "o1/p1.tif"): "deposited", ("o2", OBJECT): "failed", ("o3", "o3/p1.tif"): "deposited",
        ("o4", OBJECT): "failed"}
    assert items["o4", OBJECT][1].endswith(f"o4/p1.tif under {root} cannot be read: Permission denied")
    assert items["o2", OBJECT][1] == (f"the source cannot describe it: perm: o2/ under {root} cannot be listed: "
                                      f"Permission denied (its files, and the objects of its subfolders, are not "
                                      f"harvested until it can be)")
