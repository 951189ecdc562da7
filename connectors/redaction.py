"""Keeping credentials out of log lines and exception text.

Three defences: URLs lose their user-info and the values of query parameters that look secret;
every string a connector registered as secret (password, Basic header, session token) is replaced
wherever it appears, encoded or not; and urllib3's DEBUG request lines, which carry query strings,
go through the same scrubbing (a filter installed on its logger when this module is imported).
The registry is process-wide: a secret is a secret whichever connector met it.
"""
from __future__ import annotations

import logging
import re
import threading
from typing import Annotated
from urllib.parse import quote, quote_plus, urlsplit, urlunsplit

from pydantic import BeforeValidator, SecretStr

from gcis_etl.settings import Deferred

MASK = "***"

_SECRET_PARAM = re.compile(
    r"pass|pwd|secret|token|auth|api_?key|signature|credential|session|pds_handle|ticket|digest|x-amz-",
    re.IGNORECASE)
_QUERY_PAIR = re.compile(r"(?<=[?&])([^=&\s\"'#]+)=([^&\s\"'#]*)")
_secrets: set[str] = set()
_lock = threading.Lock()


def register(*secrets: str | None) -> None:
    """Remember credentials (and their URL-encoded forms) so that scrub() removes them."""
    with _lock:
        for secret in secrets:
            if secret and len(secret) >= 3:
                _secrets.update({secret, quote(secret, safe=""), quote_plus(secret)})


def scrub(text: str) -> str:
    """Text with registered secrets and the values of secret-looking query parameters masked."""
    with _lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for secret in secrets:
        text = text.replace(secret, MASK)
    return _QUERY_PAIR.sub(lambda m: f"{m.group(1)}={MASK}" if _SECRET_PARAM.search(m.group(1)) else m.group(0), text)


def scrub_url(url: str) -> str:
    """A URL fit for a message: no user-info, secret-looking parameters and registered secrets masked."""
    parts = urlsplit(url)
    return scrub(urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, parts.query, "")))


class _ScrubbingFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = scrub(message)
        if clean != message:
            record.msg, record.args = clean, ()
        return True


logging.getLogger("urllib3.connectionpool").addFilter(_ScrubbingFilter())


def _secret_text(value: object) -> object:
    """Accept YAML scalars as text, and refuse a `${VAR}` that nobody interpolated (never echoing values); one
    the config loader deferred passes its check of config.yaml (opening the source fills it in, or fails)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, str) and not isinstance(value, Deferred) and _UNINTERPOLATED.fullmatch(value.strip()):
        raise ValueError("still holds a ${VAR} reference: load the configuration through the config loader, "
                         "which takes secrets from the environment")
    return value


_UNINTERPOLATED = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}")

Secret = Annotated[SecretStr, BeforeValidator(_secret_text)]
"""A credential in settings: written `${ENV_VAR}` in config.yaml, held as SecretStr, shown as '**********'."""
