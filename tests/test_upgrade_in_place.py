"""gcis-etl installed anew under the processes that run it (a walk upgrading with work in flight): a conversion
process started from the new files ran the other version's code and failed every item (an attempt counted each),
`inspect` rejected good masters ("cannot be decoded: conversion process exited with code 1"), and a Celery pool
process imported the new gcis_etl.conversion beside its old isolation module (ImportError, counted as the item's
failure). Also without an upgrade: run from inside another checkout, the conversion process imported that one's
code (the working directory first on its path). "Another version" here is a copy of this checkout's packages with
a file changed, imported through PYTHONPATH or found in the working directory."""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from gcis_etl.config import load_config
from gcis_etl.work import Outcome, Worker
from tests.broker import make_masters, pool_config, tasks_of

REPO = Path(__file__).resolve().parent.parent
MASTER = REPO / "tests" / "corpus" / "rgb8-tiff-uncompressed" / "hopper.tif"
# what the walk's two versions did to each other: a job message of another shape, an import the old module lacks
OTHER_JOB_SHAPE = ("gcis_etl/isolation.py", "target, args, deadline, seconds = message",
                   "target, args, deadline = message")
NEEDS_NEW_ISOLATION = ("gcis_etl/conversion.py", "from gcis_etl import isolation\n",
                       "from gcis_etl import isolation\nfrom gcis_etl.isolation import TimeLimitOfTheNewVersion\n")
OTHER_VERSION = re.compile(r"the conversion process runs another version of gcis-etl than the process that started "
                           r"it \(.+, pid \d+ on .+; upgraded in place\?\): restart that process")


def another_version(tmp_path: Path) -> Path:
    """A copy of this checkout's packages and recipes, in a folder of its own: another version once changed()."""
    root = tmp_path / "other"
    for folder in ("gcis_etl", "connectors", "recipes"):
        shutil.copytree(REPO / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def changed(root: Path, change: tuple[str, str, str]) -> None:
    path, old, new = change
    text = (root / path).read_text()
    assert text.count(old) == 1
    (root / path).write_text(text.replace(old, new))


def python(code: str, *args: str, cwd: Path, path: list[Path]) -> subprocess.CompletedProcess:
    """`code` in a Python of its own (-P: not its working directory on its path), its packages from `path`."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, path)))
    return subprocess.run([sys.executable, "-P", "-c", code, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_inspect_from_inside_another_checkout_converts_with_its_own_code_not_that_checkouts(tmp_path):
    """As the installed gcis-etl run with another checkout as the working directory: this checkout's code, the
    other's in that directory. The conversion process once imported the other's (ValueError: exit 1, reject)."""
    other = another_version(tmp_path)
    changed(other, OTHER_JOB_SHAPE)
    run = python("import sys; from gcis_etl.cli import main; sys.argv[0] = 'gcis-etl'; sys.exit(main())",
                 "inspect", str(MASTER), cwd=other, path=[REPO])
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.rstrip().endswith("-> accept"), run.stdout


def test_a_conversion_process_of_another_version_cannot_start_and_inspect_does_not_reject_the_master(tmp_path):
    """Started after the files changed under its parent, the conversion process runs their code: refused at its
    first message, an error of the process (not checked), not a verdict on the master."""
    other = another_version(tmp_path)
    run = python("""
import sys
from pathlib import Path
from gcis_etl.conversion import check_decoding
from gcis_etl.isolation import CannotStart, IsolatedProcess
from tests.test_upgrade_in_place import OTHER_JOB_SHAPE, changed
with IsolatedProcess() as child:
    print(check_decoding(sys.argv[1], worker=child).verdict.value)
    child.close()
    changed(Path(sys.argv[2]), OTHER_JOB_SHAPE)
    info = check_decoding(sys.argv[1], worker=child)
    print(info.verdict.value)
    print(*info.reasons, sep="\\n")
    try:
        child.call("gcis_etl.isolation.code_fingerprint")
    except CannotStart as exc:
        print("CannotStart:", exc)
""", str(MASTER), str(other), cwd=tmp_path, path=[other, REPO])
    assert run.returncode == 0, run.stdout + run.stderr
    first, verdict, reason, refused = run.stdout.splitlines()
    assert (first, verdict) == ("accept", "not-checked"), run.stdout
    assert OTHER_VERSION.fullmatch(reason), reason
    assert OTHER_VERSION.fullmatch(refused.removeprefix("CannotStart: ")), refused


def test_a_settings_digest_mismatch_names_another_version_as_a_cause(tmp_path):
    """A release that adds a setting changes the digest: the workers' refusal says so, not only 'the configs'."""
    masters = make_masters(tmp_path / "masters", objects=1, per_object=1)
    config = pool_config(tmp_path / "config.yaml", masters=masters, broker_url="redis://127.0.0.1:1/0",
                         store={"kind": "local", "root": str(tmp_path / "store")})
    planned = load_config(config).pipeline("demo")
    task = replace(tasks_of(planned)[0], settings={**planned.worker_digests, "imaging": "0" * 16})
    with Worker({"demo": planned}, tmp_path / "scratch") as worker:
        refused = worker.process(task)
    assert (refused.outcome, refused.stops_run) == (Outcome.FAILED, True)
    assert refused.reason == (
        f"the imaging settings of pipeline 'demo' on the worker on {socket.gethostname()} are not those the task was "
        f"planned with: the config.yaml files differ, or the harvest and the worker run different versions of "
        f"gcis-etl (a release that adds a setting changes what is compared): restart every worker with the "
        f"config.yaml and recipes of the harvest's machine, then run the harvest again: either side may be the stale "
        f"one (a worker reads them as it starts, a harvest as it begins) (no item's attempt was counted)")
