"""Exception hierarchy: every failure a curator or operator can see has a class and a one-line reason."""


class GcisError(Exception):
    """Base of every error raised on purpose by gcis-etl."""


class ConfigError(GcisError):
    """Configuration or recipe file is invalid; the message names the file, the key and what was expected."""


class RejectedMaster(GcisError):
    """The master is not acceptable by policy (format, size, pages, corrupt data); retrying will not help."""


class ConversionFailed(GcisError):
    """The conversion could not complete (decoder crash, timeout, encoder error); a retry may help."""


class DiskFull(ConversionFailed):
    """A filesystem the conversion writes (its scratch, the output's folder) is full, over its quota or read-only:
    not the master's fault, and every conversion there would fail alike until someone makes room."""


class VerificationFailed(ConversionFailed):
    """The output was produced but does not meet the access-master contract."""


class StoreError(GcisError):
    """A store operation failed (including integrity mismatches)."""


class StoreUnavailable(StoreError):
    """The store takes no deposit now (unreachable past its retries, its disk full): every item would fail
    alike, so a run stops rather than spend each item's attempts."""


class StoreFull(StoreUnavailable):
    """The store takes no more data: its disk full, a quota reached."""


class StoreRefused(StoreError):
    """The store refuses this client what every deposit needs (its credentials or bucket policy, an expired token,
    an endpoint whose certificate is not trusted; a local store's filesystem mounted read-only): every item would fail alike, so a run stops rather than spend
    each item's attempts. No outage: it lasts until someone changes the configuration."""


class IntegrityError(StoreError):
    """A checksum or size did not match: the data is not what was sent or announced."""


class SourceError(GcisError):
    """A source connector could not list or fetch; the message never carries credentials."""


class ManifestError(GcisError):
    """A IIIF manifest could not be built or failed validation; the message names what is wrong."""


class VersionSkew(GcisError):
    """A task or an outcome written by another version of gcis-etl than the one reading it (a pool half upgraded):
    not the item's failure; the message names the fields that differ."""
