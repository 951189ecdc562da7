"""What someone extending gcis-etl meets: a store kind with no implementation is refused by name, not opened as
a local store; a recipe edited in place is told apart from another recipe; `gcis-etl recipes` keeps a recipe's
several errors under its row; `gcis-migrate --help` lists the scripts in migrations/."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import typing
from pathlib import Path
from typing import Literal

import pytest
import yaml

from gcis_etl.errors import ConfigError
from gcis_etl.migration import available
from gcis_etl.settings import Settings
from gcis_etl.stores import open_store

BIN = Path(sys.executable).parent
REPOSITORY = Path(__file__).resolve().parent.parent
MASTER = REPOSITORY / "tests" / "corpus" / "gray8" / "hopper_gray.jpg"


class FtpStoreSettings(Settings):
    """A kind added to the settings, its store not yet written."""

    kind: Literal["ftp"] = "ftp"


def run(program: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "GCIS_CONFIG"}
    return subprocess.run([str(BIN / program), *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=180)


def test_a_store_kind_open_store_has_no_implementation_for_is_a_config_error():
    with pytest.raises(ConfigError, match=r"store: kind 'ftp' has no implementation \(gcis_etl.stores.STORE_KINDS "
                                          r"knows local, s3\)"):
        open_store(FtpStoreSettings())


def test_every_kind_of_store_settings_has_an_opener():
    from gcis_etl.stores import STORE_KINDS, StoreSettings
    union, _ = typing.get_args(StoreSettings)
    kinds = {typing.get_args(model.model_fields["kind"].annotation)[0] for model in typing.get_args(union)}
    assert kinds == set(STORE_KINDS)


def test_a_recipe_edited_in_place_is_named_as_an_older_version_of_itself(tmp_path):
    (tmp_path / "masters" / "book").mkdir(parents=True)
    shutil.copy(MASTER, tmp_path / "masters" / "book" / "p1.jpg")
    recipe = yaml.safe_load((REPOSITORY / "recipes" / "ptiff-jpeg-q90.yaml").read_text()) | {"name": "house"}
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "house.yaml").write_text(yaml.safe_dump(recipe))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"pipelines": {"museum": {
        "source": {"kind": "filesystem", "root": "masters"}, "store": {"kind": "local", "root": "store"},
        "recipe": "house"}}}))
    config = str(tmp_path / "config.yaml")
    first = run("gcis-etl", "--config", config, "harvest", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    old = run("gcis-etl", "--config", config, "recipes", cwd=tmp_path).stdout
    (tmp_path / "recipes" / "house.yaml").write_text(yaml.safe_dump(recipe | {"quality": 80}))
    new = run("gcis-etl", "--config", config, "recipes", cwd=tmp_path).stdout
    digests = [next(line.split()[1] for line in out.splitlines() if line.startswith("house ")) for out in (old, new)]

    again = run("gcis-etl", "--config", config, "harvest", "--dry-run", "--full", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert (f"unchanged; deposited with an older version of recipe house (digest {digests[0]}, now {digests[1]}): "
            f"`gcis-migrate reencode --from-recipe house` re-derives it") in again.stdout


def test_the_recipes_command_keeps_a_recipes_errors_under_its_row(tmp_path):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "broken.yaml").write_text("name: broken\nqualty: 80\ntile: 500\n")
    (tmp_path / "config.yaml").write_text("imaging: {}\n")
    listed = run("gcis-etl", "--config", str(tmp_path / "config.yaml"), "recipes", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    row = next(n for n, line in enumerate(lines) if line.startswith("broken "))
    head = lines[row][:lines[row].index("INVALID: ") + len("INVALID: ")]
    following = lines[row + 1:row + 2]
    assert following and following[0].startswith(" " * len(head)) and "qualty" in lines[row] + following[0]
    assert "tile" in lines[row] + following[0]


def test_gcis_migrate_help_lists_the_scripts(tmp_path):
    shown = run("gcis-migrate", "--help", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    scripts = shown.stdout[shown.stdout.index("Scripts in migrations/"):]
    assert " ".join(scripts.split()).endswith(", ".join(available()))
