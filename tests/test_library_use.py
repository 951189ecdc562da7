"""gcis_etl as a service or notebook uses it: a slow stage listener, a recipe derived in
code, a Ctrl-C as the conversion process starts, a host that ignores SIGCHLD (a decoder's crash in it too), a
Config built in code (a pipeline's bad recipe in it too), and the names the front door offers."""
from __future__ import annotations

import signal
import sys
import threading
import time

import pytest
import yaml

import gcis_etl
from gcis_etl import isolation
from gcis_etl.config import Config, load_config
from gcis_etl.errors import ConfigError
from gcis_etl.isolation import IsolatedProcess, WorkerCrashed
from gcis_etl.models import Status
from gcis_etl.policy import ImagingPolicy, IsolationSettings
from gcis_etl.recipes import DEFAULT_RECIPE, load_recipe, recipe_files
from tests.conftest import CORPUS
from tests.test_isolation import CRASHER, TO_VIPS, through_a_vips_crash

QUIET = CORPUS / "rgb8-tiff-lzw/hopper_lzw.tif"


def test_an_answer_that_came_while_the_listener_held_the_thread_is_taken_past_the_deadline():
    """The listener runs in the thread that waits for the child, which works on meanwhile: its answer, come in
    time, was thrown away and the child killed as timed out once the listener returned past the deadline."""
    with IsolatedProcess() as worker:
        worker.call("tests.jobs.pid")  # started: its start-up is no part of the job's time
        sent = time.monotonic()

        def past_the_deadline(stage: str) -> None:  # the child answers right after this stage
            time.sleep(max(sent + 2 - time.monotonic(), 0))

        assert worker.call("gcis_etl.isolation.stage", "at work", timeout=1, on_stage=past_the_deadline) is None


def test_a_slow_listener_does_not_fail_a_good_master_as_timed_out(tmp_path):
    """The walk's case: a listener blocking on the last stage (a websocket push) past isolation.timeout_seconds
    failed a master whose conversion had finished, 'timed out ... raise it for masters this size'."""
    limit = 8  # a small master converts in a second or two
    began: list[float] = []

    def blocking(stage: str) -> None:
        if stage == "starting the conversion":
            began.append(time.monotonic())
        elif stage == "verifying the output":
            time.sleep(max(began[0] + limit + 1 - time.monotonic(), 0))

    with IsolatedProcess(IsolationSettings(timeout_seconds=limit)) as worker:
        assert gcis_etl.convert(QUIET, tmp_path / "warm.tif", worker=worker).ok  # started before the clock runs
        result = gcis_etl.convert(QUIET, tmp_path / "out.tif", worker=worker, on_stage=blocking)
    assert result.status is Status.CONVERTED, result.reason
    assert gcis_etl.verify(tmp_path / "out.tif").ok


BAD_UPDATES = [{"tile": 300}, {"quality": 0}, {"quality": 180}, {"chroma": "4:2:2"}, {"extension": "../evil.tif"},
               {"tiles": 512}, {"encoder": "grok"}]


@pytest.mark.parametrize("update", BAD_UPDATES, ids=lambda u: ",".join(f"{k}={v}" for k, v in u.items()))
def test_a_recipe_derived_in_code_is_refused_with_the_errors_its_file_would_get(update, tmp_path):
    """Recipe.model_copy(update=...) checked nothing: a tile of 300 (not TIFF's multiple of 16), a quality of 0,
    a path for an extension were converted, and a quality of 180 raised the encoder's raw ValueError."""
    shipped = recipe_files()[DEFAULT_RECIPE]
    as_file = tmp_path / shipped.name
    as_file.write_text(yaml.safe_dump({**yaml.safe_load(shipped.read_text()), **update}))
    with pytest.raises(ConfigError) as from_file:
        load_recipe(as_file)
    with pytest.raises(ConfigError) as derived:
        load_recipe().model_copy(update=update)
    told = str(derived.value).splitlines()
    assert all(line.startswith(f"<recipe {DEFAULT_RECIPE!r} derived in code>: ") for line in told)
    assert [line.split(": ", 1)[1] for line in told] == \
        [line.removeprefix(f"{as_file}: ") for line in str(from_file.value).splitlines()]


