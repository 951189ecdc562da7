"""Run decoding and encoding in a child process, so that a decoder crash, a hang or a memory blow-up on
one master is that master's failure ("decoder crashed: SIGSEGV while decoding with vips"), never the
batch's.

The child is a fresh interpreter (not multiprocessing, which would re-import the caller's main script) talking over a socket pair, reused across jobs (starting Python and importing
libvips per master would cost more than converting a small one). It is recycled after a number of jobs
or when its memory grows past a limit (libvips' long-run growth), and replaced after any crash.
The parent never imports libvips, so forking workers stays safe.

A child's scratch folder is named for its host and pid: the parent removes what a child it killed, or saw die,
left behind (tempfile's cleanup never runs on SIGKILL or SIGSEGV; a JP2 recipe's is 3 bytes a pixel), and
before starting a child it removes those of this host's conversion processes that are no longer alive.
"""
from __future__ import annotations

import errno
import hashlib
import importlib
import json
import logging
import math
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

from gcis_etl.durable import DISK_MARGIN, DISK_REFUSES_WRITES
from gcis_etl.durable import room as durable_room
from gcis_etl.errors import ConversionFailed, DiskFull, GcisError, RejectedMaster
from gcis_etl.policy import IsolationSettings

_log = logging.getLogger(__name__)
_conn: Connection | None = None  # set in the child: where stage() reports to
_memory_limit_mb: int | None = None  # set in the child: its isolation.memory_limit_mb
_encoder_limit_mb: int | None = None  # set in the child: its isolation.encoder_memory_limit_mb
_metadata_timeout: float | None = None  # set in the child: its isolation.metadata_timeout_seconds
_exiftool_deadline = 0.0  # set in the child for each job: when its exiftool must be done (exiftool_time_limit)
SCRATCH_PREFIX = "gcis-scratch-"
# Run with -P (no working directory on its path: from inside another checkout, the child imported that one's code)
# and the folder the parent's gcis_etl came from first, when not on the path already (compared resolved: put first
# again, site-packages would go before the standard library).
_CHILD_ENTRY = ("import sys, json, os.path; "
                "any(os.path.realpath(p) == sys.argv[3] for p in sys.path) or sys.path.insert(0, sys.argv[3]); "
                "from multiprocessing.connection import Connection; "
                "from gcis_etl.isolation import _child_main; "
                "_child_main(Connection(int(sys.argv[1])), json.loads(sys.argv[2]))")
_PACKAGES = ("gcis_etl", "connectors")  # this distribution's code, beside each other: what its processes import
_ROOT = Path(__file__).resolve().parent.parent


def _code_files() -> list[Path]:
    return sorted(path for package in _PACKAGES for path in (_ROOT / package).rglob("*.py"))


def _stamp(files: list[Path]) -> tuple[tuple[str, int, int], ...]:
    """Each source file's path, modification time and size: cheap to take again."""
    return tuple((str(path), stat.st_mtime_ns, stat.st_size) for path, stat in ((p, p.stat()) for p in files))


def _fingerprint(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.relative_to(_ROOT)}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


# Taken as this module is imported, with the first of the package's: the code this process runs. Not the version
# string, which a release may leave as it was.
_started_files = _code_files()
_seen_stamp = _stamp(_started_files)  # the files' last stamp found to hold the code this process started with
_STARTED_WITH = _fingerprint(_started_files)
del _started_files


def code_fingerprint() -> str:
    """A digest of the gcis-etl source files as this process found them when it started: a conversion process
    tells its own to its parent, which refuses one that runs other code."""
    return _STARTED_WITH


def code_changed() -> bool:
    """Whether the gcis-etl source files on disk no longer hold the code this process started with (upgraded in
    place): a module it imports from now on would be another version's (a fresh Celery pool process importing
    the new gcis_etl.conversion beside its old isolation module: ImportError). The files' modification times and
    sizes are compared, their contents only when those changed (a reinstall of the same code touches them)."""
    global _seen_stamp
    try:
        files = _code_files()
        stamp = _stamp(files)
        if stamp == _seen_stamp:
            return False
        if _fingerprint(files) != _STARTED_WITH:
            return True
    except OSError:  # a file replaced while read: an install under way
        return True
    _seen_stamp = stamp
    return False


_running: str | None = None  # run_as's name of this process


