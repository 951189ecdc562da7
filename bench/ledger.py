"""Ledger benchmark: what the ledger's per-run and per-object queries cost as a pipeline's items grow.

    python bench/ledger.py                                   # 200k items, this checkout's gcis_etl/ledger.py
    python bench/ledger.py --items 50000
    python bench/ledger.py --ledger /tmp/old/ledger.py --ledger gcis_etl/ledger.py   # before and after a change

For each ledger.py given, a fresh ledger is filled through its API (Ledger.record, Ledger.supersede: each commits
on its own, as a harvest does) with --items items of one pipeline, 5 to an object: 1% rejected, 1% failed out of
attempts, the rest deposited, and every other object with one superseded key per item. Then each query a run,
`status`, `report` or `retire` makes is timed in CPU seconds (the fastest of --repeat: the ledger is in the
page cache, and wall times on a shared machine vary more); superseded() is timed per object, as
retire_superseded calls it for every object a run settles. One column per ledger.py: a query that reads the
whole pipeline shows as a time growing with --items, one that reads only its rows stays flat.
Not part of the test suite; timings on shared machines are noisy.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.measure import module_at  # noqa: E402
from gcis_etl.work import ItemResult, Outcome  # noqa: E402

PIPELINE = "bench"
PER_OBJECT = 5
MAX_ATTEMPTS = 3
SAMPLED_OBJECTS = 200  # superseded() is timed over this many objects, spread over the pipeline


def load_ledger(path: Path) -> ModuleType:
    """A ledger.py (another version's copy, for a before/after) as its own module."""
    return module_at(path, f"bench_ledger_{abs(hash(str(path.resolve())))}")


def object_id(number: int) -> str:
    return f"obj{number:07d}"


def item_id(n: int) -> str:
    return f"{object_id(n // PER_OBJECT)}/p{n % PER_OBJECT}.tif"


def result(n: int, outcome: Outcome, attempt: int = 1, **values) -> ItemResult:
    return ItemResult(PIPELINE, object_id(n // PER_OBJECT), item_id(n), n % PER_OBJECT, outcome, f"fp{n}", "recipe",
                      "0123456789abcdef", attempt, **values)


def fill(ledger, items: int) -> tuple[int, float]:
    """The run's id, and the CPU seconds per item recorded."""
    run = ledger.begin_run(PIPELINE, None, None, {})
    started = time.process_time()
    for n in range(items):
        if n % 100 == 0:
            ledger.record(run, result(n, Outcome.REJECTED, reason="not an image"), None)
        elif n % 100 == 1:
            for attempt in range(1, MAX_ATTEMPTS + 1):
                ledger.record(run, result(n, Outcome.FAILED, attempt, reason="source timed out"), None)
        else:
            deposit = result(n, Outcome.DEPOSITED, key=f"{PIPELINE}/{n}.tif", sha256="0" * 64, bytes=16,
                             width=100, height=100, seconds=1.0)
            ledger.record(run, deposit, None)
        if (n // PER_OBJECT) % 2 == 0:
            ledger.supersede(PIPELINE, object_id(n // PER_OBJECT), item_id(n), f"{PIPELINE}/{n}.jp2", run)
    seconds = time.process_time() - started
    ledger.finish_run(run, "completed", ledger.recorded_counts(run), 0, None)
    return run, seconds / items


def fastest(call: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        call()
        best = min(best, time.process_time() - started)
    return best


def measure(module: ModuleType, items: int, repeat: int) -> dict[str, tuple[float, str]]:
    """Query name: (milliseconds, what it returned)."""
    with tempfile.TemporaryDirectory() as folder:
        with module.Ledger(Path(folder) / "ledger.sqlite") as ledger:
            run, per_item = fill(ledger, items)
            objects = items // PER_OBJECT
            sampled = [object_id(n) for n in range(0, objects, max(1, objects // SAMPLED_OBJECTS))]

            def per_object() -> int:
                return sum(len(list(ledger.superseded(PIPELINE, obj))) for obj in sampled)

            failed = "status='failed' AND attempts<?", (MAX_ATTEMPTS,)
            exhausted = "status='failed' AND attempts>=?", (MAX_ATTEMPTS,)
            queries: dict[str, Callable[[], object]] = {
                "superseded(object), per object": per_object,
                "superseded(object with none)": lambda: list(ledger.superseded(PIPELINE, "none")),
                "superseded(all)": lambda: list(ledger.superseded(PIPELINE)),
                "iter_items(failed, attempts left) [each run]": lambda: list(ledger.iter_items(PIPELINE, *failed)),
                "iter_items(failed, out of attempts) [each run]": lambda: list(ledger.iter_items(PIPELINE,
                                                                                                  *exhausted)),
                "items(status=failed, limit=10) [status]": lambda: ledger.items(PIPELINE, status="failed", limit=10),
                "items(status=failed) [status --all]": lambda: ledger.items(PIPELINE, status="failed"),
                "objects_with(failed) [retry]": lambda: ledger.objects_with(PIPELINE, "failed"),
                "counts [status]": lambda: ledger.counts(PIPELINE),
                "recorded_counts(run) [report]": lambda: ledger.recorded_counts(run),
                "run_items(run, failed) [report]": lambda: ledger.run_items(run, "failed"),
            }
            timings = {"record(), per item (fill)": (per_item * 1000, f"{items} items")}
            for name, call in queries.items():
                seconds = fastest(call, repeat)
                if name.endswith("per object"):
                    seconds /= len(sampled)
                found = call()
                timings[name] = (seconds * 1000, f"{found} rows of {len(sampled)} objects" if isinstance(found, int)
                                 else f"{len(found)} rows")
            return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ledger", type=Path, action="append",
                        help="a ledger.py to measure (repeatable; default: this checkout's)")
    args = parser.parse_args()
    paths = args.ledger or [ROOT / "gcis_etl" / "ledger.py"]
    columns = []
    for path in paths:
        print(f"filling and measuring {path} with {args.items} items ...", file=sys.stderr, flush=True)
        columns.append(measure(load_ledger(path), args.items, args.repeat))
    width = max(len(name) for name in columns[0])
    print(f"{args.items} items; CPU milliseconds (fastest of {args.repeat}), then what the last returned")
    for number, path in enumerate(paths, 1):
        print(f"  [{number}] {path}")
    print(f"{'':{width}}" + "".join(f"{f'[{number}]':>12}" for number in range(1, len(paths) + 1)))
    for name in columns[0]:
        print(f"{name:{width}}" + "".join(f"{column[name][0]:12.3f}" for column in columns)
              + f"   {columns[-1][name][1]}")


if __name__ == "__main__":
    main()
