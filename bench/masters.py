"""Benchmark masters: built once into bench/out/ from a real photograph of the corpus, in a child process
(libvips never runs in the benchmark's own process, as in production)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
PHOTO = ROOT / "tests/corpus/jpeg-gainmap-ultrahdr/ultra-hdr.jpg"      # 3840x2160 photograph
ADOBE = ROOT / "tests/corpus/icc-adobergb/example.tif"                  # carries an Adobe RGB (1998) profile
EXIF_DONOR = ROOT / "tests/corpus/metadata-rich/Canon.jpg"
WARM_UP = ROOT / "tests/corpus/jpeg-baseline/flowers.jpeg"         # every recipe converts it
SIZES = {"S": (8, 8), "M": (40, 8), "L": (120, 8), "XL": (300, 8), "M16": (40, 16)}  # megapixels, bits


def build_master(name: str) -> Path:
    """An uncompressed Adobe RGB TIFF of the requested size and depth, with EXIF, like the DAMs' masters."""
    mp, bits = SIZES[name]
    path = OUT / f"master-{name}.tif"
    if path.exists():
        return path
    OUT.mkdir(parents=True, exist_ok=True)
    code = f"""
import pyvips, math
photo = pyvips.Image.new_from_file({str(PHOTO)!r})
scale = math.sqrt({mp} * 1e6 / (photo.width * photo.height))
image = photo.resize(scale, kernel="lanczos3") if scale > 1 else photo
noise = pyvips.Image.gaussnoise(image.width, image.height, sigma=4)
image = (image + noise).cast("uchar")
if {bits} == 16:
    image = (image.cast("ushort") * 257).cast("ushort").copy(interpretation="rgb16")
icc = pyvips.Image.new_from_file({str(ADOBE)!r}).get("icc-profile-data")
image = image.copy()
image.set_type(pyvips.GValue.blob_type, "icc-profile-data", icc)
image.tiffsave({str(path)!r}, compression="none", bigtiff=False)
"""
    subprocess.run([sys.executable, "-c", code], check=True)
    subprocess.run(["exiftool", "-q", "-m", "-overwrite_original", "-TagsFromFile", str(EXIF_DONOR),
                    "-EXIF:all", "--MakerNotes:all", "--IFD1:all", str(path)], check=True)
    return path


def build_srgb(name: str) -> Path:
    """The master converted to an uncompressed 8-bit sRGB TIFF without profile or metadata: the input the
    JPEG 2000 encoders read on our path (jp2.py writes the same from the normalised image)."""
    path = OUT / f"srgb-{name}.tif"
    if path.exists():
        return path
    master = build_master(name)
    code = (f"import pyvips; im = pyvips.Image.new_from_file({str(master)!r}, access='sequential');"
            f"im.icc_transform('srgb', embedded=True, depth=8).tiffsave({str(path)!r}, compression='none',"
            f" strip=True)")
    subprocess.run([sys.executable, "-c", code], check=True)
    return path


def dimensions(path: Path) -> tuple[int, int]:
    import tifffile
    with tifffile.TiffFile(path) as tf:
        return tf.pages[0].imagewidth, tf.pages[0].imagelength


def megapixels(path: Path) -> float:
    width, height = dimensions(path)
    return width * height / 1e6


def batch(master: Path, images: int, work: Path, warm_ups: int = 4) -> tuple[Path, Path]:
    """Under `work`: `images` objects of one master each (hard links: no disk, and every item the same work),
    and `warm_ups` objects of a tiny master that start every process before the timed part."""
    masters, warm = work / "masters", work / "warm-up"
    shutil.rmtree(masters, ignore_errors=True)
    shutil.rmtree(warm, ignore_errors=True)
    for n in range(images):
        (masters / f"obj{n:03d}").mkdir(parents=True)
        os.link(master, masters / f"obj{n:03d}" / "master.tif")
    for n in range(warm_ups):
        (warm / f"warm{n}").mkdir(parents=True)
        shutil.copyfile(WARM_UP, warm / f"warm{n}" / WARM_UP.name)
    return masters, warm