def run_as(name: str) -> None:
    """Name this process, and those it forks, in the messages asking to restart it: a Celery worker's node and
    main process, the one to restart (a pool process's pid named, its SIGTERM only made the stale main process
    fork another; shown as `__main__.py` under `python -m celery`)."""
    global _running
    _running = name


def running_process() -> str:
    """This process, as a message asking to restart it names it (run_as): by default its program and pid."""
    return _running or f"{Path(sys.argv[0]).name or 'python'}, pid {os.getpid()} on {socket.gethostname()}"


class CannotStart(ConversionFailed):
    """The conversion process could not be started (the interpreter gone after an upgrade, a process or memory
    limit): no master's fault, and every conversion would fail alike."""


class WorkerCrashed(ConversionFailed):
    def __init__(self, message: str, stage: str | None, signal_name: str | None):
        super().__init__(message)
        self.stage, self.signal_name = stage, signal_name


class WorkerTimeout(ConversionFailed):
    pass


_send_lock = threading.Lock()  # in the child: threads beside may report while the job's thread does


def _report(kind: str, payload: Any) -> None:
    if _conn is not None:
        with _send_lock:
            _conn.send((kind, payload))


def stage(name: str) -> None:
    """Tell the parent what the child is doing now, so a crash can be attributed ("while decoding ...")."""
    _report("stage", name)


_PIXELS_STAGE = "reading pixels with "  # + a decoder's name: a crash then is that decoder's, and the next is tried


def reading_pixels(decoder: str) -> None:
    """The stage in which `decoder` reads the master's pixels (a crash in it retries with the next decoder)."""
    stage(_PIXELS_STAGE + decoder)


def crashed_decoder(stage_name: str | None) -> str | None:
    """The decoder a crash in `stage_name` is blamed on (reading_pixels), or None for any other stage."""
    return stage_name.removeprefix(_PIXELS_STAGE) if (stage_name or "").startswith(_PIXELS_STAGE) else None


def heard(on_stage: Callable[[str], None] | None, name: str) -> None:
    """Hand the stage `name` to a caller's listener (a progress line), which runs while the child works on: one
    that raises is logged and the conversion goes on (raised, it would leave the child's answer unread, the child
    killed and a good master failed for its display). Not a KeyboardInterrupt (Ctrl-C): that still stops. One
    that blocks past isolation.timeout_seconds fails nothing the child answered meanwhile (IsolatedProcess.call)."""
    if on_stage is None:
        return
    try:
        on_stage(name)
    except Exception:
        _log.warning("the listener of the conversion's stages failed on %r", name, exc_info=True)


class _ToParent(logging.Handler):
    """In the child, what tifffile logs (what it skips in a damaged master and reads on) goes to the parent as
    a note of the job, a warning of its result: written to the inherited stderr it was a plain line among a
    harvest's JSON log lines (--log-json), and no one could tell which master it was about."""

    def emit(self, record: logging.LogRecord) -> None:
        from gcis_etl.inspection import plain_complaint, structure_warning
        _report("note", structure_warning(plain_complaint(record.getMessage())))


# Threads for work that needs no result of the main thread's, e.g. exiftool reading the master while the
# encoder runs: an encoder leaves part of the machine idle (reading its input, writing its output), and so
# does the single-threaded check of its output. Threads kept for the life of the process: exiftool dies
# with the thread that started it. Four: the most that run at once, during verification (fsync, hash,
# pixel check, metadata read-back).
_beside = ThreadPoolExecutor(max_workers=4, thread_name_prefix="gcis-beside")
_threads: int | None = None  # in a conversion child: the threads it may use (isolation.vips_concurrency)


class InCallerThread(Executor):
    """Runs what is submitted at once, in the caller's thread: for a conversion that must keep to one core
    (one conversion process per core), where a thread beside would compete for a second one."""

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        done: Future = Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except Exception as exc:
            done.set_exception(exc)
        return done


def beside(function: Callable, *args: Any) -> Future:
    """Start `function(*args)` in a thread beside the caller's; its result (or exception) is the Future's.
    A conversion child allowed one thread (one process per core) runs it at once instead: the pool's
    processes keep to a core each, and the work costs the same CPU either way."""
    return (_beside if _threads != 1 else InCallerThread()).submit(function, *args)


# How the libraries under the child report an allocation refused under its address-space limit: libvips
# ("vips_tracked: out of memory"), libjpeg ("Insufficient memory (case 4)"), OpenCV ("Insufficient memory to
# allocate ..."), Python starting a thread whose stack cannot be mapped ("can't start new thread"), the loader
# ("failed to map segment from shared object").
_OUT_OF_MEMORY = re.compile(r"out of memory|insufficient memory|not enough memory|can't start new thread|"
                            r"failed to map segment", re.IGNORECASE)


