"""The filesystem source pointed at a share others write to: a FIFO or device swapped in for a master, a master
larger than the scratch space, links out of the root, unreadable files, very long names, upload leftovers and a
file still being written. Real files, FIFOs, sockets and (root) a small tmpfs and dropped capabilities."""
from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from connectors import open_source
from connectors.errors import FetchIntegrityError
from connectors.fetching import scratch_name
from gcis_etl.errors import ConfigError, SourceError
from gcis_etl.harvesting import OBJECT
from tests.emulators import FAST_RETRY
from tests.emulators.catalogue import CORPUS
from tests.mounts import tmpfs
from tests.test_cron_operation import GCIS, Night

MASTER = CORPUS / "gray8/gray.tif"


def source(root: Path, **overrides):
    return open_source("filesystem", {"root": str(root), "retry": FAST_RETRY, **overrides}, name="fs-test")


def masters(root: Path, *paths: str) -> Path:
    for relative in paths:
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(MASTER, root / relative)
    return root


def fetch_in_thread(fs, item, scratch: Path) -> object:
    """What fetching `item` returned or raised, in a thread joined with a generous timeout: a hang guard."""
    outcome: list[object] = []

    def fetch() -> None:
        try:
            outcome.append(fs.fetch(item, scratch))
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=fetch, daemon=True)
    thread.start()
    thread.join(60)
    return outcome[0] if outcome else None


def test_a_fifo_or_device_swapped_in_after_the_listing_fails_its_item_without_waiting(tmp_path):
    """open() of a FIFO with no writer waited for ever, and a stop waited on the item in flight for ever."""
    root = masters(tmp_path / "masters", "o/p1.tif", "o/p2.tif", "o/p3.tif")
    (root / "o/p2.tif").unlink()
    (root / "o/p2.tif").symlink_to(tmp_path / "linked.tif")
    shutil.copyfile(MASTER, tmp_path / "linked.tif")
    fs = source(root)
    (obj,) = fs.get(["o"])
    (root / "o/p1.tif").unlink()
    os.mkfifo(root / "o/p1.tif")
    os.mkfifo(tmp_path / "fifo")
    (root / "o/p2.tif").unlink()
    (root / "o/p2.tif").symlink_to(tmp_path / "fifo")  # the link re-pointed at a FIFO
    (root / "o/p3.tif").unlink()
    (root / "o/p3.tif").symlink_to("/dev/zero")
    try:
        outcomes = [fetch_in_thread(fs, item, tmp_path / "scratch") for item in obj.items]
    finally:
        for fifo in (root / "o/p1.tif", tmp_path / "fifo"):  # a reader still waiting is let go
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
    assert [type(o) for o in outcomes] == [SourceError] * 3, outcomes
    assert [str(o) for o in outcomes] == [
        "fs-test: cannot read o/p1.tif: it is a FIFO (named pipe), not a regular file",
        "fs-test: cannot read o/p2.tif: it is a FIFO (named pipe), not a regular file",
        "fs-test: cannot read o/p3.tif: it is a character device, not a regular file"]


def test_fifos_sockets_and_device_links_are_named_in_a_warning_each_listing(tmp_path, caplog):
    root = masters(tmp_path / "masters", "o/p1.tif")
    os.mkfifo(root / "o/pipe.tif")
    os.mkfifo(root / "o/.hidden-pipe")  # excluded: not named
    (root / "o/null.tif").symlink_to("/dev/null")
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(root / "o/sock"))
        with caplog.at_level(logging.WARNING, logger="connectors"):
            (obj,) = source(root).get(["o"])
    assert [i.id for i in obj.items] == ["o/p1.tif"]
    (warning,) = [r.getMessage() for r in caplog.records if "FIFO" in r.getMessage()]
    assert warning.startswith(f"fs-test: 3 FIFO(s), socket(s) or device(s) under {root} not harvested, as they are "
                              f"no regular files: ")
    assert sorted(warning.rpartition("files: ")[2].split(", ")) == [
        "o/null.tif -> /dev/null (a character device)", "o/pipe.tif (a FIFO (named pipe))", "o/sock (a socket)"]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs for the scratch space needs root")
