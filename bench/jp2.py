"""JPEG 2000 benchmark: our JP2 path beside the bare encoder run with the same parameters on the same input.

    python bench/jp2.py                 # M (40 Mpx), 3 rounds
    python bench/jp2.py --sizes S,M,L --repeat 5

Both read one uncompressed 8-bit sRGB TIFF without profile or metadata, made from the bench master
(bench/masters.py): the normaliser passes it through untouched, so the difference is our path's own work
(the isolated process, inspection, the scratch copy the encoder reads, exiftool metadata, jpylyzer, the
sampled pixel verification - one reduced resolution decoded whole and five full-resolution regions - and
hashing). Compare CPU seconds too: wall time on a shared machine is noisy. Ours is also timed by the stages
the conversion reports: its encoding stage beside the bare encoder's time says what the work run beside the
encoder costs it. The bare argument vector is the one our path runs (gcis_etl.jp2.build_command).
Target: ours/bare wall time <= 1.1x, i.e. speed vs bare >= 0.91x.

Each pair is timed in --repeat rounds, the bare encoder then ours, with one warmed-up conversion process
for all of ours: a 2-core machine varies by several percent from run to run, as much as the margin
measured. The table gives the fastest run of each (the least disturbed); the line above it the ratio of
those and the median of the rounds' own ratios.

Our conversion may use --threads threads (isolation.vips_concurrency), 2 by default: the cores grk_compress
uses on its own, and what lets exiftool and verification run beside the encoder. With 1, the setting for
one conversion process per core, that work runs in sequence.
Not part of the test suite; timings on shared machines are noisy.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.masters import OUT, build_srgb, dimensions, megapixels  # noqa: E402
from bench.measure import Run, conversion_process, report, timed  # noqa: E402

RECIPES = ("jp2-openjpeg-lossy", "jp2-openjpeg-lossless", "jp2-grok-lossy", "jp2-grok-htj2k")


@dataclass
class Comparison:
    recipe: str
    rounds: list[tuple[Run, Run]]  # (bare, ours), in the order run

    @property
    def fastest(self) -> list[Run]:
        return [min((pair[i] for pair in self.rounds), key=lambda run: run.seconds) for i in (0, 1)]

    def summary(self) -> str:
        bare, ours = self.fastest
        ratios = [o.seconds / b.seconds for b, o in self.rounds]
        stages = {stage: statistics.median(dict(run.stages).get(stage, 0.0) for _, run in self.rounds)
                  for stage, _ in self.rounds[0][1].stages}
        return (f"{self.recipe} {bare.master}: ours/bare wall, fastest runs {ours.seconds / bare.seconds:.3f}x, "
                f"median of rounds {statistics.median(ratios):.3f}x (rounds: {', '.join(f'{r:.3f}' for r in ratios)})\n"
                f"  medians: bare {statistics.median(b.seconds for b, _ in self.rounds):.2f} s; ours by stage: "
                + ", ".join(f"{stage} {seconds:.2f} s" for stage, seconds in stages.items()))


def compared(name: str, recipe: str, memory_limit_mb: int | None, threads: int, repeat: int) -> Comparison:
    """The bare encoder, then our path, on the same sRGB TIFF, `repeat` times. The bare encoder gets the
    parameters our path fits to the image (levels, tiles, rates: see gcis_etl.jp2.fit_to_image)."""
    from gcis_etl.jp2 import build_command
    from gcis_etl.recipes import load_recipe
    source = build_srgb(name)
    mp = megapixels(source)
    bare_out, ours_out = OUT / f"bare-{recipe}-{name}.jp2", OUT / f"ours-{recipe}-{name}.jp2"
    argv = list(build_command(load_recipe(recipe), source, bare_out, size=dimensions(source)).argv)
    rounds = []
    with conversion_process(recipe, ours_out, memory_limit_mb, threads) as ours:
        for _ in range(repeat):
            rounds.append((timed(argv, name, f"bare {argv[0]} ({recipe})", bare_out, mp),
                           ours(source, name, mp, f"gcis-etl convert {recipe}")))
    return Comparison(recipe, rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="M")
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--threads", type=int, default=2, help="isolation.vips_concurrency of our conversion")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of each pair (bare encoder, ours)")
    parser.add_argument("--memory-limit-mb", type=int, help="address-space limit of the conversion process "
                        "(default: gcis_etl's 8192; grk_compress reserves more than that on 40 Mpx)")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("VIPS_CONCURRENCY", "1")
    comparisons = []
    for name in args.sizes.split(","):
        for recipe in args.recipes.split(","):
            comparisons.append(compared(name, recipe, args.memory_limit_mb, args.threads, args.repeat))
            report(comparisons[-1].fastest, "bare", "bare encoder")
            print(comparisons[-1].summary())
    (OUT / "results-jp2.json").write_text(json.dumps(
        [[asdict(run) | {"mps": run.mps} for run in pair] for c in comparisons for pair in c.rounds], indent=1))
    print(f"\nall pairs, fastest of {args.repeat} rounds each:")
    for comparison in comparisons:
        report(comparison.fastest, "bare", "bare encoder")
        print(comparison.summary())


if __name__ == "__main__":
    main()
