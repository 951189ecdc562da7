"""Collection update benchmark: the CPU one harvest run spends on the pipeline's collection, by its size.

    python bench/collection.py                               # 1k, 10k, 50k listed objects, 3.0 and 2.1
    python bench/collection.py --sizes 1000 --added 100
    python bench/collection.py --manifests path/to/manifests.py   # another manifests.py (the code before a change)

For each size and version, a collection of that many entries is deposited in a local store (written directly,
not timed), then Manifests.update_collection adds --added new objects to it, as a run that published them
does. The table gives the CPU and wall seconds of that call (the fastest of --repeat, each on a fresh copy of
the collection) and the size of the document written. A run's cost should follow the entries added, not those
listed: what remains proportional to the size is reading and writing the document itself.
Not part of the test suite; timings on shared machines are noisy.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.measure import module_at  # noqa: E402
from connectors.base import LangValue  # noqa: E402
from gcis_etl.stores import LocalStore, LocalStoreSettings  # noqa: E402

BASE = "https://iiif.example.org/manifests"


@dataclass
class Timing:
    size: int
    version: str
    cpu_seconds: float
    seconds: float
    megabytes: float


def manifests_module(path: Path | None) -> ModuleType:
    """gcis_etl.manifests, or the module at `path` (a copy of it from before a change) under its own name."""
    if path is None:
        import gcis_etl.manifests
        return gcis_etl.manifests
    return module_at(path, "bench_manifests")


def entries(module: ModuleType, start: int, count: int) -> list:
    return [module.CollectionEntry(f"obj{i:07d}", (LangValue(f"Object {i}", "en"),))
            for i in range(start, start + count)]


def measure(module: ModuleType, size: int, version: str, added: int, repeat: int) -> Timing:
    settings = module.ManifestSettings(manifest_base_url=BASE, image_service_base_url="https://iiif.example.org/iiif",
                                       versions=(version,))
    listed = entries(module, 0, size)
    new = entries(module, size, added)
    runs = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory(prefix="bench-collection-") as root:
            manifests = module.Manifests(settings, "bench", LocalStore(LocalStoreSettings(root=Path(root))))
            key = manifests.collection_key(version)
            document = manifests.collection(version, [manifests._collection_item(e, version) for e in listed])
            manifests.store.put_bytes(key, json.dumps(document, ensure_ascii=False, indent=2).encode() + b"\n",
                                      content_type="application/json")
            cpu, wall = time.process_time(), time.perf_counter()
            manifests.update_collection(added=new)
            runs.append((time.process_time() - cpu, time.perf_counter() - wall,
                         len(manifests.store.get_bytes(key)) / 1e6))
    cpu_seconds, seconds, megabytes = min(runs)
    return Timing(size, version, cpu_seconds, seconds, megabytes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,50000", help="entries listed before the run")
    parser.add_argument("--versions", default="3.0,2.1")
    parser.add_argument("--added", type=int, default=1, help="entries the run adds")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--manifests", type=Path, help="the manifests.py to measure (default: this tree's)")
    args = parser.parse_args()
    module = manifests_module(args.manifests)
    print(f"{module.__file__}: update_collection adding {args.added}, fastest of {args.repeat}")
    print(f"{'listed':>8} {'version':>7} {'CPU s':>8} {'wall s':>8} {'MB':>6}")
    for size in map(int, args.sizes.split(",")):
        for version in args.versions.split(","):
            t = measure(module, size, version, args.added, args.repeat)
            print(f"{t.size:>8} {t.version:>7} {t.cpu_seconds:>8.3f} {t.seconds:>8.3f} {t.megabytes:>6.1f}", flush=True)


if __name__ == "__main__":
    main()
