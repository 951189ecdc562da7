"""The migrations, the fixity audit first, called from Python (gcis_etl.migrate): the command line's function, with
nothing done to the host's process (signal handlers, logging, stdout), from any thread, a script loaded once for
all of them; and run_script, the command line's way, leaving the process as it found it."""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import warnings
from pathlib import Path

import pytest

import gcis_etl
from gcis_etl.config import load_config
from gcis_etl.errors import ConfigError
from gcis_etl.migration import run_script
from tests.conftest import run_on_a_terminal
from tests.test_audit import DAMAGED, KEYS, audit, flip_a_byte, loaded, problems
from tests.test_migrations import BIN, PIPELINE

STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def host_handler(signum, frame) -> None:
    """The host's own: what a service installs to stop on SIGTERM."""


def process_state() -> tuple:
    """What a call must leave as it found it: the handlers of the signals that stop a command, the root logger's
    handlers and level, every logger's level, Python's warning hook."""
    root = logging.getLogger()
    levels = {name: logger.level for name, logger in root.manager.loggerDict.items()
              if isinstance(logger, logging.Logger) and logger.level != logging.NOTSET}
    return ({signum: signal.getsignal(signum) for signum in STOPPING}, list(root.handlers), root.level, levels,
            warnings.showwarning)


@pytest.fixture
def host():
    """The test's process with handlers of its own for SIGINT, SIGTERM and SIGHUP, put back after."""
    kept = {signum: signal.signal(signum, host_handler) for signum in STOPPING}
    try:
        yield
    finally:
        for signum, handler in kept.items():
            signal.signal(signum, handler)


def found(report) -> dict[str, tuple[str, str]]:
    """The report's problems: key -> (outcome, reason)."""
    return {event.subject: (event.outcome, event.reason) for event in report.problems}


@pytest.mark.parametrize("thread", [False, True], ids=["main thread", "worker thread"])
def test_the_audit_from_python_finds_what_the_command_line_finds_and_leaves_the_host_as_it_was(tmp_path, host,
                                                                                               capfd, thread):
    site = loaded(tmp_path)
    flip_a_byte(site.store / DAMAGED)
    capfd.readouterr()
    before = process_state()
    if thread:
        done: dict = {}
        worker = threading.Thread(target=lambda: done.update(report=gcis_etl.migrate("audit", site.config,
                                                                                     pipeline=PIPELINE)))
        worker.start()
        worker.join()
        report = done["report"]  # a raise in the thread leaves none
    else:
        report = gcis_etl.migrate("audit", site.config, pipeline=PIPELINE)
    assert process_state() == before
    assert capfd.readouterr().out == ""
    assert isinstance(report, gcis_etl.MigrationReport)
    assert (report.script, report.pipeline, report.status, report.exit_code) == ("audit", PIPELINE, "completed", 1)
    assert report.counts == {"ok": KEYS - 1, "damaged": 1}
    assert report.json_file.is_file() and report.csv_file.is_file()

    command = audit(site, code=1)  # the command line, on the same damage
    assert command["counts"] == report.counts
    assert problems(command) == found(report) == {DAMAGED: found(report)[DAMAGED]}
    assert found(report)[DAMAGED][0] == "damaged"


def test_on_a_terminal_the_library_call_draws_no_live_line_where_the_command_line_does(tmp_path):
    """A REPL's stderr is a terminal: the audit's line of keys, and its repair's harvest line, are the command
    line's to draw."""
    site = loaded(tmp_path)
    flip_a_byte(site.store / DAMAGED)
    call = ("import sys, gcis_etl\n"
            "r = gcis_etl.migrate('audit', sys.argv[1], pipeline=sys.argv[2], repair=True)\n"
            "print(r.status, r.counts['repaired'], r.runs)")
    library, shown = run_on_a_terminal([sys.executable, "-c", call, str(site.config), PIPELINE])
    assert library.wait() == 0 and library.stdout.read().decode().startswith("completed 1 [")  # a harvest ran
    assert shown == ""
    flip_a_byte(site.store / DAMAGED)
    command, shown = run_on_a_terminal([str(BIN / "gcis-migrate"), "audit", "--pipeline", PIPELINE, "--config",
                                        str(site.config), "--repair"])
    assert command.wait() == 0 and f"{PIPELINE}: 0 of {KEYS} keys" in shown


