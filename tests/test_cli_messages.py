"""What the commands say on stderr, and the option formats they take: with --log-json every stderr line is a JSON
object (a log shipper reads nothing else), without it the same messages are plain lines; one syntax for spans of
time in every option; verify says nothing it does not know. Run as real subprocesses."""
from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from gcis_etl.spans import SPAN_FORMATS, parse_span
from tests.conftest import CORPUS
from tests.emulators.rosetta import RosettaCatalogue, RosettaEmulator
from tests.harvests import PATIENT_RETRY, SECRETS, Gate, ie, rosetta_source, serving, wait_for

GCIS = str(Path(sys.executable).with_name("gcis-etl"))


def gcis(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([GCIS, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def json_lines(stderr: str) -> list[dict]:
    """Every line of stderr as a JSON object (the test fails on the first that is not one)."""
    lines = stderr.splitlines()
    assert lines, "nothing on stderr"
    return [json.loads(line) for line in lines]


def not_json(line: str) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return True
    return False


@pytest.fixture
def two_pipelines(tmp_path) -> Path:
    """`p` harvests one master; `q`'s source root is missing, so its run stops on a source error; an empty cache."""
    (tmp_path / "m" / "o").mkdir(parents=True)
    (tmp_path / "m" / "o" / "flowers.jpeg").write_bytes((CORPUS / "jpeg-baseline/flowers.jpeg").read_bytes())
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"state_dir": "state", "pipelines": {
        "p": {"source": {"kind": "filesystem", "root": "m"}, "store": {"kind": "local", "root": "store"}},
        "q": {"source": {"kind": "filesystem", "root": "missing"}, "store": {"kind": "local", "root": "store"}}},
        "cache": {"dir": str(tmp_path / "cache")}}))
    return tmp_path


# ------------------------------------------------------------------------------------------- --log-json


def test_a_run_stopped_by_its_source_is_a_json_line_with_log_json_and_the_same_plain_line_without(two_pipelines):
    logged = gcis(two_pipelines, "harvest", "q", "--log-json")
    assert logged.returncode == 1
    [stopped] = [e for e in json_lines(logged.stderr) if e["logger"] == "gcis_etl.cli"]
    assert stopped["level"] == "error" and stopped["pipeline"] == "q"
    assert stopped["message"].startswith("q: run stopped: root ") and stopped["message"].endswith("run again)")
    plain = gcis(two_pipelines, "harvest", "q")
    assert plain.returncode == 1 and plain.stderr.splitlines() == [stopped["message"]]


def test_a_held_lock_is_a_json_line_with_log_json(two_pipelines):
    lock = two_pipelines / "state" / "locks" / "p.lock"
    lock.parent.mkdir(parents=True)
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        logged = gcis(two_pipelines, "harvest", "p", "--log-json")
        plain = gcis(two_pipelines, "harvest", "p")
    assert logged.returncode == 3 and plain.returncode == 3
    [entry] = json_lines(logged.stderr)
    assert entry["level"] == "error" and entry["pipeline"] == "p"
    assert entry["message"].startswith("pipeline 'p' is already running") and str(lock) in entry["message"]
    assert plain.stderr.splitlines() == [entry["message"]]


def test_a_configuration_error_is_one_json_line_with_log_json(tmp_path):
    (tmp_path / "bad.yaml").write_text("pipelines:\n  p: {source: {kind: filesystem, root: m}, stor: {}}\n")
    logged = gcis(tmp_path, "--config", "bad.yaml", "harvest", "--log-json")
    assert logged.returncode == 2
    [entry] = json_lines(logged.stderr)
    assert entry["level"] == "error" and entry["message"].splitlines() == [
        "configuration error:", "bad.yaml: pipelines.p.store: Field required",
        "bad.yaml: pipelines.p.stor: unknown key (did you mean 'store'?)"]
    plain = gcis(tmp_path, "--config", "bad.yaml", "harvest")
    assert plain.returncode == 2 and plain.stderr == entry["message"] + "\n"


