"""Named pipelines: a source → a recipe → a store → manifests, with the policy and limits they run under.

`defaults:` at the top of config.yaml holds what every pipeline inherits; a pipeline may override any of
it, and may override single keys of the top-level `imaging:` and `isolation:` sections (merged key by
key, so `imaging: {max_megapixels: 400}` keeps the rest of the product policy).
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import timedelta
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from connectors import Source, connector, open_source, settings_model
from gcis_etl.errors import ConfigError
from gcis_etl.manifests import ManifestSettings, Manifests
from gcis_etl.policy import ImagingPolicy, IsolationSettings
from gcis_etl.recipes import DEFAULT_RECIPE, Recipe, load_recipe
from gcis_etl.settings import Deferred, EnvironmentValues, Settings, environment_values, masked, parse
from gcis_etl.stores import Store, StoreSettings, open_store

PIPELINE_NAME = r"^[a-z0-9][a-z0-9_-]{0,62}$"  # used in store keys, lock and report file names
TRANSPORT = ("retry", "verify_tls", "user_agent")
"""Keys under any source: that change how the source is reached, never what it lists (Pipeline.listing_digest).
A connector names its own others in the class attribute `transport_settings` (a nested key dotted:
"search.page_size"); credentials, as `config` output masks them, never count."""


class SourceSettings(Settings):
    """`kind` picks the connector; every other key is that connector's own (validated on load)."""

    model_config = Settings.model_config | {"extra": "allow"}
    kind: str

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class RunSettings(Settings):
    """How a pipeline's runs go: what `defaults:` sets for all pipelines and each may override."""

    recipe: str = DEFAULT_RECIPE
    executor: Literal["local", "celery"] = "local"
    concurrency: int = Field(2, ge=1, le=256, description="items converted at once (local executor: processes)")
    transfer_slots: int | None = Field(
        None, ge=0, le=256, description="local executor: items fetched or deposited beside those converting, so "
        "that no conversion process waits for a download or an upload; null: as many as concurrency, 0: none. "
        "Each item in flight holds its master and its output in state_dir/scratch. The celery executor ignores it")
    max_attempts: int = Field(3, ge=1, le=100, description="tries of a failing item before it waits for `retry`")
    overlap_seconds: float = Field(300, ge=0, description="re-list this far before the checkpoint (clock skew)")
    max_run_minutes: float | None = Field(None, gt=0, description="stop taking new items after this long")

    @property
    def transfers(self) -> int:
        """transfer_slots, null resolved."""
        return self.concurrency if self.transfer_slots is None else self.transfer_slots


class PipelineSettings(RunSettings):
    source: SourceSettings
    store: StoreSettings
    manifests: ManifestSettings | None = None
    imaging: ImagingPolicy = ImagingPolicy()
    isolation: IsolationSettings = IsolationSettings()


def config_folder(config_file: str | Path) -> Path:
    """The folder a config file's relative paths and recipe names start from (recipe_dirs)."""
    return Path(config_file).resolve().parent


def checked_recipe(name: str, source: str, key: str) -> Recipe:
    """The recipe `key` names, or a ConfigError with all that is wrong with it (the recipe file's own
    errors, YAML line and column included)."""
    try:
        return load_recipe(name, config_folder(source))
    except ConfigError as exc:
        raise ConfigError(f"{source}: {key}: {exc}") from None


def pipeline_settings(name: str, data: Any, defaults: dict, imaging: dict, isolation: dict,
                      source: str) -> PipelineSettings:
    """Validate one pipeline after merging what it inherits; errors name `pipelines.<name>.<key>`."""
    prefix = f"pipelines.{name}"
    if not re.match(PIPELINE_NAME, name):
        raise ConfigError(f"{source}: {prefix}: a pipeline name is lower-case letters, digits, '-' and '_' "
                          f"(at most 63, starting with a letter or digit)")
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: {prefix}: expected a mapping with at least source: (got {data!r})")
    merged = {**defaults, **data,
              "imaging": {**imaging, **(data.get("imaging") or {})},
              "isolation": {**isolation, **(data.get("isolation") or {})}}
    settings = parse(PipelineSettings, merged, source, prefix)
    checked_recipe(settings.recipe, source, f"{prefix}.recipe")
    versions = settings.manifests.versions if settings.manifests else ()
    problems = settings.store.keys.version_problems(versions)
    if problems:
        raise ConfigError("\n".join(f"{source}: {prefix}.store.keys.{field}: {problem}"
                                     for field, problem in problems.items()))
    try:
        model = settings_model(settings.source.kind)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {prefix}.source.kind: {exc}") from None
    parse(model, settings.source.options, source, f"{prefix}.source")
    return settings


