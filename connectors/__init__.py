"""Source connectors: the registry that turns a pipeline's `source:` configuration into a Source.

    source = open_source("rosetta", {"base_url": ..., "password": "<value of ${ROSETTA_PASSWORD}>", ...},
                         name="rosetta-main")

A connector is a class following connectors.base.Source built as `Connector(settings, name=...)`, its
`settings` parameter annotated with the gcis_etl.settings.Settings model that validates the pipeline's
`source:` keys; fields the model types as Path are relative to config.yaml's folder. `kind:` names a built-in
connector (BUILT_IN) or one an installed distribution declares in the entry-point group `gcis_etl.connectors`
(`flat = mysource:FlatSource`): read wherever gcis_etl loads a config, so the CLI, cron and every Celery
worker where that distribution is installed know the kind, with no code of their own to run first.

Modules are imported on demand, so a pipeline reading the filesystem never imports boto3 or requests.
Opening a source validates its settings and touches no network: the first request happens on use.
"""
from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Mapping

from connectors.base import Source
from connectors.redaction import register_environment, scrub
from gcis_etl.errors import ConfigError
from gcis_etl.settings import Settings, interpolate_env, parse

ENTRY_POINT_GROUP = "gcis_etl.connectors"
METHODS = tuple(name for name, member in vars(Source).items() if callable(member) and not name.startswith("_"))
ATTRIBUTES = tuple(name for name in Source.__annotations__ if not hasattr(Source, name))
"""What connectors.base.Source requires of a connector: its methods, on the class; its attributes (those with
no default there), which a connector may set in __init__, on the source opened."""
BUILT_IN: dict[str, str] = {
    "rosetta": "connectors.rosetta:RosettaSource",
    "otmm": "connectors.otmm:OtmmSource",
    "filesystem": "connectors.filesystem:FilesystemSource",
    "s3": "connectors.s3:S3Source",
}


@dataclass(frozen=True)
class Connector:
    """A connector kind's Source class and the model of its settings (the type of the class's `settings`)."""

    source: type
    settings: type[Settings]


def connector(kind: str) -> Connector:
    """Connector `kind`, built-in or declared by an installed distribution; a ConfigError says what is wrong
    with it (unknown, its module or class not importable, no settings model), for the caller to name the key."""
    target = BUILT_IN.get(kind) or _declared(kind)
    try:
        source = EntryPoint(kind, target, ENTRY_POINT_GROUP).load()
    except Exception as exc:  # whatever importing someone's module raises: the kind cannot be used
        raise ConfigError(f"connector {kind!r} ({target}) cannot be loaded: {type(exc).__name__}: {exc}") from exc
    try:
        model = typing.get_type_hints(source.__init__).get("settings") if isinstance(source, type) else None
    except NameError as exc:
        raise ConfigError(f"connector {kind!r} ({target}): its __init__'s annotations cannot be read: {exc}") from exc
    if not (isinstance(model, type) and issubclass(model, Settings)):
        raise ConfigError(f"connector {kind!r} ({target}) is no class whose __init__(self, settings, name) annotates "
                          "`settings` with a gcis_etl.settings.Settings model")
    signature = inspect.signature(source)
    try:
        signature.bind(None, name=kind)
    except TypeError:
        raise ConfigError(f"connector {kind!r} ({target}): its __init__(self, {', '.join(signature.parameters)}) "
                          f"cannot be called as {source.__name__}(settings, name=...), as every connector is") from None
    missing = [name for name in METHODS if not callable(getattr(source, name, None))]
    if missing:
        raise ConfigError(f"connector {kind!r} ({target}) lacks the method(s) {', '.join(missing)} of "
                          f"connectors.base.Source")
    return Connector(source, model)


def settings_model(kind: str) -> type[Settings]:
    """The pydantic model validating a connector's options (for config loaders that validate up front)."""
    return connector(kind).settings


def open_source(kind: str, settings: Mapping[str, Any] | Settings, name: str, *,
                config_file: str = "config.yaml", prefix: str = "") -> Source:
    """Validate `settings` for connector `kind` and return the Source; errors are ConfigError naming the key.

    A ${VAR} still in `settings` is filled from the environment now: config.yaml leaves a source's unset
    ones to here, so that only commands opening the source need its secrets; an unset one is a ConfigError.
    Every value the environment filled in is a secret from here on, whatever its key and whichever connector,
    built-in or not, quotes it (connectors.redaction.register_environment). A connector whose __init__ raises,
    or whose source lacks an attribute of connectors.base.Source, is a ConfigError naming `kind`.
    """
    found = connector(kind)
    if not isinstance(settings, Settings):
        try:
            filled = interpolate_env(dict(settings), prefix)
        except ConfigError as exc:
            raise ConfigError(f"{config_file}: {exc}") from None
        settings = parse(found.settings, filled, config_file, prefix)
    register_environment(settings)
    key = f"{config_file}: {prefix}.kind" if prefix else config_file
    try:
        source = found.source(settings, name=name)
    except ConfigError:
        raise
    except Exception as exc:  # someone's connector, refusing its settings its own way (or a bug in it)
        raise ConfigError(f"{key}: connector {kind!r} cannot be opened: its {found.source.__name__}(settings, "
                          f"name=...) raised {type(exc).__name__}: {scrub(str(exc))}") from None
    missing = [attribute for attribute in ATTRIBUTES if not hasattr(source, attribute)]
    if missing:
        raise ConfigError(f"{key}: connector {kind!r} gives a source without the attribute(s) {', '.join(missing)} "
                          f"of connectors.base.Source")
    return source


def _declared(kind: str) -> str:
    """The `module:Class` an installed distribution declares for `kind`; two declaring it is an error too."""
    declared = {e.value for e in entry_points(group=ENTRY_POINT_GROUP, name=kind)}
    if len(declared) == 1:
        return declared.pop()
    if declared:
        raise ConfigError(f"connector {kind!r} is declared more than once in the {ENTRY_POINT_GROUP} entry points "
                          f"of the installed distributions: {', '.join(sorted(declared))}")
    known = sorted({*BUILT_IN, *entry_points(group=ENTRY_POINT_GROUP).names})
    raise ConfigError(f"unknown source connector {kind!r}; known: {', '.join(known)} (a connector of your own is "
                      f"declared in the {ENTRY_POINT_GROUP} entry-point group of an installed distribution)")