def test_a_pipeline_not_configured_is_one_json_line_with_log_json(two_pipelines):
    logged = gcis(two_pipelines, "harvest", "--log-json", "nosuchpipe")
    assert logged.returncode == 2
    [entry] = json_lines(logged.stderr)
    assert entry["level"] == "error" and entry["message"].splitlines() == [
        "configuration error:", f"{two_pipelines / 'config.yaml'}: no pipeline 'nosuchpipe' (pipelines: p, q)"]
    plain = gcis(two_pipelines, "harvest", "nosuchpipe")
    assert plain.returncode == 2 and plain.stderr == entry["message"] + "\n"


def test_the_force_note_is_a_json_line_with_log_json(two_pipelines):
    logged = gcis(two_pipelines, "harvest", "p", "--force", "--log-json", "--quiet")
    assert logged.returncode == 0
    notes = [e for e in json_lines(logged.stderr) if e["message"].startswith("note: --force")]
    assert [e["level"] for e in notes] == ["warning"]
    plain = gcis(two_pipelines, "harvest", "p", "--force", "--quiet")
    assert plain.returncode == 0 and plain.stderr.splitlines() == [notes[0]["message"]]


def test_the_signal_taken_is_a_json_line_with_log_json(tmp_path):
    """The Rosetta emulator holds the downloads at a Gate, so the run is certainly at work when SIGTERM comes."""
    catalogue = RosettaCatalogue([ie(7000, "2024-01-01 10:00:00", "rgb8-tiff-uncompressed/hopper.tif")])
    gate = Gate(RosettaEmulator(catalogue), "dps_pid=FL7002&")
    with serving(gate) as emulator:
        (tmp_path / "config.yaml").write_text(yaml.safe_dump({"state_dir": "state", "pipelines": {"dam": {
            "source": rosetta_source(emulator.url, retry=PATIENT_RETRY),
            "store": {"kind": "local", "root": str(tmp_path / "store")}}}}))
        run = subprocess.Popen([GCIS, "harvest", "--log-json"], cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env={**os.environ, **SECRETS})
        wait_for(lambda: gate.held == 1, "the download is held", run)
        stderr: list[str] = []
        reader = threading.Thread(target=lambda: stderr.extend(run.stderr), daemon=True)
        reader.start()
        run.send_signal(signal.SIGTERM)
        wait_for(lambda: any("stopping after the items in flight" in line for line in stderr), "the signal was taken")
        gate.open()
        run.wait(120)
        reader.join(10)
    assert run.returncode == 0  # its only item was in flight: the run got to its end all the same
    said = [(e["level"], e["message"]) for e in json_lines("".join(stderr)) if e["logger"] == "gcis_etl.cli"]
    assert said == [("warning", "stopping after the items in flight (SIGTERM)")]


# -------------------------------------------------------------------------------------------- spans of time


@pytest.mark.parametrize("text, span", [
    ("90m", timedelta(minutes=90)), ("36h", timedelta(hours=36)), ("7d", timedelta(days=7)),
    ("2w", timedelta(weeks=2)), ("PT90M", timedelta(minutes=90)), ("P1DT12H", timedelta(hours=36)),
    ("P2W", timedelta(weeks=2)), ("PT1.5H", timedelta(minutes=90)), ("P1D", timedelta(days=1)),
])
def test_spans_in_both_syntaxes(text, span):
    assert parse_span(text) == span


@pytest.mark.parametrize("text", ["12:00:00", "10", "P1M", "P1Y", "PT", "1d12h", "-P1D", "soon"])
def test_ambiguous_or_unknown_spans_are_refused_naming_the_forms(text):
    with pytest.raises(ValueError, match=re.escape(SPAN_FORMATS)):
        parse_span(text)


@pytest.mark.parametrize("text", ["0m", "P0D"])
def test_a_span_of_zero_is_refused(text):
    with pytest.raises(ValueError, match="a span of zero"):
        parse_span(text)


