"""The library stands without the command line, and the two command lines (gcis-etl, gcis-migrate) agree: the
same configuration-error exit, the same shared options."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import click
import pytest

from gcis_etl.cli import main as gcis_etl_main
from gcis_etl.migration import MIGRATIONS

BIN = Path(sys.executable).parent
LIBRARY = sorted(p.stem for p in (Path(__file__).resolve().parent.parent / "gcis_etl").glob("*.py")
                 if p.stem != "__init__")


def test_no_library_module_loads_the_command_line():
    """Each gcis_etl module imported in a fresh interpreter, as the Celery worker and a migration script import
    them: none pulls in gcis_etl.cli."""
    probe = ("import importlib, sys\n"
             f"for name in {LIBRARY!r}:\n"
             "    importlib.import_module('gcis_etl.' + name)\n"
             "print(sorted(m for m in sys.modules if m == 'gcis_etl.cli' or m.startswith('gcis_etl.cli.')))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "migration" in LIBRARY and "harvesting" in LIBRARY
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("log_json", [True, False])
def test_gcis_migrate_and_gcis_etl_fail_the_same_way_on_a_bad_configuration(tmp_path, log_json):
    (tmp_path / "bad.yaml").write_text("pipelines:\n  p: {source: {kind: nope}}\n")
    flag = ["--log-json"] if log_json else []
    migrate = subprocess.run([str(BIN / "gcis-migrate"), "initial_load", "--config", "bad.yaml", "--pipeline", "p",
                              *flag], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    harvest = subprocess.run([str(BIN / "gcis-etl"), "--config", "bad.yaml", "harvest", *flag],
                             capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert migrate.returncode == harvest.returncode == 2
    assert migrate.stdout == harvest.stdout == ""
    if log_json:
        [said], [also] = [[json.loads(line) for line in p.stderr.splitlines()] for p in (migrate, harvest)]
        said.pop("time"), also.pop("time")
        assert said == also
        assert said["level"] == "error" and said["message"].startswith(
            "configuration error:\nbad.yaml: pipelines.p.source.kind: unknown source connector 'nope'")
    else:
        assert migrate.stderr == harvest.stderr
        assert migrate.stderr.startswith("configuration error:\nbad.yaml: pipelines.p.source.kind: ")


def _script_command(name: str):
    spec = importlib.util.spec_from_file_location(f"layering_{name}", MIGRATIONS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.main.command


def _options(command) -> dict[str, tuple]:
    """Each option by its flags: what --help says of it, and what it accepts."""
    return {tuple(p.opts): (p.help, p.envvar, repr(p.type), p.count, p.is_flag) for p in command.params
            if isinstance(p, click.Option)}


@pytest.mark.parametrize("script", ["initial_load", "reencode"])
def test_the_options_both_command_lines_take_are_described_alike(script):
    ours = {**_options(gcis_etl_main), **_options(gcis_etl_main.commands["harvest"])}
    theirs = _options(_script_command(script))
    shared = [("--config",), ("--log-json",), ("-v", "--verbose"), ("--limit",), ("--max-minutes",)]
    for flags in shared:
        assert flags in ours and flags in theirs
        assert ours[flags] == theirs[flags], flags
    assert _options(gcis_etl_main.commands["retry"])[("--log-json",)] == theirs[("--log-json",)]
