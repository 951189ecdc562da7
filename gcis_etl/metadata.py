"""Embedded metadata (EXIF, XMP, IPTC) read and carried from master to access master with exiftool.

One persistent exiftool process per thread (its -stay_open mode): starting Perl per file would cost more than
the metadata work itself, and one process shared by a worker pool's threads made them queue for it.

A master's metadata is read in the calling process (inspection), not the conversion child: that exiftool is
held to the isolation limits itself (IsolationSettings: its address space, the time of a read), as a 2 MB PNG
whose zTXt chunk inflates to gigabytes took it to 8 GB and minutes, holding a harvest's lock meanwhile. In the
conversion child, exiftool has the child's address space and a time limit of its own (exiftool_time_limit).
"""
from __future__ import annotations

import atexit
import base64
import json
import os
import re
import selectors
import signal
import struct
import subprocess
import tempfile
import threading
import time
import weakref
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from gcis_etl import tiff
from gcis_etl.errors import ConversionFailed
from gcis_etl.isolation import TimeLimit, dying_with_thread, exiftool_time_limit
from gcis_etl.models import ImageInfo
from gcis_etl.policy import IsolationSettings


@dataclass(frozen=True)
class _Answer:
    status: int
    stdout: str
    stderr: str


class _StayOpen:
    """An `exiftool -stay_open` process taking one command at a time.

    It runs in a session of its own, so a signal to the harvest's process group (a terminal's Ctrl-C, a
    `kill -- -PGID`) leaves it to finish the item in flight, and it dies with the thread that started it
    (isolation.dying_with_thread). When it dies anyway (a signal to every process of a cgroup, a crash), the
    command in hand fails with ConversionFailed rather than waiting for ever for an answer that cannot come.
    A command interrupted in the caller (Ctrl-C, a Celery soft time limit) kills it: its answer, still to come,
    would be read as the next command's.

    `memory_limit_mb`: its address-space limit (soft, as the conversion child's), set by util-linux prlimit before
    it execs exiftool: a preexec_fn would run Python in a forked copy of a threaded harvest. None: the limit it
    inherits (in the conversion child, the child's)."""

    def __init__(self, memory_limit_mb: int | None = None) -> None:
        self.memory_limit_mb = memory_limit_mb
        limit = ["prlimit", f"--as={memory_limit_mb << 20}:", "--"] if memory_limit_mb else []
        # -common_args: options of every command (given at the start, they would hold for the first alone);
        # LargeFileSupport: a BigTIFF's directory past 2 GB (libtiff writes it after the pixels) is read, not
        # passed over with a warning as holding no tags, a rotated master's orientation among them
        self._process = subprocess.Popen(dying_with_thread([*limit, "exiftool", "-stay_open", "True", "-@", "-",
                                                            "-common_args", "-api", "LargeFileSupport=1"]),
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         start_new_session=True)
        self._commands = 0

    @property
    def running(self) -> bool:
        return self._process.poll() is None

    def execute(self, *args: str, timeout: TimeLimit | None = None) -> _Answer:
        """exiftool marks the end of each command's output with a number of ours on stdout and, after its exit
        status, on stderr: both pipes are read together up to those marks (one read after the other could
        wait on a full pipe). Past `timeout` (None: no limit) it is killed and the command fails."""
        self._commands += 1
        ready, post = f"{{ready{self._commands}}}".encode(), f"post{self._commands}".encode()
        command = [*args, "-echo4", f"=${{status}}={post.decode()}", f"-execute{self._commands}"]
        try:
            self._process.stdin.write(b"".join(os.fsencode(arg) + b"\n" for arg in command))
            self._process.stdin.flush()
            out, err = self._read({self._process.stdout: ready, self._process.stderr: post}, timeout)
        except BrokenPipeError:
            raise self._died(bytearray()) from None
        except BaseException:
            self.kill()
            raise
        stderr, _, status = err.decode(errors="replace").strip()[:-len(post) - 1].rpartition("=")  # "...=0="
        return _Answer(int(status), out.decode(errors="surrogateescape").strip()[:-len(ready)], stderr)

    def _read(self, marks: dict[BinaryIO, bytes], timeout: TimeLimit | None) -> tuple[bytes, bytes]:
        received = {pipe: bytearray() for pipe in marks}
        deadline = None if timeout is None else time.monotonic() + timeout.seconds
        with selectors.DefaultSelector() as selector:
            for pipe in marks:
                selector.register(pipe, selectors.EVENT_READ)
            while selector.get_map():
                remaining = None if deadline is None else deadline - time.monotonic()
                events = selector.select(remaining) if remaining is None or remaining > 0 else []
                if not events:  # execute() kills it
                    raise ConversionFailed(f"exiftool timed out after {round(timeout.seconds, 1):g} s reading the "
                                           f"metadata under isolation.{timeout.setting} (raise it for metadata "
                                           "this large)")
                for key, _ in events:
                    chunk = os.read(key.fd, 65536)
                    if not chunk:  # end of file: exiftool is gone, the mark will never come
                        raise self._died(received[self._process.stderr])
                    received[key.fileobj] += chunk
                    # the mark is looked for in the tail: the whole answer stripped at each read was quadratic
                    # (minutes for a 256 MB text chunk)
                    mark = marks[key.fileobj]
                    if received[key.fileobj][-len(mark) - 64:].rstrip().endswith(mark):
                        selector.unregister(key.fileobj)
        out, err = received.values()
        return bytes(out), bytes(err)

    def _died(self, stderr: bytearray) -> ConversionFailed:
        """Why it ended, from its exit and what it said last: Perl says 'Out of memory!' when an allocation is
        refused under the address-space limit."""
        os.set_blocking(self._process.stderr.fileno(), False)  # what is left once it has ended; none to wait for
        with suppress(BlockingIOError):
            while chunk := os.read(self._process.stderr.fileno(), 65536):
                stderr += chunk
        self.kill()
        if b"Out of memory" in stderr:
            under = f" under isolation.memory_limit_mb ({self.memory_limit_mb} MB): raise it for metadata this " \
                    "large" if self.memory_limit_mb else ""
            return ConversionFailed(f"exiftool ran out of memory reading the metadata{under}")
        code = self._process.returncode
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        return ConversionFailed(f"exiftool {how} while reading metadata")

    def close(self) -> None:
        """Ask it to end; kill it when it does not within a few seconds."""
        try:
            self._process.communicate(b"-stay_open\nFalse\n", timeout=5)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            self.kill()

    def kill(self) -> None:
        self._process.kill()
        self._process.wait()
        for pipe in (self._process.stdin, self._process.stdout, self._process.stderr):
            pipe.close()


