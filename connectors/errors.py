"""What can go wrong in a source, by what the operator must do about it.

All are SourceError (gcis_etl.errors): the pipeline can treat a source failure as one kind and
still tell a wrong password from an outage. Messages never carry credentials.
"""
from __future__ import annotations

from gcis_etl.errors import SourceError


class SourceUnavailable(SourceError):
    """Transient failures (connection, timeout, 429, 5xx, cut transfers) outlasted the retry policy; try later."""


class AuthenticationFailed(SourceError):
    """The source refused the credentials (HTTP 401, failed login): fix the configuration; retrying will not help."""


class PermissionDenied(SourceError):
    """The credentials are valid but may not do this (HTTP 403): ask the source's administrators for the role."""


class ObjectNotFound(SourceError):
    """An object or item named explicitly does not exist in the source (or is not visible to this user)."""


class SourceRequestFailed(SourceError):
    """The source answered with an error that retrying will not fix (4xx other than 401/403/429)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class SourceDataError(SourceError):
    """The source answered, but its document is not what the connector expects (bad XML/JSON, missing field)."""


class FetchIntegrityError(SourceError):
    """Downloaded bytes kept disagreeing with the size or fixity the source announced: never handed on."""


class TransferInterrupted(SourceError):
    """A body stopped early or the connection dropped mid-transfer; the fetch loop retries it."""


class RetryStopped(SourceError):
    """A wait before retrying ended early: the run was asked to stop (retry.waits_end_when), which must not wait
    out a Retry-After or a backoff first. Not the source's failure: the run ends as a stopped run does."""


# What describing one object can raise and still be that object's failure alone: the object is reported, and
# the listing goes on (connectors.base.unreadable: an outage, SourceUnavailable, only while the source answers
# otherwise; refused credentials never).
DESCRIBE_ERRORS = (ObjectNotFound, SourceDataError, SourceRequestFailed, SourceUnavailable)
