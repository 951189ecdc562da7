"""The JPEG 2000 encoders: kdu_compress (licensed, used when installed), opj_compress and grk_compress.

Every encoder reads an uncompressed 8-bit sRGB TIFF written from the normalised image into scratch, never
the master: stock kdu_compress reads only uncompressed TIFF, and a TIFF without an ICC profile makes all
three write an enumerated sRGB colour box (opj_compress would drop a profile anyway). Argument vectors are
lists; the kakadu one is the recipe's `kdu_args` verbatim. The master's kept metadata follows the
codestream, in the boxes exiftool writes (metadata_carrier).
"""
from __future__ import annotations

import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gcis_etl import isolation
from gcis_etl.durable import DISK_MARGIN
from gcis_etl.errors import ConversionFailed
from gcis_etl.metadata import RESOLUTION_TAGS, carrier_copy, exiftool_run, kept_tag_values, write_carrier
from gcis_etl.models import ImageInfo
from gcis_etl.recipes import Recipe, max_levels

KDU_ENV = "GCIS_KDU_COMPRESS"
TOOLS = {"kakadu": "kdu_compress", "openjpeg": "opj_compress", "grok": "grk_compress"}
INPUT_BITS_PER_PIXEL = 24  # the normalised image: 3 x 8 bits; opj/grk take ratios, kakadu bits per pixel
GROK_PLT_WITH_RATES = ("grk_compress 10.0.5 segfaults when PLT markers (-L) are combined with rates (-r): "
                       "PLT markers dropped")
GROK_SOP_WITH_TILE_PARTS = ("grk_compress 10.0.5 numbers the packets' SOP markers wrongly when tile-parts are split "
                            "(-u), and Grok's own decoder then reads the file as garbage: SOP markers dropped")
_SECONDS_BASE, _SECONDS_PER_MEGAPIXEL = 120.0, 4.0  # opj_compress runs at ~4 MP/s: a wide margin
ENCODED_SHARE = 20  # a lossy JP2 is about a tenth of its uncompressed input or more: a twentieth is a floor
# Bytes a codestream spends besides coded data (main header; per tile-part; per packet: SOP 6 + EPH 2 + a
# packet header). A layer whose byte budget is near this total cannot be met: grk_compress 10.0.5 gives up
# ("failed to compress image") and opj_compress spends it on markers (14.9 dB on 64x56). So every layer gets
# at least twice that budget: on small images the rates are raised (on 40 Mpx the recipes' are kept).
_MAIN_HEADER_BYTES, _TILE_PART_BYTES, _PACKET_BYTES = 300, 14, 9
# Measured on a detailed photograph with both lossy recipes: edge and corner tiles whose last-layer budget is at
# least 4x their markers' bytes stay within 1-4 dB of the interior (37.9-39.6 dB against 40.7-42.1); at 2-3x they
# fall to 34-36 dB, at 1.2x to 29-34.
EDGE_TILE_MARGIN = 4
# The encoders' high-water resident memory per pixel of their input, a floor of what was measured (VmHWM; OpenJPEG
# 2.5.0 and Grok 10.0.5 on 2 cores, the shipped recipes): opj_compress 15.3 and 15.2 bytes a pixel on 20 and 40 Mpx
# (lossy and lossless alike), 14.6-15.7 on 300 and 800 Mpx; grk_compress 36.9-39.6 on 20-40 Mpx, 34-36 on 200-300 Mpx.
# kdu_compress is not measured (not installed here): only its watcher holds it to the limit.
RESIDENT_BYTES_PER_PIXEL = {"openjpeg": 14, "grok": 33}
# iipsrv 1.1 (OpenJPEG) makes up levels below a JP2's smallest one until it fits in 256x256, and fails on them
IIPSRV_TILE = 256


@dataclass(frozen=True)
class Jp2Command:
    argv: tuple[str, ...]
    plt: bool  # whether the output will carry PLT markers
    levels: int  # wavelet levels the output will have
    tiles: tuple[int, int] | None  # the output's tile size; None: one tile
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Jp2Fit:
    """A recipe's opj/grk parameters fitted to one image (fit_to_image)."""

    levels: int
    tiles: tuple[int, int] | None
    ratios: tuple[float, ...]  # compression ratios, descending (opj/grk's terms for layer rates)
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Jp2Plan:
    """What encode_jp2 will run, known before the encoder starts (verification prepares beside it)."""

    command: Jp2Command  # writes `encoded`, in scratch: the encoders choose the format by extension
    reference: Path  # the uncompressed sRGB TIFF the encoder reads, kept in scratch for verification
    encoded: Path
    timeout: float
    pixels: int


