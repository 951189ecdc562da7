"""The OTMM findings of walk 31, over real HTTP against the OTMM emulator: content_checksum read as an MD5 by
default (a master corrupted in transfer is downloaded again, never deposited; a site whose checksum is something
else still harvests, warned once), metadata_language and a base_url ending with the API path refused at load, the
session ended when the source is closed, and a wrong last-modified search field failing the first run."""
from __future__ import annotations

import hashlib
import logging

import pytest

from connectors import open_source
from connectors.base import close_source
from connectors.errors import FetchIntegrityError, SourceRequestFailed
from gcis_etl.errors import ConfigError
from tests.emulators.catalogue import CORPUS
from tests.emulators.faults import Fault
from tests.emulators.otmm import API, MODIFIED_FIELD, OtmmEmulator
from tests.emulators.server import EmulatorServer
from tests.harvests import otmm_source, serving
from tests.test_connector_otmm import PASSWORD, asset_id, otmm, utc
from tests.test_otmm_group_leave import catalogue

pytest_plugins = ("tests.harvests",)  # the `rig` fixture

DATED = {"modified_field_id": MODIFIED_FIELD, "modified_operator_id": "ARTESIA.OPERATOR.DATE.IS ON OR AFTER"}


@pytest.fixture
def emulator():
    with EmulatorServer(OtmmEmulator()) as server:
        yield server


def live_sessions(server: EmulatorServer) -> list:
    return [s for s in server.app.sessions.values() if s.valid]


# --- 1. content_checksum: auto, the default --------------------------------------------------------------------

def test_a_master_corrupted_in_transfer_is_downloaded_again_and_never_deposited_by_default(rig):
    """An uncompressed TIFF with one byte changed decodes all the same: without its checksum read, the damaged
    download was deposited, silently."""
    source = catalogue()
    tiff = source.by_name("2020_X_1_a.tif")
    with serving(OtmmEmulator(source)) as emulator:
        rig.write(otmm_source(emulator.url))
        emulator.inject(f"{tiff.asset_id}/contents", Fault.corrupt(), times=1)
        run = rig.harvest()
        assert run.counts == {"deposited": 3, "skipped": 0, "rejected": 0, "failed": 0}
        assert len(emulator.requests(f"{tiff.asset_id}/contents")) == 2
    (deposited,) = rig.peek(f"SELECT master_sha256 FROM items WHERE item_id='{tiff.asset_id}'")[0]
    assert deposited == hashlib.sha256(tiff.master.path.read_bytes()).hexdigest()


def test_a_site_whose_content_checksum_is_no_md5_of_the_content_harvests_with_one_warning(rig, caplog):
    source = catalogue()
    emulator_app = OtmmEmulator(source)
    emulator_app.content_checksum = lambda file: file.digest("sha1")[:32]  # 32 hex digits, not the MD5
    with serving(emulator_app) as emulator:
        rig.write(otmm_source(emulator.url))
        with caplog.at_level(logging.WARNING, logger="connectors.otmm"):
            run = rig.harvest()
    assert run.counts == {"deposited": 3, "skipped": 0, "rejected": 0, "failed": 0}
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "connectors.otmm"]
    assert "two downloads of the master agree with each other but not with its content_checksum" in warning
    assert "set content_checksum: none under the pipeline's source:" in warning


def test_two_downloads_that_differ_and_miss_the_checksum_fail_the_fetch_as_a_damaged_transfer(emulator, tmp_path):
    source = otmm(emulator.url)
    (obj,) = source.get([asset_id(emulator, "2019_M_1_recto.tif")])
    emulator.app.garbled = 2
    with pytest.raises(FetchIntegrityError, match=r"two downloads of the master differ \(SHA-256 .*\) and neither "
                                                  r"has the MD5 of its content_checksum: a damaged transfer"):
        source.fetch(obj.items[0], tmp_path)
    assert list(tmp_path.iterdir()) == []
    fetched = source.fetch(obj.items[0], tmp_path)  # the link mended: the next run's
    assert fetched.fixity_verified
    assert fetched.path.read_bytes() == (CORPUS / "rgb8-tiff-lzw/kodim02-lzw.tif").read_bytes()


def test_a_master_that_matches_its_checksum_is_downloaded_once_and_verified(emulator, tmp_path):
    source = otmm(emulator.url)
    (obj,) = source.get([asset_id(emulator, "2019_M_1_recto.tif")])
    fetched = source.fetch(obj.items[0], tmp_path)
    assert fetched.fixity_verified and len(emulator.requests("/contents")) == 1


class ScratchWatched(OtmmEmulator):
    """What the scratch folder holds each time a master is asked for."""

    def __init__(self, scratch):
        super().__init__()
        self.scratch = scratch
        self.held: list[list[str]] = []

    def _content(self, user, source):
        self.held.append(sorted(p.name for p in self.scratch.iterdir()))
        return super()._content(user, source)


