"""Records that flow between the imaging stages and out to callers (CLI, pipeline, Celery tasks)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum


class Verdict(str, Enum):
    """What policy makes of a master (ImageInfo.verdict): accepted as it is, accepted once converted (a colour
    space, depth or layout the access master changes), rejected (ImageInfo.reasons say why), or not checked (its
    full decode ran out of memory or time: no verdict on the master itself)."""

    ACCEPT = "accept"
    ACCEPT_AFTER_CONVERSION = "accept-after-conversion"
    REJECT = "reject"
    NOT_CHECKED = "not-checked"  # the full decode ran out of memory or time under the isolation limits


@dataclass(frozen=True)
class ImageInfo:
    """What the header of a master says, and what policy makes of it (no pixel was decoded to get this)."""

    path: str
    format: str
    width: int | None = None
    height: int | None = None
    bands: int | None = None
    bit_depth: int | None = None
    sample_format: str | None = None      # uint | int | float
    interpretation: str | None = None     # rgb | grey | cmyk | lab | ycbcr | palette | bilevel | multiband
    icc: str | None = None                # ICC profile description
    pages: int | None = None              # full-resolution images; reduced-resolution IFDs are not pages
    exif: bool = False
    xmp: bool = False
    iptc: bool = False
    orientation: int = 1
    resolution: tuple[float, float, int] | None = None  # upright X, Y pixels per unit, TIFF unit; None: unstated
    alpha: bool = False                   # first extra band is alpha
    extra_bands: int = 0                  # bands beyond the colour ones (alpha included)
    compression: str | None = None
    whole_slide: bool = False
    verdict: Verdict = Verdict.REJECT
    reasons: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["verdict"] = self.verdict.value
        d["reasons"] = list(self.reasons)
        d["warnings"] = list(self.warnings)
        return d


class Status(str, Enum):
    """How a conversion ended (ConversionResult.status): converted (the output verified and in place), rejected
    (the master breaks policy or cannot be decoded: trying again changes nothing) or failed (anything else: a
    limit, a crash, the disk; trying again may succeed). The values are what the CLI prints and the JSON holds."""

    CONVERTED = "converted"
    REJECTED = "rejected"
    FAILED = "failed"


@dataclass(frozen=True)
class Level:
    width: int
    height: int


@dataclass(frozen=True)
class ConversionResult:
    """Outcome of one master: converted (output verified and in place), rejected (policy) or failed; `disk_full`:
    failed because a filesystem it writes refused (errors.DiskFull), `cannot_start`: because no conversion process
    could be started (isolation.CannotStart), neither of which is the master's failure."""

    status: Status
    source: str
    output: str | None = None
    reason: str | None = None
    recipe: str | None = None
    recipe_digest: str | None = None
    width: int | None = None
    height: int | None = None
    levels: int | None = None
    bytes: int | None = None
    sha256: str | None = None
    seconds: float = 0.0
    decoder: str | None = None
    peak_rss_mb: float | None = None  # of the (reused) conversion process, or an encoder it ran, so far
    warnings: tuple[str, ...] = ()
    info: ImageInfo | None = None
    disk_full: bool = False
    cannot_start: bool = False

    @property
    def ok(self) -> bool:
        return self.status is Status.CONVERTED

    def to_dict(self) -> dict:
        d = asdict(self)
        d["status"] = self.status.value
        d["warnings"] = list(self.warnings)
        d["info"] = self.info.to_dict() if self.info else None
        return d


def item_label(object_id: str, item_id: str) -> str:
    """An item as logs, progress lines and reports name it for people: `object/item`, or the item id alone when it
    starts with its object's id and a slash already (a filesystem source's `obj02/p00.jpg` of object `obj02`: not
    `obj02/obj02/p00.jpg`); a DAM's ids stay joined (`IE123/FL456`). For people only: provenance, store keys, the
    ledger and JSON fields keep the two ids as they are."""
    return item_id if item_id.startswith(f"{object_id}/") else f"{object_id}/{item_id}"


def pyramid_levels(count: int, jp2: bool = False) -> str:
    """A pyramid's size for people; a JP2's as JPEG 2000 counts it: its recipe's `levels` are wavelet levels, one
    fewer than its resolutions (the pyramid levels a PTIFF would have)."""
    return f"{count} resolutions ({count - 1} wavelet levels)" if jp2 else f"{count} level{'s' if count > 1 else ''}"


@dataclass(frozen=True)
class VerifyReport:
    """Whether a file meets the access-master contract; errors fail it, warnings do not."""

    path: str
    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    width: int | None = None
    height: int | None = None
    levels: tuple[Level, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return not self.errors

    def summary(self, jp2: bool = False) -> str:
        """One line for people: the size and levels only as far as the file could be read (a file that is not a
        TIFF at all has neither)."""
        found = [f"{self.width}x{self.height}"] if self.width is not None and self.height is not None else []
        found += [pyramid_levels(len(self.levels), jp2)] if self.levels else []
        return ", ".join([f"{self.path}: {'valid' if self.ok else 'NOT a valid'} access master", *found])

    def to_dict(self) -> dict:
        return {"path": self.path, "valid": self.ok, "errors": list(self.errors), "warnings": list(self.warnings),
                "width": self.width, "height": self.height,
                "levels": [[lv.width, lv.height] for lv in self.levels]}
