"""Validation of YAML-backed settings: every error names the file, the key path and what was expected."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from gcis_etl.errors import ConfigError

M = TypeVar("M", bound=BaseModel)

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_SECRET_KEY = re.compile(r"password|secret|token|credential|api[_-]?key|authorization|cookie", re.IGNORECASE)


class Settings(BaseModel):
    """Base of every settings model: unknown keys are errors (a typo must not be silently ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def read_yaml(path: str | Path) -> Any:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None


class FromEnvironment(str):
    """A value that ${NAME} filled in: the environment holds the secrets, so an error never shows it,
    whatever the key it was put under (a misspelt `passwd:` is not secret-named)."""


def interpolate_env(value: Any, where: str = "") -> Any:
    """Replace ${NAME} with the environment variable NAME; a missing variable is a ConfigError."""
    if isinstance(value, str) and _ENV_REF.search(value):
        def sub(match: re.Match) -> str:
            name = match.group(1)
            if name not in os.environ:
                raise ConfigError(f"{where}: environment variable {name} is not set")
            return os.environ[name]
        return FromEnvironment(_ENV_REF.sub(sub, value))
    if isinstance(value, dict):
        return {k: interpolate_env(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate_env(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def parse(model: type[M], data: Any, source: str, prefix: str = "") -> M:
    """Validate `data` as `model`; on failure raise ConfigError listing `source: key.path: problem (got ...)`."""
    try:
        return model.model_validate(data if data is not None else {})
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            key = ".".join(str(p) for p in (prefix, *err["loc"]) if p != "")
            got = err.get("input")
            secret = any(_SECRET_KEY.search(str(p)) for p in err["loc"])
            if isinstance(got, FromEnvironment):
                shown = " (got a value from the environment, not shown)"
            elif err["type"] == "missing" or isinstance(got, dict) or secret:
                shown = ""
            else:
                shown = f" (got {got!r})"
            lines.append(f"{source}: {key or '<top>'}: {err['msg']}{shown}")
        raise ConfigError("\n".join(lines)) from None


def environment_values(value: Any) -> frozenset[str]:
    """Every string ${NAME} filled in, for `masked`: validation turns them into plain str, marker lost."""
    if isinstance(value, FromEnvironment):
        return frozenset({str(value)} if value else ())
    parts = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return frozenset().union(*map(environment_values, parts))


def masked(value: Any, hidden: frozenset[str] = frozenset(), key: str = "") -> Any:
    """A copy of plain settings data for printing: the values of secret-named keys, and every string in
    `hidden` (the environment's values) wherever it sits, replaced."""
    if isinstance(value, dict):
        return {k: masked(v, hidden, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v, hidden, key) for v in value]
    if value in hidden or (_SECRET_KEY.search(key) and value not in (None, "") and not isinstance(value, bool)):
        return "********"
    return value