class _ThreadExiftool:
    """One thread's exiftool process: worker threads each run their own, never waiting for another's.
    It is closed cleanly when its thread ends (the thread-local holding it is dropped) or the interpreter exits."""

    def __init__(self) -> None:
        self._process: _StayOpen | None = None
        with _registry_lock:
            _registry.add(self)

    def get(self, memory_limit_mb: int | None = None) -> _StayOpen:
        """The running process with that address-space limit: another is started when it died (a crash, a
        signal, killed over a limit) or has another limit (set at its start)."""
        process = self._process
        if process is None or not process.running or process.memory_limit_mb != memory_limit_mb:
            self.close()
            self._process = _StayOpen(memory_limit_mb)
        return self._process

    def close(self) -> None:
        if self._process is None:  # closed at exit already: at interpreter teardown, nothing is left to call
            return
        process, self._process = self._process, None
        process.close()

    __del__ = close


_registry: weakref.WeakSet[_ThreadExiftool] = weakref.WeakSet()  # every live thread's, for the exit
_registry_lock = threading.Lock()
_local = threading.local()


def _exiftool() -> _ThreadExiftool:
    if not hasattr(_local, "exiftool"):
        _local.exiftool = _ThreadExiftool()
    return _local.exiftool


@atexit.register
def _shutdown() -> None:
    with _registry_lock:
        running = list(_registry)
    for process in running:
        process.close()


