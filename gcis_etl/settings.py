"""Validation of YAML-backed settings: every error names the file, the key path and what was expected."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError

from gcis_etl.errors import ConfigError

M = TypeVar("M", bound=BaseModel)

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# A name whose value is a credential: a settings key, an environment variable, a header or a query parameter
# (OTMM's session_id, Rosetta's pds_handle, a presigned URL's X-Amz-*). Masks `auth: session` too: more than
# needed, never less.
_SECRET_NAME = re.compile(r"pass|pwd|secret|token|credential|(api|access)[_-]?key|auth|cookie|signature|session"
                         r"|pds_handle|ticket|digest|x-amz-", re.IGNORECASE)
_SCHEME = r"[A-Za-z][A-Za-z0-9+.-]*://"
# A URL in a text ends at a blank, a quote or a ';' that starts the next URL of a list.
_URL = re.compile(rf"{_SCHEME}(?:[^\s\"'<>;]|;(?!{_SCHEME}))*")
_QUERY_PAIR = re.compile(rf"((?<=[?&])([^=&\s\"'#;]+)=)((?:[^&\s\"'#;]|;(?!{_SCHEME}))*)")
_MIN_SECRET = 4  # shorter environment values ("0", "yes") are no secrets; masked everywhere, they hide settings
_MASK = "********"


class Settings(BaseModel):
    """Base of every settings model: unknown keys are errors (a typo must not be silently ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    _from_environment: frozenset[str] = PrivateAttr(frozenset())

    @property
    def from_environment(self) -> frozenset[str]:
        """The strings ${NAME} filled into the data `parse` validated (environment_values): secrets, whatever
        their key, for whoever must keep them out of messages (connectors.redaction.register_environment)."""
        return self._from_environment


def read_yaml(path: str | Path) -> Any:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML{_where(exc)}") from None


def _where(exc: yaml.YAMLError) -> str:
    """Where the YAML breaks and why, without PyYAML's snippet of the line: that may be a password."""
    mark = getattr(exc, "problem_mark", None)
    problem = "; ".join(filter(None, (getattr(exc, "context", None), getattr(exc, "problem", None))))
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{at}: {problem}" if problem else at


class FromEnvironment(str):
    """A value that ${NAME} filled in: the environment holds the secrets, so an error never shows it,
    whatever the key it was put under (a misspelt `passwd:` is not secret-named). `secrets`: what the
    secret-named variables in it (or all of them, under a secret-named key) put there."""

    secrets: frozenset[str] = frozenset()


class Deferred(str):
    """A string whose ${NAME} was not set when the configuration was read, kept as written: what it
    configures fills it in when opened (connectors.open_source), and fails then, naming the key."""


def interpolate_env(value: Any, where: str = "", deferred: re.Pattern | None = None) -> Any:
    """Replace ${NAME} with the environment variable NAME; a missing variable is a ConfigError, but under a
    key path `deferred` matches, where the string is kept as Deferred (a pipeline's source: commands that only
    read the ledger need no DAM password). A value filled in already is not filled in again (an environment
    value may hold a literal ${...})."""
    if isinstance(value, FromEnvironment):
        return value
    if isinstance(value, str) and _ENV_REF.search(value):
        secrets = set()
        if deferred is not None and deferred.match(where) and any(
                name not in os.environ for name in _ENV_REF.findall(value)):
            return Deferred(value)

        def sub(match: re.Match) -> str:
            name = match.group(1)
            if name not in os.environ:
                raise ConfigError(f"{where}: environment variable {name} is not set")
            if len(os.environ[name]) >= _MIN_SECRET and (_SECRET_NAME.search(name) or _SECRET_NAME.search(where)):
                secrets.add(os.environ[name])
            return os.environ[name]
        filled = FromEnvironment(_ENV_REF.sub(sub, value))
        filled.secrets = frozenset(secrets)
        return filled
    if isinstance(value, dict):
        return {k: interpolate_env(v, f"{where}.{k}" if where else str(k), deferred) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate_env(v, f"{where}[{i}]", deferred) for i, v in enumerate(value)]
    return value


def parse(model: type[M], data: Any, source: str, prefix: str = "") -> M:
    """Validate `data` as `model`; on failure raise ConfigError listing `source: key.path: problem (got ...)`."""
    try:
        settings = model.model_validate(data if data is not None else {})
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            key = ".".join(str(p) for p in (prefix, *_written(err["loc"], data)) if p != "")
            got = err.get("input")
            secret = _hidden_input(err)
            if isinstance(got, FromEnvironment):
                shown = " (got a value from the environment, not shown)"
            elif err["type"] == "missing" or isinstance(got, dict) or secret:
                shown = ""
            else:
                shown = f" (got {redacted(got) if isinstance(got, str) else got!r})"
            lines.append(f"{source}: {key or '<top>'}: {err['msg']}{shown}")
        raise ConfigError("\n".join(lines)) from None
    if isinstance(settings, Settings):
        settings._from_environment = environment_values(data)
    return settings


def _hidden_input(error: dict) -> bool:
    """An input an error must not show: under a secret-named key or a mapping of headers (a gateway's API key),
    or under a key the model does not have (a misspelt `passwd:` holds a password all the same)."""
    return error["type"] == "extra_forbidden" or any(
        _SECRET_NAME.search(str(part)) or str(part).lower().endswith("headers") for part in error["loc"])


def checked_url(url: str, schemes: tuple[str, ...], what: str) -> str:
    """`url` of an accepted scheme (else ValueError(what)), and parsed as a client will parse it: a password
    with an unencoded '#', '?' or '/' ends the host part early, and the client then fails on a "port" made
    of the password's first characters (and shows them), or connects somewhere else. The value is not
    repeated."""
    parts = urlsplit(url)
    if parts.scheme not in schemes:
        raise ValueError(what)
    try:
        parts.port
    except ValueError:
        parsed = False
    else:
        parsed = "@" not in url[len(parts.scheme) + 3 + len(parts.netloc):]
    if not parsed:
        raise ValueError("cannot be parsed: percent-encode the reserved characters of its user name and "
                         "password ('#' as %23, '?' as %3F, '/' as %2F, '@' as %40, ':' as %3A, '%' as %25)")
    return url


def _written(loc: tuple, data: Any) -> list:
    """An error's key path as the file writes it: without the tag pydantic adds for a union told apart by
    `kind` (pipelines.p.store.endpoint_url, not store.s3.endpoint_url)."""
    path = []
    for part in loc:
        if isinstance(data, dict) and part not in data and data.get("kind") == part:
            continue
        path.append(part)
        if isinstance(data, dict):
            data = data.get(part)
        elif isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
            data = data[part]
        else:
            data = None
    return path


class EnvironmentValues(frozenset):
    """Every string ${NAME} filled in (but the shortest), for `masked`: validation turns them into plain str,
    marker lost. And `secrets`: the values of secret-named variables, which `masked` also finds inside other
    strings (one a validator derived from the value, a URL `redacted` could not parse)."""

    secrets: frozenset[str] = frozenset()


def environment_values(value: Any) -> EnvironmentValues:
    """What `masked` hides of the interpolated (not yet validated) settings data."""
    if isinstance(value, FromEnvironment):
        found = EnvironmentValues({str(value)} if len(value) >= _MIN_SECRET else ())
        found.secrets = value.secrets
        return found
    parts = [environment_values(v) for v in (value.values() if isinstance(value, dict)
                                              else value if isinstance(value, list) else ())]
    found = EnvironmentValues(frozenset().union(*parts))
    found.secrets = frozenset().union(*(p.secrets for p in parts))
    return found


def masked(value: Any, hidden: frozenset[str] = frozenset(), key: str = "") -> Any:
    """A copy of plain settings data for printing: the values of secret-named keys, and every string in
    `hidden` (the environment's values) wherever it sits, replaced; the `secrets` of hidden
    EnvironmentValues inside any string, and the password of any URL (a source's base_url written with
    user:password@)."""
    if isinstance(value, dict):
        return {k: masked(v, hidden, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v, hidden, key) for v in value]
    if value in hidden or (_SECRET_NAME.search(key) and value not in (None, "") and not isinstance(value, bool)):
        return _MASK
    if isinstance(value, str):
        for secret in getattr(hidden, "secrets", ()):
            value = value.replace(secret, _MASK)
        value = redacted(value, _MASK)
    return value


def redacted(text: str, mask: str = "***") -> str:
    """`text` (a URL, ';'-separated URLs for Sentinel or failover, or a message quoting URLs) with every
    password masked: a URL's userinfo's and the values of secret-named query parameters (redis' ?password=,
    OTMM's ?session_id=). The userinfo ends at the URL's last '@', so a password with an unencoded '#', '?' or
    '/' is masked too; an '@' after the host masks more than needed, never less."""
    text = _URL.sub(lambda m: _without_password(m.group(0), mask), text)
    return _QUERY_PAIR.sub(lambda m: m.group(1) + (mask if _SECRET_NAME.search(m.group(2)) else m.group(3)), text)


def _without_password(url: str, mask: str) -> str:
    scheme, _, rest = url.partition("://")
    userinfo, at, rest = rest.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        userinfo = f"{user}:{mask}@" if colon else f"{userinfo}@"
    return f"{scheme}://{userinfo}{rest}"
