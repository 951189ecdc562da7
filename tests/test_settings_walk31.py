"""What a newcomer configuring DAM sources meets: `config check` warns of a password written in config.yaml (never
showing it) and shows how a source authenticates (`auth: session`), not a mask; a setting's error says once what was
given and never names a class of ours; a run that its source stops says what to do once, names its pipeline once,
and leaves its report under state_dir/reports as every run does. Real subprocesses, against the OTMM emulator."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.emulators.otmm import OtmmEmulator
from tests.harvests import OTMM_PASSWORD, SECRETS, otmm_source, rosetta_source, serving

GCIS = str(Path(sys.executable).with_name("gcis-etl"))
LITERAL = "Literal-Pa55word"


def gcis(config: Path, *args: str, **environment: str) -> subprocess.CompletedProcess:
    return subprocess.run([GCIS, "--config", str(config), *args], capture_output=True, text=True,
                          cwd=config.parent, timeout=300, env={**os.environ, **SECRETS, **environment})


def write(tmp_path: Path, **sources: dict) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"state_dir": "state", "pipelines": {
        name: {"source": source, "store": {"kind": "local", "root": "store"}} for name, source in sources.items()}}))
    return path


def test_config_check_warns_of_a_password_written_in_the_file_without_showing_it(tmp_path):
    config = write(tmp_path, museum=otmm_source("http://127.0.0.1:9", password=LITERAL),
                   library=otmm_source("http://127.0.0.1:9"))
    done = gcis(config, "config", "check")
    assert done.returncode == 0, done.stderr  # warned, not refused: existing setups keep working
    assert LITERAL not in done.stdout + done.stderr
    warned = [line for line in done.stderr.splitlines() if "credential written in" in line]
    assert warned == [f"warning: pipelines.museum.source.password: a credential written in {config} itself, where "
                      f"whoever reads the file (or a copy of it) reads it too: set it in an environment variable and "
                      f"write ${{VARIABLE}} here"]


def test_config_check_shows_how_a_source_authenticates_and_masks_its_password(tmp_path):
    config = write(tmp_path, museum=otmm_source("http://127.0.0.1:9", auth="session"),
                   library=rosetta_source("http://127.0.0.1:9", auth_scheme="local"))
    done = gcis(config, "config", "check")
    assert done.returncode == 0, done.stderr
    pipelines = yaml.safe_load(done.stdout)["pipelines"]
    assert pipelines["museum"]["source"]["auth"] == "session"
    assert pipelines["library"]["source"]["auth_scheme"] == "local"
    assert pipelines["museum"]["source"]["password"] == pipelines["library"]["source"]["password"] == "********"
    assert OTMM_PASSWORD not in done.stdout + done.stderr


def test_an_authentication_mode_not_known_is_quoted_in_its_error(tmp_path):
    config = write(tmp_path, museum=otmm_source("http://127.0.0.1:9", auth="basic"))
    done = gcis(config, "config", "check")
    assert done.returncode == 2
    assert f"{config}: pipelines.museum.source.auth: Input should be 'session' or 'oauth' (got 'basic')" \
        in done.stderr, done.stderr


def test_a_validators_error_quoting_the_value_does_not_repeat_it(tmp_path):
    config = write(tmp_path, library=rosetta_source("http://127.0.0.1:9", timezone="America/New York"))
    done = gcis(config, "config", "check")
    assert done.returncode == 2
    assert done.stderr.count("America/New York") == 1, done.stderr


def test_a_nested_settings_key_given_a_word_says_a_mapping_was_expected_and_its_keys(tmp_path):
    config = write(tmp_path, library=rosetta_source("http://127.0.0.1:9", oai="gcis"))
    done = gcis(config, "config", "check")
    assert done.returncode == 2
    assert f"{config}: pipelines.library.source.oai: expected a mapping of settings (keys: " in done.stderr, \
        done.stderr
    assert "(got 'gcis')" in done.stderr and "OaiSettings" not in done.stderr and "instance" not in done.stderr


def test_a_run_its_source_refuses_for_good_says_what_to_do_once_and_leaves_its_report(tmp_path):
    """The note added "(everything settled so far is recorded; run again)" after "running again will not help",
    and the source's name after the pipeline's ("library: run stopped: library: search: ..."); no report file was
    written, although harvest --help promises one for every run."""
    unknown = {"type": "com.artesia.search.SearchScalarCondition", "metadata_field_id": "NO.SUCH.FIELD",
               "relational_operator_id": "ARTESIA.OPERATOR.CHAR.IS", "value": "x"}
    with serving(OtmmEmulator()) as emulator:
        config = write(tmp_path, library=otmm_source(emulator.url, search={"conditions": [unknown]}))
        stopped = gcis(config, "harvest")
    assert stopped.returncode == 1, stopped.stderr
    [said] = [line for line in stopped.stderr.splitlines() if "run stopped" in line]
    assert said.startswith("library: run stopped: ") and said.count("library") == 1, said
    assert "running again will not help" in said and "; run again" not in said, said
    assert said.endswith("(everything settled so far is recorded)"), said
    report = json.loads((tmp_path / "state" / "reports" / "library-run1.json").read_text())
    assert report["status"] == "failed" and "will not help" in report["note"]


def test_a_run_whose_credentials_are_refused_says_to_fix_them_not_only_to_run_again(tmp_path):
    with serving(OtmmEmulator()) as emulator:
        config = write(tmp_path, library=otmm_source(emulator.url))
        stopped = gcis(config, "harvest", OTMM_PASSWORD="not-the-Secret")
    assert stopped.returncode == 1, stopped.stderr
    [said] = [line for line in stopped.stderr.splitlines() if "run stopped" in line]
    assert "the source refused the configured credentials" in said and said.count("run again") == 1, said
    assert said.endswith(": fix the source's credentials, then run again (everything settled so far is recorded)")
    assert (tmp_path / "state" / "reports" / "library-run1.json").is_file()


def test_a_run_stopped_by_its_source_names_its_pipeline_once_and_leaves_its_report(tmp_path):
    """A source's errors start with its name, which is the pipeline's: "q: run stopped: q: root ..."."""
    config = write(tmp_path, q={"kind": "filesystem", "root": "missing"})
    stopped = gcis(config, "harvest")
    assert stopped.returncode == 1, stopped.stderr
    [said] = [line for line in stopped.stderr.splitlines() if "run stopped" in line]
    assert said.startswith("q: run stopped: root ") and said.count("q: ") == 1, said
    report = json.loads((tmp_path / "state" / "reports" / "q-run1.json").read_text())
    assert report["status"] == "failed" and report["note"].startswith("SourceError: q: root ")