def exiftool_json(path: str | Path, *args: str, limits: IsolationSettings | None = None) -> dict:
    """All tags exiftool reports for one file (group-0 prefixed unless `args` say otherwise, numeric values),
    {} when it reads nothing. Raises ConversionFailed when exiftool dies meanwhile or answers with something
    other than JSON: no answer, or another command's, is not 'no tags' (a rotated master would be left lying).
    `limits`: exiftool's memory and time are held to their memory_limit_mb and metadata_timeout_seconds
    (ConversionFailed past them); None: the address space its process inherits (in the conversion child, the
    child's) and its time limit (exiftool_time_limit)."""
    memory = limits.memory_limit_mb if limits else None
    timeout = exiftool_time_limit(limits)
    with _plain_name(path) as readable:
        out = _exiftool().get(memory).execute("-j", "-G0", "-n", *args, str(readable), timeout=timeout).stdout
    try:
        result = json.loads(out) if out.strip() else []
    except ValueError:
        raise ConversionFailed(f"exiftool's answer for {path} is not JSON: {out[:200]!r}") from None
    return result[0] if result else {}


def exiftool_run(*args: str) -> str:
    """Run one exiftool command, held to exiftool_time_limit; raise ConversionFailed with exiftool's own message
    when it reports an error."""
    answer = _exiftool().get().execute(*args, timeout=exiftool_time_limit())
    said = (answer.stderr or answer.stdout).strip()
    if answer.status != 0 or "Error" in answer.stderr:
        raise ConversionFailed(f"exiftool: {said.splitlines()[-1] if said else answer.status}")
    return answer.stdout


@dataclass(frozen=True)
class MetadataSummary:
    exif: bool
    xmp: bool
    iptc: bool
    orientation: int | None          # 1..8, None when absent
    orientation_invalid: object = None  # the raw value when present but not 1..8
    resolution: Resolution | None = None  # upright (see _upright), from the same read
    colour_space: int | None = None   # EXIF ColorSpace (1 sRGB, 0xFFFF Uncalibrated), colour evidence
    interop_index: str | None = None  # EXIF InteropIndex: R98 (sRGB) or R03 (Adobe RGB) by DCF


# Tags read as "family 0:family 1:name": the main image's orientation is IFD0's (or XMP-tiff's). By family 0
# alone, exiftool gives IFD1's (the thumbnail's) when IFD0 has none, and the main image would be turned by it.
_GROUPS = "-G0:1"
_ORIENTATION_TAGS = ("IFD0:Orientation", "XMP-tiff:Orientation")


def summarise(path: str | Path, limits: IsolationSettings | None = None) -> MetadataSummary:
    tags = exiftool_json(path, _GROUPS, limits=limits)
    groups = {k.split(":", 1)[0] for k in tags}
    orientation, invalid = _orientation(tags)
    return MetadataSummary(exif="EXIF" in groups, xmp="XMP" in groups, iptc="IPTC" in groups,
                           orientation=orientation, orientation_invalid=invalid, resolution=_upright(tags),
                           colour_space=tags.get("EXIF:ExifIFD:ColorSpace"),
                           interop_index=tags.get("EXIF:InteropIFD:InteropIndex"))


def _orientation(tags: dict) -> tuple[int | None, object]:
    """The orientation the conversion applies (1..8, or None), and the raw value when it is not one of those.
    `tags` as read with _GROUPS."""
    raw = tags.get("EXIF:IFD0:Orientation", tags.get("XMP:XMP-tiff:Orientation"))
    if raw is None:
        return None, None
    return (raw, None) if isinstance(raw, int) and 1 <= raw <= 8 else (None, raw)


# --- carrying metadata into the access master ------------------------------------------------------
# exiftool writes the kept tags into a 1-pixel classic-TIFF "carrier"; its IFD0 (with the EXIF, GPS and
# Interop sub-IFDs) is then transplanted into the access master's first IFD as it is written. One path
# serves classic TIFF and BigTIFF (which exiftool cannot write), and the large output is never rewritten.

_STRUCTURAL = {254, 255, 256, 257, 258, 259, 262, 263, 266, 273, 274, 277, 278, 279, 280, 281, 284,
               292, 293, 317, 320, 322, 323, 324, 325, 330, 338, 339, 340, 341, 347, 512, 513, 514, 515,
               517, 518, 519, 520, 521, 529, 530, 531, 532, 34675}
_POINTERS = {34665, 34853, 40965}  # ExifIFD, GPS IFD, Interoperability IFD
_COLOURSPACE_SRGB = ("-ExifIFD:ColorSpace#=1",)  # 1 = sRGB; '#' writes the numeric value

