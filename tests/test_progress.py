"""A harvest shows it is alive while one long conversion runs: on a terminal a timer redraws the live line with
the items in flight and the age of the oldest; without one (cron) a log line names the oldest item once per
quiet interval without an item settled. The intervals are driven down to fractions of a second and the tests
wait for what is drawn or logged: no assertion depends on how fast anything runs (a line that must not come
gets a few intervals' room; the spacing of lines is checked from below only, which the code guarantees).
Through a real harvest, a Gate holds one item's download in the emulated Rosetta, so that item is certainly in
flight until the test lets it go."""
from __future__ import annotations

import logging
import re
import threading
import time

import pytest
import yaml

from gcis_etl.config import load_config
from gcis_etl.harvesting import harvest
from gcis_etl.progress import TerminalProgress, elapsed
from tests.emulators.rosetta import RosettaCatalogue, RosettaEmulator
from tests.harvests import PATIENT_RETRY, SECRETS, Gate, ie, rosetta_source, serving, wait_for

QUIET = 0.3


def in_flight_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if " in flight" in r.getMessage()]


def timer_running(pipeline: str) -> bool:
    return any(t.name == f"gcis-progress-{pipeline}" for t in threading.enumerate())


@pytest.fixture
def info(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="gcis_etl.harvest")  # what -v or --log-json shows
    return caplog


@pytest.mark.parametrize("seconds, text", [(0.4, "0 s"), (59.9, "59 s"), (300, "5 min 0 s"), (192, "3 min 12 s"),
                                           (3600 + 5 * 60 + 7, "1 h 5 min")])
def test_an_age_reads_as_people_say_it(seconds, text):
    assert elapsed(seconds) == text


def test_without_a_terminal_an_item_long_in_flight_is_logged_once_per_quiet_interval_until_it_settles(info):
    progress = TerminalProgress("museum", live=False, quiet_seconds=QUIET, tick_seconds=0.02)
    progress.started("obj", "slow")
    progress.started("obj", "later")
    wait_for(lambda: len(in_flight_lines(info)) >= 3, "three in-flight lines were logged")
    progress.item("obj", "slow", "deposited", None)
    wait_for(lambda: any(r.item_id == "later" for r in in_flight_lines(info)), "the item still in flight was named")
    progress.item("obj", "later", "deposited", None)
    wait_for(lambda: not timer_running("museum"), "the timer ended with nothing in flight", timeout=10)
    logged = list(info.records)
    time.sleep(QUIET * 3)  # room for a line that must not come

    assert info.records == logged
    lines = in_flight_lines(info)
    slow, later = [r for r in lines if r.item_id == "slow"], [r for r in lines if r.item_id == "later"]
    assert lines == slow + later and len(slow) >= 3 and later
    assert all(re.fullmatch(r"museum: 2 items in flight, the oldest for \d+ s: obj/slow", r.getMessage())
               and r.in_flight == 2 for r in slow)
    assert all(re.fullmatch(r"museum: 1 item in flight for \d+ s: obj/later", r.getMessage()) and r.in_flight == 1
               for r in later)
    assert all(r.levelno == logging.INFO and r.pipeline == "museum" and r.object_id == "obj" for r in lines)
    messages = [r.getMessage() for r in info.records]
    assert messages.index(slow[-1].getMessage()) < messages.index("deposited obj/slow") < info.records.index(later[0])
    # at most one per interval: the timer looks far more often (every 0.02 s) than it may log
    gaps = [b.created - a.created for a, b in zip(lines, lines[1:])]
    assert min(gaps) >= QUIET * 0.9, gaps


def test_without_a_terminal_the_quiet_interval_counts_from_the_last_item_settled_or_started(info):
    progress = TerminalProgress("museum", live=False, quiet_seconds=QUIET, tick_seconds=0.02)
    for n in range(10):
        progress.started("obj", f"item{n}")
        progress.item("obj", f"item{n}", "deposited", None)
    wait_for(lambda: not timer_running("museum"), "the timer ended with nothing in flight", timeout=10)
    time.sleep(QUIET * 2)  # a long listing: nothing in flight, nothing to say
    assert in_flight_lines(info) == []

    begun = time.time()
    progress.started("obj", "late")
    first = wait_for(lambda: in_flight_lines(info), "the item in flight was logged")[0]
    progress.clear()
    assert first.getMessage().endswith("obj/late") and first.created - begun >= QUIET * 0.9