def refused_allocation(exc: BaseException) -> bool:
    """Whether `exc` is an allocation refused (under the child's limit) rather than the job's own failure: also
    an OSError ENOMEM (mmap refused: verification maps the reference TIFF), which a caller would otherwise take
    for its files' ("cannot write <output>: Cannot allocate memory")."""
    return isinstance(exc, MemoryError) or (isinstance(exc, OSError) and exc.errno == errno.ENOMEM) or \
        bool(_OUT_OF_MEMORY.search(str(exc)))


def out_of_memory() -> ConversionFailed:
    """An allocation refused under the child's address-space limit: the limit's failure, not the master's
    (FAILED, so a harvest retries it), with the setting to raise."""
    if _memory_limit_mb is None:
        return ConversionFailed("out of memory")
    return ConversionFailed(f"out of memory under isolation.memory_limit_mb ({_memory_limit_mb} MB): "
                            "raise it for masters this size")


def pixel_error(exc: Exception) -> GcisError:
    """What a decoder's error while reading pixels stands for. libvips and the libraries under it report an
    allocation refused under the address-space limit the way they report corrupt data ("vips_tracked: out of
    memory"; libjpeg's "Insufficient memory (case 4)" on a large progressive JPEG): that is out_of_memory();
    anything else is the master's data, rejected."""
    if refused_allocation(exc):
        return out_of_memory()
    text = str(getattr(exc, "detail", None) or getattr(exc, "message", None) or exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return RejectedMaster(f"corrupt or truncated image data: {lines[-1] if lines else type(exc).__name__}")


def scratch() -> tempfile.TemporaryDirectory:
    """A folder for this conversion's intermediate files, named so that the parent can find it when the
    child dies before its own cleanup runs."""
    with in_scratch():
        return tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{os.getpid()}@{socket.gethostname()}-")


@contextmanager
def in_scratch() -> Iterator[None]:
    """Around reading and writing scratch files: an OSError there (a full temp filesystem) is named for the
    scratch folder, where it would otherwise be taken for the destination's ("cannot write <dst>")."""
    try:
        yield
    except OSError as exc:
        temp = tempfile.gettempdir()
        # as for a conversion's scratch folder in `temp` (any: the message names `temp`)
        raise disk_refusal(exc, Path(temp, SCRATCH_PREFIX)) or ConversionFailed(
            f"cannot write scratch files in {temp}: {exc.strerror or exc}{_TMPDIR_SETS}") from None


_TMPDIR_SETS = " (the system temp dir: TMPDIR sets where it is)"
# What libraries say of a disk that refuses a write, in their own messages (libvips: "unix error: No space left
# on device"), where no errno reaches Python.
_DISK_SAYS = tuple(os.strerror(code) for code in DISK_REFUSES_WRITES)


def disk_refusal(exc: BaseException, *folders: Path, needs: int = 0,
                 began: dict[Path, int] | None = None) -> DiskFull | None:
    """`exc`, raised by a step writing into `folders`, as a DiskFull when a disk refused the write rather than the
    master or the tool failing (else None): an OSError of a disk refusing writes (ENOSPC, EDQUOT, EROFS), a
    library's message saying so, a folder on a read-only filesystem, or one with less free space than the step
    `needs` (opj_compress and grk_compress remove their output and say only 'Failed to seek in the stream',
    'failed to compress image'). Ask right after the failure, before the step's scratch is removed. The message
    names the folder, its free space (or, read-only, what makes it writable), what the step needs, and what sets
    where the folder is. `began`: each folder's free space when the step began (disk_checked), which the message
    gives: once it failed, what the step wrote fills the disk ("0.0 MB free"), saying nothing of what it lacked."""
    if isinstance(exc, DiskFull):
        return exc
    said = exc.strerror if isinstance(exc, OSError) and exc.errno in DISK_REFUSES_WRITES else \
        next((words for words in _DISK_SAYS if words in str(exc)), None)
    room = {folder: durable_room(folder) for folder in folders}
    # short of room by what was free when the step began, where known: a step that failed for its own reasons
    # (a corrupt strip two thirds in) has filled the disk with what it wrote meanwhile
    short = [folder for folder, (free, read_only) in room.items()
             if read_only or (began or {}).get(folder, free) < needs]
    if said is None and not short:
        return None
    named = [folder for folder in folders if str(folder) in f"{getattr(exc, 'filename', None)} {exc}"]
    folder = min(short if said is None else named or folders, key=lambda f: room[f][0])
    free, read_only = room[folder]
    why = said or (os.strerror(errno.EROFS) if read_only else str(exc))
    needed = f", up to {needs / 1e6:.1f} MB needed" if needs and not read_only else ""
    when = " when it began" if began and folder in began else ""
    free = began[folder] if when else free
    remedy = (": make it writable (remount its filesystem read-write) or choose another folder"
              if why == os.strerror(errno.EROFS) else
              f" ({free / 1e6:.1f} MB free there{when}{needed}): free space on its filesystem")
    return DiskFull(f"cannot write {_named(folder)}: {why}{remedy}{_set_by(folder)}")


def _named(folder: Path) -> Path:
    """A folder as messages name it: a conversion's scratch by the temp dir it is made in."""
    return folder.parent if folder.name.startswith(SCRATCH_PREFIX) else folder


def _set_by(folder: Path) -> str:
    """What sets where the folder is, for a conversion's scratch (the temp dir); nothing for another."""
    return _TMPDIR_SETS if folder.name.startswith(SCRATCH_PREFIX) else ""


@contextmanager
def disk_checked(*folders: Path, needs: int = 0) -> Iterator[None]:
    """Around a step writing into `folders`: its failure raised as disk_refusal's DiskFull when a disk refused
    (also a decorator, for a function run beside). A step that `needs` more than a folder has free fails at
    once, before minutes of decoding fill the disk to the same end; one that needs more than the folder's whole
    filesystem holds is the master's failure alone (ConversionFailed): no room freed there would let it run, and
    a DiskFull would stop every run on it."""
    began = {folder: durable_room(folder)[0] for folder in folders}
    for folder in folders:
        fs = os.statvfs(folder)
        if needs > max(DISK_MARGIN, fs.f_blocks * fs.f_frsize):  # the margin alone is a rule of thumb
            raise ConversionFailed(f"needs up to {needs / 1e6:.1f} MB in {_named(folder)}, more than its whole "
                                   f"filesystem holds ({fs.f_blocks * fs.f_frsize / 1e6:.1f} MB){_set_by(folder)}")
    short = next((folder for folder, free in began.items() if free < needs), None)
    if short is not None:
        raise disk_refusal(OSError(errno.ENOSPC, "not enough free space"), short, needs=needs, began=began)
    try:
        yield
    except Exception as exc:
        refusal = disk_refusal(exc, *folders, needs=needs, began=began)
        if refusal is None:
            raise
        raise refusal from None


def _remove_scratch(pid: int | None = None) -> None:
    """Remove the scratch folders of the dead child `pid`, or (None) of every dead conversion process of
    this host: never those of a live one, which may be converting in another worker process."""
    pattern = f"{SCRATCH_PREFIX}{'*' if pid is None else pid}@{socket.gethostname()}-*"
    for folder in Path(tempfile.gettempdir()).glob(pattern):
        owner = folder.name[len(SCRATCH_PREFIX):].partition("@")[0]
        if pid is not None or (owner.isdigit() and not _process_exists(int(owner))):
            shutil.rmtree(folder, ignore_errors=True)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        pass
    return True


def _child_main(conn: Connection, settings: dict) -> None:
    global _conn, _threads, _memory_limit_mb, _encoder_limit_mb, _metadata_timeout, _exiftool_deadline
    try:
        conn.send(("hello", code_fingerprint()))  # first, before anything another version may do otherwise
    except OSError:  # the parent closed its end as it started this process (a Ctrl-C there): no one to work for,
        return       # and a BrokenPipeError's traceback went to the stderr it shares with the caller
    _conn, _threads, _memory_limit_mb = conn, settings["vips_concurrency"], settings["memory_limit_mb"]
    _encoder_limit_mb, _metadata_timeout = settings["encoder_memory_limit_mb"], settings["metadata_timeout_seconds"]
    limit = settings["memory_limit_mb"] * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))  # soft only
    # a host ignoring SIGCHLD passes that on, and every subprocess here (encoders, exiftool) would say exit 0
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when the child stops, a terminal's
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # hang-up to its process group included (commands._on_each)
    logging.getLogger("tifffile").addHandler(_ToParent(logging.WARNING))
    _die_with_parent()
    os.environ["VIPS_CONCURRENCY"] = str(settings["vips_concurrency"])  # before any job imports libvips
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        target, args, deadline, seconds = message
        _exiftool_deadline = deadline - seconds * _ENDING_SHARE
        module, _, name = target.rpartition(".")
        try:
            result = getattr(importlib.import_module(module), name)(*args)
            _report("ok", result)
        except Exception as exc:  # the job's failure, reported to the parent; the child lives on
            _report("error", _failure(exc))


