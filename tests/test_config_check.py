"""`gcis-etl config check` prints what the code reads: each source as its connector resolves it, and every
relative path anchored to the config file's folder, whatever the working directory."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def config_check(path: Path, cwd: Path, **environment: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gcis_etl.cli", "--config", str(path), "config", "check"],
                          capture_output=True, text=True, cwd=cwd, timeout=120,
                          env={**os.environ, **environment})


def test_config_check_fills_in_the_sources_defaults_and_masks_its_secrets(tmp_path):
    secret = "s3cr3t-Value-42"
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"pipelines": {"museum": {
        "source": {"kind": "otmm", "base_url": "https://otmm.example.org", "username": "etl",
                   "password": "${GCIS_TEST_PASSWORD}", "search": {"page_size": 50}},
        "store": {"kind": "local", "root": "store"}}}}))
    done = config_check(path, ROOT, GCIS_TEST_PASSWORD=secret)
    assert done.returncode == 0, done.stderr
    assert secret not in done.stdout + done.stderr
    source = yaml.safe_load(done.stdout)["pipelines"]["museum"]["source"]
    assert source["kind"] == "otmm" and source["username"] == "etl" and source["password"] == "********"
    assert source["api_path"] == "/otmmapi/v6" and source["retry"]["max_attempts"] == 5  # the connector's defaults
    assert source["search"]["page_size"] == 50 and source["search"]["method"] == "POST"  # nested: both


def test_the_consumers_program_and_mirador_folder_are_relative_to_the_config_files_folder(tmp_path):
    folder, elsewhere = tmp_path / "etc", tmp_path / "cwd"
    folder.mkdir()
    elsewhere.mkdir()
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump({"cache": {"server": {"iipsrv": "bin/iipsrv.fcgi",
                                                         "mirador_dir": "viewer/mirador"}}}))
    done = config_check(path, elsewhere)
    assert done.returncode == 0, done.stderr
    server = yaml.safe_load(done.stdout)["cache"]["server"]
    assert server["iipsrv"] == str(folder / "bin/iipsrv.fcgi")
    assert server["mirador_dir"] == str(folder / "viewer/mirador")



def test_a_path_starting_with_a_tilde_is_in_the_home_folder_whatever_its_key(tmp_path):
    """It was a folder named ~ beside the config file: state, stores and sources went there."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"state_dir": "~/gcis-state", "cache": {"server": {"mirador_dir": "~/mirador"}},
                                    "pipelines": {"museum": {"source": {"kind": "filesystem", "root": "~/masters"},
                                                             "store": {"kind": "local", "root": "~/store"}}}}))
    done = config_check(path, tmp_path)
    assert done.returncode == 0, done.stderr
    printed, home = yaml.safe_load(done.stdout), Path.home()
    assert printed["state_dir"] == str(home / "gcis-state")
    assert printed["cache"]["server"]["mirador_dir"] == str(home / "mirador")
    assert printed["pipelines"]["museum"]["source"]["root"] == str(home / "masters")
    assert printed["pipelines"]["museum"]["store"]["root"] == str(home / "store")
    assert not (tmp_path / "~").exists()
