"""A connector of one's own: declared in the `gcis_etl.connectors` entry-point group of an installed distribution
(here written as pip writes one: a .dist-info folder with entry_points.txt on the path), it is a `kind:` like the
built-in ones, in config files, the CLI and workers alike; its settings' Path fields are anchored to the config
file's folder; a wrong declaration is a ConfigError naming `pipelines.<name>.source.kind`."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Iterator

import pytest
import yaml

from connectors.base import FetchedFile, Fixity, SourceItem, SourceObject
from connectors.errors import ObjectNotFound
from connectors.idlist import IdListSettings
from gcis_etl.config import load_config
from gcis_etl.errors import ConfigError
from gcis_etl.settings import Settings

GCIS = str(Path(sys.executable).with_name("gcis-etl"))
REPOSITORY = Path(__file__).resolve().parent.parent
HERE = f"{__name__}:FlatSource"


class FlatSettings(Settings):
    folder: Path
    only: IdListSettings = IdListSettings()
    title_prefix: str = "Image"


class FlatSource:
    """Every file in a folder is an object of one image."""

    lists_in_modified_order = False
    modified_order_setting = None

    def __init__(self, settings: FlatSettings, name: str = "flat"):
        self.name, self.settings = name, settings

    def changes(self, since: datetime | None, until: datetime | None = None) -> Iterator[SourceObject]:
        wanted = set(self.settings.only.read())
        for path in sorted(self.settings.folder.iterdir()):
            if not wanted or path.stem in wanted:
                yield self._object(path)

    def get(self, object_ids: Iterable[str]) -> Iterator[SourceObject]:
        for object_id in object_ids:
            path = next(self.settings.folder.glob(f"{object_id}.*"), None)
            if path is None:
                raise ObjectNotFound(f"{self.name}: no object {object_id}")
            yield self._object(path)

    def fetch(self, item: SourceItem, dest_dir: Path) -> FetchedFile:
        path = Path(shutil.copyfile(item.locator, Path(dest_dir) / item.original_name))
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        return FetchedFile(item, path, path.stat().st_size, digest, digest == item.fixity.value)

    def _object(self, path: Path) -> SourceObject:
        modified = datetime.fromtimestamp(path.stat().st_mtime, timezone.utc)
        item = SourceItem(path.name, 1, path.name, path.stat().st_size, modified,
                          Fixity("sha256", hashlib.sha256(path.read_bytes()).hexdigest()), locator=str(path))
        return SourceObject(path.stem, modified, (item,))


class NoSettingsModel:
    def __init__(self, settings, name: str = "plain"):
        self.settings = settings


def write_config(folder: Path, source: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump({"pipelines": {"photos": {"source": source,
                                                             "store": {"kind": "local", "root": "store"}}}}))
    return path


def masters(folder: Path, *names: str) -> None:
    folder.mkdir(parents=True)
    for name in names:
        (folder / name).write_bytes(name.encode())


def test_a_declared_connector_is_a_kind_whose_path_fields_are_relative_to_the_config_file(declare, tmp_path,
                                                                                          monkeypatch):
    declare("museum-connectors", flat=HERE)
    masters(tmp_path / "etc" / "masters", "a.tif", "b.tif", "c.tif")
    (tmp_path / "etc" / "wanted.txt").write_text("a\nc\n")
    path = write_config(tmp_path / "etc", {"kind": "flat", "folder": "masters", "only": {"file": "wanted.txt"},
                                           "title_prefix": "masters/x"})
    monkeypatch.chdir(tmp_path)  # not the config file's folder
    source = load_config(path).pipeline("photos").source
    assert isinstance(source, FlatSource) and source.name == "photos"
    assert source.settings.folder == tmp_path / "etc" / "masters"
    assert source.settings.only.file == tmp_path / "etc" / "wanted.txt"
    assert source.settings.title_prefix == "masters/x"  # a str field, not a path: left as written
    assert [o.id for o in source.changes(None)] == ["a", "c"]


def test_an_absolute_path_field_is_left_as_it_is(declare, tmp_path):
    declare("museum-connectors", flat=HERE)
    masters(tmp_path / "elsewhere", "a.tif")
    path = write_config(tmp_path / "etc", {"kind": "flat", "folder": str(tmp_path / "elsewhere")})
    assert load_config(path).pipeline("photos").source.settings.folder == tmp_path / "elsewhere"


def test_the_cli_knows_a_declared_kind_with_no_code_run_first(declare, tmp_path):
    """The same holds in every process where the distribution is installed: cron's, a Celery worker's."""
    site = declare("museum-connectors", flat=HERE)
    masters(tmp_path / "etc" / "masters", "a.tif", "b.tif")
    path = write_config(tmp_path / "etc", {"kind": "flat", "folder": "masters"})
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPOSITORY)])}
    env.pop("GCIS_CONFIG", None)
    done = subprocess.run([GCIS, "--config", str(path), "config", "check"], capture_output=True, text=True,
                          cwd=elsewhere, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    printed = yaml.safe_load(done.stdout)["pipelines"]["photos"]["source"]
    assert printed["kind"] == "flat" and printed["folder"] == str(tmp_path / "etc" / "masters")


@pytest.mark.parametrize("declared, kind, message", [
    ({"flat": HERE}, "flatt", "unknown source connector 'flatt'; known: filesystem, flat, otmm, rosetta, s3"),
    ({"flat": "no_such_module:FlatSource"}, "flat",
     "connector 'flat' (no_such_module:FlatSource) cannot be loaded: ModuleNotFoundError: No module named "
     "'no_such_module'"),
    ({"flat": f"{__name__}:FlatSourceX"}, "flat",
     f"connector 'flat' ({__name__}:FlatSourceX) cannot be loaded: AttributeError"),
    ({"flat": f"{__name__}:NoSettingsModel"}, "flat",
     f"connector 'flat' ({__name__}:NoSettingsModel) is no class whose __init__(self, settings, name) annotates "
     "`settings` with a gcis_etl.settings.Settings model"),
    ({"flat": f"{__name__}:FlatSettings"}, "flat", "is no class whose __init__(self, settings, name) annotates"),
], ids=["unknown", "no module", "no class", "no settings model", "a settings model, no source"])
def test_a_wrong_declaration_is_a_config_error_naming_the_key(declare, tmp_path, declared, kind, message):
    declare("museum-connectors", **declared)
    path = write_config(tmp_path, {"kind": kind, "folder": "masters"})
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value).startswith(f"{path}: pipelines.photos.source.kind: ")
    assert message in str(raised.value)


def test_a_kind_two_distributions_declare_is_a_config_error(declare, tmp_path):
    declare("museum-connectors", flat=HERE)
    declare("other-connectors", flat="other:FlatSource")
    with pytest.raises(ConfigError, match=rf"pipelines.photos.source.kind: connector 'flat' is declared more than "
                                          rf"once .*: other:FlatSource, {__name__}:FlatSource"):
        load_config(write_config(tmp_path, {"kind": "flat", "folder": "masters"}))


def test_its_settings_are_validated_with_the_key_named(declare, tmp_path):
    declare("museum-connectors", flat=HERE)
    with pytest.raises(ConfigError, match="pipelines.photos.source.folder: Field required"):
        load_config(write_config(tmp_path, {"kind": "flat"}))
    with pytest.raises(ConfigError,
                       match=r"pipelines.photos.source.titel_prefix: unknown key \(did you mean 'title_prefix'\?\)"):
        load_config(write_config(tmp_path, {"kind": "flat", "folder": "m", "titel_prefix": "x"}))
