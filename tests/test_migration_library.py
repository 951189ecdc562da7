"""The migrations, the fixity audit first, called from Python (gcis_etl.migrate): the command line's function, with
nothing done to the host's process (signal handlers, root logger, stdout), from any thread; and run_script, the
command line's way, leaving the process as it found it. Also two messages a library caller meets: a pipeline's
bad recipe in a Config built in code, and a decoder's crash in a host that ignores SIGCHLD."""
from __future__ import annotations

import logging
import signal
import sys
import threading
import warnings

import pytest

import gcis_etl
from gcis_etl.config import Config
from gcis_etl.errors import ConfigError
from gcis_etl.migration import run_script
from gcis_etl.models import Status
from gcis_etl.policy import ImagingPolicy
from tests.conftest import run_on_a_terminal
from tests.test_audit import DAMAGED, KEYS, audit, flip_a_byte, loaded, problems
from tests.test_isolation import CRASHER, TO_VIPS, through_a_vips_crash
from tests.test_migrations import BIN, PIPELINE

STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def host_handler(signum, frame) -> None:
    """The host's own: what a service installs to stop on SIGTERM."""


def process_state() -> tuple:
    """What a call must leave as it found it: the handlers of the signals that stop a command, the root logger's
    handlers and level, Python's warning hook."""
    root = logging.getLogger()
    return ({signum: signal.getsignal(signum) for signum in STOPPING}, list(root.handlers), root.level,
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


def test_a_bad_recipe_in_a_config_built_in_code_names_its_key(tmp_path):
    """load_config names `pipelines.<name>.recipe`; a Config built in code said only "recipe 'nope' not found"."""
    config = Config(**{"pipelines": {"lib": {"source": {"kind": "filesystem", "root": str(tmp_path)},
                                             "store": {"kind": "local", "root": str(tmp_path / "store")},
                                             "recipe": "nope"}}})
    with pytest.raises(ConfigError, match=r"^<Config built in code>: pipelines\.lib\.recipe: recipe 'nope' not found"):
        config.pipeline("lib").recipe


def test_a_decoder_crash_in_a_host_that_ignores_sigchld_says_its_exit_status_is_unknown(tmp_path):
    """The kernel reaps the child and keeps no status: the fallback's note said "decoder vips crashed (exit)"."""
    kept = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        result = through_a_vips_crash(lambda: gcis_etl.convert(CRASHER, tmp_path / "a.tif",
                                                               policy=ImagingPolicy(**TO_VIPS)))
    finally:
        signal.signal(signal.SIGCHLD, kept)
    assert result.status is Status.CONVERTED and result.decoder == "pillow"
    fallback, = [w for w in result.warnings if w.startswith("decoder vips")]
    assert "(exit)" not in fallback
    assert "exit status unknown (this process ignores SIGCHLD" in fallback and fallback.endswith("retried with pillow")


def test_a_script_of_ones_own_takes_a_flag_turned_off_and_is_refused_an_option_without_a_long_name(tmp_path):
    """migrate() gives options as their --long flags: False for a --x/--no-x flag that defaults to True was the
    default, True; a positional argument had no flag to give (StopIteration, a raw traceback)."""
    (tmp_path / "counted.py").write_text(
        "import click\nfrom gcis_etl.migration import migration\n\n\n"
        "@migration('Counts.')\n@click.option('--pipeline', 'name', required=True)\n"
        "@click.option('--with-rejected/--without-rejected', default=True)\n"
        "def main(ctx, name, with_rejected):\n    ctx.report.add('with rejected' if with_rejected else 'without', 1)\n")
    (tmp_path / "positional.py").write_text(
        "import click\nfrom gcis_etl.migration import migration\n\n\n"
        "@migration('Takes a positional argument.')\n@click.argument('name')\ndef main(ctx, name):\n    pass\n")
    config = Config(pipelines={"p": {"source": {"kind": "filesystem", "root": str(tmp_path)},
                                     "store": {"kind": "local", "root": str(tmp_path / "store")}}},
                    state_dir=tmp_path / "state")
    assert gcis_etl.migrate(str(tmp_path / "counted.py"), config, pipeline="p", with_rejected=False).counts == {
        "without": 1}
    assert gcis_etl.migrate(str(tmp_path / "counted.py"), config, pipeline="p").counts == {"with rejected": 1}
    with pytest.raises(TypeError, match=r"migration script positional: NAME has no --long option name"):
        gcis_etl.migrate(str(tmp_path / "positional.py"), config)