def kdu_compress_path() -> str | None:
    """The kdu_compress binary: $GCIS_KDU_COMPRESS, else kdu_compress on PATH; None when not installed."""
    configured = os.environ.get(KDU_ENV)
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    return shutil.which(TOOLS["kakadu"])


def build_command(recipe: Recipe, source: Path, output: Path, binary: str | None = None,
                  size: tuple[int, int] | None = None) -> Jp2Command:
    """The encoder's argument vector for `source` (uncompressed sRGB TIFF) -> `output` (.jp2). With the image
    `size`, opj/grk parameters are fitted to it (see fit_to_image); kakadu's stay verbatim."""
    jp2 = recipe.jp2
    binary = binary or TOOLS[recipe.encoder]
    io = ["-i", str(source), "-o", str(output)]
    if recipe.encoder == "kakadu":
        return Jp2Command((binary, *io, *jp2.kdu_args), plt=jp2.plt, levels=jp2.levels, tiles=jp2.tiles)
    opj = recipe.encoder == "openjpeg"
    fit = fit_to_image(recipe, size)
    warnings = fit.notes
    args = ["-n", str(fit.levels + 1), "-b", _pair(jp2.code_block), "-p", jp2.progression]
    if jp2.precincts:
        args += ["-c", ",".join(f"[{_pair(p)}]" for p in jp2.precincts)]
    if fit.tiles:
        args += ["-t", _pair(fit.tiles)]
    if jp2.tile_parts:
        args += ["-TP" if opj else "-u", jp2.tile_parts]
    if jp2.sop and not opj and jp2.tile_parts:
        warnings = (*warnings, GROK_SOP_WITH_TILE_PARTS)
    elif jp2.sop:
        args.append("-SOP" if opj else "-S")
    if jp2.eph:
        args.append("-EPH" if opj else "-E")
    if not jp2.reversible:
        args.append("-I")
    if fit.ratios:
        args += ["-r", ",".join(f"{r:.4g}" for r in fit.ratios)]
    if jp2.ht:  # grok: the recipe refuses HT through openjpeg
        args += ["-M", "64"]
    plt = jp2.plt
    if jp2.plt:
        if not opj and jp2.rates:
            warnings, plt = (*warnings, GROK_PLT_WITH_RATES), False
        else:
            args.append("-PLT" if opj else "-L")
    return Jp2Command((binary, *io, *args), plt=plt, levels=fit.levels, tiles=fit.tiles, warnings=warnings)