# Tags that describe the master's encoding (pixel size, sample layout, colour space and profile, file format).
# The access master is upright 8-bit sRGB in another format, which its own IFD0, ICC profile and file say: these
# would contradict them, so they are never carried, whatever a recipe keeps (EXIF ColorSpace is rewritten).
ENCODING_TAGS = (
    "XMP-tiff:ImageWidth", "XMP-tiff:ImageHeight", "XMP-tiff:BitsPerSample", "XMP-tiff:Compression",
    "XMP-tiff:PhotometricInterpretation", "XMP-tiff:Orientation", "XMP-tiff:SamplesPerPixel",
    "XMP-tiff:PlanarConfiguration", "XMP-tiff:YCbCrSubSampling", "XMP-tiff:YCbCrPositioning",
    "XMP-tiff:XResolution", "XMP-tiff:YResolution", "XMP-tiff:ResolutionUnit", "XMP-tiff:TransferFunction",
    "XMP-tiff:WhitePoint", "XMP-tiff:PrimaryChromaticities", "XMP-tiff:YCbCrCoefficients",
    "XMP-tiff:ReferenceBlackWhite", "XMP-tiff:NativeDigest",
    "XMP-exif:ColorSpace", "XMP-exif:ExifImageWidth", "XMP-exif:ExifImageHeight", "XMP-exif:NativeDigest",
    "XMP-photoshop:ICCProfileName", "XMP-photoshop:ColorMode", "XMP-dc:Format",
    "IFD0:TransferFunction", "IFD0:WhitePoint", "IFD0:PrimaryChromaticities",
    "ExifIFD:Gamma", "ExifIFD:ExifImageWidth", "ExifIFD:ExifImageHeight",
)
RESOLUTION_TAGS = ("IFD0:XResolution", "IFD0:YResolution", "IFD0:ResolutionUnit")


@dataclass(frozen=True)
class Resolution:
    """Pixels per unit across and down; unit as TIFF's ResolutionUnit (1 none, 2 inch, 3 centimetre)."""

    x: float
    y: float
    unit: int

    @classmethod
    def of(cls, stated: tuple[float, float, int] | None) -> Resolution | None:
        """From ImageInfo.resolution's plain tuple (models cannot import this module); None for None."""
        return cls(*stated) if stated else None

    def upright(self, orientation: int | None) -> Resolution:
        """The resolution once the orientation is applied: orientations 5-8 swap rows and columns."""
        return Resolution(self.y, self.x, self.unit) if orientation in (5, 6, 7, 8) else self

    @property
    def square(self) -> bool:
        """X and Y within 1% of each other: a difference that is rounding, not a fax's 204x98 dpi."""
        return abs(self.x - self.y) <= 0.01 * max(self.x, self.y)

    def squared(self) -> Resolution:
        """The resolution of the pixels as the conversion leaves them: non-square ones are resampled to square
        along the lower-resolution axis (colour.square_pixels), so both axes have the higher value."""
        return self if self.square else Resolution(max(self.x, self.y), max(self.x, self.y), self.unit)

    def square_size(self, width: int, height: int) -> tuple[int, int]:
        """The size of a width x height image at this resolution once its pixels are squared."""
        if self.square:
            return width, height
        return (round(width * self.y / self.x), height) if self.x < self.y else (width, round(height * self.x / self.y))

    def exiftool_args(self) -> list[str]:
        x, y, unit = RESOLUTION_TAGS
        return [f"-{x}={self.x!r}", f"-{y}={self.y!r}", f"-{unit}#={self.unit}"]


@dataclass(frozen=True)
class _ResolutionSource:
    """Where one container states the resolution (exiftool names as read with _GROUPS), and its units as TIFF
    units."""

    x: str
    y: str
    x_unit: str
    y_unit: str
    units: Callable[[object], tuple[int, float] | None]  # unit tag value -> (TIFF unit, factor), None: no unit

    def read(self, tags: dict) -> Resolution | None:
        axes = []
        for value, unit in ((tags.get(self.x), self.units(tags.get(self.x_unit))),
                            (tags.get(self.y), self.units(tags.get(self.y_unit)))):
            if not isinstance(value, (int, float)) or value <= 0 or unit is None:
                return None
            axes.append((value * unit[1], unit[0]))
        (x, x_unit), (y, y_unit) = axes
        return Resolution(x, y, x_unit) if x_unit == y_unit else None


