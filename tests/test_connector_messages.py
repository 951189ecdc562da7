"""What a cron harvest's mail says of its sources (walk-cron findings 3, 5, 7): a retry that then succeeds mails
nothing under --quiet while one that gives up still says so with its attempts; refused credentials are quoted in the
server's own words and name the settings to fix, never their values; a masked query string keeps the ':' after it,
and a download's reason does not repeat its item. Real `gcis-etl harvest` processes against the emulators over HTTP,
into a local store."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.emulators.faults import Fault
from tests.emulators.otmm import API, OtmmEmulator
from tests.emulators.rosetta import RosettaEmulator
from tests.harvests import OTMM_PASSWORD, ROSETTA_PASSWORD, SECRETS, otmm_source, rosetta_source, serving

GCIS = str(Path(sys.executable).with_name("gcis-etl"))
OBJECT = "84.PA.1"  # one asset, a small PNG
WRONG = "not-the-Secret-9"
API_KEY = "gateway-Key-77"


def harvest(tmp_path: Path, source: dict, *args: str, **environment: str) -> subprocess.CompletedProcess:
    """`gcis-etl harvest --quiet` as cron runs it, of `source` into a local store."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"state_dir": "state", "pipelines": {
        "lib": {"source": source, "store": {"kind": "local", "root": "store"}}}}))
    return subprocess.run([GCIS, "--config", str(config), "harvest", "--quiet", *args], capture_output=True,
                          text=True, cwd=tmp_path, timeout=300, env={**os.environ, **SECRETS, **environment})


def test_a_retry_that_then_succeeds_mails_nothing_under_quiet(tmp_path):
    with serving(OtmmEmulator()) as emulator:
        emulator.inject("/contents", Fault.http(503))
        done = harvest(tmp_path, otmm_source(emulator.url), "--object", OBJECT)
    assert done.returncode == 0, done.stderr
    assert len(emulator.requests("/contents")) == 2  # the 503, then the master
    assert done.stdout == done.stderr == ""


def test_a_download_that_gives_up_says_so_once_with_its_attempts(tmp_path):
    with serving(OtmmEmulator()) as emulator:
        emulator.inject("/contents", Fault.http(503), times=None)
        done = harvest(tmp_path, otmm_source(emulator.url), "--object", OBJECT)
    assert done.returncode == 1, done.stderr
    assert "retrying in" not in done.stderr
    [failed] = [line for line in done.stderr.splitlines() if line.startswith("WARNING failed ")]
    assert "HTTP 503 Service Unavailable; gave up after 4 attempt(s)" in failed, failed


def test_refused_credentials_quote_the_servers_words_and_name_the_settings_never_their_values(tmp_path):
    """OTMM's error body starts with a debug_message echoing the request (a debug page): the 200 characters quoted
    ended before the server's "Invalid username or password"."""
    app = OtmmEmulator()
    app.echoed_headers = ("User-Agent", "Accept", "Accept-Encoding", "Connection", "Content-Type", "Content-Length")
    with serving(app) as emulator:
        done = harvest(tmp_path, otmm_source(emulator.url), OTMM_PASSWORD=WRONG)
    assert done.returncode == 1, done.stderr
    [said] = [line for line in done.stderr.splitlines() if "run stopped" in line]
    assert (f"POST {emulator.url}{API}/sessions: HTTP 401 Unauthorized: the source refused the configured credentials "
            "(source.username, source.password from the environment): Invalid username or password "
            "(AUTHENTICATION_FAILED); User-Agent: gcis-etl") in said, said
    assert said.endswith(": fix the source's credentials, then run again (everything settled so far is recorded)")
    assert WRONG not in done.stderr and OTMM_PASSWORD not in done.stderr


def test_rosettas_refusal_names_the_settings_rather_than_quote_its_html_page(tmp_path):
    with serving(RosettaEmulator()) as emulator:
        done = harvest(tmp_path, rosetta_source(emulator.url), ROSETTA_PASSWORD=WRONG)
    assert done.returncode == 1, done.stderr
    [said] = [line for line in done.stderr.splitlines() if "run stopped" in line]
    named = "source.username, source.institution_code, source.password from the environment"
    assert f"HTTP 401 Unauthorized: the source refused the configured credentials ({named}): fix the source's " \
           "credentials" in said, said
    assert "<html>" not in said and WRONG not in done.stderr and ROSETTA_PASSWORD not in done.stderr


def test_a_masked_query_string_keeps_its_separator_and_a_download_names_its_asset_once(tmp_path):
    """Was "fetching: <asset>: GET …/assets/<asset>/contents?api_key=*** response body ended early"."""
    with serving(OtmmEmulator()) as emulator:
        asset = emulator.app.catalogue.by_name("84_PA_1.png").asset_id
        emulator.inject("/contents", Fault.truncate(), times=None)
        done = harvest(tmp_path, otmm_source(emulator.url, contents_params={"api_key": "${OTMM_KEY}"}),
                       "--object", OBJECT, OTMM_KEY=API_KEY)
    assert done.returncode == 1, done.stderr
    [failed] = [line for line in done.stderr.splitlines() if line.startswith("WARNING failed ")]
    assert failed.startswith(f"WARNING failed {OBJECT}/{asset}: fetching: GET {emulator.url}{API}/assets/{asset}"
                             "/contents?api_key=***: response body ended early ("), failed
    assert failed.count(asset) == 2, failed  # the item's, and its URL's
    assert API_KEY not in done.stderr
