"""Conversion benchmark: our `convert` beside the bare tools on the same masters, in one run.

    python bench/convert.py                 # S (8 Mpx), M (40 Mpx), L (120 Mpx), M16 (40 Mpx, 16-bit)
    python bench/convert.py --sizes S,M     # a subset
    python bench/convert.py --soak 500      # 500 conversions in one worker process: RSS drift

Masters are built from a real photograph of the corpus (upscaled, with noise), tagged Adobe RGB (1998)
and given EXIF, as uncompressed TIFFs like the DAMs' masters. Not part of the test suite: timings on
shared 2-core machines are noisy; read ratios, not absolute numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
OUT = ROOT / "bench" / "out"
PHOTO = ROOT / "tests/corpus/jpeg-gainmap-ultrahdr/ultra-hdr.jpg"      # 3840x2160 photograph
ADOBE = ROOT / "tests/corpus/icc-adobergb/example.tif"                  # carries an Adobe RGB (1998) profile
EXIF_DONOR = ROOT / "tests/corpus/metadata-rich/Canon.jpg"
SIZES = {"S": (8, 8), "M": (40, 8), "L": (120, 8), "M16": (40, 16)}    # megapixels, bits
TIME = shutil.which("time") or "/usr/bin/time"


@dataclass
class Run:
    master: str
    path: str
    seconds: float
    cpu_seconds: float
    peak_rss_mb: float
    output_bytes: int
    megapixels: float

    @property
    def mps(self) -> float:
        return self.megapixels / self.seconds


def build_master(name: str) -> Path:
    """An uncompressed Adobe RGB TIFF of the requested size and depth (built in a child: no libvips here)."""
    mp, bits = SIZES[name]
    path = OUT / f"master-{name}.tif"
    if path.exists():
        return path
    code = f"""
import pyvips, math
photo = pyvips.Image.new_from_file({str(PHOTO)!r})
scale = math.sqrt({mp} * 1e6 / (photo.width * photo.height))
image = photo.resize(scale, kernel="lanczos3") if scale > 1 else photo
noise = pyvips.Image.gaussnoise(image.width, image.height, sigma=4)
image = (image + noise).cast("uchar")
if {bits} == 16:
    image = (image.cast("ushort") * 257).copy(interpretation="rgb16")
icc = pyvips.Image.new_from_file({str(ADOBE)!r}).get("icc-profile-data")
image = image.copy()
image.set_type(pyvips.GValue.blob_type, "icc-profile-data", icc)
image.tiffsave({str(path)!r}, compression="none", bigtiff=False)
"""
    subprocess.run([sys.executable, "-c", code], check=True)
    subprocess.run(["exiftool", "-q", "-m", "-overwrite_original", "-TagsFromFile", str(EXIF_DONOR),
                    "-EXIF:all", "--MakerNotes:all", "--IFD1:all", str(path)], check=True)
    return path


def timed(cmd: list[str], master: str, label: str, out: Path, mp: float) -> Run:
    """Run a bare tool under GNU time: wall, user+sys, max RSS."""
    out.unlink(missing_ok=True)
    proc = subprocess.run([TIME, "-f", "%e %U %S %M", *cmd], capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{label} failed: {proc.stderr[-500:]}")
    wall, user, system, rss_kb = proc.stderr.strip().splitlines()[-1].split()
    return Run(master, label, float(wall), float(user) + float(system), int(rss_kb) / 1024,
               out.stat().st_size, mp)


def ours(master: Path, name: str, mp: float) -> Run:
    from gcis_etl.conversion import convert
    from gcis_etl.isolation import IsolatedProcess
    out = OUT / f"ours-{name}.tif"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with IsolatedProcess() as worker:
        warm = convert(ROOT / "tests/corpus/png/png-rgb-64x56x8.png", OUT / "warm.tif", worker=worker)
        assert warm.ok, warm.reason
        started = time.monotonic()
        result = convert(master, out, worker=worker)
        seconds = time.monotonic() - started
        peak = result.peak_rss_mb
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if not result.ok:
        raise RuntimeError(f"our conversion failed: {result.reason}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Run(name, "gcis-etl convert (Q90 4:2:0, sRGB, metadata, verify)", seconds, cpu, peak,
               result.bytes, mp)


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


def report(runs: list[Run]) -> None:
    base = {r.master: r for r in runs if r.path.startswith("bare pyvips")}
    print(f"\n{'master':6} {'path':56} {'MP/s':>7} {'wall s':>7} {'CPU s':>7} {'RSS MB':>7} {'MB out':>7}"
          f" {'speed vs bare sRGB+Q89':>10} {'size vs':>8}")
    for r in runs:
        b = base.get(r.master)
        ratio = f"{r.mps / b.mps:.2f}x" if b else ""
        size = f"{r.output_bytes / b.output_bytes:.2f}x" if b else ""
        print(f"{r.master:6} {r.path:56} {r.mps:7.1f} {r.seconds:7.2f} {r.cpu_seconds:7.2f} {r.peak_rss_mb:7.0f}"
              f" {r.output_bytes / 1e6:7.1f} {ratio:>10} {size:>8}")


def soak(count: int) -> None:
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
            result = convert(masters[i % len(masters)], OUT / "soak.tif", worker=worker)
            assert result.ok, result.reason
            pid = pid or worker.pid
            assert worker.pid == pid, "the worker was replaced during the soak"
            samples.append(worker.rss_bytes() / 1e6)
    k = max(1, count // 10)
    first, last = statistics.median(samples[:k]), statistics.median(samples[-k:])
    print(f"soak: {count} conversions in one process in {time.monotonic() - started:.0f} s; RSS median first "
          f"{k}: {first:.0f} MB, last {k}: {last:.0f} MB, drift {100 * (last - first) / first:+.1f}%, "
          f"max {max(samples):.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="S,M,L,M16")
    parser.add_argument("--no-magick", action="store_true", help="skip ImageMagick (slow, 2 GB on L)")
    parser.add_argument("--soak", type=int, default=0, metavar="N")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("VIPS_CONCURRENCY", "1")
    if args.soak:
        soak(args.soak)
        return
    runs: list[Run] = []
    for name in args.sizes.split(","):
        master = build_master(name)
        mp = SIZES[name][0]
        import tifffile
        with tifffile.TiffFile(master) as tf:
            mp = tf.pages[0].imagewidth * tf.pages[0].imagelength / 1e6
        runs.append(ours(master, name, mp))
        runs.extend(bare_runs(master, name, mp, with_magick=not args.no_magick and name != "L"))
        report([r for r in runs if r.master == name])
    (OUT / "results.json").write_text(json.dumps([asdict(r) | {"mps": r.mps} for r in runs], indent=1))
    print("\nall runs:")
    report(runs)


if __name__ == "__main__":
    main()
