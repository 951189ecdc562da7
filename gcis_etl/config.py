"""config.yaml: the imaging policy and process limits (pipelines, stores and sources join it later).

Looked up as --config, then $GCIS_CONFIG, then ./config.yaml; without any file the built-in defaults
(the product policy) apply. Errors name the file, the key path and what was expected.
"""
from __future__ import annotations

import os
from pathlib import Path

from gcis_etl.errors import ConfigError
from gcis_etl.policy import ImagingPolicy, IsolationSettings
from gcis_etl.settings import Settings, interpolate_env, parse, read_yaml


class Config(Settings):
    imaging: ImagingPolicy = ImagingPolicy()
    isolation: IsolationSettings = IsolationSettings()


def config_path(explicit: str | Path | None = None) -> Path | None:
    if explicit:
        return Path(explicit)
    if os.environ.get("GCIS_CONFIG"):
        return Path(os.environ["GCIS_CONFIG"])
    local = Path.cwd() / "config.yaml"
    return local if local.is_file() else None


def load_config(path: str | Path | None = None) -> Config:
    found = config_path(path)
    if found is None:
        return Config()
    data = read_yaml(found)
    if data is None:
        return Config()
    if not isinstance(data, dict):
        raise ConfigError(f"{found}: expected a mapping at the top level")
    return parse(Config, interpolate_env(data, ""), str(found))