class TimeLimit(NamedTuple):
    """The time an exiftool command may take, and the isolation setting that sets it (named when it runs out)."""

    seconds: float
    setting: str


_ENDING_SHARE = 0.1  # of a job's time, what is left to end it when exiftool has run out of time


def exiftool_time_limit(limits: IsolationSettings | None = None) -> TimeLimit | None:
    """The time the next exiftool command may take: the metadata_timeout_seconds of `limits` (the caller's read of
    a master's metadata) or, without them, of a conversion child, there cut to what is left of the job's time
    (isolation.timeout_seconds) but a share to end it: a master whose metadata keeps exiftool too long (28 MB of
    IPTC: minutes) fails naming the metadata, where the job's time running out under it named the conversion.
    None: no limit (outside a child, without `limits`)."""
    seconds = limits.metadata_timeout_seconds if limits else _metadata_timeout
    if seconds is None:
        return None
    left = math.inf if limits else max(_exiftool_deadline - time.monotonic(), 0.0)
    return TimeLimit(seconds, "metadata_timeout_seconds") if seconds <= left else TimeLimit(left, "timeout_seconds")


_lift_lock = threading.Lock()
_lifted = 0     # encoders running with the soft limit lifted
_kept_soft = 0  # the soft limit to restore when the last of them ends