# First to last, as libvips reads a JPEG (EXIF over JFIF). JFIF and PNG unit 0 state an aspect ratio only.
_RESOLUTION_SOURCES = (
    _ResolutionSource("EXIF:IFD0:XResolution", "EXIF:IFD0:YResolution", "EXIF:IFD0:ResolutionUnit",
                      "EXIF:IFD0:ResolutionUnit",
                      {None: (2, 1.0), 1: (1, 1.0), 2: (2, 1.0), 3: (3, 1.0)}.get),  # absent: inches (TIFF)
    _ResolutionSource("JFIF:XResolution", "JFIF:YResolution", "JFIF:ResolutionUnit", "JFIF:ResolutionUnit",
                      {1: (2, 1.0), 2: (3, 1.0)}.get),
    _ResolutionSource("PNG:PNG-pHYs:PixelsPerUnitX", "PNG:PNG-pHYs:PixelsPerUnitY", "PNG:PNG-pHYs:PixelUnits",
                      "PNG:PNG-pHYs:PixelUnits",
                      {1: (3, 0.01)}.get),  # per metre
    _ResolutionSource("Jpeg2000:CaptureXResolution", "Jpeg2000:CaptureYResolution",  # per 10^-unit metre
                      "Jpeg2000:CaptureXResolutionUnit", "Jpeg2000:CaptureYResolutionUnit",
                      lambda e: (3, 10.0 ** (e - 2)) if isinstance(e, int) and -10 <= e <= 10 else None),
)
def _upright(tags: dict) -> Resolution | None:
    """The master's resolution from whichever container states it (`tags` as read with _GROUPS), turned as its
    pixels are; None when none does (no resolution is better than a made-up one)."""
    stated = next((r for r in (s.read(tags) for s in _RESOLUTION_SOURCES) if r is not None), None)
    return stated.upright(_orientation(tags)[0]) if stated else None


# exiftool names of the structural entries above (they describe the file, not the image).
STRUCTURAL_NAMES = {"SubfileType", "OldSubfileType", "ImageWidth", "ImageHeight", "BitsPerSample", "Compression",
                    "PhotometricInterpretation", "Thresholding", "FillOrder", "StripOffsets", "Orientation",
                    "SamplesPerPixel", "RowsPerStrip", "StripByteCounts", "PlanarConfiguration", "Predictor",
                    "TileWidth", "TileLength", "TileOffsets", "TileByteCounts", "SubIFD", "ExtraSamples",
                    "SampleFormat", "JPEGTables", "ColorMap", "YCbCrCoefficients", "YCbCrSubSampling",
                    "YCbCrPositioning", "ReferenceBlackWhite", "CellWidth", "CellLength", "T4Options",
                    "T6Options", "Software", "ColorSpace", "XMPToolkit"}


@dataclass(frozen=True)
class Carried:
    """The IFD entries to transplant, and the values exiftool reads from them (what verification expects)."""

    tags: list
    values: dict


def selection(keep: tuple[str, ...], exclude: tuple[str, ...]) -> list[str]:
    """exiftool arguments selecting the kept tags, and with IPTC its CodedCharacterSet.

    exiftool marks CodedCharacterSet 'unsafe': IPTC:all does not copy it, and -TagsFromFile then writes the IPTC
    text in exiftool's default IPTC charset, Latin ('Café 東京' arrives as 'Café ??'). Copied with the text, it
    makes exiftool write back the bytes it read, in any charset. It is left out when every kept entry names
    another group, or it would make an IPTC record of its own (deciding from the names costs no exiftool read).
    ENCODING_TAGS are excluded always."""
    charset = [] if all(_other_group(tag) for tag in keep) else ["-IPTC:CodedCharacterSet"]
    return [f"-{tag}" for tag in keep] + charset + [f"--{tag}" for tag in (*exclude, *ENCODING_TAGS)]


def _other_group(tag: str) -> bool:
    """True when an exiftool tag or group name ('EXIF:all', '1XMP-dc:Title') cannot select IPTC tags."""
    group = tag.rpartition(":")[0]
    return bool(group) and group.lstrip("0123456789").lower() not in ("iptc", "all", "*")