def test_a_bad_configuration_or_option_is_a_config_error_not_an_exit(tmp_path, host):
    site = loaded(tmp_path)
    before = process_state()
    bad = tmp_path / "bad.yaml"
    bad.write_text("pipelines:\n  museum:\n    sorce: {kind: filesystem, root: masters}\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: pipelines\.museum"):
        gcis_etl.migrate("audit", bad, pipeline=PIPELINE)
    with pytest.raises(ConfigError, match=r"no pipeline 'nope'"):
        gcis_etl.migrate("audit", site.config, pipeline="nope")
    with pytest.raises(ConfigError, match=r"audit: no option 'repiar' \(it takes concurrency, limit, max_minutes, "
                                          r"older_than, pipeline, repair\)"):
        gcis_etl.migrate("audit", site.config, pipeline=PIPELINE, repiar=True)
    with pytest.raises(ConfigError, match=r"audit: Missing option '--pipeline'"):
        gcis_etl.migrate("audit", site.config)
    with pytest.raises(ConfigError, match=r"audit: Invalid value for '--concurrency': 0 is not in the range"):
        gcis_etl.migrate("audit", site.config, pipeline=PIPELINE, concurrency=0)
    with pytest.raises(ConfigError, match=r"no migration script 'audti' \(available: audit, "):
        gcis_etl.migrate("audti", site.config, pipeline=PIPELINE)
    assert process_state() == before


@pytest.mark.parametrize("when", ["before", "while"])
def test_a_stop_set_before_or_while_the_audit_runs_gives_a_stopped_report(tmp_path, host, when):
    site = loaded(tmp_path)
    stop = threading.Event()
    if when == "before":
        stop.set()

    class StopAtFirstKey(logging.Handler):
        """The host's own logging: the audit logs each key it settles."""

        def emit(self, record: logging.LogRecord) -> None:
            if getattr(record, "outcome", None) == "ok":
                stop.set()

    logger = logging.getLogger("gcis_etl.migration")
    handler, level = StopAtFirstKey(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        report = gcis_etl.migrate("audit", site.config, stop=stop, pipeline=PIPELINE, concurrency=1)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert (report.status, report.exit_code) == ("stopped", 1)
    assert report.notes == ["stopped on request: run again to continue"]
    assert sum(report.counts.values()) == (0 if when == "before" else report.counts["ok"])
    assert sum(report.counts.values()) < KEYS


def test_run_script_twice_leaves_the_signal_handlers_and_the_root_logger_as_it_found_them(tmp_path, host, capsys):
    site = loaded(tmp_path)
    before = process_state()
    for _ in range(2):
        assert run_script("audit", ["--pipeline", PIPELINE, "--config", str(site.config)]) == 0
        assert process_state() == before
        assert capsys.readouterr().out.startswith(f"audit: completed: {KEYS} ok")
    with pytest.raises(SystemExit) as exited:  # the command line's way out of a bad configuration
        run_script("audit", ["--pipeline", "nope", "--config", str(site.config), "--log-json"])
    assert exited.value.code == 2
    assert process_state() == before


def own_script(tmp_path, name: str, text: str) -> str:
    """A migration script of one's own, `text` after the imports every script makes: its path."""
    path = tmp_path / name
    path.write_text(f"import click\nfrom gcis_etl.migration import migration\n\n\n{text}")
    return str(path)


def own_config(tmp_path) -> Path:
    """A config.yaml of one pipeline, "p", for scripts of one's own (which read no source)."""
    config = tmp_path / "config.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\npipelines:\n  p:\n"
                      f"    source: {{kind: filesystem, root: {tmp_path}}}\n"
                      f"    store: {{kind: local, root: {tmp_path / 'store'}}}\n")
    return config


COUNTED = """\
@migration("Counts.")
@click.option("--pipeline", "name", required=True)
@click.option("--with-rejected/--without-rejected", default=True)
def main(ctx, name, with_rejected):
    ctx.report.add("with rejected" if with_rejected else "without", 1)
"""


