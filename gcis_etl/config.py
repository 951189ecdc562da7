"""config.yaml: imaging policy, process limits, where state lives, and the named pipelines.

Looked up as --config, then $GCIS_CONFIG, then ./config.yaml; without any file the built-in defaults
(the product policy, no pipelines) apply. Relative paths in the file are relative to the file's folder,
so a cron job finds the same ledger and masters whatever its working directory. Errors name the file,
the key path and what was expected; ${VAR} references are filled from the environment.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from connectors import settings_model
from connectors.http import tls_switch
from gcis_etl.cache import CacheSettings
from gcis_etl.distributed import CelerySettings
from gcis_etl.errors import ConfigError
from gcis_etl.pipelines import (Pipeline, PipelineSettings, RunSettings, checked_recipe, config_folder,
                                pipeline_settings)
from gcis_etl.policy import ImagingPolicy, IsolationSettings
from gcis_etl.recipes import is_recipe_file, recipe_names
from gcis_etl.settings import (Settings, annotation_types, environment_values, interpolate_env, masked, parse,
                               read_yaml)


BUILT_IN_CODE = "<Config built in code>"  # what errors name a Config not read from a file
NO_FILE = "<built-in defaults: no --config, no $GCIS_CONFIG, no config.yaml in the working folder>"


class LedgerSettings(Settings):
    path: Path | None = Field(None, description="default: <state_dir>/ledger.sqlite")
    journal_mode: Literal["wal", "delete", "truncate"] = Field(
        "wal", description="'delete' where WAL cannot work (network filesystems)")
    busy_timeout_seconds: float = Field(30, gt=0)
    skipped_history_runs: int = Field(
        30, ge=1, description="runs of a pipeline whose skipped items the ledger keeps, item by item (the counts "
                              "of every run are kept)")


class Config(Settings):
    """config.yaml, validated: read it with load_config. Built in code (`Config(**data)`), it is not checked as
    load_config checks a file (pipelines' sources and recipes only when used), its relative paths are the working
    directory's, and its errors name it `<Config built in code>`. Its `imaging` and `isolation` are what the
    library's convert, inspect and verify take as `policy`, `limits` and `isolation_settings`: they read no
    config themselves."""

    imaging: ImagingPolicy = ImagingPolicy()
    isolation: IsolationSettings = IsolationSettings()
    state_dir: Path = Field(Path("var/state"), description="ledger, run locks, run reports, scratch")
    ledger: LedgerSettings = LedgerSettings()
    defaults: RunSettings = RunSettings()
    pipelines: dict[str, PipelineSettings] = {}
    celery: CelerySettings = CelerySettings()
    cache: CacheSettings = CacheSettings()
    source_file: str = Field(BUILT_IN_CODE, exclude=True)  # where the settings were read: not a key of the file

    def printable(self) -> dict[str, Any]:
        """The resolved settings as plain data (each source as its connector's settings read it, defaults filled
        in), secrets masked: those under secret-looking keys and every value that came from the environment,
        whatever its key (an API key in `extra_headers`)."""
        data = self.model_dump(mode="json")
        for name, pipeline in self.pipelines.items():
            source = pipeline.source
            resolved = parse(settings_model(source.kind), source.options, self.source_file,
                             f"pipelines.{name}.source")
            data["pipelines"][name]["source"] = {"kind": source.kind, **resolved.model_dump(mode="json")}
        return masked(data, self.from_environment)

    @property
    def ledger_path(self) -> Path:
        return self.ledger.path or self.state_dir / "ledger.sqlite"

    @property
    def reports_dir(self) -> Path:
        """Run and migration reports: under state_dir wherever the ledger is (ledger.path may be elsewhere)."""
        return self.state_dir / "reports"

    def pipeline(self, name: str) -> Pipeline:
        try:
            return Pipeline(name, self.pipelines[name], self.source_file)
        except KeyError:
            known = ", ".join(sorted(self.pipelines)) or "none configured"
            raise ConfigError(f"{self.source_file}: no pipeline {name!r} (pipelines: {known})") from None


def config_path(explicit: str | Path | None = None) -> Path | None:
    if explicit:
        return Path(explicit)
    if os.environ.get("GCIS_CONFIG"):
        return Path(os.environ["GCIS_CONFIG"])
    local = Path.cwd() / "config.yaml"
    return local if local.is_file() else None


class SingleFileConfig(Settings):
    """What the commands on one local file (inspect, convert, verify) use of config.yaml: they need no
    pipeline, so neither the pipelines' ${VAR} secrets nor the other sections have to be in order."""

    imaging: ImagingPolicy = ImagingPolicy()
    isolation: IsolationSettings = IsolationSettings()


def load_single_file_config(path: str | Path | None = None) -> SingleFileConfig:
    found = config_path(path)
    if found is None:
        return SingleFileConfig()
    data = _read_mapping(found)
    used = {key: data[key] for key in SingleFileConfig.model_fields if key in data}
    return parse(SingleFileConfig, _filled(used, found, _anchored_imaging), str(found))


def load_config(path: str | Path | None = None) -> Config:
    """The configuration in `path`; None: $GCIS_CONFIG, else ./config.yaml in the working directory (a
    service's, which may not be yours), else the built-in defaults with no pipelines. ConfigError names the
    file, each key and what was expected."""
    found = config_path(path)
    if found is None:
        return Config(source_file=NO_FILE)
    source = str(found)
    data = _filled(_read_mapping(found), found, _anchored, _SOURCES)
    hidden = environment_values(data)
    pipelines = data.pop("pipelines", None) or {}
    if not isinstance(pipelines, dict):
        raise ConfigError(f"{source}: pipelines: expected a mapping of pipeline name to settings")
    top = parse(Config, data, source)
    checked_recipe(top.defaults.recipe, source, "defaults.recipe")  # also when no pipeline inherits it yet
    inherited = {key: data.get(key) or {} for key in ("defaults", "imaging", "isolation")}
    for key, value in inherited.items():
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {key}: expected a mapping")
    parsed = {name: _pipeline(str(name), settings, inherited, source) for name, settings in pipelines.items()}
    config = top.model_copy(update={"pipelines": _served(parsed, top.cache.server.max_cvt, top.cache.pipelines,
                                                         source),
                                    "source_file": source})
    config._from_environment = hidden
    _check_names(config)
    return config


def _read_mapping(found: Path) -> dict:
    data = read_yaml(found)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{found}: expected a mapping at the top level")
    return data


_SOURCES = re.compile(r"pipelines\.[^.]+\.source\b")
"""Where a ${VAR} that is not set is left for connectors.open_source: only commands that open a pipeline's
source (harvest, retry, config check) need its secrets; status, report and cache only read the ledger."""


def _filled(data: dict, found: Path, anchored, deferred: re.Pattern | None = None) -> dict:
    """`data` with its ${VAR} filled in (but where `deferred`), then its relative paths made relative to the
    file's folder by `anchored` (after interpolation: an absolute path from the environment stays absolute)."""
    try:
        return anchored(interpolate_env(data, "", deferred), anchor_in(config_folder(found)))
    except ConfigError as exc:
        raise ConfigError(f"{found}: {exc}") from None


def _pipeline(name: str, settings: Any, inherited: dict[str, dict], source: str) -> PipelineSettings:
    """One pipeline's settings; when they are invalid and its source has a ${VAR} left unset, the missing
    variable is what to report (`base_url: ${ROSETTA_URL}` fails its pattern only for want of it)."""
    try:
        return pipeline_settings(name, settings, inherited["defaults"], inherited["imaging"], inherited["isolation"],
                                 source)
    except ConfigError:
        if isinstance(settings, dict):
            _filled({"pipelines": {name: {"source": settings.get("source")}}}, Path(source), lambda data, _: data)
        raise


def _check_names(config: Config) -> None:
    """Names one section gives another's things: a misspelt one would match nothing, silently."""
    recipes = sorted({*recipe_names(config_folder(config.source_file)),
                      *(Path(p.recipe).stem for p in config.pipelines.values())})
    named = [("celery.time_limits", [name for name in config.celery.time_limits if name != "default"],
              "recipe", recipes),
             *((f"celery.queues.{queue}.recipes", route.recipes, "recipe", recipes)
               for queue, route in config.celery.queues.items()),
             ("cache.pipelines", config.cache.pipelines or (), "pipeline", sorted(config.pipelines))]
    for key, names, kind, known in named:
        for name in names:
            if name not in known:
                raise ConfigError(f"{config.source_file}: {key}: no {kind} {name!r} "
                                  f"({kind}s: {', '.join(known) or 'none'})")


def _served(pipelines: dict[str, PipelineSettings], max_cvt: int, cached: tuple[str, ...] | None,
            source: str) -> dict[str, PipelineSettings]:
    """The manifests ask for images no larger than iipsrv renders: manifests.max_image_size is
    cache.server.max_cvt unless a pipeline sets it (for another image server, or a smaller size). A pipeline
    whose images this cache serves cannot ask for more than its iipsrv renders."""
    out = {}
    for name, settings in pipelines.items():
        manifests = settings.manifests
        if manifests is not None and manifests.max_image_size is None:
            settings = settings.model_copy(update={"manifests": manifests.model_copy(
                update={"max_image_size": max_cvt})})
        elif manifests is not None and manifests.max_image_size > max_cvt and (cached is None or name in cached):
            raise ConfigError(f"{source}: pipelines.{name}.manifests.max_image_size: more than "
                              f"cache.server.max_cvt, the largest size the iipsrv serving this pipeline's images "
                              f"renders (unset, it follows max_cvt)")
        out[name] = settings
    return out


def anchor_in(base: Path):
    """A relative path made relative to `base`, one starting with ~ relative to the home folder (it was taken
    for a folder named ~ in `base`); an anchored value from the environment stays marked as such."""
    def anchor(value: Any) -> Any:
        if isinstance(value, str) and value:
            return type(value)(base / Path(value).expanduser())  # an absolute path stays as it is
        return value
    return anchor


def _anchored(data: dict, anchor) -> dict:
    """Make the file's relative paths relative to its folder (only keys that are paths by definition)."""
    data = dict(data)
    data["state_dir"] = anchor(data.get("state_dir", "var/state"))
    if isinstance(data.get("ledger"), dict) and "path" in data["ledger"]:
        data["ledger"] = {**data["ledger"], "path": anchor(data["ledger"]["path"])}
    cache = data.get("cache") or {}
    if isinstance(cache, dict):
        server = cache.get("server") or {}
        if isinstance(server, dict):
            defaults = {"run_dir": "var/iipsrv", "access_log": "var/iipsrv/access.log"}
            server = {**server, **{key: anchor(server.get(key, default)) for key, default in
                                   (*defaults.items(), ("documents_root", None), ("iipsrv", None),
                                    ("mirador_dir", None)) if server.get(key, default)}}
        data["cache"] = {**cache, "dir": anchor(cache.get("dir", "var/iipsrv-cache")), "server": server}
    data = _anchored_imaging(data, anchor)
    if isinstance(data.get("defaults"), dict):
        data["defaults"] = _anchored_recipe(data["defaults"], anchor)
    pipelines = data.get("pipelines")
    if isinstance(pipelines, dict):
        data["pipelines"] = {name: _anchored_pipeline(str(name), p, anchor) for name, p in pipelines.items()}
    return data


def _anchored_imaging(section: dict, anchor) -> dict:
    """imaging.cmyk_fallback_profile is a path unless it names libvips' built-in profile."""
    imaging = section.get("imaging")
    profile = imaging.get("cmyk_fallback_profile") if isinstance(imaging, dict) else None
    if not profile or profile == "cmyk":
        return section
    return {**section, "imaging": {**imaging, "cmyk_fallback_profile": anchor(profile)}}


def _anchored_recipe(section: dict, anchor) -> dict:
    """`recipe:` is a path when it names a YAML file (a name is looked up beside the file: recipe_dirs)."""
    recipe = section.get("recipe")
    if not isinstance(recipe, str) or not is_recipe_file(recipe):
        return section
    return {**section, "recipe": anchor(recipe)}


def _anchored_pipeline(name: str, pipeline: Any, anchor) -> Any:
    if not isinstance(pipeline, dict):
        return pipeline
    pipeline = _anchored_recipe(_anchored_imaging(dict(pipeline), anchor), anchor)
    if "store" in pipeline:
        pipeline["store"] = anchored_store(pipeline["store"], anchor)
    source = pipeline.get("source")
    if isinstance(source, dict) and isinstance(source.get("kind"), str):
        try:
            model = settings_model(source["kind"])
        except ConfigError as exc:
            raise ConfigError(f"pipelines.{name}.source.kind: {exc}") from None
        pipeline["source"] = _anchored_source(source, model, anchor)
    return pipeline


def anchored_store(store: Any, anchor) -> Any:
    """A local store's root relative to the folder of the file that gives it: config.yaml's pipelines, or a
    store file given to a migration script (inline on its command line: the working directory)."""
    if isinstance(store, dict) and store.get("kind") == "local" and "root" in store:
        return {**store, "root": anchor(store["root"])}
    return store


def _anchored_source(source: dict, model: type[BaseModel], anchor) -> dict:
    """A source's paths: every field its connector's settings model types as a Path (in nested settings too,
    as Rosetta's pid_list.file), built-in connector or not, and a CA bundle given as verify_tls."""
    source = _anchored_fields(source, model, anchor)
    if isinstance(source.get("verify_tls"), str) and tls_switch(source["verify_tls"]) is None:
        source["verify_tls"] = anchor(source["verify_tls"])
    return source


def _anchored_fields(values: dict, model: type[BaseModel], anchor) -> dict:
    values = dict(values)
    for key, field in model.model_fields.items():
        value = values.get(key)
        types = list(annotation_types(field.annotation))
        if isinstance(value, str) and Path in types:
            values[key] = anchor(value)
        elif isinstance(value, dict):
            nested = [t for t in types if isinstance(t, type) and issubclass(t, BaseModel)]
            values[key] = _anchored_fields(value, nested[0], anchor) if nested else value
    return values