def test_a_master_larger_than_the_free_scratch_space_fails_alone_and_the_run_goes_on(tmp_path):
    """A `truncate -s 1T` on the share filled the scratch space: the run stopped as for a full disk, every night,
    no attempt counted, the master never named."""
    night = Night(tmp_path)
    night.add("a", "b")
    huge = tmp_path / "src" / "huge" / "master.tif"
    huge.parent.mkdir()
    with open(huge, "wb") as sparse:
        sparse.truncate(1 << 30)
    scratch = tmp_path / "state" / "scratch"
    with tmpfs(scratch, "size=16m"):
        run = night.harvest()
        free = shutil.disk_usage(scratch).free
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert "run stopped" not in run.stderr
    assert night.items() == {"a/a/master.tif": ("deposited", 0), "b/b/master.tif": ("deposited", 0),
                             "huge/huge/master.tif": ("failed", 1)}
    assert (f"failed huge/master.tif: fetching: huge/master.tif is 1073.7 MB; the scratch space has "
            f"{free / 1e6:.1f} MB free (scratch: {scratch / 'dam'}/item-") in run.stderr
    assert "): too large to fetch here" in run.stderr


def test_links_inside_refuses_a_link_out_of_the_root_per_item_and_is_validated(tmp_path):
    root = masters(tmp_path / "masters", "o/p1.tif")
    masters(tmp_path / "elsewhere", "p2.tif")
    (root / "o/p2.tif").symlink_to(tmp_path / "elsewhere/p2.tif")
    (root / "o/p3.tif").symlink_to("p1.tif")
    fs = source(root, links="inside")
    (obj,) = fs.get(["o"])
    assert [i.id for i in obj.items] == ["o/p1.tif", "o/p2.tif", "o/p3.tif"]
    assert fs.fetch(obj.items[2], tmp_path / "scratch").path.read_bytes() == MASTER.read_bytes()
    with pytest.raises(SourceError) as refused:
        fs.fetch(obj.items[1], tmp_path / "scratch")
    assert str(refused.value) == (f"fs-test: o/p2.tif under {root} is a link to {tmp_path / 'elsewhere/p2.tif'}, "
                                  f"outside the root (links: inside)")
    anywhere = source(root)
    assert anywhere.fetch(obj.items[1], tmp_path / "scratch").path.read_bytes() == MASTER.read_bytes()
    with pytest.raises(ConfigError, match="links: Input should be 'anywhere' or 'inside'"):
        source(root, links="nowhere")


def test_links_inside_holds_for_a_link_swapped_out_of_the_root_as_the_master_is_opened(tmp_path, monkeypatch):
    """Checked on the path, then opened by the path again: a link turned outside the root in between was read.
    The swap is made as the first path is resolved: whatever was checked, the bytes read are never the outside
    file's."""
    root = masters(tmp_path / "masters", "o/p1.tif")
    outside = tmp_path / "elsewhere" / "p2.tif"
    outside.parent.mkdir()
    outside.write_bytes(MASTER.read_bytes()[:-1] + b"\1")  # the listed size: read to its end, no retry
    link = root / "o/p2.tif"
    link.symlink_to("p1.tif")
    fs = source(root, links="inside")
    (obj,) = fs.get(["o"])
    resolve = os.path.realpath

    def swapping(path, *args, **kwargs):
        resolved = resolve(path, *args, **kwargs)
        if os.readlink(link) != str(outside):
            link.unlink()
            link.symlink_to(outside)
        return resolved

    monkeypatch.setattr(os.path, "realpath", swapping)
    try:
        fetched = fs.fetch(obj.items[1], tmp_path / "scratch")
    except SourceError as refused:
        assert str(refused).endswith(f"is a link to {outside}, outside the root (links: inside)")
    else:
        assert fetched.path.read_bytes() == MASTER.read_bytes()  # opened before the swap


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root's setpriv to drop the capabilities that let root read any file")
def test_an_unreadable_file_fails_its_object_at_the_listing_and_is_harvested_once_chmod_fixes_it(tmp_path):
    """It failed at the fetch, spending the item's attempts, and after max_attempts waited for `gcis-etl retry`
    even once readable."""
    night = Night(tmp_path, pipeline={"max_attempts": 1})
    night.add("a", "b")
    master = tmp_path / "src" / "b" / "master.tif"
    master.chmod(0)

    def harvest() -> subprocess.CompletedProcess:
        return subprocess.run(["setpriv", "--bounding-set", "-dac_override,-dac_read_search", GCIS, "--config",
                               str(tmp_path / "config.yaml"), "harvest"], capture_output=True, text=True,
                              timeout=300)

    try:
        first = harvest()
        assert first.returncode == 1 and "Traceback" not in first.stderr, first.stderr
        assert night.items() == {"a/a/master.tif": ("deposited", 0), f"b/{OBJECT}": ("failed", 1)}
        assert (f"b/master.tif under {tmp_path / 'src'} cannot be read: Permission denied") in first.stderr
        harvest()
    finally:
        master.chmod(0o644)
    fixed = harvest()
    assert fixed.returncode == 0, fixed.stderr
    assert night.items() == {"a/a/master.tif": ("deposited", 0), "b/b/master.tif": ("deposited", 0)}