def test_a_script_of_ones_own_takes_a_flag_turned_off_and_is_refused_an_option_without_a_long_name(tmp_path):
    """migrate() gives options as their --long flags: False for a --x/--no-x flag that defaults to True was the
    default, True; a positional argument had no flag to give (StopIteration, a raw traceback)."""
    counted = own_script(tmp_path, "counted.py", COUNTED)
    positional = own_script(tmp_path, "positional.py", "@migration('Takes a positional argument.')\n"
                                                       "@click.argument('name')\ndef main(ctx, name):\n    pass\n")
    config = load_config(own_config(tmp_path))
    assert gcis_etl.migrate(counted, config, pipeline="p", with_rejected=False).counts == {"without": 1}
    assert gcis_etl.migrate(counted, config, pipeline="p").counts == {"with rejected": 1}
    with pytest.raises(TypeError, match=r"migration script positional: NAME has no --long option name"):
        gcis_etl.migrate(positional, config)


PICKLED = """\
import pickle
import time
from dataclasses import dataclass
from pathlib import Path

with Path(__file__).with_suffix(".loads").open("a") as loads:
    loads.write("loaded\\n")
time.sleep(0.5)  # a slow import: the other thread's call comes while it loads


@dataclass
class Found:
    subject: str


@migration("Pickles an object of its own class.")
@click.option("--pipeline", "name", required=True)
def main(ctx, name):
    ctx.report.add(pickle.loads(pickle.dumps(Found("a/1"))).subject, 1)
"""


def test_two_threads_migrating_with_one_script_at_once_load_it_once_and_an_edited_script_again(tmp_path):
    """Each call executed the script again, under the other thread's run: its objects were then of a class its
    module's name no longer led to (pickle: "not the same object", or no such attribute yet)."""
    script = own_script(tmp_path, "pickled.py", PICKLED)
    config = own_config(tmp_path)
    reports, raised = [], []

    def call() -> None:
        try:
            reports.append(gcis_etl.migrate(script, config, pipeline="p"))
        except Exception as exc:  # what a thread raises is lost otherwise
            raised.append(exc)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert raised == []
    assert [report.counts for report in reports] == [{"a/1": 1}] * 2
    loads = Path(script).with_suffix(".loads")
    assert loads.read_text() == "loaded\n"
    own_script(tmp_path, "pickled.py", PICKLED.replace('"a/1"', '"b/2"'))  # as a notebook's user edits it
    assert gcis_etl.migrate(script, config, pipeline="p").counts == {"b/2": 1}
    assert loads.read_text() == "loaded\n" * 2


def open_files() -> set[Path]:
    """The files this process holds open."""
    held = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            held.add(Path(os.readlink(fd)))
        except OSError:  # the listing's own descriptor, closed since
            pass
    return held


def test_a_script_that_fails_on_a_bug_after_a_problem_leaves_its_csv_closed_and_holding_it(tmp_path):
    """What a script raises that is no GcisError goes through migrate(): the report's CSV was left open for as
    long as the exception was kept (a notebook keeps the last one, a service may log it later)."""
    buggy = own_script(tmp_path, "buggy.py", '@migration("Finds a problem, then fails on a bug.")\n'
                                             '@click.option("--pipeline", "name", required=True)\n'
                                             'def main(ctx, name):\n'
                                             '    ctx.report.event("a/1", "damaged", "a byte flipped")\n'
                                             '    raise RuntimeError("a bug")\n')
    config = load_config(own_config(tmp_path))
    with pytest.raises(RuntimeError, match="a bug") as raised:  # kept, as a notebook keeps it
        gcis_etl.migrate(buggy, config, pipeline="p")
    written, = config.reports_dir.glob("buggy-p-*.csv")
    assert written.resolve() not in open_files() and raised.type is RuntimeError
    header, row = written.read_text().splitlines()
    assert (header, row.rsplit(",", 1)[0]) == ("subject,outcome,reason,at", "a/1,damaged,a byte flipped")


def test_run_script_puts_back_the_levels_a_host_gave_the_loggers_it_quiets(tmp_path, host):
    """The command line holds the AWS and HTTP libraries' loggers at WARNING (their DEBUG lines carry credentials):
    a host's own levels for them stood changed after run_script, a host debugging its S3 calls left blind."""
    counted = own_script(tmp_path, "counted.py", COUNTED)
    chosen = {"botocore": logging.DEBUG, "urllib3": logging.ERROR}
    kept = {name: logging.getLogger(name).level for name in chosen}
    for name, level in chosen.items():
        logging.getLogger(name).setLevel(level)
    try:
        before = process_state()
        assert run_script(counted, ["--pipeline", "p", "--config", str(own_config(tmp_path)), "-vv"]) == 0
        assert process_state() == before
    finally:
        for name, level in kept.items():
            logging.getLogger(name).setLevel(level)
