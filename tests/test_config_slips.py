"""Three slips an operator makes in config.yaml or a recipe that used to load silently: a variable set but empty
(the harvest harvested its own folder), a key written twice (the last won) and a yes/no where a number goes
(pydantic read it as 1)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from gcis_etl.config import load_config
from gcis_etl.errors import ConfigError
from gcis_etl.migration import store_settings
from gcis_etl.recipes import load_recipe

ROOT = Path(__file__).resolve().parent.parent
SHIPPED_RECIPE = (ROOT / "recipes" / "ptiff-jpeg-q90.yaml").read_text()
PIPELINE = """\
pipelines:
  ops:
    source: {kind: filesystem, root: masters}
    store: {kind: local, root: store}
"""


def write(folder: Path, text: str, name: str = "config.yaml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def config_check(path: Path, **environment: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gcis_etl.cli", "--config", str(path), "config", "check"],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, **environment}, timeout=120)


def test_config_check_refuses_a_source_root_from_a_variable_set_but_empty(tmp_path):
    (tmp_path / "masters").mkdir()
    path = write(tmp_path, PIPELINE.replace("root: masters", "root: '${GCIS_TEST_MASTERS}'"))
    done = config_check(path, GCIS_TEST_MASTERS="")
    assert done.returncode == 2
    assert (f"{path}: pipelines.ops.source.root: environment variable GCIS_TEST_MASTERS is set but empty"
            in done.stderr)
    assert config_check(path, GCIS_TEST_MASTERS=str(tmp_path / "masters")).returncode == 0


def test_an_empty_source_variable_is_left_for_opening_the_source_like_an_unset_one(tmp_path, monkeypatch):
    """status and report read only the ledger: they need no source variable, set or not, empty or not."""
    monkeypatch.setenv("GCIS_TEST_PASSWORD", "")
    path = write(tmp_path, PIPELINE.replace("source: {kind: filesystem, root: masters}",
                                            "source: {kind: otmm, base_url: 'https://otmm.example.org', "
                                            "username: etl, password: '${GCIS_TEST_PASSWORD}'}"))
    pipeline = load_config(path).pipeline("ops")
    with pytest.raises(ConfigError, match="pipelines.ops.source.password: environment variable GCIS_TEST_PASSWORD "
                                          "is set but empty"):
        pipeline.source


@pytest.mark.parametrize("written", ["${GCIS_TEST_ROOT}", "${GCIS_TEST_ROOT}/store"])
def test_a_variable_set_but_empty_is_refused_wherever_it_sits_in_a_value(tmp_path, monkeypatch, written):
    """Empty, `${GCIS_TEST_ROOT}/store` is /store: the same slip, so the rule is one: never fill in an empty value
    (a key that may be empty is written empty or left out)."""
    monkeypatch.setenv("GCIS_TEST_ROOT", "")
    path = write(tmp_path, PIPELINE.replace("root: store", f"root: '{written}'"))
    with pytest.raises(ConfigError, match=f"^{path}: pipelines.ops.store.root: environment variable GCIS_TEST_ROOT "
                                          "is set but empty$"):
        load_config(path)


def test_a_pipeline_pasted_twice_is_refused_with_where_both_are(tmp_path):
    path = write(tmp_path, PIPELINE + PIPELINE.replace("pipelines:\n", "").replace("root: masters", "root: other"))
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value) == (f"{path}: not valid YAML at line 5, column 3: key 'ops' appears twice in this "
                                 f"mapping (first at line 2)")


def test_config_check_refuses_a_top_level_key_written_twice(tmp_path):
    path = write(tmp_path, "state_dir: a\n" + PIPELINE + "state_dir: b\n")
    done = config_check(path)
    assert done.returncode == 2
    assert (f"{path}: not valid YAML at line 6, column 1: key 'state_dir' appears twice in this mapping "
            f"(first at line 1)") in done.stderr


def test_a_recipe_with_a_key_written_twice_is_refused(tmp_path):
    path = write(tmp_path, SHIPPED_RECIPE + "quality: 75\n", "ptiff-jpeg-q90.yaml")
    with pytest.raises(ConfigError, match=r"^.*ptiff-jpeg-q90.yaml: not valid YAML at line \d+, column 1: key "
                                          r"'quality' appears twice in this mapping \(first at line \d+\)$"):
        load_recipe(path)


def test_an_inline_store_with_a_key_written_twice_is_refused():
    with pytest.raises(click.BadParameter):
        store_settings("{kind: local, root: a, root: b}", "--to")


def test_yaml_merge_keys_still_merge_and_may_be_overridden(tmp_path):
    path = write(tmp_path, "defaults: &run {max_attempts: 2, concurrency: 3}\n" + PIPELINE +
                 "    <<: *run\n    max_attempts: 4\n")
    ops = load_config(path).pipelines["ops"]
    assert (ops.max_attempts, ops.concurrency) == (4, 3)


@pytest.mark.parametrize(("setting", "key"), [("overlap_seconds: yes", "pipelines.ops.overlap_seconds"),
                                              ("max_run_minutes: on", "pipelines.ops.max_run_minutes"),
                                              ("imaging: {background: [255, true, 0]}",
                                               "pipelines.ops.imaging.background.1")])
def test_a_boolean_is_no_number(tmp_path, setting, key):
    path = write(tmp_path, PIPELINE + f"    {setting}\n")
    with pytest.raises(ConfigError, match=f"^{path}: {key}: Input should be a number, not a boolean "):
        load_config(path)


def test_a_boolean_in_a_source_is_no_number_either(tmp_path):
    path = write(tmp_path, PIPELINE.replace("root: masters", "root: masters, retry: {max_attempts: yes}"))
    with pytest.raises(ConfigError, match=f"^{path}: pipelines.ops.source.retry.max_attempts: Input should be a "
                                          "number, not a boolean"):
        load_config(path).pipeline("ops").source


def test_config_check_refuses_a_boolean_for_a_number_and_keeps_a_number_in_quotes(tmp_path):
    path = write(tmp_path, PIPELINE + "    overlap_seconds: '30'\n    max_run_minutes: yes\n")
    done = config_check(path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[1:] == [
        f"{path}: pipelines.ops.max_run_minutes: Input should be a number, not a boolean (YAML reads yes, no, on, "
        "off, true and false as booleans) (got True)"]


def test_a_recipe_number_given_a_boolean_is_refused_but_booleans_stay_booleans(tmp_path):
    path = write(tmp_path, SHIPPED_RECIPE.replace("quality: 90", "quality: yes").replace("fast_dct: false",
                                                                                         "fast_dct: yes"),
                 "ptiff-jpeg-q90.yaml")
    with pytest.raises(ConfigError, match="ptiff-jpeg-q90.yaml: quality: Input should be a number, not a "
                                          "boolean") as raised:
        load_recipe(path)
    assert "fast_dct" not in str(raised.value)
    path.write_text(path.read_text().replace("quality: yes", "quality: '90'"))
    assert load_recipe(path).quality == 90 and load_recipe(path).fast_dct is True


@pytest.mark.parametrize("chroma", ["4:2:0", "4:4:4"])
def test_an_unquoted_chroma_read_as_a_base_60_number_is_taken_as_written(tmp_path, chroma):
    """YAML 1.1 reads 4:2:0 as 14520: the recipe was refused with "Input should be '4:2:0' or '4:4:4' (got
    14520)", a number the user never wrote."""
    (tmp_path / "quoted").mkdir()
    unquoted = load_recipe(write(tmp_path, SHIPPED_RECIPE.replace('chroma: "4:2:0"', f"chroma: {chroma}"),
                                 "ptiff-jpeg-q90.yaml"))
    quoted = load_recipe(write(tmp_path / "quoted", SHIPPED_RECIPE.replace('chroma: "4:2:0"', f'chroma: "{chroma}"'),
                               "ptiff-jpeg-q90.yaml"))
    assert unquoted.chroma == quoted.chroma == chroma and unquoted.digest == quoted.digest


@pytest.mark.parametrize("extension, message", [
    ("./../../escaped", "extension: must be a dot and lower-case letters or digits (.tif, .jp2) (got './../../escaped')"),
    (".", "extension: must be a dot and lower-case letters or digits"),
    ("'. tif'", "got '. tif'"),
    (".TIF", "got '.TIF'"),
    (".jp2", "extension: names JPEG 2000, but encoder ptiff writes TIFF (.tif) (got '.jp2')"),
])
def test_a_recipe_extension_that_is_no_plain_suffix_or_names_another_format_is_refused(tmp_path, extension, message):
    """The scratch file and the store key end with it: "./../../escaped" wrote every item's output to one path
    outside its scratch folder."""
    path = write(tmp_path, SHIPPED_RECIPE.replace("extension: .tif", f"extension: {extension}"), "ptiff-jpeg-q90.yaml")
    with pytest.raises(ConfigError, match=r"ptiff-jpeg-q90\.yaml: .*" + re.escape(message)):
        load_recipe(path)
