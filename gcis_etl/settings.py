"""Validation of YAML-backed settings: every error names the file, the key path and what was expected."""
from __future__ import annotations

import difflib
import json
import os
import re
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Iterator, Literal, TypeVar, Union, get_args, get_origin
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError

from gcis_etl.errors import ConfigError

M = TypeVar("M", bound=BaseModel)

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# A name whose value is a credential: a settings key, an environment variable, a header or a query parameter
# (OTMM's session_id, Rosetta's pds_handle, a presigned URL's X-Amz-*). More than needed, never less, but for
# _MODE_KEY.
_SECRET_NAME = re.compile(r"pass|pwd|secret|token|credential|(api|access)[_-]?key|auth|cookie|signature|session"
                         r"|pds_handle|ticket|digest|x-amz-", re.IGNORECASE)
# A settings key naming how to authenticate, not with what (OTMM's `auth: session`, Rosetta's `auth_scheme:
# Basic`): shown, in the resolved settings and in errors, where a query parameter `auth=` stays masked.
_MODE_KEY = re.compile(r"auth(?:[_-]?(?:scheme|mode|method|type|kind))?", re.IGNORECASE)
_SCHEME = r"[A-Za-z][A-Za-z0-9+.-]*://"
# A URL in a text ends at a blank, a quote or a ';' that starts the next URL of a list.
_URL = re.compile(rf"{_SCHEME}(?:[^\s\"'<>;]|;(?!{_SCHEME}))*")
# A value ends where the URL does, or at a ':' closing the URL in a text ("GET …?api_key=…: HTTP 401").
_QUERY_PAIR = re.compile(rf"((?<=[?&])([^=&\s\"'#;]+)=)((?:[^&\s\"'#;:]|:(?!\s|$)|;(?!{_SCHEME}))*)")
_MIN_SECRET = 4  # shorter environment values ("0", "yes") are no secrets; masked everywhere, they hide settings
_MASK = "********"
_LISTED_KEYS = 16  # an unknown key's message lists the keys allowed beside it when there are at most so many


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
        return load_yaml(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML{_where(exc)}") from None


def load_yaml(text: str) -> Any:
    """yaml.safe_load, but a key twice in one mapping is a YAMLError: PyYAML keeps the last silently, so a
    second `ops:` pipeline pasted below the first replaced it."""
    return yaml.load(text, Loader=_UniqueKeyLoader)


class _UniqueKeyLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first: dict = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE:  # `<<: *base` may be overridden
                continue
            key = self.construct_object(key_node)
            if key in first:
                raise yaml.constructor.ConstructorError(
                    problem=f"key {key!r} appears twice in this mapping (first at line {first[key].line + 1})",
                    problem_mark=key_node.start_mark)
            first[key] = key_node.start_mark
        return super().construct_mapping(node, deep)


_MERGE = "tag:yaml.org,2002:merge"


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
    filled: frozenset[str] = frozenset()  # every variable's value put in (but the shortest)


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
        secrets, filled_in = set(), set()
        if deferred is not None and deferred.match(where) and any(
                not os.environ.get(name) for name in _ENV_REF.findall(value)):
            return Deferred(value)

        def sub(match: re.Match) -> str:
            name = match.group(1)
            if not os.environ.get(name):
                raise ConfigError(f"{where}: environment variable {name} is "
                                  f"{'set but empty' if name in os.environ else 'not set'}")
            if len(os.environ[name]) >= _MIN_SECRET:
                filled_in.add(os.environ[name])
                if _SECRET_NAME.search(name) or _SECRET_NAME.search(where):
                    secrets.add(os.environ[name])
            return os.environ[name]
        filled = FromEnvironment(_ENV_REF.sub(sub, value))
        filled.secrets = frozenset(secrets)
        filled.filled = frozenset(filled_in)
        return filled
    if isinstance(value, dict):
        return {k: interpolate_env(v, f"{where}.{k}" if where else str(k), deferred) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate_env(v, f"{where}[{i}]", deferred) for i, v in enumerate(value)]
    return value


def parse(model: type[M], data: Any, source: str, prefix: str = "") -> M:
    """Validate `data` as `model`; on failure raise ConfigError listing `source: key.path: problem (got ...)`."""
    booleans = {_key_path(prefix, path): value for path, value in _booleans_for_numbers([model], data)}
    lines = [f"{source}: {key}: {_NOT_BOOLEAN} (got {value})" for key, value in booleans.items()]
    try:
        settings = model.model_validate(data if data is not None else {})
    except ValidationError as exc:
        for err in _reworded(model, exc.errors()):
            key = _key_path(prefix, _written(err["loc"], data))
            if key in booleans:  # what pydantic says of 1 (a bound it breaks) is beside the point
                continue
            got = err.get("input")
            secret = _hidden_input(err)
            expected = _expected(model, err)
            if isinstance(got, FromEnvironment):
                shown = " (got a value from the environment, not shown)"
            elif err["type"] == "missing" or isinstance(got, dict) or secret or _quotes(expected, got):
                shown = ""
            else:
                shown = f" (got {redacted(got) if isinstance(got, str) else got!r})"
            lines.append(f"{source}: {key or '<top>'}: {expected}{shown}")
    if lines:
        raise ConfigError("\n".join(lines))
    if isinstance(settings, Settings):
        settings._from_environment = environment_values(data)
    return settings


def secret_key(key: str, header: bool = False) -> bool:
    """Whether a settings key's value is a credential (masked when printed, not quoted in an error). A `header`'s
    name says what it carries: `Auth:` a credential."""
    return bool(_SECRET_NAME.search(key)) and (header or not _MODE_KEY.fullmatch(key))


def _key_path(prefix: str, path: Any) -> str:
    return ".".join(str(p) for p in (prefix, *path) if p != "")


_NOT_BOOLEAN = "Input should be a number, not a boolean (YAML reads yes, no, on, off, true and false as booleans)"


def _booleans_for_numbers(annotations: list[Any], data: Any, path: tuple = ()) -> Iterator[tuple[tuple, bool]]:
    """The key paths (and values) where `data` holds a bool that one of `annotations` takes as a number and none
    as a bool: pydantic's lax mode reads True as 1, so `overlap_seconds: yes` was 1.0. Strings stay numbers
    ("30", a ${VAR}), as pydantic reads them."""
    arms = [arm for annotation in annotations for arm in annotation_types(annotation)]
    if isinstance(data, bool):
        if bool not in arms and any(isinstance(arm, type) and issubclass(arm, (int, float)) for arm in arms):
            yield path, data
        return
    for key, value in data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ():
        inner = [step for step in (_inside(arm, key) for arm in arms) if step is not None]
        yield from _booleans_for_numbers(inner, value, (*path, key))


def _expected(model: type[BaseModel], error: dict) -> str:
    """What an error says was expected: for a key the model does not have, the one meant or those allowed
    there; for a list-like field given something else, its length, bounds and default; pydantic's words
    otherwise."""
    if not error["loc"]:  # the model's own check
        return error["msg"]
    holders = _holders(model, error["loc"])
    if error["type"] == "extra_forbidden":
        known = _keys(holders)
        meant = difflib.get_close_matches(str(error["loc"][-1]), known, n=1)
        if meant:
            return f"unknown key (did you mean {meant[0]!r}?)"
        return f"unknown key (keys here: {', '.join(known)})" if 0 < len(known) <= _LISTED_KEYS else "unknown key"
    if error["type"] == "model_type":  # pydantic's words name our class ("instance of OaiSettings")
        named = error.get("ctx", {}).get("class_name")
        known = _keys([arm for annotation in _annotations(model, error["loc"]) for arm in annotation_types(annotation)
                       if isinstance(arm, type) and issubclass(arm, BaseModel) and arm.__name__ == named])
        listed = f" (keys: {', '.join(known)})" if 0 < len(known) <= _LISTED_KEYS else ""
        return f"expected a mapping of settings{listed}"
    sequences = [arm for annotation in _annotations(model, error["loc"]) for arm in annotation_types(annotation)
                 if get_origin(arm) in (list, tuple, set, frozenset)]
    if error["type"] in ("tuple_type", "list_type", "set_type", "frozen_set_type") and len(sequences) == 1:
        elements = [argument for argument in get_args(sequences[0]) if argument is not Ellipsis]
        size = f" of {len(elements)} values" if _sized(sequences[0]) else ""
        bounds = {_bounds(element) for element in elements}
        each = f", each {bounds.pop()}" if len(bounds) == 1 and "" not in bounds else ""
        fields = [holder.model_fields[error["loc"][-1]] for holder in holders
                  if error["loc"][-1] in holder.model_fields]
        default = fields[0].default if len(fields) == 1 else None
        listed = isinstance(default, (tuple, list)) and default
        example = f", e.g. {json.dumps(list(default), default=str)}" if listed else ""
        return f"expected a list{size}{each}{example}"
    return error["msg"]


def _keys(models: list[type[BaseModel]]) -> list[str]:
    """The keys a file may write in a mapping that one of `models` reads."""
    return sorted({field.alias or name for held in models for name, field in held.model_fields.items()
                   if not field.exclude})


def _quotes(message: str, got: Any) -> bool:
    """Whether an error's message quotes the value given already (a validator's "unknown time zone 'X'")."""
    return isinstance(got, str) and bool(got) and repr(got) in message


def _reworded(model: type[BaseModel], errors: list[dict]) -> Iterator[dict]:
    """pydantic's errors as `parse` reports them: a fixed-size tuple given too few or too many values is one
    error at the tuple (not "background.2: Field required", nor one more of each value out of bounds); a
    validator's ValueError is in its own words, without "Value error, ", and at the field its message starts
    with, if it names one there ("celery.time_limits: needs a 'default' entry")."""
    miscounted = {loc: error["input"] for error in errors if (loc := _miscounted(model, error)) is not None}
    said = set()
    for error in errors:
        within = next((loc for loc in miscounted if error["loc"][:len(loc)] == loc), None)
        if within is not None:
            if within not in said:
                said.add(within)
                yield {"type": "tuple_type", "loc": within, "input": miscounted[within],
                       "msg": "Input should be a valid tuple"}
        elif error["type"] == "value_error":
            yield _in_own_words(model, error)
        else:
            yield error


def _miscounted(model: type[BaseModel], error: dict) -> tuple | None:
    """The loc of the fixed-size tuple an error says was given too few values (one missing) or too many."""
    loc = error["loc"]
    if error["type"] == "missing" and loc and isinstance(loc[-1], int):
        loc = loc[:-1]
    elif error["type"] != "too_long":
        return None
    sized = any(_sized(arm) for annotation in _annotations(model, loc) for arm in annotation_types(annotation))
    return loc if sized else None


def _sized(annotation: Any) -> bool:
    arguments = get_args(annotation)
    return get_origin(annotation) is tuple and bool(arguments) and Ellipsis not in arguments


def _bounds(annotation: Any) -> str:
    """The bounds of an Annotated number ("0-255" for Annotated[int, Field(ge=0, le=255)]), "" for none."""
    if get_origin(annotation) is not Annotated:
        return ""
    found = {name: getattr(constraint, name) for item in get_args(annotation)[1:]
             for constraint in getattr(item, "metadata", [item])
             for name in ("ge", "gt", "le", "lt") if getattr(constraint, name, None) is not None}
    if found.keys() == {"ge", "le"}:
        return f"{found['ge']}-{found['le']}"
    signs = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    return " and ".join(f"{signs[name]} {value}" for name, value in found.items())


_FIELD_FIRST = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*): (.+)", re.DOTALL)


