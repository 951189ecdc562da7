"""A listing that repeats itself for ever still ends at max_run_minutes or on a stop (SIGTERM): the objects it lists
twice are skipped before the run looks, between objects, for a reason to stop, so the listing looks itself.

The source is a connector of this module, declared in the `gcis_etl.connectors` entry points of a distribution
written into tmp_path (as pip writes one), so that `gcis-etl` in a subprocess loads it as a `kind:` too. What it
lists has no items: nothing is fetched, and the store is a local folder.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Iterator

import pytest
import yaml

from connectors.base import SourceObject
from gcis_etl.config import load_config
from gcis_etl.harvesting import HarvestOptions, harvest
from gcis_etl.ledger import Ledger
from gcis_etl.settings import Settings
from tests.harvests import peek, wait_for

GCIS = str(Path(sys.executable).with_name("gcis-etl"))
REPOSITORY = Path(__file__).resolve().parent.parent
MODIFIED = datetime(2024, 1, 2, 10, tzinfo=timezone.utc)


class RepeatingSettings(Settings):
    objects: int = 3
    give_up_seconds: float = 20


class Repeating:
    """Lists its objects, then the first again and again; after give_up_seconds of that it raises, so that a run
    that never stops fails the test instead of hanging the suite."""

    lists_in_modified_order = False
    modified_order_setting = None

    def __init__(self, settings: RepeatingSettings, name: str = "repeating"):
        self.settings, self.name = settings, name

    def changes(self, since: datetime | None, until: datetime | None = None) -> Iterator[SourceObject]:
        objects = list(self.get(f"O{n}" for n in range(self.settings.objects)))
        yield from objects
        repeating = time.monotonic()
        while time.monotonic() - repeating < self.settings.give_up_seconds:
            yield objects[0]
        raise RuntimeError(f"the run kept listing for {self.settings.give_up_seconds:g}s")

    def get(self, object_ids: Iterable[str]) -> Iterator[SourceObject]:
        for object_id in object_ids:
            yield SourceObject(object_id, MODIFIED, ())

    def fetch(self, item, dest_dir):  # its objects have no items
        raise NotImplementedError


@pytest.fixture
def site(tmp_path: Path, declare) -> Path:
    """A config file whose pipeline `loop` lists a Repeating source, declared as an installed connector."""
    declare("repeating-source", repeating=f"{__name__}:Repeating")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"state_dir": "state", "pipelines": {"loop": {
        "source": {"kind": "repeating"}, "store": {"kind": "local", "root": str(tmp_path / "store")}}}}))
    return config


def test_a_listing_repeating_itself_ends_at_the_run_time_limit(site):
    config = load_config(site)
    report = harvest(config, "loop", HarvestOptions(max_run_minutes=0.01))  # 0.6 s; the source gives up after 20
    assert report.status == "stopped" and report.checkpoint_after is None
    assert report.note.startswith("stopped at the run time limit; O0 was listed twice: the source's listing moved")
    assert "the checkpoint stays where it was" in report.note
    with Ledger.open(config, read_only=True) as ledger:
        assert ledger.checkpoint("loop") is None


def test_a_stop_asked_for_ends_a_listing_repeating_itself(site):
    """What a library caller's own Event does; stop_on_signals sets one for the CLI (below)."""
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    report = harvest(load_config(site), "loop", stop=stop)
    assert (report.status, report.note, report.checkpoint_after) == ("stopped", "stopped on request", None)


def test_sigterm_ends_a_harvest_whose_listing_repeats_itself_as_a_stopped_run(site):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site.parent / "site"), str(REPOSITORY)])}
    run = subprocess.Popen([GCIS, "--config", str(site), "harvest"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env=env)
    stderr: list[str] = []
    reader = threading.Thread(target=lambda: stderr.extend(run.stderr), daemon=True)
    reader.start()
    wait_for(lambda: any("O0 was listed twice" in line for line in stderr), "the listing repeats itself", run)
    run.send_signal(signal.SIGTERM)
    try:
        run.wait(15)
    finally:
        run.kill()
    reader.join(10)
    assert run.returncode == 128 + signal.SIGTERM, (run.stdout.read(), stderr)
    ledger = site.parent / "state" / "ledger.sqlite"
    assert peek(ledger, "SELECT status, note FROM runs") == [("stopped", "stopped on request")]
    assert peek(ledger, "SELECT * FROM checkpoints") == []