def fit_to_image(recipe: Recipe, size: tuple[int, int] | None) -> Jp2Fit:
    """The recipe's levels, tiles and compression ratios for an image of `size` (None: the recipe's own).
    More levels than the recipe's where its smallest level would be over IIPSRV_TILE pixels (iipsrv 1.1 makes up
    the levels below it and fails on them: deploy/iipsrv/README.md), within what its tiles and precincts allow
    (recipes.max_levels), and no more than halve its shorter side to one pixel (OpenJPEG refuses more); a note
    when the smallest level is still too large. With layer rates, no
    edge or corner tile too small for its share of them (_edge_free_tiles), and no layer budget below twice the
    marker overhead: the rates are raised (ratios floored at 1: such a layer holds everything coded)."""
    jp2 = recipe.jp2
    ratios = tuple(INPUT_BITS_PER_PIXEL / r for r in sorted(jp2.rates))
    if size is None:
        return Jp2Fit(jp2.levels, jp2.tiles, ratios)
    width, height = size
    served = ((max(width, height) - 1) // IIPSRV_TILE).bit_length()  # the fewest halvings to IIPSRV_TILE or less
    ceiling = max_levels(jp2)
    wanted = served if ceiling is None else min(served, ceiling)
    levels = min(max(jp2.levels, wanted), max(1, min(width, height).bit_length() - 1))
    notes = []
    if levels != jp2.levels:
        notes.append(f"{width}x{height} image: {levels} wavelet levels instead of {jp2.levels}"
                     + (f", so that iipsrv's smallest level is at most {IIPSRV_TILE} pixels" if levels > jp2.levels
                        else ""))
    if levels < served:
        smallest = (-(-width >> levels), -(-height >> levels))  # a level's size rounds up
        notes.append(f"{width}x{height} image: its smallest level ({_pair(smallest, 'x')}, {levels} "
                     f"wavelet levels) is over {IIPSRV_TILE} pixels: iipsrv 1.1 lists sizes below it that it cannot "
                     f"render (it makes up levels for them, and sends an error text as a JPEG or crashes); a PTIFF "
                     f"recipe serves every size")
    resolutions = levels + 1
    tile_overhead = resolutions * ((_TILE_PART_BYTES if jp2.tile_parts else 0) + 3 * jp2.layers * _PACKET_BYTES)
    tiles = jp2.tiles
    if ratios and tiles:
        # a tile keeps at least EDGE_TILE_MARGIN times its markers' bytes in the last layer (3 bytes a pixel / ratio)
        tiles = _edge_free_tiles(tiles, size, EDGE_TILE_MARGIN * tile_overhead * ratios[-1] / 3)
        if tiles != jp2.tiles:
            notes.append(f"{width}x{height} image: {_pair(tiles, 'x')} tiles instead of {_pair(jp2.tiles, 'x')}, "
                         f"so that no edge or corner tile is too small for its share of the layer budgets (the "
                         f"encoder shares them out by tile area, and a small tile's would go on its markers)")
    if ratios:
        overhead = _MAIN_HEADER_BYTES + _tile_count(tiles, width, height) * tile_overhead
        scale = ratios[0] / max(1.0, width * height * 3 / (2 * overhead))
        if scale > 1:  # every layer's budget raised by one factor, keeping the recipe's spacing
            ratios = tuple(max(1.0, r / scale) for r in ratios)
            notes.append(f"{width}x{height} image: layer rates raised {scale:.3g}x (compression ratios "
                         f"{','.join(f'{r:.3g}' for r in ratios)}) so that every layer holds more than its markers")
    return Jp2Fit(levels, tiles, ratios, tuple(notes))


def _edge_free_tiles(tiles: tuple[int, int], size: tuple[int, int], min_area: float) -> tuple[int, int]:
    """opj_compress and grk_compress give each tile the layer budgets in proportion to its area, but its
    markers (SOP/EPH and a header per packet, tile-part headers) cost the same in every tile: a small edge or
    corner tile is left with little or nothing for coded data (a 10-row edge of a 594x522 photograph with 512
    tiles: a flat strip at 17.9 dB; grk_compress gives up). When the last tiles along an axis, or the corner
    tile, would have fewer than `min_area` pixels, that axis's tiles (for a corner, the thinner edge's) grow
    just enough to take its last tile in. Only then: a tile size out of step with the precincts makes the
    encoders' rate allocation slower (8433x4743 with 528x527 tiles: opj_compress +49%, grk_compress +20% CPU)."""
    tiles = list(tiles)

    def last(a: int) -> int:  # the extent of the last tile along axis a
        return size[a] - (-(-size[a] // tiles[a]) - 1) * tiles[a]

    def grow(a: int) -> None:
        tiles[a] = -(-size[a] // (size[a] // tiles[a]))

    for a in (0, 1):
        if size[a] > tiles[a] and last(a) * min(tiles[1 - a], size[1 - a]) < min_area:
            grow(a)
    thin = [a for a in (0, 1) if size[a] > tiles[a] and last(a) < tiles[a]]
    if thin and last(0) * last(1) < min_area:
        grow(min(thin, key=last))
    return tuple(tiles)


def _tile_count(tiles: tuple[int, int] | None, width: int, height: int) -> int:
    return -(-width // tiles[0]) * -(-height // tiles[1]) if tiles else 1


def _pair(size: tuple[int, int], separator: str = ",") -> str:
    return f"{size[0]}{separator}{size[1]}"


def plan_jp2(image, recipe: Recipe, scratch: Path) -> Jp2Plan:
    """Write `image` (normalised, 8-bit sRGB, no profile) as the encoder's input and build its command."""
    import pyvips
    binary = kdu_compress_path() if recipe.encoder == "kakadu" else shutil.which(TOOLS[recipe.encoder])
    if binary is None:
        configured = os.environ.get(KDU_ENV) if recipe.encoder == "kakadu" else None
        if configured:
            raise ConversionFailed(f"{KDU_ENV} is {configured}, which is not an executable file")
        where = f" (set {KDU_ENV} to its path)" if recipe.encoder == "kakadu" else ""
        raise ConversionFailed(f"{TOOLS[recipe.encoder]} not installed{where}")
    pixels = image.width * image.height
    if recipe.encoder in RESIDENT_BYTES_PER_PIXEL:  # before seconds of writing its input and minutes of encoding
        isolation.encoder_fits(TOOLS[recipe.encoder], pixels, RESIDENT_BYTES_PER_PIXEL[recipe.encoder])
    reference, encoded = scratch / "normalised-srgb.tif", scratch / "encoded.jp2"
    try:
        image.tiffsave(str(reference), compression="none", strip=True,
                       bigtiff=pixels * 3 > 2 ** 32 - 2 ** 26)
    except pyvips.Error as exc:  # corrupt data, or an allocation refused under the memory limit
        raise isolation.pixel_error(exc) from None
    return Jp2Plan(build_command(recipe, reference, encoded, binary, size=(image.width, image.height)),
                   reference, encoded, _SECONDS_BASE + _SECONDS_PER_MEGAPIXEL * pixels / 1e6, pixels)


def encode_jp2(plan: Jp2Plan, out_path: Path, metadata: Callable[[], Jp2Metadata]) -> int:
    """Run the plan's encoder and append the master's kept metadata (metadata_carrier's boxes): the JP2 at
    `out_path` (not fsync'ed: the caller does that beside verification). `metadata` is asked for only then,
    so it can be made meanwhile. Returns its size."""
    isolation.stage(f"encoding with {Path(plan.command.argv[0]).name}")
    run_encoder(plan.command.argv, timeout=plan.timeout, pixels=plan.pixels)
    with open(plan.encoded, "ab") as f:
        f.write(metadata().boxes)
    shutil.move(plan.encoded, out_path)
    return out_path.stat().st_size


def run_encoder(argv: tuple[str, ...], timeout: float, pixels: int | None = None) -> None:
    """Run the encoder on an image of `pixels`; its crash, time-out, memory over isolation.encoder_memory_limit_mb
    or error is this master's ConversionFailed with the reason. It dies with the thread that waits for it
    (isolation.dying_with_thread): the conversion child dies with its parent, and a Celery pool process
    hard-killed at its time limit would otherwise leave the encoder burning the cores for minutes."""
    tool = Path(argv[0]).name
    proc = isolation.run_encoder_process(argv, timeout, pixels)
    if proc.returncode < 0:
        raise ConversionFailed(f"{tool} crashed: {signal.Signals(-proc.returncode).name}")
    # opj_compress reports some argument errors on stdout with exit status 0 and writes nothing
    output = Path(argv[argv.index("-o") + 1])
    if proc.returncode or not output.is_file() or output.stat().st_size == 0:
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        failed = ConversionFailed(f"{tool} failed (exit {proc.returncode}): "
                                  f"{lines[-1].strip() if lines else 'no output'}")
        # The encoders remove an output they could not finish, and say nothing of the disk. Its room is judged by
        # what even a lossy output would take (ENCODED_SHARE of the input): an encoder that fails for its own
        # reasons (memory) on a big master must not pass for a full disk, which stops every run.
        needs = max(DISK_MARGIN, Path(argv[argv.index("-i") + 1]).stat().st_size // ENCODED_SHARE)
        raise isolation.disk_refusal(failed, output.parent, needs=needs) or failed


@dataclass(frozen=True)
class Jp2Metadata:
    boxes: bytes  # the boxes exiftool appends to a JP2 after its codestream to hold the kept tags
    values: dict  # kept tag -> value, as exiftool reads them from the carrier: what verification expects


def metadata_carrier(master: ImageInfo, keep: tuple[str, ...], exclude: tuple[str, ...],
                     scratch: Path) -> Jp2Metadata:
    """The kept tags, normalised by exiftool into a TIFF carrier as on the PTIFF path (rationals rounded,
    ColorSpace = sRGB, exclusions applied, the master's resolution whatever is kept), so the JP2 and the PTIFF
    carry the same values; then written by exiftool into a 1-pixel JP2 (the XMP as a block: copied tag by tag
    again, it would lose unknown namespaces). exiftool appends metadata boxes after a JP2's codestream and leaves
    what precedes it alone, so these boxes are what it would add to the real JP2, without rewriting that (a tag
    that did not travel this way would fail verification, which reads every kept tag back)."""
    carrier = write_carrier(master, keep, exclude, scratch / "metadata-carrier.tif")
    jp2 = scratch / "metadata-carrier.jp2"
    run_encoder((TOOLS["openjpeg"], "-i", str(carrier), "-o", str(jp2), "-n", "1"), timeout=_SECONDS_BASE)
    bare = jp2.stat().st_size
    # The resolution is copied whatever is kept, as into a PTIFF's IFD0. exiftool gives the EXIF it creates in a
    # JP2 a made-up 72 dpi; deleted before -TagsFromFile (as in '-all= -TagsFromFile @'), the carrier's
    # resolution replaces it, or none stays.
    exiftool_run("-m", "-q", "-n", "-overwrite_original", *(f"-{tag}=" for tag in RESOLUTION_TAGS),
                 *carrier_copy(carrier, keep, exclude), "-TagsFromFile", str(carrier),
                 *(f"-{tag}" for tag in RESOLUTION_TAGS), str(jp2))
    return Jp2Metadata(jp2.read_bytes()[bare:], kept_tag_values(carrier, keep, exclude))