def _in_own_words(model: type[BaseModel], error: dict) -> dict:
    """A validator's ValueError as it was raised (pydantic's message adds "Value error, "), at the field (or
    field.key path) its message starts with when that is a field of the model at the error's loc."""
    raised = error.get("ctx", {}).get("error")
    message = str(raised) if isinstance(raised, ValueError) else error["msg"]
    named = _FIELD_FIRST.fullmatch(message)
    if named:
        path = tuple(named.group(1).split("."))
        if any(path[0] in holder.model_fields for holder in _holders(model, (*error["loc"], path[0]))) \
                and _annotations(model, (*error["loc"], *path)):
            return {**error, "loc": (*error["loc"], *path), "msg": named.group(2)}
    return {**error, "msg": message}


def _holders(model: type[BaseModel], loc: tuple) -> list[type[BaseModel]]:
    """The models that may hold the last key of an error's `loc`."""
    return [arm for annotation in _annotations(model, loc[:-1]) for arm in annotation_types(annotation)
            if isinstance(arm, type) and issubclass(arm, BaseModel)]


def _annotations(model: type[BaseModel], loc: tuple) -> list[Any]:
    """The annotations of what `loc` names inside `model`, found by following its parts through the annotations
    (fields, mappings' values, sequences' elements); a part no annotation takes is the tag pydantic adds for a
    union's arm, which keeps the arms with a Literal field that admits it (store: `s3`)."""
    found: list[Any] = [model]
    for part in loc:
        arms = [arm for annotation in found for arm in annotation_types(annotation)]
        found = [step for step in (_inside(arm, part) for arm in arms) if step is not None] or [
            arm for arm in arms if _tagged(arm, part)]
    return found


