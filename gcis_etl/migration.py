"""Running migration scripts: modules in migrations/ (or any path) exposing main(args) -> exit code."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import click

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


def available() -> list[str]:
    return sorted(p.stem for p in MIGRATIONS.glob("*.py") if not p.name.startswith("_"))


def run_script(script: str, args: list[str]) -> int:
    path = Path(script)
    if path.suffix != ".py":
        path = MIGRATIONS / f"{script}.py"
    if not path.is_file():
        names = ", ".join(available()) or "none yet"
        click.echo(f"no migration script {script!r} (available: {names})", err=True)
        return 2
    spec = importlib.util.spec_from_file_location(f"gcis_migration_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return int(module.main(args) or 0)