@pytest.mark.parametrize("span", ["36h", "P1D", "2w"])
def test_since_and_max_age_take_the_same_spans(two_pipelines, span):
    before = datetime.now(timezone.utc)
    planned = gcis(two_pipelines, "harvest", "p", "--dry-run", "--since", span)
    after = datetime.now(timezone.utc)
    assert planned.returncode == 0, planned.stderr
    since = datetime.fromisoformat(re.search(r"\(since (\S+)\)", planned.stdout)[1])
    assert before - parse_span(span) <= since <= after - parse_span(span)
    pruned = gcis(two_pipelines, "cache", "prune", "--max-bytes", "1G", "--max-age", span, "--json")
    assert pruned.returncode == 0 and json.loads(pruned.stdout)["evicted"] == [], pruned.stderr


def test_since_and_max_age_refuse_the_same_spans(two_pipelines):
    for option in (["harvest", "p", "--dry-run", "--since"], ["cache", "prune", "--max-age"]):
        refused = gcis(two_pipelines, *option, "12:00:00")
        assert refused.returncode == 2 and SPAN_FORMATS in " ".join(refused.stderr.split()), refused.stderr


def test_config_max_age_takes_the_options_spans():
    """cache.max_age in config.yaml is the default of --max-age: the same spans, the same refusals."""
    from gcis_etl.cache import CacheSettings
    from gcis_etl.errors import ConfigError
    from gcis_etl.settings import parse
    assert parse(CacheSettings, {"max_age": "36h"}, "config.yaml", "cache").max_age == timedelta(hours=36)
    assert parse(CacheSettings, {"max_age": "2w"}, "config.yaml", "cache").max_age == timedelta(weeks=2)
    with pytest.raises(ConfigError, match="cache.max_age: .*'12:00:00' is not a span of time"):
        parse(CacheSettings, {"max_age": "12:00:00"}, "config.yaml", "cache")


def test_since_in_the_future_is_refused(two_pipelines):
    refused = gcis(two_pipelines, "harvest", "p", "--since", "2999-01-01")
    assert refused.returncode == 2 and "'2999-01-01' is in the future" in refused.stderr
    assert not (two_pipelines / "state").exists()  # nothing ran


def test_since_takes_a_past_date_with_its_offset(two_pipelines):
    planned = gcis(two_pipelines, "harvest", "p", "--dry-run", "--since", "2026-01-01T08:00+02:00")
    assert planned.returncode == 0 and "(since 2026-01-01T08:00:00+02:00)" in planned.stdout, planned.stderr


