"""Keeping credentials out of log lines and exception text.

Three defences: URLs lose their passwords and the values of query parameters that look secret (by
gcis_etl.settings.redacted, the rule printed settings follow too); every string a connector registered as
secret (password, Basic header, session token, whatever the environment filled into its settings) is
replaced wherever it appears, encoded or not; and log lines go through the same scrubbing (ScrubbingFilter:
on urllib3's request logger when this module is imported, on every handler gcis_etl.logs sets up). The
registry is process-wide: a secret is a secret whichever connector met it.

Where a credential must not go at all: a SourceItem.locator, which travels in Celery task messages (the
broker, `celery inspect`, task events, a worker's DEBUG log). A locator holds no user-info
(HttpSession.credential_free) and no secret parameter: both are added when the item is fetched.
"""
from __future__ import annotations

import logging
import re
import threading
from typing import Annotated, Any, Iterable, Iterator
from urllib.parse import quote, quote_plus, unquote, urlsplit, urlunsplit

from pydantic import BaseModel, BeforeValidator, SecretStr

from gcis_etl.settings import Deferred, FromEnvironment, Settings, annotation_types, redacted

MASK = "***"

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_secrets: set[str] = set()
_lock = threading.Lock()


def register(*secrets: str | None) -> None:
    """Remember credentials (and their URL-encoded forms) so that scrub() removes them."""
    with _lock:
        for secret in secrets:
            if secret and len(secret) >= 3:
                _secrets.update({secret, quote(secret, safe=""), quote_plus(secret)})


def register_environment(settings: Settings) -> None:
    """Register what the environment filled into a source's settings (config.yaml's ${VAR}s, validated by
    gcis_etl.settings.parse): put there for being secret, whatever its key (`code:` under delivery_params as
    much as `password:`). Of a URL only its password, so that messages keep naming the host; a value
    validation turned into a number or a switch (verify_tls: ${VERIFY}) is no secret."""
    texts = set(_texts(settings))
    for value in settings.from_environment & texts:
        register(unquote(urlsplit(value).password or "") if _URL.match(value) else value)


def _texts(value: Any) -> Iterator[str]:
    """Every string of validated settings, secret ones included."""
    if isinstance(value, BaseModel):
        value = dict(value)
    if isinstance(value, SecretStr):
        yield value.get_secret_value()
    elif isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _texts(item)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            yield from _texts(item)


def scrub(text: str) -> str:
    """Text with registered secrets, URLs' passwords and the values of secret-named query parameters masked
    (gcis_etl.settings.redacted: the one rule of what looks secret)."""
    with _lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for secret in secrets:
        text = text.replace(secret, MASK)
    return redacted(text, MASK)


def scrub_url(url: str) -> str:
    """A URL fit for a message: no user-info, secret-looking parameters and registered secrets masked."""
    parts = urlsplit(url)
    return scrub(urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, parts.query, "")))


class ScrubbingFilter(logging.Filter):
    """Log records with their message and their traceback scrubbed (on a handler: every record it writes,
    whichever logger): an exception's text quotes whatever its raiser put in it (a connector's KeyError, a
    token). The traceback is formatted here, as logging.Formatter would, into the exc_text formatters write."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = scrub(message)
        if clean != message:
            record.msg, record.args = clean, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = _FORMATTER.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub(record.exc_text)
        return True


_FORMATTER = logging.Formatter()


logging.getLogger("urllib3.connectionpool").addFilter(ScrubbingFilter())


def _secret_text(value: object) -> object:
    """Accept YAML scalars as text, and refuse a `${VAR}` that nobody interpolated (never echoing values); one
    the config loader deferred passes its check of config.yaml (opening the source fills it in, or fails)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, str) and not isinstance(value, Deferred) and _UNINTERPOLATED.fullmatch(value.strip()):
        raise ValueError("still holds a ${VAR} reference: load the configuration through the config loader, "
                         "which takes secrets from the environment")
    return value


def written_secrets(model: type[BaseModel], options: Any, where: str) -> Iterator[str]:
    """The key paths (under `where`) of `model`'s credentials (its Secret fields) that `options`, a source's settings
    as config.yaml holds them once its ${VAR}s are filled in, writes out instead of taking from the environment:
    the file is read by whoever may read it, and copied into backups and tickets."""
    if not isinstance(options, dict):
        return
    for name, field in model.model_fields.items():
        key = field.alias or name
        value = options.get(key)
        arms = list(annotation_types(field.annotation))
        if SecretStr in arms and value not in (None, "") and not isinstance(value, (FromEnvironment, Deferred)):
            yield f"{where}.{key}"
        for arm in arms:
            if isinstance(arm, type) and issubclass(arm, BaseModel):
                yield from written_secrets(arm, value, f"{where}.{key}")


def credential_keys(settings: Settings, fields: Iterable[str] | None = None, *,
                    where: str = "source") -> tuple[str, ...]:
    """The keys (under `where`) of the credentials `settings` authenticates with, for a refusal to name what to fix,
    never their values: `fields`, those its configured auth uses (its settings know: OTMM's `auth: oauth` adds
    client_id and client_secret), else each Secret field set (not a `username` field: an auth mode by token has
    none to send); "from the environment" when a ${VAR} filled it in (what cron's environment exports)."""
    model_fields = type(settings).model_fields
    if fields is None:
        fields = [name for name in model_fields if isinstance(getattr(settings, name), SecretStr)]
    keys = []
    for name in fields:
        value = getattr(settings, name)
        text = value.get_secret_value() if isinstance(value, SecretStr) else value
        filled = isinstance(text, str) and text in settings.from_environment
        keys.append(f"{where}.{model_fields[name].alias or name}{' from the environment' if filled else ''}")
    return tuple(keys)


_UNINTERPOLATED = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}")

Secret = Annotated[SecretStr, BeforeValidator(_secret_text)]
"""A credential in settings: written `${ENV_VAR}` in config.yaml, held as SecretStr, shown as '**********'."""