def keeps_all_xmp(keep: tuple[str, ...]) -> bool:
    """True when a kept entry selects every XMP tag, so the XMP packet can travel whole.

    Copied tag by tag, XMP loses what exiftool has no table for (an in-house namespace) and moves tags into
    their preferred namespace (XMP-pdf:Title into XMP-dc:Title). Whole: 'all' or '*' with no group or with
    groups that are each XMP (family 0, or no family number) or all ('XMP:all', 'all:all', '0XMP:*', 'all'),
    and 'XMP', the block itself. 'XMP-dc:all' or a family-2 group ('Author:all') selects part of it."""
    for entry in keep:
        *groups, name = entry.lower().split(":")
        whole_group = all(g in ("xmp", "0xmp") or g.lstrip("0123456789") in ("all", "*") for g in groups)
        if whole_group and name in ("all", "*", "xmp"):
            return True
    return False


# Family 0 and 1 groups that hold no XMP tag: an excluded entry naming one deletes nothing from the XMP, and
# asking exiftool to look ('XMP:MakerNotes:all=') costs ~0.3 s of loading every tag table. A group not listed
# is looked in (a family-2 group such as Author holds XMP tags too): slower, never an excluded tag carried.
_NOT_XMP_GROUPS = frozenset({
    "exif", "ifd0", "ifd1", "exififd", "gps", "interopifd", "subifd", "globparamifd", "makernotes", "iptc",
    "icc_profile", "photoshop", "jfif", "png", "jpeg2000", "adobe", "printim", "file", "composite", "exiftool",
})


def _xmp_edits(exclude: tuple[str, ...]) -> list[str]:
    """exiftool arguments deleting, from XMP carried whole, what a tag-by-tag copy would leave out: the XMP
    ENCODING_TAGS and the excluded entries that can select XMP tags, confined to XMP ('Orientation' as
    'XMP:Orientation', 'Author:all' as 'XMP:Author:all'). ForceWrite: exiftool keeps a packet it did not change
    byte for byte, and a master's may not be well-formed XML as it stands (a JPEG's may end in a NUL byte),
    which the JP2 validator rejects; rewritten, it is exiftool's own XML."""
    deleted = []
    for tag in (*exclude, *(t for t in ENCODING_TAGS if t.lower().startswith("xmp"))):
        groups = [g.lstrip("0123456789").lower() for g in tag.split(":")[:-1]]
        if not _NOT_XMP_GROUPS.intersection(groups):
            deleted.append(f"-{tag}=" if groups and groups[0].startswith("xmp") else f"-XMP:{tag}=")
    return deleted + ["-ForceWrite=XMP"]


def carrier_copy(carrier: Path, keep: tuple[str, ...], exclude: tuple[str, ...]) -> list[str]:
    """exiftool arguments copying a carrier's kept tags: its XMP as a block (it holds the kept XMP only, encoding
    and excluded tags already deleted, in its original namespaces), the rest tag by tag. None when nothing is
    kept: a -TagsFromFile list of exclusions alone copies every tag but those."""
    if not keep:
        return []
    return ["-TagsFromFile", str(carrier), "-XMP", "-TagsFromFile", str(carrier), *selection(keep, exclude),
            "--XMP:all"]