def dying_with_thread(argv, signal_name: str = "KILL") -> list[str]:
    """`argv` made to die with the thread that starts it (util-linux setpriv sets PR_SET_PDEATHSIG, then execs
    it), even when Python is killed: a tool must not outlive its user, burning a core or writing into scratch.
    `signal_name`: TERM for a server that must stop what it spawned. Without setpriv, `argv` as it is."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", signal_name, "--", *argv] if setpriv else list(argv)


@contextmanager
def encoder_address_space() -> Iterator[None]:
    """An external encoder inherits the child's address-space limit, and grk_compress reserves more than 8 GB
    on 40 Mpx. It is a process of its own, with its own time-out: the soft limit is lifted while it runs
    (the child itself only waits for it meanwhile). Threads beside may run encoders too: the limit comes
    back when the last of them ends."""
    global _lifted, _kept_soft
    with _lift_lock:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if not _lifted:
            _kept_soft = soft
            resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
        _lifted += 1
    try:
        yield
    finally:
        with _lift_lock:
            _lifted -= 1
            if not _lifted:
                resource.setrlimit(resource.RLIMIT_AS, (_kept_soft, hard))


WATCH_SECONDS = 0.1  # how often an encoder's resident memory is read
ENCODER_OOM_SCORE_ADJ = 1000  # the most: of all processes, the kernel's OOM killer takes an encoder first
_encoders_peak = 0  # the high-water resident bytes of the largest encoder this process ran
_peak_lock = threading.Lock()


def run_encoder_process(argv, timeout: float, pixels: int | None = None) -> subprocess.CompletedProcess:
    """Run an external encoder and wait for it, dying with this thread (dying_with_thread), the address-space
    limit lifted (encoder_address_space): its resident memory is what is held under a limit instead,
    isolation.encoder_memory_limit_mb (in a conversion child), read every WATCH_SECONDS from its VmHWM and
    killed above it. That is the limit's failure, not the master's (ConversionFailed: a harvest retries it),
    naming the size reached and the master's `pixels`: left unchecked, an encoder's blow-up (grk_compress holds
    ~35 bytes a pixel) meets the kernel's OOM killer, which may take the harvest or a neighbour instead. Its
    high-water is kept for peak_rss_mb (encoders_peak_mb): the kernel's ru_maxrss of a child is no measure, as
    Linux carries the parent's across the exec. Should the host still run out of memory (concurrency x the limit
    is more than it has), the OOM killer takes an encoder first (ENCODER_OOM_SCORE_ADJ), and the SIGKILL that
    ended it says so. Raises ConversionFailed also on time-out or when it cannot start."""
    global _encoders_peak
    tool, peak = Path(argv[0]).name, 0
    deadline = time.monotonic() + timeout
    with encoder_address_space():
        try:
            proc = subprocess.Popen(dying_with_thread(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, errors="replace")
        except OSError as exc:
            raise ConversionFailed(f"{tool} could not be started: {exc.strerror}") from None
        with suppress(OSError):  # raising it needs no privilege; the exec keeps it
            Path(f"/proc/{proc.pid}/oom_score_adj").write_text(str(ENCODER_OOM_SCORE_ADJ))
        try:
            while True:
                try:
                    stdout, stderr = proc.communicate(timeout=WATCH_SECONDS)  # output kept across time-outs
                    break
                except subprocess.TimeoutExpired:
                    pass
                peak = max(peak, high_water(proc.pid))
                _within_encoder_limit(peak, f"{tool} reached {peak / 2 ** 20:.0f} MB", pixels)
                if time.monotonic() > deadline:
                    raise ConversionFailed(f"{tool} timed out after {timeout:.0f} s")
        finally:
            if proc.returncode is None:
                proc.kill()
                proc.communicate()
            with _peak_lock:
                _encoders_peak = max(_encoders_peak, peak)
    if proc.returncode == -signal.SIGKILL:  # not by its watcher, which raises
        raise ConversionFailed(f"{tool} was killed (SIGKILL): when the host runs out of memory, the kernel's OOM "
                               f"killer takes an encoder first; lower concurrency or isolation.encoder_memory_limit_mb")
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def encoder_fits(tool: str, pixels: int, bytes_per_pixel: float) -> None:
    """Fail at once, not after minutes of encoding, when an encoder needing `bytes_per_pixel` (measured: a
    floor) cannot encode `pixels` under isolation.encoder_memory_limit_mb (in a conversion child)."""
    needs = pixels * bytes_per_pixel
    _within_encoder_limit(needs, f"{tool} needs about {needs / 2 ** 20:.0f} MB ({bytes_per_pixel:g} bytes a pixel)",
                          pixels)


def _within_encoder_limit(nbytes: float, what: str, pixels: int | None) -> None:
    """The watcher's and the estimate's one failure: `what` the encoder reached or needs, over the limit."""
    if _encoder_limit_mb is not None and nbytes > _encoder_limit_mb << 20:
        size = f" on a {pixels / 1e6:.0f} Mpx image" if pixels else ""
        raise ConversionFailed(f"out of memory under isolation.encoder_memory_limit_mb ({_encoder_limit_mb} MB): "
                               f"{what}{size}; raise it for masters this size")


def encoders_peak_mb() -> float:
    """The high-water resident memory of the largest encoder this process ran (run_encoder_process), in MB."""
    return _encoders_peak / 2 ** 20


def high_water(pid: int | str) -> int:
    """The high-water resident bytes of a running process (of its threads together; "self": this one), 0 once
    it has ended. Not ru_maxrss: Linux carries that across exec, so a child started from a large parent would
    report the parent's size; VmHWM belongs to the address space exec created."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    found = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
    return int(found.group(1)) << 10 if found else 0