def test_on_a_terminal_the_timer_redraws_the_line_and_draws_nothing_once_the_run_is_over(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    progress = TerminalProgress("museum", live=True, tick_seconds=0.02)
    drawn: list[str] = []

    def draws() -> list[str]:
        drawn.append(capsys.readouterr().err)
        return [d for d in "".join(drawn).split("\r") if d]

    progress.started("obj", "slow")  # one call: every draw after the first is the timer's
    wait_for(lambda: len(draws()) >= 4, "the timer redrew the line")
    assert all(re.fullmatch(r"museum: 0 objects, 0 items \(deposited 0 skipped 0 rejected 0 failed 0\), 0/min, "
                            r"1 in flight, oldest \d+ s, \d+ s elapsed *", d) for d in draws()), draws()

    progress.clear()  # what the CLI does once harvest() returned, before the summary
    assert re.search(r", 1 in flight, oldest \d+ s, \d+ s elapsed *\n$", draws()[-1]) and not timer_running("museum")
    time.sleep(0.2)  # ten ticks of a timer that must be gone
    assert capsys.readouterr().err == ""


def test_a_harvest_without_a_terminal_logs_the_item_in_flight_while_its_download_is_held(tmp_path, monkeypatch,
                                                                                           info):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    catalogue = RosettaCatalogue([
        ie(7000, "2024-01-01 10:00:00", "rgb8-tiff-uncompressed/hopper.tif"),
        ie(7010, "2024-01-02 10:00:00", "gray8/gray.tif"),
    ])
    gate = Gate(RosettaEmulator(catalogue), "dps_pid=FL7012&")
    config = tmp_path / "config.yaml"
    progress = TerminalProgress("dam", live=False, quiet_seconds=QUIET)
    reports = []
    with serving(gate) as emulator:
        config.write_text(yaml.safe_dump({
            "state_dir": "state", "defaults": {"concurrency": 2},
            "pipelines": {"dam": {"source": rosetta_source(emulator.url, retry=PATIENT_RETRY),
                                  "store": {"kind": "local", "root": str(tmp_path / "store")}}}}))
        run = threading.Thread(target=lambda: reports.append(harvest(load_config(config), "dam", progress=progress)))
        run.start()
        try:
            wait_for(lambda: any(r.item_id == "FL7012" for r in in_flight_lines(info)), "the held item was logged")
        finally:
            gate.open()
            run.join(120)
    progress.clear()

    assert reports and reports[0].status == "completed" and reports[0].counts["deposited"] == 2
    messages = [r.getMessage() for r in info.records]
    settled = messages.index("deposited IE7010/FL7012")
    held = [n for n, m in enumerate(messages) if re.fullmatch(r"dam: 1 item in flight for \d+ s: IE7010/FL7012", m)]
    assert held and max(held) < settled, messages


def test_the_live_line_fits_the_terminal(capsys, monkeypatch):
    """A line wider than the terminal wraps, and a carriage return cannot redraw it in place."""
    monkeypatch.setenv("COLUMNS", "40")
    progress = TerminalProgress("museum", live=True)
    progress.started("obj", "item")
    progress.clear()
    lines = [d.rstrip("\n") for d in capsys.readouterr().err.split("\r") if d]
    assert lines and all(len(line) <= 39 for line in lines), lines
    assert lines[0].startswith("museum: 0 items, 1 in flight, oldest ")  # counts of 0 and the objects go first


class Counting(TerminalProgress):
    """How many items the progress held in flight at most: what the live line and the quiet log count."""
    most = 0

    def started(self, object_id: str, item_id: str) -> None:
        super().started(object_id, item_id)
        self.most = max(self.most, len(self.in_flight))


def test_no_more_items_are_counted_in_flight_than_the_executor_runs_at_once(tmp_path, monkeypatch):
    """One slot (concurrency 1, no transfer slots): the item finished when the next one takes its slot is settled
    before the next is counted as started."""
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    catalogue = RosettaCatalogue([ie(7000 + 10 * n, f"2024-01-0{n + 1} 10:00:00", "gray8/gray.tif")
                                  for n in range(4)])
    config = tmp_path / "config.yaml"
    progress = Counting("dam", live=False)
    with serving(RosettaEmulator(catalogue)) as emulator:
        config.write_text(yaml.safe_dump({
            "state_dir": "state", "defaults": {"concurrency": 1, "transfer_slots": 0},
            "pipelines": {"dam": {"source": rosetta_source(emulator.url),
                                  "store": {"kind": "local", "root": str(tmp_path / "store")}}}}))
        report = harvest(load_config(config), "dam", progress=progress)
    progress.clear()

    assert report.counts["deposited"] == 4 and progress.most == 1 and not progress.in_flight
