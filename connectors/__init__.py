"""Source connectors: the registry that turns a pipeline's `source:` configuration into a Source.

    source = open_source("rosetta", {"base_url": ..., "password": "<value of ${ROSETTA_PASSWORD}>", ...},
                         name="rosetta-main")

Modules are imported on demand, so a pipeline reading the filesystem never imports boto3 or requests.
Opening a source validates its settings and touches no network: the first request happens on use.
"""
from __future__ import annotations

import importlib
from typing import Any, Mapping

from connectors.base import Source
from gcis_etl.errors import ConfigError
from gcis_etl.settings import Settings, interpolate_env, parse

CONNECTORS: dict[str, tuple[str, str, str]] = {
    "rosetta": ("connectors.rosetta", "RosettaSource", "RosettaSettings"),
    "otmm": ("connectors.otmm", "OtmmSource", "OtmmSettings"),
    "filesystem": ("connectors.filesystem", "FilesystemSource", "FilesystemSettings"),
    "s3": ("connectors.s3", "S3Source", "S3Settings"),
}


def settings_model(kind: str) -> type[Settings]:
    """The pydantic model validating a connector's options (for config loaders that validate up front)."""
    module, _, model = _entry(kind)
    return getattr(importlib.import_module(module), model)


def open_source(kind: str, settings: Mapping[str, Any] | Settings, name: str, *,
                config_file: str = "config.yaml", prefix: str = "") -> Source:
    """Validate `settings` for connector `kind` and return the Source; errors are ConfigError naming the key.

    A ${VAR} still in `settings` is filled from the environment now: config.yaml leaves a source's unset
    ones to here, so that only commands opening the source need its secrets; an unset one is a ConfigError.
    """
    module, cls, model = _entry(kind)
    loaded = importlib.import_module(module)
    if not isinstance(settings, Settings):
        try:
            filled = interpolate_env(dict(settings), prefix)
        except ConfigError as exc:
            raise ConfigError(f"{config_file}: {exc}") from None
        settings = parse(getattr(loaded, model), filled, config_file, prefix)
    return getattr(loaded, cls)(settings, name=name)


def _entry(kind: str) -> tuple[str, str, str]:
    try:
        return CONNECTORS[kind]
    except KeyError:
        raise ConfigError(f"unknown source connector {kind!r}; known: {', '.join(sorted(CONNECTORS))}") from None
