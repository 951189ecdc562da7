"""JPEG 2000 benchmark: our JP2 path beside the bare encoder run with the same parameters on the same input.

    python bench/jp2.py                 # M (40 Mpx)
    python bench/jp2.py --sizes S,M,L

Both read one uncompressed 8-bit sRGB TIFF without profile or metadata, made from the bench master
(bench/masters.py): the normaliser passes it through untouched, so the difference is our path's own work
(the isolated process, inspection, the scratch copy the encoder reads, exiftool metadata, jpylyzer, the
sampled pixel verification - one reduced resolution decoded whole and five full-resolution regions - and
hashing). Compare CPU seconds too: wall time on a shared machine is noisy. The bare argument vector is the one our path
runs (gcis_etl.jp2.build_command). Target: ours/bare wall time <= 1.1x, i.e. speed vs bare >= 0.91x.

Our conversion may use --threads threads (isolation.vips_concurrency), 2 by default: the cores grk_compress
uses on its own, and what lets exiftool and verification run beside the encoder. With 1, the setting for
one conversion process per core, that work runs in sequence.
Not part of the test suite; timings on shared machines are noisy.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.masters import OUT, build_srgb, megapixels  # noqa: E402
from bench.measure import Run, converted, report, timed  # noqa: E402

RECIPES = ("jp2-openjpeg-lossy", "jp2-openjpeg-lossless", "jp2-grok-lossy", "jp2-grok-htj2k")


def compared(name: str, recipe: str, memory_limit_mb: int | None, threads: int) -> list[Run]:
    """The bare encoder, then our path, on the same sRGB TIFF."""
    from gcis_etl.jp2 import build_command
    from gcis_etl.recipes import load_recipe
    source = build_srgb(name)
    mp = megapixels(source)
    bare_out = OUT / f"bare-{recipe}-{name}.jp2"
    argv = list(build_command(load_recipe(recipe), source, bare_out).argv)
    return [timed(argv, name, f"bare {argv[0]} ({recipe})", bare_out, mp),
            converted(source, name, mp, recipe, f"gcis-etl convert {recipe}", OUT / f"ours-{recipe}-{name}.jp2",
                      memory_limit_mb, threads)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="M")
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--threads", type=int, default=2, help="isolation.vips_concurrency of our conversion")
    parser.add_argument("--memory-limit-mb", type=int, help="address-space limit of the conversion process "
                        "(default: gcis_etl's 8192; grk_compress reserves more than that on 40 Mpx)")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("VIPS_CONCURRENCY", "1")
    groups = []
    for name in args.sizes.split(","):
        for recipe in args.recipes.split(","):
            groups.append(compared(name, recipe, args.memory_limit_mb, args.threads))
            report(groups[-1], "bare", "bare encoder")
    (OUT / "results-jp2.json").write_text(json.dumps([asdict(r) | {"mps": r.mps} for g in groups for r in g],
                                                     indent=1))
    print("\nall runs:")
    for group in groups:
        report(group, "bare", "bare encoder")


if __name__ == "__main__":
    main()
