"""Benchmark measurements: a bare tool under GNU time, our conversions in a fresh (warmed-up) conversion
process, and the table both are reported in."""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Callable, Iterator

from bench.masters import WARM_UP


def module_at(path: Path, name: str) -> ModuleType:
    """The module in the file at `path` (a copy from before a change, for a before/after) under its own name."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


TIME = shutil.which("time") or "/usr/bin/time"


@dataclass
class Run:
    master: str
    path: str
    seconds: float
    cpu_seconds: float
    peak_rss_mb: float    # the largest single process (ours: the conversion process or an encoder it ran)
    output_bytes: int
    megapixels: float
    # ours: (stage, seconds) in the order the conversion reported them (the first from the call's start, the
    # last to its end): where the time beside the bare tool's goes
    stages: list[tuple[str, float]] = field(default_factory=list)

    @property
    def mps(self) -> float:
        return self.megapixels / self.seconds


def timed(cmd: list[str], master: str, label: str, out: Path, mp: float) -> Run:
    """Run a bare tool under GNU time: wall, user+sys, max RSS."""
    out.unlink(missing_ok=True)
    proc = subprocess.run([TIME, "-f", "%e %U %S %M", *cmd], capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{label} failed: {proc.stderr[-500:]}")
    wall, user, system, rss_kb = proc.stderr.strip().splitlines()[-1].split()
    return Run(master, label, float(wall), float(user) + float(system), int(rss_kb) / 1024,
               out.stat().st_size, mp)


def converted(master: Path, name: str, mp: float, recipe: str, label: str, out: Path,
              memory_limit_mb: int | None = None, vips_concurrency: int = 1) -> Run:
    """One conversion in a fresh conversion process (see conversion_process)."""
    with conversion_process(recipe, out, memory_limit_mb, vips_concurrency) as convert_one:
        return convert_one(master, name, mp, label)


@contextmanager
def conversion_process(recipe: str, out: Path, memory_limit_mb: int | None = None,
                       vips_concurrency: int = 1) -> Iterator[Callable[[Path, str, float, str], Run]]:
    """A fresh conversion process, warmed up first on a small master with the same recipe (imports,
    exiftool), that converts masters to `out` one call at a time: wall time of the call; CPU of the process
    and everything it ran (encoders, exiftool) during the call; peak RSS of the largest of them over the
    process's life (the conversion process's or an encoder's: ru_maxrss would carry the parent's across the
    exec); the seconds of each stage it reported (Run.stages). `memory_limit_mb` replaces the conversion process's
    address-space limit; `vips_concurrency` is the threads it may use (isolation.vips_concurrency)."""
    import psutil

    from gcis_etl.conversion import convert
    from gcis_etl.isolation import IsolatedProcess
    from gcis_etl.policy import IsolationSettings
    settings = IsolationSettings(vips_concurrency=vips_concurrency,
                                 **({"memory_limit_mb": memory_limit_mb} if memory_limit_mb else {}))
    with IsolatedProcess(settings) as worker:
        warm = convert(WARM_UP, out.with_name(f"warm-{out.name}"), recipe, worker=worker)
        assert warm.ok, warm.reason
        child = psutil.Process(worker.pid)

        def convert_one(master: Path, name: str, mp: float, label: str) -> Run:
            before = _cpu(child)
            started = time.monotonic()
            marks = [("starting", started)]
            result = convert(master, out, recipe, worker=worker,
                             on_stage=lambda stage: marks.append((stage, time.monotonic())))
            ended = time.monotonic()
            cpu = _cpu(child) - before
            if not result.ok:
                raise RuntimeError(f"{label} failed: {result.reason}")
            stages = [(stage, end - start) for (stage, start), (_, end) in zip(marks, marks[1:] + [("", ended)])]
            return Run(name, label, ended - started, cpu, result.peak_rss_mb, result.bytes, mp,  # encoders' included
                       stages)

        yield convert_one


def _cpu(process) -> float:
    """User + system seconds of a process, its finished children and its live descendants."""
    import psutil
    times = process.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for descendant in process.children(recursive=True):
        try:
            live = descendant.cpu_times()
        except psutil.Error:
            continue
        total += live.user + live.system
    return total


def report(runs: list[Run], base: str, against: str) -> None:
    """One row per run; speed and size relative to the run of the same master whose path starts with `base`."""
    baseline = {r.master: r for r in runs if r.path.startswith(base)}
    print(f"\n{'master':6} {'path':58} {'MP/s':>7} {'wall s':>7} {'CPU s':>7} {'RSS MB':>7} {'MB out':>7}"
          f" {'speed vs ' + against:>22} {'size vs':>8}")
    for r in runs:
        b = baseline.get(r.master)
        speed = f"{r.mps / b.mps:.2f}x" if b else ""
        size = f"{r.output_bytes / b.output_bytes:.2f}x" if b else ""
        print(f"{r.master:6} {r.path:58} {r.mps:7.1f} {r.seconds:7.2f} {r.cpu_seconds:7.2f} {r.peak_rss_mb:7.0f}"
              f" {r.output_bytes / 1e6:7.1f} {speed:>22} {size:>8}")