def _inside(annotation: Any, part: Any) -> Any:
    """The annotation of what `part` names inside a value of `annotation` (None: nothing)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        field = annotation.model_fields.get(part)
        return field.annotation if field else None
    arguments = get_args(annotation)
    if get_origin(annotation) is dict and len(arguments) == 2:
        return arguments[1]
    if get_origin(annotation) in (list, tuple, set, frozenset) and isinstance(part, int) and arguments:
        return arguments[min(part, len(arguments) - 1) if Ellipsis not in arguments else 0]
    return None


def _tagged(annotation: Any, tag: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel) and any(
        get_origin(field.annotation) is Literal and tag in get_args(field.annotation)
        for field in annotation.model_fields.values())


def annotation_types(annotation: Any) -> Iterator[Any]:
    """The types an annotation admits: those of a union (Path | None), the base of Annotated (FilePath)."""
    if get_origin(annotation) in (Union, UnionType, Annotated):
        arguments = get_args(annotation)
        for argument in arguments[:1] if get_origin(annotation) is Annotated else arguments:
            yield from annotation_types(argument)
    else:
        yield annotation


def _hidden_input(error: dict) -> bool:
    """An input an error must not show: under a secret-named key or a mapping of headers (a gateway's API key),
    or under a key the model does not have (a misspelt `passwd:` holds a password all the same)."""
    return error["type"] == "extra_forbidden" or any(
        secret_key(str(part)) or str(part).lower().endswith("headers") for part in error["loc"])


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
    strings (one a validator derived from the value, a URL `redacted` could not parse). `urls`: those of the
    strings that are one URL whose variables were put only where `redacted` masks (its password): shown so,
    the operator can check its host."""

    secrets: frozenset[str] = frozenset()
    urls: frozenset[str] = frozenset()


def environment_values(value: Any) -> EnvironmentValues:
    """What `masked` hides of the interpolated (not yet validated) settings data."""
    if isinstance(value, FromEnvironment):
        shown = redacted(value, _MASK)
        url = (_URL.fullmatch(value) is not None and bool(value.filled)
               and not any(part in shown for part in value.filled))
        found = EnvironmentValues({str(value)} if len(value) >= _MIN_SECRET else ())
        found.secrets = value.secrets
        found.urls = frozenset({str(value)} if url else ())
        return found
    parts = [environment_values(v) for v in (value.values() if isinstance(value, dict)
                                              else value if isinstance(value, list) else ())]
    found = EnvironmentValues(frozenset().union(*parts))
    found.secrets = frozenset().union(*(p.secrets for p in parts))
    found.urls = frozenset().union(*(p.urls for p in parts))
    return found


def masked(value: Any, hidden: frozenset[str] = frozenset(), key: str = "", header: bool = False) -> Any:
    """A copy of plain settings data for printing: the values of secret-named keys (secret_key: `auth: session`
    is shown, a header `Auth:` masked; `header`: `key` names one), and every string in
    `hidden` (the environment's values) wherever it sits but its `urls`, replaced; the `secrets` of hidden
    EnvironmentValues inside any string, and the password of any URL (a source's base_url written with
    user:password@)."""
    if isinstance(value, dict):
        return {k: masked(v, hidden, str(k), key.lower().endswith("headers")) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v, hidden, key, header) for v in value]
    if ((value in hidden and value not in getattr(hidden, "urls", ()))
            or (secret_key(key, header) and value not in (None, "") and not isinstance(value, bool))):
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