def _die_with_parent() -> None:
    """A parent killed with -9 must not leave a conversion burning a core (Linux: PR_SET_PDEATHSIG). It fires
    when the parent *thread* that started this process ends, so a process is owned by one long-lived thread."""
    import ctypes
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


def _failure(exc: Exception) -> Exception:
    """What the parent is told of a job's exception. An allocation refused is the limit's failure wherever it
    happened (numpy, OpenCV, a thread pool, loading a library), not a fault of the code that asked."""
    if not isinstance(exc, GcisError) and refused_allocation(exc):
        return out_of_memory()
    return exc if _picklable(exc) else ConversionFailed(f"{type(exc).__name__}: {exc}")


def _picklable(exc: Exception) -> bool:
    import pickle
    try:
        pickle.loads(pickle.dumps(exc))
        return True
    except Exception:
        return False


class IsolatedProcess:
    """One reusable child process; call() runs `module.function(*args)` in it. A library caller converting many
    masters passes one as convert()'s, check_decoding()'s `worker` (`with IsolatedProcess(cfg.isolation) as
    worker:`): a new process for each master costs several times the conversion of a small one.

    It serves one call at a time: threads sharing one wait for each other (their jobs and answers went over one
    socket, each thread taking another's answer). Threads that want to convert in parallel make one each."""

    def __init__(self, settings: IsolationSettings | None = None):
        self.settings = settings or IsolationSettings()
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._jobs = 0
        self._greeted = False  # the child said it runs this process's code (its first message)
        self._turn = threading.RLock()  # reentrant: call() closes the child it recycles

    def __enter__(self) -> "IsolatedProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._alive() else None

    def call(self, target: Callable | str, *args: Any, timeout: float | None = None,
             notes: list[str] | None = None, on_stage: Callable[[str], None] | None = None) -> Any:
        """Run the job in the child; raise WorkerCrashed / WorkerTimeout, or the job's own exception.
        What the child's libraries log meanwhile (see _ToParent) is added to `notes`; without it, logged here.
        `on_stage` hears each stage the child reports (stage()) as it comes, in this thread (see heard)."""
        if callable(target):
            target = f"{target.__module__}.{target.__qualname__}"
        with self._turn:
            return self._call(target, args, timeout, notes, on_stage)

    def _call(self, target: str, args: tuple, timeout: float | None, notes: list[str] | None,
              on_stage: Callable[[str], None] | None) -> Any:
        self.start()
        setting = "" if timeout else " under isolation.timeout_seconds: raise it for masters this size"
        timeout = timeout or self.settings.timeout_seconds
        deadline = time.monotonic() + timeout
        current_stage: str | None = None
        self._conn.send((target, args, deadline, timeout))  # time.monotonic() is the host's (CLOCK_MONOTONIC)
        self._jobs += 1
        answered = False
        try:
            while True:
                # what the child sent is taken whatever the clock says: a listener (heard) holding this thread
                # past the deadline has let the child's answer wait, not made the child late. The deadline is
                # the child's, which works on meanwhile: one that has not answered by then is killed
                if not self._conn.poll(max(deadline - time.monotonic(), 0)):
                    self._kill()
                    where = f" while {current_stage}" if current_stage else ""
                    raise WorkerTimeout(f"timed out after {timeout:g} s{where}{setting}")
                try:
                    kind, payload = self._conn.recv()
                except (EOFError, ConnectionResetError, OSError):
                    answered = True
                    raise self._crashed(current_stage) from None
                if not self._greeted:
                    self._greet(kind, payload)
                    continue
                if kind == "stage":
                    current_stage = payload
                    heard(on_stage, payload)
                    continue
                if kind == "note":
                    if notes is None:
                        _log.warning("%s", payload)
                    else:
                        notes.append(payload)
                    continue
                answered = True
                if kind == "ok":
                    return payload
                raise payload
        finally:
            if not answered:  # interrupted while waiting (a soft time limit, Ctrl-C): its late answer would
                self._kill()  # be taken for the next job's
            self._recycle_if_needed()

    def close(self) -> None:
        """After the call in flight, if any: the child would be killed under it."""
        with self._turn:
            if self._alive():
                try:
                    self._conn.send(None)
                    self._proc.wait(5)
                except (OSError, subprocess.TimeoutExpired):
                    self._kill()
            if self._conn is not None:
                self._conn.close()
            self._proc, self._conn = None, None

    def _alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def rss_bytes(self) -> int | None:
        import psutil
        try:
            return psutil.Process(self._proc.pid).memory_info().rss if self.pid else None
        except psutil.Error:
            return None

    def start(self) -> None:
        """Start the child unless it runs (call does this first): CannotStart."""
        if self._alive():
            return
        if self._conn is not None:  # the previous child died between jobs
            self._conn.close()
            self._conn = None
        _remove_scratch()
        parent, child = socket.socketpair()
        with parent, child:
            try:
                self._proc = _kept_process(
                    [sys.executable, "-P", "-c", _CHILD_ENTRY, str(child.fileno()),
                     json.dumps(self.settings.model_dump()), str(_ROOT)],
                    pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, start_new_session=True)
            except OSError as exc:  # not the job's: a caller would take it for its own files' ("cannot write")
                raise CannotStart(f"the conversion process could not be started: {sys.executable}: "
                                       f"{exc.strerror or exc}") from None
            self._conn = Connection(os.dup(parent.fileno()))
        self._jobs, self._greeted = 0, False

    def _greet(self, kind: str, payload: Any) -> None:
        """The child's first message: the fingerprint of the code it runs, which must be this process's (a child
        started after an in-place upgrade runs the new files). Raises CannotStart otherwise, the child killed."""
        if kind != "hello" or payload != code_fingerprint():
            self._kill()
            raise CannotStart(f"the conversion process runs another version of gcis-etl than the process that "
                              f"started it ({running_process()}; upgraded in place?): restart that process")
        self._greeted = True

    def _crashed(self, current_stage: str | None) -> ConversionFailed:
        """WorkerCrashed; CannotStart for a child that died before its first message (not started, no job's)."""
        try:
            self._proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        code = self._end()
        self._conn.close()
        self._proc, self._conn = None, None
        name = signal.Signals(-code).name if code is not None and code < 0 else None
        how = f"crashed: {name}" if name else _exited(code)
        if not self._greeted:
            return CannotStart(f"the conversion process {how} before it was ready (its error went to the stderr of "
                               f"the process that started it, {running_process()}): if gcis-etl was upgraded in "
                               f"place, restart that process")
        where = f" while {current_stage}" if current_stage else ""
        return WorkerCrashed(f"conversion process {how}{where}", current_stage, name)

    def _kill(self) -> None:
        if self._proc is not None:
            self._end()
        if self._conn is not None:
            self._conn.close()
        self._proc, self._conn = None, None

    def _end(self) -> int:
        """Kill the child and what it started, in a session of its own (an encoder would outlive it, burning
        a core and writing into the scratch folder), and remove the scratch it left; its exit code."""
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        code = self._proc.wait()
        _remove_scratch(self._proc.pid)
        return code

    def _recycle_if_needed(self) -> None:
        if self._proc is None:
            return
        rss = self.rss_bytes() or 0
        if self._jobs >= self.settings.max_jobs_per_process or rss > self.settings.max_rss_mb * 1024 * 1024:
            self.close()