def test_a_very_long_name_is_fetched_under_a_bounded_scratch_name(tmp_path):
    """Names of 219 to 244 characters failed with a raw OSError: the temporary name adds to the scratch name."""
    name = "x" * 236 + ".tif"
    root = masters(tmp_path / "masters", f"long/{name}", f"long/{name[:-5]}y.tif")
    fs = source(root)
    (obj,) = fs.get(["long"])
    fetched = [fs.fetch(item, tmp_path / "scratch") for item in obj.items]
    assert [f.path.read_bytes() for f in fetched] == [MASTER.read_bytes()] * 2
    names = [f.path.name for f in fetched]
    assert len(set(names)) == 2 and all(len(n) <= 120 and n.startswith("long_xxxx") and n.endswith(".tif")
                                        for n in names)
    assert scratch_name(obj.items[0]) == names[0]


def test_upload_leftovers_and_hidden_files_are_excluded_by_one_visible_setting(tmp_path):
    root = masters(tmp_path / "masters", "o/page1.jpg", "o/page2.JPG", "o/page3.jpg.part", "o/page4.tmp",
                   "o/Thumbs.db", "o/desktop.ini", "o/~$lock.jpg", "o/.DS_Store", "o/x.crdownload",
                   ".trash/old.tif", "o/.cache/p.tif")
    assert [i.id for o in source(root).changes(None) for i in o.items] == ["o/page1.jpg", "o/page2.JPG"]
    chosen = source(root, grouping={"exclude": ["*.JPG", ".trash"]})
    assert sorted(i.id for o in chosen.changes(None) for i in o.items) == [
        "o/.DS_Store", "o/.cache/p.tif", "o/Thumbs.db", "o/desktop.ini", "o/page3.jpg.part", "o/page4.tmp",
        "o/x.crdownload"]  # *.JPG matches page1.jpg and ~$lock.jpg alike
    with pytest.raises(ConfigError, match=r"grouping.exclude: .*no '/' and not empty: got 'o/\*.tif'"):
        source(root, grouping={"exclude": ["o/*.tif"]})


@pytest.mark.parametrize("exclude", [["*.csv"], ["objects.*"]])
def test_an_exclude_pattern_matching_the_sidecar_leaves_it_read(tmp_path, exclude):
    """Excluded, the sidecar was not found, and mode auto grouped by folder: every object id changed, silently."""
    root = masters(tmp_path / "masters", "o/page1.tif", "o/page2.tif", "o/notes.csv")
    (root / "objects.csv").write_text("object_id,file,sequence\n2019.M.1,o/page2.tif,1\n2019.M.1,o/page1.tif,2\n")
    listed = list(source(root, grouping={"exclude": exclude}).changes(None))
    assert [(o.id, [i.id for i in o.items]) for o in listed] == [("2019.M.1", ["o/page2.tif", "o/page1.tif"])]


def test_a_file_growing_as_it_is_read_is_copied_no_further_than_its_listed_size(tmp_path):
    """A file still being written was copied by the kernel to its end before the sizes were compared: here a
    file-size limit just past the listed size makes that copy fail (EFBIG) where the bounded one stops in time."""
    root = masters(tmp_path / "masters", "o/p1.tif")
    script = (
        "import os, resource, signal, sys\n"
        "from pathlib import Path\n"
        "from connectors import open_source\n"
        f"fs = open_source('filesystem', {{'root': {str(root)!r}, 'retry': {FAST_RETRY!r}}}, name='fs-test')\n"
        "(obj,) = fs.get(['o'])\n"
        f"with open({str(root / 'o/p1.tif')!r}, 'ab') as grown:\n"
        "    grown.write(bytes(8 << 20))\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "limit = obj.items[0].size + 4096\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))\n"
        "try:\n"
        f"    fs.fetch(obj.items[0], Path({str(tmp_path / 'scratch')!r}))\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{FetchIntegrityError.__name__} o/p1.tif: more than the {MASTER.stat().st_size} "
                                  f"bytes listed arrived: it grew while it was read (still being written?)"), \
        done.stdout
