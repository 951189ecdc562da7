"""convert(): one master in, one verified access master out (or a rejection / failure with a reason).

Inspection runs here (header only, no libvips); decoding, colour, encoding, metadata and verification
run in the isolated child. The output is written under a temporary name beside the destination and
renamed into place only after verification: nothing half-written ever sits at the destination path.
"""
from __future__ import annotations

import os
import resource
import time
import uuid
from concurrent import futures
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from gcis_etl import isolation
from gcis_etl.durable import DISK_MARGIN, fsync_path, sha256_file
from gcis_etl.errors import ConversionFailed, DiskFull, RejectedMaster, VerificationFailed
from gcis_etl.formats import names_a_sequence, names_of, sniff
from gcis_etl.inspection import inspect
from gcis_etl.isolation import CannotStart, IsolatedProcess, WorkerCrashed
from gcis_etl.models import ConversionResult, ImageInfo, Status, Verdict, VerifyReport
from gcis_etl.policy import ImagingPolicy, IsolationSettings
from gcis_etl.recipes import JP2_ENCODERS, PTIFF_ENCODERS, Recipe, load_recipe

if TYPE_CHECKING:
    from gcis_etl.jp2 import Jp2Metadata
    from gcis_etl.metadata import Carried



@dataclass(frozen=True)
class DecodeJob:
    info: ImageInfo
    policy: ImagingPolicy
    decoders: tuple[str, ...]


@dataclass(frozen=True)
class EncodeJob(DecodeJob):
    output: str = ""
    recipe: Recipe | None = None


@dataclass(frozen=True)
class EncodeOutcome:
    decoder: str
    width: int
    height: int
    levels: int
    bytes: int
    sha256: str
    notes: tuple[str, ...]
    peak_rss_mb: float  # of the conversion process or an encoder it ran, over its life so far (it is reused)


def convert(src: str | Path, dst: str | Path, recipe: Recipe | str | None = None,
            policy: ImagingPolicy | None = None, worker: IsolatedProcess | None = None,
            isolation_settings: IsolationSettings | None = None, durable: bool = True,
            on_stage: Callable[[str], None] | None = None) -> ConversionResult:
    """Convert `src` into the access master `dst`. Never raises for a bad master (nor a missing one): the
    result says why. Both paths are made absolute first, as the result names them: a reused `worker` keeps
    the cwd it started in. `durable`: fsync `dst` and its folder; not for scratch output that a store deposits
    (the store makes durable what it holds, the bytes linked or copied and their names) and that is deleted
    right after. `on_stage`: hears each stage as it begins ("inspecting", "encoding with grk_compress", ...), so
    that a caller can tell a conversion of minutes at work from a hung one; one that raises is logged, never the
    conversion's failure (isolation.heard)."""
    started = time.monotonic()
    recipe = recipe if isinstance(recipe, Recipe) else load_recipe(recipe or "ptiff-jpeg-q90")
    policy = policy or ImagingPolicy()
    src, unwritable = Path(src).absolute(), _destination_problem(dst)
    dst = Path(dst).absolute()
    base = dict(source=str(src), recipe=recipe.name, recipe_digest=recipe.digest)
    isolation.heard(on_stage, "inspecting")
    try:
        info = inspect(src, policy, worker.settings if worker else isolation_settings)
    except OSError as exc:  # no master to read: a missing file, a folder
        return ConversionResult(Status.FAILED, reason=f"cannot read {src}: {exc.strerror or exc}",
                                seconds=time.monotonic() - started, **base)
    except ConversionFailed as exc:  # exiftool died reading its metadata, or went past the isolation limits
        return ConversionResult(Status.FAILED, reason=str(exc), seconds=time.monotonic() - started, **base)
    base.update(info=info, warnings=info.warnings)
    if info.verdict is Verdict.REJECT:
        return ConversionResult(Status.REJECTED, reason="; ".join(info.reasons),
                                seconds=time.monotonic() - started, **base)
    unservable = unwritable or output_name_problem(dst)
    if unservable:
        return ConversionResult(Status.FAILED, reason=unservable, seconds=time.monotonic() - started, **base)
    if dst.exists() and os.path.samefile(src, dst):
        return ConversionResult(Status.FAILED, reason=f"{dst} is the master itself: the output would replace it",
                                seconds=time.monotonic() - started, **base)
    own_worker = worker is None
    worker = worker or IsolatedProcess(isolation_settings)
    tmp = dst.parent / f".{dst.name}.{uuid.uuid4().hex[:8]}.partial"
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        job = EncodeJob(info, policy, _decoders(info, policy), output=str(tmp), recipe=recipe)
        isolation.heard(on_stage, "starting the conversion")
        outcome, notes = _run_with_fallbacks(worker, encode_in_child, job, on_stage)
        if durable:
            fsync_path(tmp)
        os.replace(tmp, dst)
        if durable:
            fsync_path(dst.parent)
    except RejectedMaster as exc:
        return ConversionResult(Status.REJECTED, reason=str(exc), seconds=time.monotonic() - started, **base)
    except ConversionFailed as exc:
        return ConversionResult(Status.FAILED, reason=str(exc), disk_full=isinstance(exc, DiskFull),
                                cannot_start=isinstance(exc, CannotStart), seconds=time.monotonic() - started, **base)
    except OSError as exc:  # where the output goes: not writable, a file where a folder should be, disk full
        full = isolation.disk_refusal(exc, dst.parent)
        return ConversionResult(Status.FAILED, reason=str(full or f"cannot write {dst}: {exc.strerror or exc}"),
                                disk_full=full is not None, seconds=time.monotonic() - started, **base)
    finally:
        if tmp.exists():  # not unlink(missing_ok=True): under a plain file it raises NotADirectoryError
            tmp.unlink()
        if own_worker:
            worker.close()
    base["warnings"] = tuple(dict.fromkeys(info.warnings + notes + outcome.notes + _misnamed(dst, recipe)))
    return ConversionResult(Status.CONVERTED, output=str(dst), width=outcome.width, height=outcome.height,
                            levels=outcome.levels, bytes=outcome.bytes, sha256=outcome.sha256,
                            decoder=outcome.decoder, peak_rss_mb=outcome.peak_rss_mb,
                            seconds=time.monotonic() - started, **base)


