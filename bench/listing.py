"""Listing benchmark: what a folder source's listings cost in time and memory as the store grows.

    python bench/listing.py                                  # 200k files, this checkout
    python bench/listing.py --files 50000
    python bench/listing.py --tree /tmp/old --tree .         # before and after: each --tree a copy of the code

A tree of --files zero-byte files, 1 to 3 to a folder (a folder is an object), is made in a temporary folder and
deleted after. For each --tree (a folder holding `connectors` and `gcis_etl`, e.g. `git archive HEAD connectors
gcis_etl | tar -x -C /tmp/old`), each measure runs in a fresh Python process, which reports its wall time and
its peak RSS (ru_maxrss, the interpreter and imports included; `imports` is that process doing nothing else):
- full: `list(source.changes(None))`, a first run;
- incremental: `list(source.changes(since))` with `since` after every file was made, a nightly run with nothing
  changed;
- revisit: --revisit ids, --gone of them no longer in the store (spread among them), through the harvester's
  own loop (connectors.base.described; Harvest._by_id in older trees), counting how many times the store is
  listed.
Not part of the test suite; timings on shared machines are noisy.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
MEASURES = ("imports", "full", "incremental", "revisit")


def object_id(number: int) -> str:
    return f"d{number // 1000:04d}/obj{number:07d}"


def make_tree(root: Path, files: int) -> int:
    """`files` zero-byte files, 1 to 3 to a folder, 1000 folders to a parent; the number of folders."""
    made = folder = 0
    while made < files:
        path = root / object_id(folder)
        path.mkdir(parents=True)
        for page in range(min(folder % 3 + 1, files - made)):
            os.close(os.open(path / f"p{page + 1}.tif", os.O_CREAT | os.O_WRONLY, 0o644))
        made += folder % 3 + 1
        folder += 1
    return folder


def measure(what: str, root: Path, since: str, folders: int, revisit: int, gone: int) -> dict:
    """In this (fresh) process: import the tree's code, run one measure, report time, peak RSS and counts."""
    from connectors.filesystem import FilesystemSettings, FilesystemSource
    try:
        from connectors.base import described
    except ImportError:  # a tree from before it: the harvester's own method
        from gcis_etl.harvesting import Harvest

        def described(source, ids):
            return Harvest._by_id(SimpleNamespace(pipeline=SimpleNamespace(source=source)), ids)

    class Counting(FilesystemSource):
        listings = 0

        def _files(self):
            Counting.listings += 1
            return super()._files()

    source = Counting(FilesystemSettings(root=root, grouping={"mode": "folder"}), name="bench")
    started = time.perf_counter()
    result: dict = {}
    if what == "full":
        result["objects"] = len(list(source.changes(None)))
    elif what == "incremental":
        result["objects"] = len(list(source.changes(datetime.fromisoformat(since))))
    elif what == "revisit":
        step = folders // revisit
        ids = [object_id(n * step) for n in range(revisit)]
        for n in range(gone):  # spread among the others, none last
            ids[(n * revisit) // gone + 1] = f"gone/obj{n}"
        listed = list(described(source, ids))
        result["objects"] = sum(1 for o in listed if type(o).__name__ == "SourceObject")
        result["gone"] = sum(1 for o in listed if getattr(o, "gone", False))
    result["seconds"] = round(time.perf_counter() - started, 2)
    result["peak_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    result["listings"] = Counting.listings
    return result


def run(tree: Path, what: str, root: Path, since: str, folders: int, args) -> dict:
    command = [sys.executable, __file__, "--child", what, "--root", str(root), "--since", since,
               "--folders", str(folders), "--revisit", str(args.revisit), "--gone", str(args.gone)]
    env = {**os.environ, "PYTHONPATH": str(tree.resolve())}
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{tree} {what}:\n{done.stderr}")
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=200_000)
    parser.add_argument("--tree", type=Path, action="append", help="a copy of the code (default: this checkout)")
    parser.add_argument("--revisit", type=int, default=1000, help="ids asked for by the revisit")
    parser.add_argument("--gone", type=int, default=10, help="of which no longer in the store")
    parser.add_argument("--child", choices=MEASURES, help=argparse.SUPPRESS)
    parser.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--since", help=argparse.SUPPRESS)
    parser.add_argument("--folders", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.root, args.since, args.folders, args.revisit, args.gone)))
        return
    trees = args.tree or [ROOT]
    with tempfile.TemporaryDirectory(prefix="bench-listing-") as scratch:
        root = Path(scratch) / "masters"
        started = time.perf_counter()
        folders = make_tree(root, args.files)
        time.sleep(1.1)  # every file's ctime, and every folder's, is now before `since`
        since = datetime.now(timezone.utc).isoformat()
        print(f"{args.files} files in {folders} folders, made in {time.perf_counter() - started:.1f} s")
        for what in MEASURES:
            for tree in trees:
                print(f"{what:12} {str(tree):30} {json.dumps(run(tree, what, root, since, folders, args))}",
                      flush=True)


if __name__ == "__main__":
    main()