@dataclass
class Pipeline:
    """A configured pipeline's parts, opened on first use (opening touches no network)."""

    name: str
    settings: PipelineSettings
    config_file: str = "config.yaml"

    @cached_property
    def source(self) -> Source:
        return open_source(self.settings.source.kind, self.settings.source.options, name=self.name,
                           config_file=self.config_file, prefix=f"pipelines.{self.name}.source")

    @cached_property
    def store(self) -> Store:
        return open_store(self.settings.store, threads=self.settings.concurrency + self.settings.transfers)

    @cached_property
    def recipe(self) -> Recipe:
        """Checked as load_config checks it: an error names `pipelines.<name>.recipe` (a Config built in code is
        not checked before)."""
        return checked_recipe(self.settings.recipe, self.config_file, f"pipelines.{self.name}.recipe")

    @cached_property
    def manifests(self) -> Manifests | None:
        if self.settings.manifests is None:
            return None
        return Manifests(self.settings.manifests, self.name, self.store)

    @property
    def overlap(self) -> timedelta:
        return timedelta(seconds=self.settings.overlap_seconds)

    @cached_property
    def listing_digest(self) -> str | None:
        """A digest of the source settings that decide what the source lists, as written under `source:`: the
        checkpoint is recorded with it, and a run under others lists the whole source (another OAI set, query,
        prefix or server: the checkpoint says nothing of what that lists). Transport settings (TRANSPORT and the
        connector's transport_settings) and credentials' values are left out: a password rotated or a timeout
        raised costs no full listing. A connector declaring none counts all its other settings: a change costs a
        full listing at worst, never an object passed over. None where a ${VAR} the digest takes is not set here
        (`status` without the source's environment): what it holds cannot be told."""
        source = self.settings.source
        options = {"kind": source.kind, **source.options}
        for key in (*TRANSPORT, *getattr(connector(source.kind).source, "transport_settings", ())):
            _drop(options, key.split("."))
        if _unset(options):
            return None
        hidden = EnvironmentValues()
        hidden.secrets = environment_values(options).secrets  # a password put inside another value: masked
        return _digest(masked(options, hidden))

    @cached_property
    def worker_digests(self) -> dict[str, str]:
        """Digests of what a worker takes from its own config.yaml to do an item beside the recipe: the `store:`
        (where it deposits: root, or bucket, prefix and endpoint; the key templates) and the `imaging:` and
        `isolation:` a conversion runs under. The harvest sends its own with each task; a worker whose differ
        refuses it (work.Worker), or it would deposit where the harvest's manifests do not look, or convert
        otherwise. What a store's settings say may differ by host (S3StoreSettings.per_host: its credentials'
        profile, its transfer tuning) is left out, and the secret-named keys' values masked."""
        sections = {"store": self.settings.store, "imaging": self.settings.imaging,
                    "isolation": self.settings.isolation}
        return {what: _digest(masked(section.model_dump(mode="json", exclude=getattr(section, "per_host", None))))
                for what, section in sections.items()}


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _drop(options: dict, path: list[str]) -> None:
    """`options` without the key at `path` (the dict is copied where it is changed)."""
    head, *rest = path
    if not rest:
        options.pop(head, None)
    elif isinstance(options.get(head), dict):
        options[head] = dict(options[head])
        _drop(options[head], rest)


def _unset(value: Any, key: str = "") -> bool:
    """Whether `value` holds a ${VAR} left unset (settings.Deferred) where `masked` would show it."""
    if isinstance(value, dict):
        return any(_unset(v, str(k)) for k, v in value.items())
    if isinstance(value, list):
        return any(_unset(v, key) for v in value)
    return isinstance(value, Deferred) and masked(value, key=key) == value
