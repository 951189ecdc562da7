"""A connector of one's own (declared in the `gcis_etl.connectors` entry points) is held to what the built-in ones
are: every ${VARIABLE} value of its settings is a secret in the run's messages, note and logged traceback, whatever
its key, with no code of its own; a class that cannot be one (its __init__ not taking (settings, name), a method
or attribute of connectors.base.Source missing, an __init__ that raises) is a ConfigError naming
`pipelines.<name>.source.kind` when the configuration is loaded or the source opened (exit 2), not a TypeError or
an AttributeError in the middle of a run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from datetime import datetime, timezone

import pytest
import yaml

from connectors.base import SourceItem, SourceObject, UnreadableObject
from connectors.errors import PermissionDenied, SourceUnavailable
from gcis_etl.config import load_config
from gcis_etl.errors import ConfigError
from gcis_etl.harvesting import harvest_pipelines
from gcis_etl.ledger import Ledger
from gcis_etl.settings import Settings

GCIS = str(Path(sys.executable).with_name("gcis-etl"))
REPOSITORY = Path(__file__).resolve().parent.parent
TOKEN = "Plugin-Token-5150"


class TokenSettings(Settings):
    token: str
    fail: str = "down"  # down: the source refuses the listing; bug: the listing raises KeyError


class Failing:
    """A source whose every listing fails, quoting its token as a careless connector would; no listing order."""

    def __init__(self, settings: TokenSettings, name: str):
        self.settings, self.name = settings, name

    def changes(self, since, until=None):
        if self.settings.fail == "bug":
            raise KeyError(f"no field for token {self.settings.token}")
        raise SourceUnavailable(f"server refused https://api.example/?key={self.settings.token} "
                                f"(token {self.settings.token})")

    def get(self, object_ids):
        return iter(())

    def fetch(self, item, dest_dir):
        raise NotImplementedError


class TokenSource(Failing):
    lists_in_modified_order = False
    modified_order_setting = None


class NoOrder(Failing):  # a run cut short would ask for lists_in_modified_order at its end
    modified_order_setting = None


class NoName(TokenSource):
    def __init__(self, settings: TokenSettings):  # before connectors were given their pipeline's name
        super().__init__(settings, "no-name")


class NoGet(TokenSource):
    get = None


class Refusing(TokenSource):
    def __init__(self, settings: TokenSettings, name: str):
        raise ValueError(f"token {settings.token} is not one of ours")


class RefusedItem(TokenSource):
    """Lists one object whose master it is refused, quoting its token: the item fails, the run goes on."""

    def changes(self, since, until=None):
        now = datetime.now(timezone.utc)
        yield SourceObject("o1", now, (SourceItem("i1", 1, "i1.tif", 10, now, locator="i1"),))

    def fetch(self, item, dest_dir):
        raise PermissionDenied(f"GET https://api.example/{item.id}?key={self.settings.token}: HTTP 403")


class Undescribed(TokenSource):
    """Names one object it cannot describe, quoting its token in why."""

    def changes(self, since, until=None):
        yield UnreadableObject("o1", None, f"GET https://api.example/o1?key={self.settings.token}: bad json")


def write_config(folder: Path, kind: str, **source) -> Path:
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump({"state_dir": "state", "pipelines": {"photos": {
        "source": {"kind": kind, "token": "${PLUGIN_TOKEN}", **source},
        "store": {"kind": "local", "root": "store"}}}}))
    return path


def gcis(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPOSITORY)]), "PLUGIN_TOKEN": TOKEN}
    env.pop("GCIS_CONFIG", None)
    return subprocess.run([GCIS, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


# ------------------------------------------------------------------------------------------------- secrets


def test_a_plugin_sources_environment_values_stay_out_of_the_runs_message_and_note(declare, tmp_path, monkeypatch):
    declare("token-connectors", tokened=f"{__name__}:TokenSource")
    monkeypatch.setenv("PLUGIN_TOKEN", TOKEN)
    config = load_config(write_config(tmp_path, "tokened"))
    [outcome] = harvest_pipelines(config)
    assert outcome.exit_code == 1
    assert outcome.message == ("photos: run stopped: server refused https://api.example/?key=*** (token ***): the "
                               "source is unavailable: run again once it is back (everything settled so far is "
                               "recorded)")
    with Ledger.open(config, read_only=True) as ledger:
        [run] = ledger.runs("photos")
    assert run.status == "failed" and run.note == "SourceUnavailable: server refused https://api.example/?key=*** " \
                                                  "(token ***)"


def test_a_plugin_sources_item_failure_is_recorded_without_its_secret(declare, tmp_path, monkeypatch):
    declare("token-connectors", tokened=f"{__name__}:RefusedItem")
    monkeypatch.setenv("PLUGIN_TOKEN", TOKEN)
    config = load_config(write_config(tmp_path, "tokened"))
    [outcome] = harvest_pipelines(config)
    assert outcome.exit_code == 1 and outcome.report.counts["failed"] == 1
    with Ledger.open(config, read_only=True) as ledger:
        [item] = ledger.items("photos")
    assert item.status == "failed" and item.reason == "fetching: GET https://api.example/i1?key=***: HTTP 403"


def test_why_a_plugin_source_cannot_describe_an_object_is_recorded_and_planned_without_its_secret(declare, tmp_path,
                                                                                                   monkeypatch):
    site = declare("token-connectors", tokened=f"{__name__}:Undescribed")
    monkeypatch.setenv("PLUGIN_TOKEN", TOKEN)
    config = load_config(write_config(tmp_path, "tokened"))
    [outcome] = harvest_pipelines(config)
    with Ledger.open(config, read_only=True) as ledger:
        [item] = ledger.items("photos")
    assert item.reason == "the source cannot describe it: GET https://api.example/o1?key=***: bad json"
    planned = gcis(site, tmp_path, "harvest", "--dry-run")
    assert "key=***" in planned.stdout and TOKEN not in planned.stdout + planned.stderr


def test_a_crashing_plugin_sources_traceback_is_logged_without_its_secret(declare, tmp_path):
    site = declare("token-connectors", tokened=f"{__name__}:TokenSource")
    write_config(tmp_path, "tokened", fail="bug")
    crashed = gcis(site, tmp_path, "harvest")
    assert crashed.returncode == 1
    assert "Traceback (most recent call last)" in crashed.stderr
    assert "KeyError: 'no field for token ***'" in crashed.stderr
    assert "photos: run crashed: KeyError: 'no field for token ***' (its traceback is logged)" in crashed.stderr
    assert TOKEN not in crashed.stderr
    logged = gcis(site, tmp_path, "harvest", "--log-json")
    crash = [json.loads(line) for line in logged.stderr.splitlines() if '"exception"' in line]
    assert crash and "KeyError: 'no field for token ***'" in crash[0]["exception"] and TOKEN not in logged.stderr
    status = gcis(site, tmp_path, "status")
    assert "KeyError: 'no field for token ***'" in status.stdout and TOKEN not in status.stdout


# ---------------------------------------------------------------------------------------- wrong connectors


@pytest.mark.parametrize("declared, message", [
    ("NoName", "connector 'tokened' (tests.test_plugin_sources:NoName): its __init__(self, settings) cannot be "
               "called as NoName(settings, name=...), as every connector is"),
    ("NoGet", "connector 'tokened' (tests.test_plugin_sources:NoGet) lacks the method(s) get of "
              "connectors.base.Source"),
], ids=["no name parameter", "no get"])
def test_a_class_that_cannot_be_a_source_is_a_config_error_naming_the_key_at_load(declare, tmp_path, declared,
                                                                                  message):
    declare("token-connectors", tokened=f"tests.test_plugin_sources:{declared}")
    path = write_config(tmp_path, "tokened")
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value) == f"{path}: pipelines.photos.source.kind: {message}"


@pytest.mark.parametrize("declared, message", [
    ("Refusing", "connector 'tokened' cannot be opened: its Refusing(settings, name=...) raised ValueError: "
                 "token *** is not one of ours"),
    ("NoOrder", "connector 'tokened' gives a source without the attribute(s) lists_in_modified_order of "
                "connectors.base.Source"),
], ids=["__init__ raises", "no lists_in_modified_order"])
def test_a_source_that_cannot_be_opened_is_a_config_error_naming_the_key(declare, tmp_path, monkeypatch, declared,
                                                                         message):
    site = declare("token-connectors", tokened=f"tests.test_plugin_sources:{declared}")
    monkeypatch.setenv("PLUGIN_TOKEN", TOKEN)
    path = write_config(tmp_path, "tokened")
    config = load_config(path)
    with pytest.raises(ConfigError) as raised:
        list(harvest_pipelines(config))
    assert str(raised.value) == f"{path}: pipelines.photos.source.kind: {message}"
    checked = gcis(site, tmp_path, "config", "check")
    assert checked.returncode == 2 and checked.stderr == f"configuration error:\n{raised.value}\n"


def test_a_source_whose_close_fails_is_one_warning_line_and_its_traceback_only_at_debug(caplog):
    """A connector's close is optional and must not sway the run: what went wrong is said on one line (cron mails
    it), the traceback only for -v, where the connector's author looks."""
    from connectors.base import close_source

    class ClosesBadly:
        name = "plugin"

        def close(self):
            raise KeyError("session")

    with caplog.at_level("DEBUG", logger="connectors.base"):
        close_source(ClosesBadly())
    warning, debug = caplog.records
    assert (warning.levelname, warning.exc_info) == ("WARNING", None)
    assert warning.getMessage() == ("plugin: closing the source failed (KeyError: 'session'); the run's outcome "
                                    "stands")
    assert debug.levelname == "DEBUG" and debug.exc_info[0] is KeyError