def _destination_problem(dst: str | Path) -> str | None:
    """Why nothing can be written at `dst`, known before any work: found only when the output is moved into
    place, it was named for the wrong thing ('cannot write afile/o.tif: File exists'; '.: Device or resource
    busy' for an empty name)."""
    if not os.fspath(dst):
        return "no output path given (an empty name)"
    path = Path(dst).absolute()
    if path.is_dir():
        return f"cannot write {path}: it is a folder (name the output file)"
    folder = next(parent for parent in path.parents if parent.exists())
    if not folder.is_dir():
        return f"cannot write {path}: {folder} is a file, not a folder"
    return None


def output_name_problem(dst: str | Path) -> str | None:
    """Why iipsrv could not serve an access master under this name, known before any work: iipsrv 1.1 reads
    '_pyr_' in a file name as a 3-D sequence marker."""
    name = Path(dst).name
    return f"{name}: iipsrv 1.1 reads '_pyr_' in a file name as a 3-D sequence marker" \
        if names_a_sequence(name) else None


def _misnamed(dst: Path, recipe: Recipe) -> tuple[str, ...]:
    """iipsrv goes by content, but people and tools go by the name: a warning when it says another format."""
    fmt = "JP2" if recipe.encoder in JP2_ENCODERS else "TIFF"
    usual = names_of(fmt) | {recipe.extension}
    if dst.suffix.lower() in usual:
        return ()
    return (f"{dst.name}: recipe {recipe.name} writes {fmt}, which is usually named {' or '.join(sorted(usual))}",)


def check_decoding(src: str | Path, policy: ImagingPolicy | None = None,
                   worker: IsolatedProcess | None = None) -> ImageInfo:
    """inspect() plus a full strict decode in the isolated child: the verdict a conversion would reach. Raises
    OSError when there is no file to read, and ConversionFailed when its metadata cannot be read (under the
    worker's isolation limits), as inspect() does."""
    policy = policy or ImagingPolicy()
    info = inspect(src, policy, worker.settings if worker else None)
    if info.verdict is Verdict.REJECT:
        return info
    own_worker = worker is None
    worker = worker or IsolatedProcess()
    try:
        decoder, notes = _run_with_fallbacks(worker, decode_in_child, DecodeJob(info, policy, _decoders(info, policy)))
        return replace(info, warnings=tuple(dict.fromkeys(info.warnings + notes)))
    except RejectedMaster as exc:
        return replace(info, verdict=Verdict.REJECT, reasons=(str(exc),))
    except WorkerCrashed as exc:
        return replace(info, verdict=Verdict.REJECT, reasons=(f"cannot be decoded: {exc}",))
    except ConversionFailed as exc:  # out of memory or time under the limits: no verdict on the master's data
        return replace(info, verdict=Verdict.NOT_CHECKED, reasons=(str(exc),))
    finally:
        if own_worker:
            worker.close()


def _decoders(info: ImageInfo, policy: ImagingPolicy) -> tuple[str, ...]:
    return policy.decoders.get(info.format, ("vips",))


