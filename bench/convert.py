"""Conversion benchmark: our two PTIFF engines beside the bare tools on the same masters, in one run.

    python bench/convert.py                 # S (8 Mpx), M (40 Mpx), L (120 Mpx), M16 (40 Mpx, 16-bit)
    python bench/convert.py --sizes S,M     # a subset
    python bench/convert.py --soak 500      # 500 conversions in one worker process: RSS drift
    python bench/convert.py --soak 500 --recipe ptiff-tifffile-q90

Masters are built from a real photograph of the corpus (upscaled, with noise), tagged Adobe RGB (1998)
and given EXIF, as uncompressed TIFFs like the DAMs' masters (bench/masters.py). Each master is converted
by the main path (ptiff-jpeg-q90: libvips + our streaming writer) and by the tifffile path
(ptiff-tifffile-q90: Pillow ImageCms + OpenCV + tifffile; targets: <= 600 MB peak RSS on L and within 2x
of the main path's wall time, i.e. speed vs main >= 0.50x). Not part of the test suite: timings on shared
2-core machines are noisy; read ratios, not absolute numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.masters import OUT, build_master, megapixels  # noqa: E402
from bench.measure import Run, converted, report, timed  # noqa: E402

MAIN = "gcis-etl convert ptiff-jpeg-q90 (main path)"
TIFFFILE = "gcis-etl convert ptiff-tifffile-q90 (tifffile path)"


def ours(master: Path, name: str, mp: float) -> list[Run]:
    return [converted(master, name, mp, "ptiff-jpeg-q90", MAIN, OUT / f"ours-{name}.tif"),
            converted(master, name, mp, "ptiff-tifffile-q90", TIFFFILE, OUT / f"ours-tifffile-{name}.tif")]


def bare_runs(master: Path, name: str, mp: float, with_magick: bool) -> list[Run]:
    runs = []
    vips_srgb = OUT / f"vips-srgb-{name}.tif"
    code = (f"import pyvips; im = pyvips.Image.new_from_file({str(master)!r}, access='sequential');"
            f"im.icc_transform('srgb', embedded=True, depth=8).tiffsave({str(vips_srgb)!r}, tile=True,"
            f" tile_width=256, tile_height=256, pyramid=True, compression='jpeg', Q=89)")
    runs.append(timed([sys.executable, "-c", code], name, "bare pyvips icc_transform sRGB + tiffsave Q89",
                      vips_srgb, mp))
    for q in (89, 90):
        out = OUT / f"vips-q{q}-{name}.tif"
        runs.append(timed(["vips", "tiffsave", str(master), str(out), "--tile", "--tile-width", "256",
                           "--tile-height", "256", "--pyramid", "--compression", "jpeg", "--Q", str(q)],
                          name, f"bare vips tiffsave Q{q} (no colour conversion)", out, mp))
    if with_magick:
        out = OUT / f"magick-{name}.tif"
        runs.append(timed(["convert", str(master), "-define", "tiff:tile-geometry=256x256", "-compress",
                           "jpeg", "-quality", "90", f"ptif:{out}"], name, "ImageMagick ptif: Q90", out, mp))
    return runs


def soak(count: int, recipe: str) -> None:
    """Many conversions in one worker process; RSS sampled after each, drift = last 10% vs first 10%."""
    from gcis_etl.conversion import convert
    from gcis_etl.isolation import IsolatedProcess
    from gcis_etl.policy import IsolationSettings
    masters = [ROOT / p for p in ("tests/corpus/jpeg-baseline/flowers.jpeg", "tests/corpus/icc-adobergb/example.tif",
                                  "tests/corpus/cmyk-tiff-icc/fogra-0-100-100-0.tif",
                                  "tests/corpus/rgb16-tiff/rgb-3c-16b.tiff", "tests/corpus/icc-prophoto/test_icc_prophoto.jpg")]
    settings = IsolationSettings(max_jobs_per_process=count + 1, max_rss_mb=100_000)
    samples = []
    started = time.monotonic()
    with IsolatedProcess(settings) as worker:
        pid = None
        for i in range(count):
            result = convert(masters[i % len(masters)], OUT / "soak.tif", recipe, worker=worker)
            assert result.ok, result.reason
            pid = pid or worker.pid
            assert worker.pid == pid, "the worker was replaced during the soak"
            samples.append(worker.rss_bytes() / 1e6)
    k = max(1, count // 10)
    first, last = statistics.median(samples[:k]), statistics.median(samples[-k:])
    print(f"soak ({recipe}): {count} conversions in one process in {time.monotonic() - started:.0f} s; RSS median first "
          f"{k}: {first:.0f} MB, last {k}: {last:.0f} MB, drift {100 * (last - first) / first:+.1f}%, "
          f"max {max(samples):.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="S,M,L,M16")
    parser.add_argument("--no-magick", action="store_true", help="skip ImageMagick (slow, 2 GB on L)")
    parser.add_argument("--soak", type=int, default=0, metavar="N")
    parser.add_argument("--recipe", default="ptiff-jpeg-q90", help="the soak's recipe")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("VIPS_CONCURRENCY", "1")
    if args.soak:
        soak(args.soak, args.recipe)
        return
    runs: list[Run] = []
    for name in args.sizes.split(","):
        master = build_master(name)
        mp = megapixels(master)
        runs.extend(ours(master, name, mp))
        runs.extend(bare_runs(master, name, mp, with_magick=not args.no_magick and name != "L"))
        _tables([r for r in runs if r.master == name])
    (OUT / "results.json").write_text(json.dumps([asdict(r) | {"mps": r.mps} for r in runs], indent=1))
    print("\nall runs:")
    _tables(runs)


def _tables(runs: list[Run]) -> None:
    report(runs, "bare pyvips", "bare sRGB+Q89")
    report([r for r in runs if r.path in (MAIN, TIFFFILE)], MAIN, "main path")


if __name__ == "__main__":
    main()