def write_carrier(master: ImageInfo, keep: tuple[str, ...], exclude: tuple[str, ...], carrier: Path) -> Path:
    """A 1-pixel classic TIFF holding the kept tags of the master (as inspection described it) as exiftool
    normalises them, ColorSpace = sRGB, and the master's resolution (upright, as inspection read it from the
    master itself, whose classic view has no Orientation; squared as its pixels are) whatever the recipe keeps: it
    belongs to the pixels, as their size does. The carrier starts without one, so a master without a resolution
    gets none.

    When the recipe keeps all of XMP (keeps_all_xmp), the master's packet is put into the carrier as it is and
    the tags a tag-by-tag copy would leave out are deleted from it in the same exiftool command: deletions edit
    the packet in place, keeping unknown namespaces (a packet *copied* as a block in that command would be
    written verbatim, the deletions ignored). A JPEG's extended XMP (beyond its 64 KB segment) is not in the
    packet: its tags are copied tag by tag into their own namespaces."""
    resolution = Resolution.of(master.resolution)
    whole = keeps_all_xmp(keep)
    with classic_view(master.path) as source:  # a BigTIFF master loses UNDEFINED tags otherwise (see classic_view)
        raw = _raw_values(source, "IFD0:ImageDescription", *(("XMP",) if whole else ()))
        packet = raw.get("XMP:XMP")
        _classic_copy([tiff.Tag(700, tiff.BYTE, packet)] if packet else [], carrier)
        xmp = ["--XMP:all"] if whole else []
        if packet and b"HasExtendedXMP" in packet:
            xmp += ["-TagsFromFile", str(source), "-all:all<XMP:all"]
        # keep: [] copies nothing: -TagsFromFile naming no tag would copy every one (File:System names included)
        copy = ["-TagsFromFile", str(source), *selection(keep, exclude),
                *_storage_description(raw.get("EXIF:ImageDescription"))] if keep else []
        exiftool_run("-m", "-q", "-n", "-overwrite_original", *copy, *xmp,
                     *(_xmp_edits(exclude) if packet else ()), *_COLOURSPACE_SRGB,
                     *(resolution.squared().exiftool_args() if resolution else ()), str(carrier))
    return carrier


def _raw_values(source: Path, *tags: str) -> dict[str, bytes]:
    """`tags` (-G0 names) as the file holds them: exiftool -b gives text as it is, anything else as base64."""
    values = exiftool_json(source, "-b", *(f"-{tag}" for tag in tags))
    return {k: base64.b64decode(v[len("base64:"):]) if v.startswith("base64:") else v.encode()
            for k, v in values.items() if k != "SourceFile" and isinstance(v, str)}


# An ImageDescription that describes how the master's file stores its pixels: ImageJ's header ('ImageJ=...'),
# tifffile's JSON ({"shape": ...}), OME-XML. Readers that trust it (tifffile, ImageJ, Bio-Formats) read the access
# master's pyramid by the master's layout ("incompatible keyframe"): it is encoding, as ENCODING_TAGS are.
_STORAGE_DESCRIPTION = re.compile(rb'\s*(ImageJ=|\{\s*"shape"\s*:|(<\?xml[^>]*\?>\s*)?<OME[\s>])')


def _storage_description(text: bytes | None) -> tuple[str, ...]:
    """The exiftool argument leaving out the master's IFD0 ImageDescription when it is a storage description;
    an ordinary description (a caption) is carried as any kept tag is."""
    return ("--IFD0:ImageDescription",) if text and _STORAGE_DESCRIPTION.match(text) else ()


def carried_tags(master: ImageInfo, keep: tuple[str, ...], exclude: tuple[str, ...], scratch: Path) -> Carried:
    """IFD entries holding the master's kept metadata (see write_carrier), with ExifIFD ColorSpace = sRGB."""
    carrier = write_carrier(master, keep, exclude, Path(scratch) / "metadata-carrier.tif")
    try:
        with open(carrier, "rb") as f:
            tags = read_ifd0_tags(f)
        return Carried(tags=tags, values=kept_tag_values(carrier, keep, exclude))
    finally:
        carrier.unlink(missing_ok=True)


def read_ifd0_tags(f: BinaryIO) -> list:
    """The non-structural entries of a TIFF's (classic or BigTIFF) first IFD, sub-IFDs followed, as tiff.Tag
    objects. Only the IFDs are read: the file may be an access master of many gigabytes."""
    f.seek(0)
    header = f.read(16)
    order = "<" if header[:2] == b"II" else ">"
    big = struct.unpack(order + "H", header[2:4])[0] == 43
    word, inline = ("Q", 8) if big else ("I", 4)  # counts and offsets; the bytes of a value held in an entry
    (first,) = struct.unpack(order + word, header[8:16] if big else header[4:8])
    count_fmt, entry_fmt = order + ("Q" if big else "H"), order + "HH" + word

    def read(offset: int, depth: int) -> list:
        f.seek(offset)
        (n,) = struct.unpack(count_fmt, f.read(struct.calcsize(count_fmt)))
        entry_size = struct.calcsize(entry_fmt) + inline
        block = f.read(n * entry_size)
        tags = []
        for at in range(0, n * entry_size, entry_size):
            code, typ, count = struct.unpack(entry_fmt, block[at:at + entry_size - inline])
            if code in _STRUCTURAL or typ not in tiff.TYPES:
                continue
            size = tiff.field_size(typ, count)
            field = block[at + entry_size - inline:at + entry_size]
            if size <= inline:
                raw = field[:size]
            else:
                f.seek(struct.unpack(order + word, field)[0])
                raw = f.read(size)
            values = tiff.decode_values(typ, raw, order)
            if code in _POINTERS:
                if depth < 2:
                    tags.append(tiff.Tag(code, tiff.LONG, sub_ifd=read(values[0], depth + 1)))
                continue
            tags.append(tiff.Tag(code, typ, values))
        return tags

    return read(first, 0)