def _run_with_fallbacks(worker: IsolatedProcess, target, job: DecodeJob,
                        on_stage: Callable[[str], None] | None = None):
    """Run the job; when a decoder crashes the child, retry in a fresh child with the next decoder. `on_stage`
    hears the child's stages (IsolatedProcess.call).

    Returns (the job's result, notes on the fallbacks taken and what the child's libraries said of the master)."""
    notes: list[str] = []
    while True:
        try:
            return worker.call(target, job, notes=notes, on_stage=on_stage), tuple(notes)
        except WorkerCrashed as exc:
            crashed = isolation.crashed_decoder(exc.stage)
            remaining = tuple(d for d in job.decoders if d != crashed)
            if crashed is None or not remaining or remaining == job.decoders:
                raise
            # no signal: the child's exit as isolation words it (its status unknown where SIGCHLD is ignored)
            how = f" crashed ({exc.signal_name})" if exc.signal_name else f": {exc}"
            notes.append(f"decoder {crashed}{how}; retried with {remaining[0]}")
            job = replace(job, decoders=remaining)


def decode_in_child(job: DecodeJob) -> str:
    """The child's half of check_decoding: every pixel through the normaliser; returns the decoder used."""
    from gcis_etl.colour import normalise
    from gcis_etl.decoding import open_master
    decoded = open_master(job.info, job.decoders, job.policy.strict, job.policy.vips_decodes_jpeg2000_origin)
    isolation.reading_pixels(decoded.decoder)
    try:
        normalise(decoded.image, job.info, job.policy).avg()
    except Exception as exc:  # pyvips.Error: libvips reports corrupt data (and a refused allocation) this way
        raise isolation.pixel_error(exc) from None
    return decoded.decoder


def verify_in_child(path: str, expect=None) -> VerifyReport:
    """A pyramidal TIFF against `expect` (an Expectation), or a JP2 on its own (`expect`: a recipe's
    Jp2Parameters or None); `expect` a Recipe checks what it sets for the file's kind (a PTIFF recipe's tile
    and chroma, a JP2 recipe's Jp2Parameters)."""
    from gcis_etl.verification import Expectation, unreadable, verify, verify_jp2_alone
    cannot = unreadable(Path(path))
    if cannot:
        return cannot
    jp2 = sniff(path) == "JP2"
    if isinstance(expect, Recipe):
        mismatch = recipe_mismatch(path, expect)
        if mismatch:
            return VerifyReport(path, errors=(mismatch,))
        expect = expect.jp2 if jp2 else Expectation(tile=expect.tile, chroma=expect.chroma)
    return verify_jp2_alone(path, expect) if jp2 else verify(path, expect)


def recipe_mismatch(path: str | Path, recipe: Recipe) -> str | None:
    """Why a file cannot be checked against a recipe: the recipe makes the other kind of access master (the
    kind known by content, whatever the name says)."""
    jp2 = sniff(path) == "JP2"
    if (recipe.jp2 is not None) == jp2:
        return None
    return (f"{path} is {'a JP2' if jp2 else 'not a JP2'}, and recipe {recipe.name} makes "
            f"{'JP2' if recipe.jp2 else 'pyramidal TIFF'} files")


def encode_in_child(job: EncodeJob) -> EncodeOutcome:
    """The child's half: read metadata, decode, normalise, encode, verify, hash."""
    from gcis_etl.colour import normalise
    from gcis_etl.decoding import open_master
    from gcis_etl.imagecms_colour import srgb_strips
    from gcis_etl.jp2 import metadata_carrier
    from gcis_etl.metadata import carried_tags

    out = Path(job.output)
    recipe = job.recipe
    ptiff = recipe.encoder in PTIFF_ENCODERS
    with isolation.scratch() as scratch, isolation.disk_checked(Path(scratch), out.parent):
        # exiftool reads the master beside the decoding and encoding; the encoders ask for it at the end. It
        # removes a carrier it could not write and says only "Error writing image data".
        carrier = isolation.disk_checked(Path(scratch), needs=DISK_MARGIN)(
            carried_tags if ptiff else metadata_carrier)
        metadata = isolation.beside(carrier, job.info, recipe.metadata.keep, recipe.metadata.exclude,
                                    Path(scratch))
        try:
            decoded = open_master(job.info, job.decoders, job.policy.strict, job.policy.vips_decodes_jpeg2000_origin)
            isolation.reading_pixels(decoded.decoder)  # pixels are read lazily, while encoding
            # the tifffile engine has its own colour stage: Pillow ImageCms, applied strip by strip while encoding
            image = (srgb_strips if recipe.encoder == "tifffile" else normalise)(decoded.image, job.info, job.policy)
            encode = {"ptiff": _encode_ptiff, "tifffile": _encode_tifffile}.get(recipe.encoder, _encode_jp2)
            encoded = encode(image, out, recipe, metadata.result, Path(scratch))
        finally:
            futures.wait([metadata])  # it writes into scratch
    if not encoded.report.ok:
        raise VerificationFailed("output failed verification: " + "; ".join(encoded.report.errors))
    return EncodeOutcome(decoder=decoded.decoder, width=image.width, height=image.height,
                         levels=encoded.levels, bytes=encoded.bytes, sha256=encoded.sha256,
                         notes=decoded.notes + encoded.notes + encoded.report.warnings,
                         peak_rss_mb=_peak_rss_mb())