def _exited(code: int) -> str:
    """How a child that no signal killed ended, as a message tells it. In a host that ignores SIGCHLD (some
    daemons do) the kernel reaps the children and keeps no exit status: wait() says 0 whatever happened, a SIGSEGV
    included."""
    if signal.getsignal(signal.SIGCHLD) is signal.SIG_IGN:
        return "ended, its exit status unknown (this process ignores SIGCHLD, so the kernel reaped it)"
    return f"exited with code {code}"


def _kept_process(argv: list[str], **popen: Any) -> subprocess.Popen:
    """`argv` started from a thread of its own that waits for it: the child dies with the thread that started it
    (_die_with_parent), and a worker shared by threads was killed mid-job when the thread that had started it
    ended (SIGKILL, a false failure). It still dies with this process."""
    started: Future = Future()

    def keep() -> None:
        try:
            proc = subprocess.Popen(argv, **popen)
        except Exception as exc:  # the caller's to judge (OSError: CannotStart), not this thread's to lose
            started.set_exception(exc)
            return
        started.set_result(proc)
        proc.wait()

    threading.Thread(target=keep, name="gcis-conversion-process", daemon=True).start()
    return started.result()


class ChildPool:
    """At most `size` conversion children, shared by the threads that lease them, each only around a conversion
    (the cores and the memory budget: each child may grow to isolation.max_rss_mb), so that these threads can
    fetch and deposit other items meanwhile. A lease with other isolation settings than the idle children's
    replaces one of them. A child is started from a thread of its own and dies with this process (or when
    closed)."""

    def __init__(self, size: int):
        self._free = threading.Semaphore(size)
        self._lock = threading.Lock()
        self._idle: list[IsolatedProcess] = []  # oldest first
        self._room = size  # children that may still be made
        self._closed = False

    @contextmanager
    def lease(self, settings: IsolationSettings) -> Iterator[IsolatedProcess]:
        with self._free:
            child = self._take(settings)
            try:
                yield child
            finally:
                with self._lock:
                    closed = self._closed
                    if not closed:
                        self._idle.append(child)
                if closed:
                    child.close()

    def _take(self, settings: IsolationSettings) -> IsolatedProcess:
        stale = None
        with self._lock:
            same = [child for child in self._idle if child.settings == settings]
            if same:
                self._idle.remove(same[-1])
                return same[-1]
            if self._room:
                self._room -= 1
            elif self._idle:  # every child not leased is idle, with other settings: the oldest makes room
                stale = self._idle.pop(0)
            # else the room of a child lost to an exception between its making and its lease (Celery's
            # SoftTimeLimit is raised from a signal handler) is taken again: _free still bounds the leases
        if stale is not None:
            stale.close()
        return IsolatedProcess(settings)

    def close(self) -> None:
        """Close the idle children now, and the leased ones when they come back."""
        with self._lock:
            self._closed, idle, self._idle = True, self._idle, []
        for child in idle:
            child.close()
