"""Re-run benchmark: what a `harvest --full` costs when nothing changed (a cron run's overlap, a revisit), where
every item is decided "skip unchanged" and every object's manifest is found up to date.

    python bench/rerun.py                                  # 20000 items, 1 to 5 to an object, this checkout
    python bench/rerun.py --items 5000 --top 25
    python bench/rerun.py --code /tmp/old                  # another checkout's code (a before/after)

A folder source of tiny files (never read: nothing is converted) and a local store. The ledger is filled
through its API, as a harvest would have left it: each item deposited (Ledger.record) with the pipeline's
recipe digest and the fingerprint of the item as listed, each object's manifest published (record_manifest,
with the fingerprint the code under test computes) and in the collection. The timed run is a `--full` re-run in
a fresh process (harvest() with HarvestOptions(full=True), imports done first), whose counts are checked (every
item skipped, no manifest published): its wall time and CPU seconds; then another under cProfile, for its top
functions by cumulative time. Not part of the test suite; timings on shared machines are noisy.
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = "bench"


def write_site(site: Path, items: int, seed: int) -> int:
    """config.yaml, and a folder of masters with `items` files, 1 to 5 to an object; the number of objects."""
    import yaml
    rng = random.Random(seed)
    masters, made, objects = site / "masters", 0, 0
    while made < items:
        folder = masters / f"obj{objects:06d}"
        folder.mkdir(parents=True)
        for n in range(min(rng.randint(1, 5), items - made)):
            (folder / f"p{n}.tif").write_bytes(b"II*\0" + bytes(n))
            made += 1
        objects += 1
    (site / "store" / PIPELINE).mkdir(parents=True)  # a store holding nothing with deposits recorded is refused
    (site / "store" / PIPELINE / "deposited.jp2").write_bytes(b"")
    config = {"state_dir": str(site / "state"), "pipelines": {PIPELINE: {
        "source": {"kind": "filesystem", "root": str(masters)},
        "store": {"kind": "local", "root": str(site / "store")},
        "manifests": {"manifest_base_url": "https://iiif.example.org/store",
                      "image_service_base_url": "https://iiif.example.org/iiif", "versions": ["3.0", "2.1"]}}}}
    (site / "config.yaml").write_text(yaml.safe_dump(config))
    return objects


def fill(site: Path) -> None:
    """Every listed item deposited and every object's manifest published and in the collection, as a harvest
    would have recorded them (publishing them for real costs 30 ms an object: the store syncs each file)."""
    from gcis_etl.config import load_config
    from gcis_etl.harvesting import _manifest_fingerprint
    from gcis_etl.ledger import Ledger
    from gcis_etl.manifests import DepositedImage
    from gcis_etl.work import ItemResult, Outcome, fingerprint
    config = load_config(site / "config.yaml")
    pipeline = config.pipeline(PIPELINE)
    recipe, manifests = pipeline.recipe, pipeline.manifests
    with Ledger.open(config) as ledger:
        run = ledger.begin_run(PIPELINE, None, None, {})
        for obj in pipeline.source.changes(None):
            images = []
            for item in obj.items:
                key = f"{PIPELINE}/{item.id}.jp2"
                ledger.record(run, ItemResult(
                    PIPELINE, obj.id, item.id, item.sequence, Outcome.DEPOSITED, fingerprint(item), recipe.name,
                    recipe.digest, 1, key=key, sha256="0" * 64, bytes=16, width=8, height=8), item.modified)
                images.append(DepositedImage(item.sequence, key, 8, 8, item.label))
            label = [[v.value, v.language] for v in manifests.label_of(obj)]
            ledger.record_manifest(run, PIPELINE, obj.id, obj.modified, label,
                                   _manifest_fingerprint(obj, images, manifests.settings.model_dump_json()))
            ledger.mark_in_collection(PIPELINE, [obj.id])
        ledger.finish_run(run, "completed", ledger.recorded_counts(run), 0, None)


def rerun(site: Path, profile: Path | None) -> dict:
    """A --full harvest in this process (under cProfile into `profile`, when given): its counts, manifests published,
    wall and CPU seconds."""
    import cProfile

    from gcis_etl.config import load_config
    from gcis_etl.harvesting import HarvestOptions, harvest
    config = load_config(site / "config.yaml")
    profiler = cProfile.Profile() if profile else None
    wall, cpu = time.perf_counter(), time.process_time()
    if profiler:
        profiler.enable()
    report = harvest(config, PIPELINE, HarvestOptions(full=True))
    if profiler:
        profiler.disable()
        profiler.dump_stats(profile)
    return {"counts": report.counts, "manifests": report.manifests, "status": report.status,
            "wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}


def child(code: Path, site: Path, profile: Path | None = None) -> dict:
    """rerun() in a fresh process running `code`'s gcis_etl."""
    command = [sys.executable, __file__, "--code", str(code), "--child", str(site)]
    out = subprocess.run(command + (["--profile", str(profile)] if profile else []), capture_output=True, text=True,
                         cwd=code)
    if out.returncode:
        raise SystemExit(f"the run failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--code", type=Path, default=ROOT, help="the checkout whose gcis_etl runs (default: this)")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)  # a site to re-run, in this process
    parser.add_argument("--profile", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    code = args.code.resolve()
    sys.path.insert(0, str(code))
    if args.child:
        print(json.dumps(rerun(args.child, args.profile)))
        return
    with tempfile.TemporaryDirectory(prefix="rerun-") as folder:
        site = Path(folder)
        objects = write_site(site, args.items, args.seed)
        started = time.monotonic()
        fill(site)
        print(f"{args.items} items in {objects} objects; ledger filled in {time.monotonic() - started:.1f} s",
              file=sys.stderr, flush=True)
        timed = child(code, site)
        if timed["counts"] != {"deposited": 0, "skipped": args.items, "rejected": 0, "failed": 0} \
                or timed["manifests"] != 0 or timed["status"] != "completed":
            raise SystemExit(f"the re-run did not skip everything unchanged: {timed}")
        profile = site / "rerun.prof"
        child(code, site, profile)
        print(f"--full re-run of {args.items} unchanged items, {objects} objects ({code}):")
        print(f"  wall {timed['wall']:.2f} s, CPU {timed['cpu']:.2f} s, "
              f"{timed['wall'] / args.items * 1e6:.0f} us wall per item")
        import pstats
        stats = pstats.Stats(str(profile))
        stats.sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