def test_the_first_download_is_gone_from_scratch_before_the_second_is_asked_for(tmp_path):
    """Kept until the second arrived, it was counted against the room for the second (a master over half the
    free space failed as too large) and scratch held two."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with EmulatorServer(ScratchWatched(scratch)) as emulator:
        source = otmm(emulator.url)
        (obj,) = source.get([asset_id(emulator, "2019_M_1_recto.tif")])
        emulator.app.garbled = 1
        fetched = source.fetch(obj.items[0], scratch)
        assert emulator.app.held == [[], []]
    assert fetched.fixity_verified and list(scratch.iterdir()) == [fetched.path]


# --- 2, 3. refused at load ---------------------------------------------------------------------------------------

def test_metadata_language_is_refused_at_load_unless_a_language_tag():
    base = {"base_url": "http://x", "username": "u", "password": "p"}
    for wrong in ("xx-NOTALANG!!", "en US", "*", "english"):
        with pytest.raises(ConfigError, match=r"^config\.yaml: sources\.dam\.metadata_language: .* is not a language "
                                              r"tag such as en or en-US"):
            open_source("otmm", {**base, "metadata_language": wrong}, "dam", prefix="sources.dam")
    assert open_source("otmm", {**base, "metadata_language": "en_US"}, "dam").settings.metadata_language == "en-US"


@pytest.mark.parametrize("base_url, api_path", [("http://x/otmmapi/v6", "/otmmapi/v6"),
                                                ("http://x/otmmapi/v6/", "/otmmapi/v6"),
                                                ("http://x/gw/dam/api", "dam/api/")])
def test_a_base_url_ending_with_the_api_path_is_refused_at_load(base_url, api_path):
    """It gave requests to /otmmapi/v6/otmmapi/v6/sessions, and a login "refused the credentials"."""
    settings = {"base_url": base_url, "api_path": api_path, "username": "u", "password": "p"}
    with pytest.raises(ConfigError, match=r"sources\.dam: base_url ends with api_path \(/.+\), which is added to it: "
                                          r"give the server's root"):
        open_source("otmm", settings, "dam", prefix="sources.dam")
    assert open_source("otmm", {**settings, "base_url": "http://x/gw"}, "dam")


# --- 4. the session ended ----------------------------------------------------------------------------------------

def test_closing_the_source_ends_its_session_and_it_logs_in_again_if_used_after(emulator, tmp_path):
    source = otmm(emulator.url)
    objects = list(source.changes(None))
    source.fetch(objects[0].items[0], tmp_path)
    assert len(live_sessions(emulator)) == 1
    close_source(source)
    assert live_sessions(emulator) == []
    (logout,) = emulator.requests(f"DELETE {API}/sessions")
    assert logout.headers["otmmauthtoken"]
    close_source(source)  # nothing left to end: nothing sent
    assert len(emulator.requests(f"DELETE {API}/sessions")) == 1
    assert len(list(source.get([objects[0].id]))) == 1
    assert len(live_sessions(emulator)) == 1 and len(emulator.requests(f"POST {API}/sessions")) == 2


def test_a_logout_that_fails_is_logged_without_secrets_and_never_raised(emulator, caplog):
    source = otmm(emulator.url)
    source.reachable()
    token = source.http.headers["otmmauthtoken"]
    emulator.inject(f"DELETE {API}/sessions", Fault.http(503), times=None)
    with caplog.at_level(logging.DEBUG, logger="connectors.otmm"):
        close_source(source)
    assert len(emulator.requests(f"DELETE {API}/sessions")) == 1  # once: not worth the retry policy's waits
    (said,) = [r for r in caplog.records if "session was not ended" in r.getMessage()]
    assert said.levelno == logging.WARNING and "HTTP 503" in said.getMessage()
    assert token not in caplog.text and PASSWORD not in caplog.text


# --- 5. the date clause probed on a listing without `since` ------------------------------------------------------

def test_a_wrong_modified_field_fails_the_first_listing_at_once(emulator):
    source = otmm(emulator.url, search={"page_size": 2, **DATED, "modified_field_id": "ARTESIA.FIELD.NOPE"})
    with pytest.raises(SourceRequestFailed, match="the server refused the search itself: check the search settings "
                                                  r"under source\.search \(modified_field_id, modified_operator_id"):
        next(source.changes(None))
    (probe,) = emulator.requests("search/text")
    assert probe.form["limit"] == ["1"] and "ARTESIA.FIELD.NOPE" in probe.form["search_condition_list"][0]


def test_a_right_modified_field_is_probed_once_and_the_first_listing_goes_on_without_the_clause(emulator):
    source = otmm(emulator.url, search={"page_size": 2, **DATED})
    assert len(list(source.changes(None))) == 6
    probe, *pages = emulator.requests("search/text")
    assert probe.form["limit"] == ["1"] and "1970-01-01T00:00:00Z" in probe.form["search_condition_list"][0]
    assert all("search_condition_list" not in page.form for page in pages)
    emulator.log.clear()
    # with a checkpoint the listing carries the clause itself: no probe
    list(source.changes(utc("2024-01-01 00:00:00")))
    assert all(p.form["limit"] != ["1"] for p in emulator.requests("search/text"))


def test_a_first_harvest_with_a_wrong_modified_field_stops_before_anything_is_done(rig):
    source = catalogue()
    with serving(OtmmEmulator(source)) as emulator:
        rig.write(otmm_source(emulator.url, search={"page_size": 2, **DATED,
                                                     "modified_operator_id": "ARTESIA.OPERATOR.CHAR.CONTAINS"}))
        done = rig.cli("harvest", "--dry-run")
        assert done.returncode != 0 and "the server refused the search itself" in done.stderr, done.stderr
        assert emulator.requests("/contents") == []


def test_a_harvest_ends_its_session(rig):
    with serving(OtmmEmulator(catalogue())) as emulator:
        rig.write(otmm_source(emulator.url))
        assert rig.harvest().counts["deposited"] == 3
        assert rig.harvest(dry_run=True)
        done = rig.cli("harvest")
        assert done.returncode == 0, done.stderr
        assert len(emulator.requests(f"POST {API}/sessions")) == 3
        assert live_sessions(emulator) == [] and len(emulator.requests(f"DELETE {API}/sessions")) == 3
