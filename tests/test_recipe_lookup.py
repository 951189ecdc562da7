"""Recipe names are looked up from the config file's folder (GCIS_RECIPES, its recipes/, the shipped ones), by
every command and every process that resolves a task's recipe, whatever its working directory: a harvest
and a reencode run from elsewhere, and Celery pool processes, which run in the worker's own folder."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from gcis_etl.config import load_config
from gcis_etl.errors import ConfigError
from gcis_etl.ledger import Ledger
from gcis_etl.recipes import Recipe, load_recipe, recipe_files, recipe_names
from gcis_etl.work import Outcome
from gcis_etl.worker import CeleryExecutor
from tests.broker import Pool, make_masters, run_all, tasks_of
from tests.conftest import CORPUS

BIN = Path(sys.executable).parent
SHIPPED = Path(__file__).resolve().parent.parent / "recipes"


def local_recipe(folder: Path, name: str, quality: int) -> Recipe:
    """The shipped ptiff-jpeg-q90 under another name and quality, as folder/NAME.yaml."""
    data = yaml.safe_load((SHIPPED / "ptiff-jpeg-q90.yaml").read_text())
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.yaml").write_text(yaml.safe_dump({**data, "name": name, "quality": quality}))
    return load_recipe(folder / f"{name}.yaml")


def run(program: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """A command as an operator (or cron) runs it: from a working directory that is not the config's."""
    env = {k: v for k, v in os.environ.items() if k != "GCIS_CONFIG"}
    return subprocess.run([str(BIN / program), *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=180)


def test_one_lookup_order_serves_load_recipe_the_names_and_the_recipes_command(tmp_path, monkeypatch):
    """GCIS_RECIPES first, then recipes/ beside the config, then the shipped ones; the first file of a name wins."""
    site, elsewhere, extra = tmp_path / "site", tmp_path / "elsewhere", tmp_path / "extra"
    elsewhere.mkdir()
    from_env = local_recipe(extra, "house", 70)
    local_recipe(site / "recipes", "house", 60)  # shadowed by GCIS_RECIPES
    beside = local_recipe(site / "recipes", "ptiff-jpeg-q90", 50)  # shadows the shipped one
    only_here = local_recipe(site / "recipes", "only-here", 40)
    (site / "recipes" / "broken.yaml").write_text("name: broken\nquality: 101\n")
    (site / "config.yaml").write_text("imaging: {}\n")
    monkeypatch.setenv("GCIS_RECIPES", str(extra))

    files = recipe_files(site)
    assert files["house"] == extra / "house.yaml"
    assert files["ptiff-jpeg-q90"] == site / "recipes" / "ptiff-jpeg-q90.yaml"
    assert files["jp2-openjpeg-lossy"] == SHIPPED / "jp2-openjpeg-lossy.yaml"
    assert recipe_names(site) == sorted(files)
    assert load_recipe("house", site).digest == from_env.digest
    assert load_recipe("ptiff-jpeg-q90", site).digest == beside.digest != load_recipe("ptiff-jpeg-q90").digest

    listed = run("gcis-etl", "--config", str(site / "config.yaml"), "recipes", cwd=elsewhere)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()}
    assert list(rows) == list(files)  # each name once, in lookup order
    assert rows["house"].split()[1] == from_env.digest
    assert rows["ptiff-jpeg-q90"].split()[1] == beside.digest
    assert rows["only-here"].split()[1] == only_here.digest
    assert "INVALID" in rows["broken"] and "quality" in rows["broken"]
    with pytest.raises(ConfigError, match=r"recipe 'only-here' not found"):
        load_recipe("only-here", elsewhere)


def test_a_recipe_written_as_yml_is_found_by_name_as_by_path(tmp_path):
    site = tmp_path / "site"
    (site / "recipes").mkdir(parents=True)
    (site / "recipes" / "house.yml").write_text((SHIPPED / "ptiff-jpeg-q90.yaml").read_text().replace(
        "name: ptiff-jpeg-q90", "name: house"))
    by_path = load_recipe(site / "recipes" / "house.yml")
    assert by_path.name == "house"
    assert load_recipe("house", site).digest == by_path.digest
    assert "house" in recipe_names(site)


def test_a_harvest_and_a_reencode_find_the_recipes_beside_the_config_from_another_working_directory(
        tmp_path, monkeypatch):
    """The pipeline's recipe and --to-recipe both live in recipes/ beside config.yaml; neither command runs
    there. Every item is deposited with each in turn, the ledger recording the local recipes' digests."""
    monkeypatch.delenv("GCIS_RECIPES", raising=False)
    site, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in ("a/p1.jpg", "b/p2.png"):
        (site / "masters" / name).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(CORPUS / "gray8/hopper_gray.jpg", site / "masters" / "a/p1.jpg")
    shutil.copyfile(CORPUS / "png/png-rgb-64x56x8.png", site / "masters" / "b/p2.png")
    q80, q70 = local_recipe(site / "recipes", "local-q80", 80), local_recipe(site / "recipes", "local-q70", 70)
    config = site / "config.yaml"
    config.write_text(yaml.safe_dump({"state_dir": "state", "defaults": {"concurrency": 1}, "pipelines": {
        "p": {"source": {"kind": "filesystem", "root": "masters"}, "store": {"kind": "local", "root": "store"},
              "recipe": "local-q80"}}}))

    def recorded() -> set[tuple[str, str, str]]:
        with Ledger(site / "state" / "ledger.sqlite") as ledger:
            return {(r.status, r.recipe, r.recipe_digest) for r in ledger.items("p")}

    harvested = run("gcis-etl", "--config", str(config), "harvest", cwd=elsewhere)
    assert harvested.returncode == 0, harvested.stdout + harvested.stderr
    assert recorded() == {("deposited", "local-q80", q80.digest)}

    reencoded = run("gcis-migrate", "reencode", "--config", str(config), "--pipeline", "p",
                    "--from-recipe", "local-q80", "--to-recipe", "local-q70", cwd=elsewhere)
    assert reencoded.returncode == 0, reencoded.stdout + reencoded.stderr
    assert "2 deposited" in reencoded.stdout
    assert recorded() == {("deposited", "local-q70", q70.digest)}


@pytest.fixture
def pool(tmp_path, minio, redis_server, celery_workers, aws_env) -> Pool:
    return Pool(tmp_path, minio, redis_server, make_masters(tmp_path / "masters", objects=1, per_object=2),
                celery_workers)


def test_celery_workers_find_a_recipe_beside_the_config_whatever_their_working_directory(pool):
    """The orchestrator (routing, limits) and the pool processes (conversion) both resolve a task's recipe
    that is not the pipeline's, as a reencode sends it, from recipes/ beside the config: the workers run in
    the repository's folder (tests/broker.py), whose ./recipes has no such recipe."""
    config = pool.config("local")
    local = local_recipe(config.parent / "recipes", "local-q80", 80)
    pool.start("w1", config)
    loaded = load_config(config)
    pipeline = loaded.pipeline("demo")
    tasks = [replace(task, recipe=local.name, recipe_digest=local.digest) for task in tasks_of(pipeline)]

    results = run_all(CeleryExecutor({"demo": pipeline}, 2, loaded.state_dir / "scratch", loaded.celery), tasks)

    assert [(r.outcome, r.reason) for r in results] == [(Outcome.DEPOSITED, None)] * 2
    assert {pipeline.store.head(r.key).provenance.recipe_digest for r in results} == {local.digest}