def _peak_rss_mb() -> float:
    """The high-water RSS of this process or of the largest encoder it ran: an external JPEG 2000 encoder holds
    many times what the conversion process does."""
    return max(_own_peak_rss_mb(), isolation.encoders_peak_mb())


def _own_peak_rss_mb() -> float:
    """This process's high-water RSS (isolation.high_water: not ru_maxrss, unless /proc has none)."""
    return (isolation.high_water("self") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10) / 2 ** 20


@dataclass(frozen=True)
class _Encoded:
    levels: int
    bytes: int
    notes: tuple[str, ...]
    report: VerifyReport
    sha256: str


def _checked(out: Path, check: Callable[[], VerifyReport]) -> tuple[VerifyReport, str]:
    """Verify the output, hashing it meanwhile: both only read the file. Whether it must survive a crash
    is convert()'s to decide, in the parent."""
    isolation.stage("verifying the output")
    digest = isolation.beside(sha256_file, out)
    report = check()
    return report, digest.result()


def _encode_ptiff(image, out: Path, recipe: Recipe, carried: Callable[[], Carried], scratch: Path) -> _Encoded:
    from gcis_etl.colour import srgb_profile
    from gcis_etl.ptiff import encode_ptiff
    encoded = encode_ptiff(image, out, recipe, srgb_profile(), lambda: carried().tags)
    return _verified_ptiff(encoded, image, out, recipe, carried())


def _encode_tifffile(strips, out: Path, recipe: Recipe, carried: Callable[[], Carried], scratch: Path) -> _Encoded:
    from gcis_etl.colour import srgb_profile
    from gcis_etl.tifffile_ptiff import encode_tifffile_ptiff
    encoded = encode_tifffile_ptiff(strips, out, recipe, srgb_profile(), lambda: carried().tags, scratch)
    return _verified_ptiff(encoded, strips, out, recipe, carried())


def _verified_ptiff(encoded, image, out: Path, recipe: Recipe, carried: Carried) -> _Encoded:
    """Both PTIFF encoders answer to one contract: the same Expectation."""
    from gcis_etl.verification import Expectation, verify
    expect = Expectation(width=image.width, height=image.height, tile=recipe.tile, chroma=recipe.chroma,
                         metadata=carried.values)
    report, sha256 = _checked(out, lambda: verify(out, expect))
    return _Encoded(len(encoded.levels), encoded.bytes, ("BigTIFF (over 4 GB)",) if encoded.bigtiff else (),
                    report, sha256)


def _encode_jp2(image, out: Path, recipe: Recipe, metadata: Callable[[], Jp2Metadata], scratch: Path) -> _Encoded:
    """The reference's reduction for verification is computed beside the encoder, which leaves part of the
    machine idle; the uncompressed sRGB TIFF it read stays in scratch until the pixels are compared."""
    from gcis_etl.jp2 import encode_jp2, plan_jp2
    from gcis_etl.verification import LOSSLESS, Jp2Coding, Jp2Expectation, reduced_reference, verify_jp2
    plan = plan_jp2(image, recipe, scratch)
    jp2 = recipe.jp2
    expect = Jp2Expectation(
        width=image.width, height=image.height, levels=plan.command.levels, layers=jp2.layers,
        progression=jp2.progression, ht=jp2.ht, plt=plan.command.plt,
        min_psnr=LOSSLESS if jp2.lossless else 30.0, reference=plan.reference,
        coding=Jp2Coding(reversible=jp2.reversible, tile=plan.command.tiles or (image.width, image.height)))
    reduced = isolation.beside(reduced_reference, expect)
    try:
        size = encode_jp2(plan, out, metadata)
    finally:
        futures.wait([reduced])  # it reads the reference, in scratch
    expect = replace(expect, metadata=metadata().values)
    report, sha256 = _checked(out, lambda: verify_jp2(out, expect, reduced.result))
    return _Encoded(plan.command.levels + 1, size, plan.command.warnings, report, sha256)