@pytest.mark.parametrize("command", [["harvest"], ["cache", "prune"]])
def test_help_lists_the_span_formats(command):
    shown = subprocess.run([GCIS, *command, "--help"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and SPAN_FORMATS in " ".join(shown.stdout.split())


# ---------------------------------------------------------------------------------------------------- verify


def test_verify_of_a_file_that_is_not_a_tiff_shows_no_unknown_size(tmp_path):
    master = CORPUS / "jpeg-baseline/flowers.jpeg"
    refused = gcis(tmp_path, "verify", str(master))
    assert refused.returncode == 1
    assert refused.stdout.splitlines()[0] == f"{master}: NOT a valid access master"


def test_inspect_shows_pages_and_the_metadata_blocks_present(tmp_path):
    rich, multipage = CORPUS / "metadata-rich/tif-exif.tif", CORPUS / "multipage-tiff/multipage.tiff"
    shown = gcis(tmp_path, "inspect", "--header-only", str(rich), str(multipage))
    lines = {line.split(": ", 1)[0]: line for line in shown.stdout.splitlines() if not line.startswith(" ")}
    assert " pages=1 metadata=EXIF,XMP,IPTC -> " in lines[str(rich)]
    assert " pages=3 metadata=" in lines[str(multipage)] and lines[str(multipage)].endswith(" -> reject")


def test_a_jp2_counts_resolutions_and_wavelet_levels_as_jpeg_2000_does(tmp_path):
    """The recipes' `levels` are wavelet levels; a JP2 of 6 has 7 resolutions: "7 levels" would mislead."""
    made = gcis(tmp_path, "convert", "-r", "jp2-openjpeg-lossy", str(CORPUS / "icc-adobergb/example.tif"), "out.jp2")
    assert made.returncode == 0, made.stderr
    assert ": 200x287, 7 resolutions (6 wavelet levels), " in made.stdout
    valid = gcis(tmp_path, "verify", "out.jp2")
    assert valid.returncode == 0 and valid.stdout == (f"{tmp_path / 'out.jp2'}: valid access master, 200x287, "
                                                      "7 resolutions (6 wavelet levels)\n")


def test_a_command_needing_pipelines_says_no_config_file_was_found_and_where_it_looked(tmp_path):
    """Once, and nothing else: demo points at no outputs of a run that never started."""
    env = {k: v for k, v in os.environ.items() if k != "GCIS_CONFIG"}
    for command in ("status", "harvest", "demo"):
        done = subprocess.run([GCIS, command], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
        assert done.returncode == 2 and done.stdout == "", done.stdout
        assert ("no --config, no $GCIS_CONFIG, no config.yaml in the working folder> configures no pipelines"
                in done.stderr), done.stderr
        assert done.stderr.count("configuration error") == 1, done.stderr


def test_verify_of_an_access_master_shows_its_size_and_levels(tmp_path):
    made = gcis(tmp_path, "convert", str(CORPUS / "rgb8-tiff-uncompressed/hopper.tif"), "out.tif")
    assert made.returncode == 0, made.stderr
    valid = gcis(tmp_path, "verify", "out.tif")
    assert valid.returncode == 0 and valid.stdout == f"{tmp_path / 'out.tif'}: valid access master, 128x128, 1 level\n"


@pytest.mark.parametrize("emulator, own_path", [
    ("rosetta", "/delivery/DeliveryManagerServlet?dps_pid=FL1002"),
    ("otmm", "/otmmapi/v6/assets/0000000000000000000000000000000000000000/contents")])
def test_an_emulators_fault_example_fires_on_its_own_paths(emulator, own_path):
    """The example an emulator prints, sent as printed, makes one of that emulator's requests fail (the OTMM
    emulator once printed Rosetta's DeliveryManagerServlet, which no OTMM request matches)."""
    with subprocess.Popen([sys.executable, "-m", f"tests.emulators.{emulator}", "--port", "0"], text=True,
                          stdout=subprocess.PIPE, cwd=Path(__file__).parent.parent) as running:
        try:
            line = ""
            while not line.startswith("faults: "):
                line = running.stdout.readline()
                assert line, "the emulator printed no fault example"
            url, example = re.fullmatch(r"faults: curl -X POST (\S+) -d '(.*)'\n", line).groups()
            urllib.request.urlopen(urllib.request.Request(url, data=example.encode(), method="POST"), timeout=10)
            with pytest.raises(urllib.error.HTTPError) as answered:
                urllib.request.urlopen(url.split("/_emulator/")[0] + own_path, timeout=10)
            assert answered.value.code == json.loads(example)["status"] == 503
        finally:
            running.terminate()


def test_a_configuration_error_quoting_an_escape_sequence_prints_it_escaped(tmp_path):
    """A pipeline named with a terminal's clear-screen sequence: the error names it, and the terminal is not
    cleared (click strips ANSI sequences only when stderr is not a terminal, so this is what a pipe sees of
    both: the name escaped, not stripped)."""
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"pipelines": {"\x1b[2Jp": {
        "source": {"kind": "filesystem", "root": str(tmp_path)},
        "store": {"kind": "local", "root": str(tmp_path / "store")}}}}))
    stopped = gcis(tmp_path, "harvest")
    assert stopped.returncode == 2
    assert "pipelines.\\x1b[2Jp: a pipeline name is" in stopped.stderr and "\x1b" not in stopped.stderr