def kept_tag_values(path: str | Path, keep: tuple[str, ...], exclude: tuple[str, ...]) -> dict:
    """Tag -> value of the kept, non-structural metadata of a file, as exiftool reads it (see tag_values); none
    when nothing is kept (a read naming no tag would give every tag, File:System names included)."""
    if not keep:
        return {}
    tags = tag_values(path, *selection(keep, exclude))
    return {k: v for k, v in tags.items() if k != "SourceFile" and k.rpartition(":")[2] not in STRUCTURAL_NAMES}


def tag_values(path: str | Path, *args: str) -> dict:
    """Every tag exiftool reads (-a), named by family 0 and 1 groups ('XMP:XMP-pdf:Title'): by
    family 0 alone, same-named tags of different groups (XMP-dc:Title, XMP-pdf:Title) were one key and one of
    them went unseen. A BigTIFF's metadata is read as exiftool reads it from a classic TIFF (see classic_view)."""
    with classic_view(path) as readable:
        return exiftool_json(readable, _GROUPS, "-a", *args)


@contextmanager
def classic_view(path: str | Path) -> Iterator[Path]:
    """The file, or for a BigTIFF a 1-pixel classic TIFF holding its first IFD's metadata (sub-IFDs included).

    exiftool's BigTIFF reader ignores the formats its EXIF tables give UNDEFINED tags: bytes that read as
    ComponentsConfiguration '1 2 3 0' and FileSource 3 in a classic TIFF come back as the strings
    '\\x01\\x02\\x03' and '\\x03', and -TagsFromFile drops SceneType. The same bytes in a classic TIFF are
    read, and copied, as from any other master."""
    try:
        with open(path, "rb") as f:
            tags = read_ifd0_tags(f) if f.read(4) in (b"II+\0", b"MM\0+") else None
    except (OSError, struct.error):  # unreadable: exiftool says what it can read, as for any file
        tags = None
    if tags is None:
        with _plain_name(path) as readable:
            yield readable
        return
    with tempfile.TemporaryDirectory(prefix="gcis-metadata-") as scratch:
        yield _classic_copy(tags, Path(scratch) / "ifd0.tif")


@contextmanager
def _plain_name(path: str | Path) -> Iterator[Path]:
    """The file under a name exiftool's input can carry: -stay_open reads one argument per line, so a name with a
    line break (a scanner's, a typo in a script) would reach it as two arguments. Such a file is read through a
    symbolic link in a private temporary folder; any other is its own name."""
    if not {"\n", "\r"} & set(str(path)):
        yield Path(path)
        return
    with tempfile.TemporaryDirectory(prefix="gcis-metadata-") as folder:
        link = Path(folder, "file" + "".join(c for c in Path(path).suffix if c not in "\r\n"))
        link.symlink_to(Path(path).absolute())
        yield link


def _classic_copy(tags: list, path: Path) -> Path:
    """A 1-pixel classic TIFF whose first IFD holds `tags`."""
    with open(path, "wb") as f:
        writer = tiff.TiffFileWriter(f)
        writer.start()
        pixel = writer.append(b"\0\0\0")
        image = [tiff.Tag(256, tiff.LONG, (1,)), tiff.Tag(257, tiff.LONG, (1,)), tiff.Tag(258, tiff.SHORT, (8, 8, 8)),
                 tiff.Tag(262, tiff.SHORT, (2,)), tiff.Tag(273, tiff.LONG, (pixel,)), tiff.Tag(277, tiff.SHORT, (3,)),
                 tiff.Tag(279, tiff.LONG, (3,))]
        writer.finish([image + tags])
    return path