def test_a_recipe_derived_in_code_takes_its_own_digest_and_the_name_it_is_given():
    shipped = load_recipe()
    derived = shipped.model_copy(update={"quality": 80, "name": "ptiff-jpeg-q80"})
    assert (derived.name, derived.quality, derived.tile) == ("ptiff-jpeg-q80", 80, shipped.tile)
    assert derived.digest != shipped.digest
    grok = load_recipe("jp2-grok-lossy")  # a nested section, and keys a file of another encoder leaves unset
    sop = grok.model_copy(update={"jp2": grok.jp2.model_copy(update={"sop": not grok.jp2.sop})})
    assert sop.jp2.sop is not grok.jp2.sop and sop.digest != grok.digest
    with pytest.raises(ConfigError, match=r"jp2\.levels: Input should be less than or equal to 32"):
        grok.model_copy(update={"jp2": grok.jp2.model_copy(update={"levels": 99})})


def test_a_ctrl_c_as_the_conversion_process_starts_leaves_the_callers_stderr_alone(capfd):
    """The interrupt lands once the child is started, before it is recorded: start() closes its end of the
    socket, and the child's hello met a broken pipe, its traceback printed on the caller's stderr. Raised here
    by a trace function as the process is handed back (deterministic, where a timer landed there 1 run in 5)."""
    def interrupt_when_started(frame, event, arg):
        if frame.f_code is not isolation._kept_process.__code__:
            return None

        def on_return(frame, event, arg):
            if event == "return":
                sys.settrace(None)
                raise KeyboardInterrupt
            return on_return
        return on_return

    before = set(threading.enumerate())
    worker = IsolatedProcess()
    sys.settrace(interrupt_when_started)
    try:
        with pytest.raises(KeyboardInterrupt):
            worker.start()
    finally:
        sys.settrace(None)
    for waiting in set(threading.enumerate()) - before:  # the thread that waits for the child: until it ends
        if waiting.name == "gcis-conversion-process":
            waiting.join()
    assert capfd.readouterr().err == ""
    with worker:
        assert worker.call("tests.jobs.pid")  # the next start works


def test_a_crash_in_a_host_that_ignores_sigchld_does_not_read_as_a_clean_exit():
    """Some daemons ignore SIGCHLD: the kernel then reaps the child, and wait() says 0 for a segfault."""
    kept = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        with IsolatedProcess() as worker, pytest.raises(WorkerCrashed) as crashed:
            worker.call("tests.jobs.segfault")
    finally:
        signal.signal(signal.SIGCHLD, kept)
    assert "code 0" not in str(crashed.value)
    assert "exit status unknown (this process ignores SIGCHLD" in str(crashed.value)


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


def test_the_conversion_process_of_a_host_that_ignores_sigchld_still_reads_its_subprocesses_exit_status():
    """The ignored SIGCHLD passed on to the conversion process, where every encoder and exiftool then said 0."""
    kept = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        with IsolatedProcess() as worker:
            assert worker.call("tests.jobs.exit_status", 3) == 3
    finally:
        signal.signal(signal.SIGCHLD, kept)


def test_a_config_built_in_code_is_named_so_in_its_errors(tmp_path, monkeypatch):
    """It was named '<built-in defaults: no --config, ...>', what load_config gives when it finds no file."""
    with pytest.raises(ConfigError, match=r"^<Config built in code>: no pipeline 'lib'"):
        Config(**{"imaging": {"max_megapixels": 0.2}}).pipeline("lib")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GCIS_CONFIG", raising=False)
    with pytest.raises(ConfigError, match=r"^<built-in defaults: no --config, no \$GCIS_CONFIG"):
        load_config().pipeline("lib")


def test_a_bad_recipe_in_a_config_built_in_code_names_its_key(tmp_path):
    """load_config names `pipelines.<name>.recipe`; a Config built in code said only "recipe 'nope' not found"."""
    config = Config(**{"pipelines": {"lib": {"source": {"kind": "filesystem", "root": str(tmp_path)},
                                             "store": {"kind": "local", "root": str(tmp_path / "store")},
                                             "recipe": "nope"}}})
    with pytest.raises(ConfigError, match=r"^<Config built in code>: pipelines\.lib\.recipe: recipe 'nope' not found"):
        config.pipeline("lib").recipe


def test_the_front_door_offers_what_its_calls_take_and_raise():
    """convert(worker=) takes an IsolatedProcess, harvest() returns a RunReport and raises LockHeld and
    SourceError: importable from gcis_etl, as the calls are."""
    from gcis_etl.errors import SourceError
    from gcis_etl.locks import LockHeld
    from gcis_etl.reports import RunReport
    offered = {"IsolatedProcess": IsolatedProcess, "RunReport": RunReport, "LockHeld": LockHeld,
               "SourceError": SourceError}
    assert {name: getattr(gcis_etl, name) for name in offered} == offered
    assert set(offered) <= set(gcis_etl.__all__) and set(offered) <= set(dir(gcis_etl))
