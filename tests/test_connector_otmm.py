"""The OTMM connector over real HTTP against the OTMM emulator (tests/emulators/otmm.py)."""
from __future__ import annotations

import itertools
import json
import logging
import re
import subprocess
import sys
import threading
import traceback
from datetime import datetime, timedelta, timezone

import pytest
import requests
import yaml

from connectors import open_source
from connectors.base import ListingCut, ListingMoved, UnreadableObject
from connectors.errors import (AuthenticationFailed, FetchIntegrityError, ObjectNotFound, PermissionDenied,
                               SourceDataError, SourceRequestFailed, SourceUnavailable)
from connectors.otmm import OtmmSource
from gcis_etl.config import load_config
from gcis_etl.errors import ConfigError
from gcis_etl.harvesting import OBJECT, harvest
from gcis_etl.ledger import Ledger
from tests.emulators import FAST_RETRY
from tests.emulators.catalogue import CORPUS, CorpusFile
from tests.emulators.faults import Fault
from tests.emulators.otmm import API, ARCHIVE, MODIFIED_FIELD, ROOT, SCULPTURE, Asset, OtmmEmulator, seed
from tests.emulators.server import EmulatorServer
from tests.servers import free_port, wait_for_port

PASSWORD = "otmm-Secret-3"
WRONG_PASSWORD = "not-the-Secret"
NAMES = ["2019_M_1_recto.tif", "2019_M_1_verso.tif", "2019_M_1_detail.jpg", "84_PA_1.png", "2019_M_10.tif",
         "86_XM_2.jpg"]
GROUP = {"field_id": "GTRUST.FIELD.OBJECT NUMBER", "sequence_field_id": "GTRUST.FIELD.SEQUENCE"}
SINCE_SERVER_SIDE = {"page_size": 2, "modified_field_id": MODIFIED_FIELD,
                     "modified_operator_id": "ARTESIA.OPERATOR.DATE.IS ON OR AFTER"}


@pytest.fixture
def emulator():
    with EmulatorServer(OtmmEmulator()) as server:
        yield server


def otmm(url: str, **overrides) -> OtmmSource:
    options = {"base_url": url, "username": "tsuper", "password": PASSWORD, "retry": FAST_RETRY,
               "search": {"page_size": 2}, **overrides}
    return open_source("otmm", options, name="otmm-test")


def asset_id(server: EmulatorServer, name: str) -> str:
    return server.app.catalogue.by_name(name).asset_id


def names(server: EmulatorServer, ids) -> list[str]:
    by_id = {a.asset_id: a.name for a in server.app.catalogue.assets.values()}
    return [by_id[i] for i in ids]


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc)


# --- session -------------------------------------------------------------------------------------------------

def test_one_session_serves_every_call_with_digest_and_requested_by_headers(emulator):
    source = otmm(emulator.url)
    list(source.changes(None))
    (login,) = emulator.requests(f"POST {API}/sessions")
    assert login.form == {"username": ["tsuper"], "password": [PASSWORD]}
    (session,) = emulator.app.sessions.values()
    calls = emulator.requests(r"/(search|assets)/")
    assert len(calls) == 4 + 6  # three full search pages and the empty one after them, six assets
    assert all(c.headers["otmmauthtoken"] == session.digest and c.headers["X-Requested-By"] == str(session.id)
               for c in calls)


def test_an_expired_session_is_renewed_transparently(emulator, tmp_path):
    source = otmm(emulator.url)
    (obj,) = source.get([asset_id(emulator, "84_PA_1.png")])
    emulator.app.expire_sessions()
    assert source.fetch(obj.items[0], tmp_path).path.read_bytes() == (CORPUS / "png/png-rgb-64x56x8.png").read_bytes()
    emulator.inject("search/text", Fault.http(401))
    assert len(list(source.changes(None))) == 6
    assert len(emulator.requests(f"POST {API}/sessions")) == 3


def test_refused_credentials_fail_at_once_without_disclosing_them(emulator):
    with pytest.raises(AuthenticationFailed, match="Invalid username or password") as raised:
        list(otmm(emulator.url, password=WRONG_PASSWORD).changes(None))
    assert len(emulator.requests(f"POST {API}/sessions")) == 1
    assert WRONG_PASSWORD not in "".join(traceback.format_exception(raised.value))


def test_a_session_refused_again_after_relogin_is_an_authentication_error(emulator):
    emulator.inject("search/text", Fault.http(401), times=2)
    with pytest.raises(AuthenticationFailed):
        list(otmm(emulator.url).changes(None))
    assert len(emulator.requests(f"POST {API}/sessions")) == 2


def test_parallel_downloads_on_an_expired_session_log_in_once(emulator, tmp_path):
    source = otmm(emulator.url, search={"page_size": 10})
    objects = list(source.changes(None))[:4]
    emulator.app.expire_sessions()
    emulator.inject("/contents", Fault.slow(0.3), times=4)  # the four refused requests are in flight together
    emulator.inject(f"POST {API}/sessions", Fault.slow(0.5))  # and all refused while the first login is under way
    threads = [threading.Thread(target=source.fetch, args=(o.items[0], tmp_path / str(n)))
               for n, o in enumerate(objects)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(emulator.requests(f"POST {API}/sessions")) == 2  # the first login and one more
    assert sorted(f.stat().st_size for f in tmp_path.rglob("*.*")) == sorted(o.items[0].size for o in objects)


def test_the_session_cookie_and_id_stay_out_of_an_error_that_quotes_the_request(emulator):
    """JSESSIONID authenticates as the token does (dam-apis.md 2.2); X-Requested-By carries the session id."""
    emulator.app.echoed_headers = ("Cookie", "X-Requested-By")
    unknown = {"type": "com.artesia.search.SearchScalarCondition", "metadata_field_id": "NO.SUCH.FIELD",
               "relational_operator_id": "ARTESIA.OPERATOR.CHAR.IS", "value": "x"}
    with pytest.raises(SourceRequestFailed, match="HTTP 400") as raised:
        list(otmm(emulator.url, search={"conditions": [unknown]}).changes(None))
    (session,) = emulator.app.sessions.values()
    message = str(raised.value)
    assert "Cookie: JSESSIONID=***; X-Requested-By: ***" in message
    assert session.cookie not in message and str(session.id) not in message


def test_a_user_without_download_rights_gets_a_permission_error(emulator, tmp_path):
    viewer = otmm(emulator.url, username="viewer", password="viewer-Secret-4")
    (obj,) = viewer.get([asset_id(emulator, "84_PA_1.png")])
    with pytest.raises(PermissionDenied, match="HTTP 403.*permission to download"):
        viewer.fetch(obj.items[0], tmp_path)
    assert len(emulator.requests("/contents")) == 1
    assert list(tmp_path.iterdir()) == []


def test_oauth_password_grant_is_an_alternative(emulator, tmp_path):
    source = otmm(emulator.url, auth="oauth", client_id="gcis-etl", client_secret="client-Secret-5")
    (obj,) = source.get([asset_id(emulator, "84_PA_1.png")])
    assert emulator.requests(f"POST {API}/sessions$") == []
    (grant,) = emulator.requests("oauth2/token")
    assert grant.form["grant_type"] == ["password"] and grant.form["client_id"] == ["gcis-etl"]
    (token,) = emulator.app.tokens
    assert emulator.requests("/assets/")[0].headers["Authorization"] == f"Bearer {token}"
    emulator.app.expire_sessions()
    assert source.fetch(obj.items[0], tmp_path).size == obj.items[0].size
    assert len(emulator.requests("oauth2/token")) == 2
    with pytest.raises(AuthenticationFailed, match="Invalid client"):
        list(otmm(emulator.url, auth="oauth", client_id="gcis-etl", client_secret="wrong").changes(None))


def test_the_otmm_token_can_also_go_in_the_authorization_header(emulator):
    list(otmm(emulator.url, bearer_otmm_token=True, extra_headers={"X-OTMM-Locale": "en_US"}).changes(None))
    (session,) = emulator.app.sessions.values()
    call = emulator.requests("search/text")[0]
    assert call.headers["Authorization"] == f"Bearer otmmToken {session.digest}"
    assert call.headers["X-OTMM-Locale"] == "en_US"


# --- discovery -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["POST", "GET"])
def test_search_pages_with_after_and_limit_until_a_short_page(emulator, method):
    """The last page is full: only the page after it, holding nothing new, shows that no asset is left. Each page
    after the first starts one asset early, at the last asset of the page before (shift_check)."""
    objects = list(otmm(emulator.url, search={"page_size": 2, "method": method}).changes(None))
    assert sorted(names(emulator, [o.id for o in objects])) == sorted(NAMES)
    pages = emulator.requests(f"{method} {API}/search/text")
    assert [(p.arg("after"), p.arg("limit")) for p in pages] == [("0", "2"), ("1", "3"), ("3", "3"), ("5", "3")]


@pytest.mark.parametrize("reported", [lambda n: min(n, 2), lambda n: min(n, 5), lambda n: None],
                         ids=["capped-at-one-page", "capped-mid-page", "absent"])
def test_a_total_hit_count_capped_or_absent_does_not_end_the_search_early(emulator, reported):
    emulator.app.reported_total = reported
    listed = list(otmm(emulator.url).changes(None))
    assert sorted(names(emulator, [o.id for o in listed])) == sorted(NAMES)  # no ListingMoved: the cap holds still
    assert [p.arg("after") for p in emulator.requests(f"POST {API}/search/text")] == ["0", "1", "3", "5"]


def test_a_server_that_serves_fewer_than_asked_is_paged_to_its_total(emulator):
    emulator.app.max_limit = 4
    listed = list(otmm(emulator.url, search={"page_size": 5}).changes(None))
    assert sorted(names(emulator, [o.id for o in listed])) == sorted(NAMES)
    assert [p.arg("after") for p in emulator.requests(f"POST {API}/search/text")] == ["0", "3"]


@pytest.mark.parametrize("reported", ["many", "1,234", ""])
def test_a_total_hit_count_that_is_no_number_is_taken_as_absent_with_one_warning(emulator, caplog, reported):
    """The pages are read on to an empty one, as without a count; the warning says that a move while paged goes
    unseen (the count is how the listing sees it)."""
    emulator.app.reported_total = lambda matches: reported
    with caplog.at_level(logging.WARNING, logger="connectors.otmm"):
        listed = list(otmm(emulator.url).changes(None))
    assert sorted(names(emulator, [o.id for o in listed])) == sorted(NAMES)
    assert [p.arg("after") for p in emulator.requests(f"POST {API}/search/text")] == ["0", "1", "3", "5"]
    assert [r.getMessage() for r in caplog.records] == [
        f"otmm-test: the search's total_hit_count is {reported!r}, not a number; paging on until a page comes "
        "back empty, and unable to tell whether the search moved between pages"]


def test_a_hit_count_that_is_no_number_is_taken_as_the_assets_the_page_holds(emulator, caplog):
    emulator.app.reported_hits = lambda served: "some"
    emulator.app.max_limit = 4  # pages short of the limit asked, ended by the total
    with caplog.at_level(logging.WARNING, logger="connectors.otmm"):
        listed = list(otmm(emulator.url, search={"page_size": 5}).changes(None))
    assert sorted(names(emulator, [o.id for o in listed])) == sorted(NAMES)
    assert [p.arg("after") for p in emulator.requests(f"POST {API}/search/text")] == ["0", "3"]
    assert [r.getMessage() for r in caplog.records] == [
        "otmm-test: the search's hit_count is 'some', not a number; counting the assets the page holds"]


def test_incremental_search_with_a_server_side_date_condition(emulator):
    objects = list(otmm(emulator.url, search=SINCE_SERVER_SIDE).changes(utc("2024-03-01 00:00:00")))
    assert names(emulator, [o.id for o in objects]) == ["2019_M_1_detail.jpg", "2019_M_10.tif", "86_XM_2.jpg"]
    pages = emulator.requests("search/text")
    assert len(pages) == 2  # three hits: the server did the filtering
    (condition,) = json.loads(pages[0].arg("search_condition_list"))["search_condition_list"]["search_condition"]
    assert condition == {"type": "com.artesia.search.SearchScalarCondition", "metadata_field_id": MODIFIED_FIELD,
                         "relational_operator_id": "ARTESIA.OPERATOR.DATE.IS ON OR AFTER",
                         "value": "2024-03-01T00:00:00Z"}


def test_incremental_search_without_a_date_field_compares_date_last_updated(emulator):
    objects = list(otmm(emulator.url).changes(utc("2024-03-01 00:00:00")))
    assert sorted(names(emulator, [o.id for o in objects])) == ["2019_M_10.tif", "2019_M_1_detail.jpg",
                                                                "86_XM_2.jpg"]
    assert len(emulator.requests("search/text")) == 4  # everything listed (and the empty page after), filtered here
    assert len(emulator.requests(r"GET /otmmapi/v6/assets/")) == 3  # only changed assets are described


def test_an_edit_after_the_checkpoint_is_picked_up(emulator):
    source = otmm(emulator.url, search=SINCE_SERVER_SIDE)
    checkpoint = datetime.now(timezone.utc) - timedelta(seconds=5)
    assert list(source.changes(checkpoint)) == []
    emulator.app.catalogue.touch(asset_id(emulator, "84_PA_1.png"))
    assert names(emulator, [o.id for o in source.changes(checkpoint)]) == ["84_PA_1.png"]


def test_folder_walk_with_paging_and_recursion(emulator):
    recursive = otmm(emulator.url, discovery="folder", folder={"folder_id": ROOT, "page_size": 2})
    assert sorted(names(emulator, [o.id for o in recursive.changes(None)])) == sorted(NAMES[:5])
    root_pages = emulator.requests(f"/folders/{ROOT}/children")  # Sculpture, then the three Irises assets
    assert [(r.arg("after"), r.arg("limit")) for r in root_pages] == [("0", "2"), ("1", "3"), ("3", "3")]
    shallow = otmm(emulator.url, discovery="folder", folder={"folder_id": ROOT, "recursive": False})
    assert sorted(names(emulator, [o.id for o in shallow.changes(None)])) == sorted(NAMES[:3])
    assert names(emulator, [o.id for o in recursive.changes(utc("2024-03-15 00:00:00"))]) == ["2019_M_10.tif"]


def test_a_search_that_shrinks_between_two_pages_says_so_in_the_listing(emulator):
    """Sorted by name, 2019_M_10 (first) leaves the folder once page 1 is read: 2019_M_1_recto moves back onto
    page 1. The changed total_hit_count comes as a ListingMoved, where the harvest learns it; the second page,
    not starting with the detail, is taken whole, the recto with it."""
    moved = emulator.app.catalogue.by_name("2019_M_10.tif")
    search = {"method": "GET", "page_size": 2, "folder_filter": ROOT, "sort": "asc_NAME"}

    def listing(**options) -> list:
        moved.folder = ROOT
        emulator.before(r"GET /otmmapi/v6/search/text\?.*after=[12](&|$)", lambda: setattr(moved, "folder", ARCHIVE))
        return list(otmm(emulator.url, search={**search, **options}).changes(None))

    listed = listing()
    (shift,) = [o for o in listed if isinstance(o, ListingMoved)]
    assert shift.reason.startswith("the search's total_hit_count went from 5 to 4 between two pages (at after=2)")
    served = names(emulator, [o.id for o in listed if not isinstance(o, ListingMoved)])
    assert sorted(served) == ["2019_M_10.tif", "2019_M_1_detail.jpg", "2019_M_1_recto.tif", "2019_M_1_verso.tif",
                              "84_PA_1.png"]
    # shift_check off (for a server whose count is an estimate): the recto passed over, the loss unreported
    unchecked = listing(shift_check=False)
    assert sorted(names(emulator, [o.id for o in unchecked])) == sorted(set(served) - {"2019_M_1_recto.tif"})


def test_a_folder_whose_children_move_back_between_two_pages_says_so_and_serves_them_all(emulator):
    """Each page of children after the first starts at the last child of the page before: once 2019_M_1_detail
    leaves the folder, the recto stands there instead, so the walk says the folder moved and takes that page
    whole (the recto with it)."""
    detail = emulator.app.catalogue.by_name("2019_M_1_detail.jpg")
    emulator.before(rf"GET /otmmapi/v6/folders/{ROOT}/children\?.*after=1", lambda: setattr(detail, "folder", ARCHIVE))
    listed = list(otmm(emulator.url, discovery="folder", folder={"folder_id": ROOT, "page_size": 2}).changes(None))
    (shift,) = [o for o in listed if isinstance(o, ListingMoved)]
    assert shift.reason == (f"folder {ROOT} changed while its children were paged (child {detail.asset_id} is no "
                            "longer at position 1): one may have been passed over")
    assert sorted(names(emulator, [o.id for o in listed if not isinstance(o, ListingMoved)])) == \
        sorted(NAMES[:5])  # the detail was read before it left


def test_a_search_server_that_ignores_after_ends_the_listing_with_an_error_instead_of_paging_for_ever(emulator):
    emulator.app.honours_after = False  # every page is the first one
    with pytest.raises(SourceDataError, match=r"^otmm-test: the search's page at after=3 holds only assets of the "
                                              "page before, where the next ones were expected: the server does not page "
                                              "by `after`$"):
        list(itertools.islice(otmm(emulator.url).changes(None), 50))  # islice: the old loop never ended
    assert [p.arg("after") for p in emulator.requests("search/text")] == ["0", "1", "3"]


def test_a_folder_that_ignores_after_ends_the_walk_with_an_error_instead_of_paging_for_ever(emulator):
    emulator.app.honours_after = False
    walk = otmm(emulator.url, discovery="folder", folder={"folder_id": ROOT, "page_size": 2})
    with pytest.raises(SourceDataError, match=rf"^otmm-test: folder {SCULPTURE}'s page of children at after=1 holds "
                                              "only assets of the page before, where the next ones were expected"):
        list(itertools.islice(walk.changes(None), 50))
    assert [r.arg("after") for r in emulator.requests(f"/folders/{SCULPTURE}/children")] == ["0", "1"]


def test_an_empty_search_page_short_of_the_total_holds_the_checkpoint(emulator, tmp_path, monkeypatch):
    """A server that stops serving past some depth while its total_hit_count still counts every match: the
    listing says so (a ListingMoved), so the run holds its checkpoint and the next one takes the rest."""
    emulator.app.deepest = 3
    listed = list(otmm(emulator.url).changes(None))
    (shift,) = [o for o in listed if isinstance(o, ListingMoved)]
    assert type(shift) is ListingCut and shift.reason == (
        "the server gave no more assets at after=4 of total_hit_count 6: the assets past it were not served (as by "
        "a server that caps how deep it pages)")
    assert len([o for o in listed if not isinstance(o, ListingMoved)]) == 4
    # shift_check off (the count an estimate): the empty page ends the listing as before
    assert not any(isinstance(o, ListingMoved) for o in otmm(emulator.url, search={"page_size": 2,
                                                                                    "shift_check": False}).changes())

    monkeypatch.setenv("OTMM_PASSWORD", PASSWORD)
    config = {"state_dir": str(tmp_path / "state"), "pipelines": {"p": {
        "source": {"kind": "otmm", "base_url": emulator.url, "username": "tsuper", "password": "${OTMM_PASSWORD}",
                   "retry": FAST_RETRY, "search": {"page_size": 2}},
        "store": {"kind": "local", "root": str(tmp_path / "store")}}}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    cfg = load_config(tmp_path / "config.yaml")
    first = harvest(cfg, "p")
    assert first.counts["deposited"] == 4 and first.checkpoint_after is None
    emulator.app.deepest = None
    assert harvest(cfg, "p").counts == {"deposited": 2, "skipped": 4, "rejected": 0, "failed": 0}



def test_a_search_cut_short_by_a_deep_paging_cap_moves_the_checkpoint_where_it_is_sorted_oldest_first(
        emulator, tmp_path, monkeypatch):
    """Held, the checkpoint would give every run the same first assets up to the cap and never the others; sorted
    oldest first on the modified field, all before the cut were served, so the next run starts from the last."""
    emulator.app.deepest = 3
    monkeypatch.setenv("OTMM_PASSWORD", PASSWORD)
    config = {"state_dir": str(tmp_path / "state"), "pipelines": {"p": {
        "source": {"kind": "otmm", "base_url": emulator.url, "username": "tsuper", "password": "${OTMM_PASSWORD}",
                   "retry": FAST_RETRY, "search": {**SINCE_SERVER_SIDE, "sort": f"asc_{MODIFIED_FIELD}",
                                                    "modified_order": True}},
        "store": {"kind": "local", "root": str(tmp_path / "store")}}}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    cfg = load_config(tmp_path / "config.yaml")
    first = harvest(cfg, "p")
    assert first.counts["deposited"] == 4 and first.checkpoint_after == "2024-03-01T10:00:00+00:00"
    assert first.status == "completed" and first.note == (
        "the server gave no more assets at after=4 of total_hit_count 6: the assets past it were not served (as by "
        "a server that caps how deep it pages); the checkpoint moved to 2024-03-01T10:00:00+00:00, where the "
        "listing stopped")
    second = harvest(cfg, "p")  # the cap still there: the last asset listed, then the two past it
    assert second.counts == {"deposited": 2, "skipped": 1, "rejected": 0, "failed": 0} and second.note is None

    for asset in emulator.app.catalogue.assets.values():  # more assets than the cap share one modified time
        emulator.app.catalogue.touch(asset.asset_id, utc("2024-06-01 10:00:00"))
    config["state_dir"] = str(tmp_path / "another-state")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    cfg = load_config(tmp_path / "config.yaml")
    assert harvest(cfg, "p").checkpoint_after == "2024-06-01T10:00:00+00:00"
    stuck = harvest(cfg, "p")
    assert stuck.checkpoint_after is None and stuck.note.endswith(
        "; the checkpoint stays where it was: all the objects served are modified no later than it, so no run gets "
        "past them; load them with `gcis-migrate initial_load`")


def test_an_html_page_in_place_of_the_api_is_the_source_not_being_there(emulator):
    """A proxy's login page answered 200 was "the response is not JSON", a malformed answer: under a describe it
    failed the asset alone and spent its attempt. It is OTMM not being there, and reachable() (source_down) says so
    too, so the run stops with every attempt kept."""
    emulator.inject("search/text|rootfolders", Fault.page(), times=None)
    source = otmm(emulator.url)
    with pytest.raises(SourceUnavailable, match=r"^otmm-test: search: the server answered with an HTML page titled "
                                                r"'Single Sign-On - Login' \(Content-Type text/html\), not JSON: a login or "
                                                r"maintenance page in front of the source\?$"):
        list(source.changes(None))
    with pytest.raises(SourceUnavailable, match=r"^GET http://\S+/folders/rootfolders\S*: the server answered with "
                                                r"an HTML page"):
        source.reachable()

def test_explicit_asset_ids(emulator, tmp_path):
    wanted = [asset_id(emulator, "86_XM_2.jpg"), asset_id(emulator, "84_PA_1.png")]
    ids_file = tmp_path / "assets.txt"
    ids_file.write_text(f"# batch\n{wanted[0]}\n\n{wanted[1]}  # bust\n")
    source = otmm(emulator.url, discovery="ids", id_list={"file": str(ids_file)})
    assert [o.id for o in source.changes(None)] == wanted
    assert [o.id for o in source.changes(utc("2024-03-01 00:00:00"))] == wanted[:1]
    assert [o.id for o in source.get(reversed(wanted))] == wanted[::-1]
    with pytest.raises(ObjectNotFound, match="no asset 0{40}"):
        list(source.get(["0" * 40]))
    assert len(emulator.requests("0{40}")) == 1


# --- objects -------------------------------------------------------------------------------------------------

def test_assets_sharing_an_object_number_form_one_object_in_natural_sequence_order(emulator):
    objects = {o.id: o for o in otmm(emulator.url, group=GROUP).changes(None)}
    assert sorted(objects) == ["2019.M.1", "2019.M.10", "84.PA.1", "86.XM.2"]
    irises = objects["2019.M.1"]
    assert names(emulator, [i.id for i in irises.items]) == NAMES[:3]  # sequences 1, 2, 10
    assert [i.sequence for i in irises.items] == [1, 2, 3]
    assert irises.modified == utc("2024-03-01 10:00:00")
    assert names(emulator, [i.id for i in objects["2019.M.10"].items]) == ["2019_M_10.tif"]


def test_a_changed_member_brings_its_whole_group(emulator):
    objects = list(otmm(emulator.url, group=GROUP).changes(utc("2024-02-15 00:00:00")))
    assert sorted(o.id for o in objects) == ["2019.M.1", "2019.M.10", "86.XM.2"]
    irises = next(o for o in objects if o.id == "2019.M.1")
    assert len(irises.items) == 3  # recto and verso did not change, the detail did


def test_a_group_whose_asset_comes_again_in_a_listing_that_moved_is_listed_again(emulator):
    """The listing is sorted by last modified and paged by offset: the recto, edited once the first page is read,
    comes again at the end, and 84_PA_1 moves back onto that page. The second page, not starting with the verso,
    says the listing moved and is taken whole (84_PA_1 with it); the recto's group is listed again."""
    recto = asset_id(emulator, "2019_M_1_recto.tif")
    listing_page_2 = r"GET /otmmapi/v6/search/text\?(?!.*search_condition_list).*after=1(&|$)"  # not a group's members
    emulator.before(listing_page_2, lambda: emulator.app.catalogue.touch(recto))
    source = otmm(emulator.url, group=GROUP, search={"page_size": 2, "method": "GET", "sort": f"asc_{MODIFIED_FIELD}"})
    listed = list(source.changes(None))
    (shift,) = [o for o in listed if isinstance(o, ListingMoved)]
    assert shift.reason == ("the search changed while it was paged (asset "
                            f"{asset_id(emulator, '2019_M_1_verso.tif')} is no longer at position 1): one may have "
                            "been passed over")
    assert [o.id for o in listed if o is not shift] == ["2019.M.1", "84.PA.1", "2019.M.10", "86.XM.2", "2019.M.1"]



@pytest.mark.parametrize("load_type, reads_of_the_other_group", [("system", 1), ("metadata", 0)])
def test_another_groups_asset_that_the_member_search_matches_is_read_only_when_the_results_cannot_tell(
        emulator, load_type, reads_of_the_other_group):
    """CONTAINS finds 2019.M.1 in 2019.M.10 too: without the field in the search's results each such asset is
    read to be told apart (on a large catalogue, several reads per member); with it, it is left unread."""
    other = asset_id(emulator, "2019_M_10.tif")
    (obj,) = otmm(emulator.url, group=GROUP, search={"page_size": 2, "load_type": load_type}).get(["2019.M.1"])
    assert names(emulator, [i.id for i in obj.items]) == NAMES[:3]
    assert len(emulator.requests(rf"GET {API}/assets/{other}\b")) == reads_of_the_other_group

def test_explicit_group_ids(emulator):
    (obj,) = otmm(emulator.url, group=GROUP).get(["2019.M.1"])
    assert len(obj.items) == 3
    with pytest.raises(ObjectNotFound, match="2019.M.999"):
        list(otmm(emulator.url, group=GROUP).get(["2019.M.999"]))


# Irises' member search (IS: without 2019.M.10) is recto, detail, verso by asset id, paged by two; the listing is
# the recto alone, so a change to the group moves its member search and nothing else.
GROUP_IS = {**GROUP, "operator_id": "ARTESIA.OPERATOR.CHAR.IS"}
RECTO_ONLY = {"method": "GET", "page_size": 2, "conditions": [{
    "type": "com.artesia.search.SearchScalarCondition", "metadata_field_id": "ARTESIA.FIELD.ASSET NAME",
    "relational_operator_id": "ARTESIA.OPERATOR.CHAR.CONTAINS", "value": "recto"}]}
MEMBERS_PAGE_2 = r"GET /otmmapi/v6/search/text\?.*OBJECT\+NUMBER.*after=[12](&|$)"  # shift_check on, off


def member_pages(server: EmulatorServer) -> list[str]:
    """`after` of each page of a member search, in order."""
    return [p.arg("after") for p in server.requests("search/text")
            if "OBJECT NUMBER" in (p.arg("search_condition_list") or "")]


def raking(server: EmulatorServer) -> Asset:
    """A raking-light view of the Irises (sequence 3) whose asset id sorts before every other member's."""
    recto = server.app.catalogue.by_name("2019_M_1_recto.tif")
    return Asset("2019_M_1_raking.tif", CorpusFile("png/png-rgb-64x56x8.png"), ROOT, recto.imported, recto.updated,
                 {**recto.fields, "GTRUST.FIELD.SEQUENCE": "3"})


def join_or_leave(server: EmulatorServer, change: str) -> None:
    """joins: the raking-light view joins 2019.M.1, every member moves on one place and it is passed over; leaves:
    the recto leaves it, every member moves back one place and the verso is passed over."""
    catalogue = server.app.catalogue
    if change == "joins":
        view = raking(server)
        catalogue.assets[view.asset_id] = view
    else:
        catalogue.by_name("2019_M_1_recto.tif").fields["GTRUST.FIELD.OBJECT NUMBER"] = "2019.M.2"


@pytest.mark.parametrize("change, members, pages, unchecked_pages", [
    ("joins", ["2019_M_1_recto.tif", "2019_M_1_verso.tif", "2019_M_1_raking.tif", "2019_M_1_detail.jpg"],
     ["0", "1", "3", "0", "1", "3"], ["0", "2", "4"]),  # a full last page, then one with nothing new
    ("leaves", ["2019_M_1_verso.tif", "2019_M_1_detail.jpg"], ["0", "1", "0", "1"], ["0", "2"]),
])
@pytest.mark.parametrize("path", ["changes", "get"])
def test_a_group_whose_members_change_while_they_are_listed_is_searched_again(emulator, path, change, members,
                                                                               pages, unchecked_pages):
    emulator.before(MEMBERS_PAGE_2, lambda: join_or_leave(emulator, change))
    source = otmm(emulator.url, group=GROUP_IS, search=RECTO_ONLY)
    (obj,) = source.changes(None) if path == "changes" else source.get(["2019.M.1"])
    assert obj.id == "2019.M.1" and names(emulator, [i.id for i in obj.items]) == members
    assert member_pages(emulator) == pages  # the second search saw the group whole
    # shift_check off (a server whose count is an estimate): searched once, as before
    emulator.app.catalogue = seed()
    emulator.before(MEMBERS_PAGE_2, lambda: join_or_leave(emulator, change))
    unchecked = otmm(emulator.url, group=GROUP_IS, search={**RECTO_ONLY, "shift_check": False})
    list(unchecked.changes(None) if path == "changes" else unchecked.get(["2019.M.1"]))
    assert member_pages(emulator)[len(pages):] == unchecked_pages


class Churn:
    """The raking-light view joins 2019.M.1 and leaves it again, in turn, before every second page of its member
    search, until stopped: each search sees its total_hit_count move."""

    def __init__(self, server: EmulatorServer):
        self.server, self.on = server, True
        server.before(MEMBERS_PAGE_2, self)

    def __call__(self) -> None:
        if not self.on:
            return
        assets, view = self.server.app.catalogue.assets, raking(self.server)
        if assets.pop(view.asset_id, None) is None:
            assets[view.asset_id] = view
        self.server.before(MEMBERS_PAGE_2, self)


GROUP_KEPT_MOVING = (r"the members of group '2019.M.1' \(GTRUST.FIELD.OBJECT NUMBER\) changed while "
                     r"they were listed, 3 times in a row \(assets joined or left it between two pages of its "
                     r"search\): one may have been passed over, so it is not deposited short; the next run tries again")


def test_a_group_whose_members_keep_changing_is_not_described_short(emulator):
    Churn(emulator)
    source = otmm(emulator.url, group=GROUP_IS, search=RECTO_ONLY)
    (unreadable,) = source.changes(None)
    assert isinstance(unreadable, UnreadableObject) and unreadable.id == "2019.M.1" and not unreadable.gone
    assert re.fullmatch("otmm-test: " + GROUP_KEPT_MOVING, unreadable.reason)
    assert unreadable.modified == utc("2024-01-05 10:00:00")  # the recto's, as listed
    assert member_pages(emulator).count("0") == 3  # searches
    with pytest.raises(SourceDataError, match=GROUP_KEPT_MOVING):
        list(source.get(["2019.M.1"]))
    assert member_pages(emulator).count("0") == 6


@pytest.mark.parametrize("path", ["changes", "get"])
def test_a_member_deleted_between_the_search_and_its_read_has_left_the_group(emulator, path):
    """Not the whole group gone (by id, a harvest would mark the object gone and never revisit it)."""
    catalogue = emulator.app.catalogue
    verso = catalogue.by_name("2019_M_1_verso.tif").asset_id
    emulator.before(rf"GET /otmmapi/v6/assets/{verso}\?", lambda: catalogue.assets.pop(verso))
    source = otmm(emulator.url, group=GROUP_IS, search=RECTO_ONLY)
    (obj,) = source.changes(None) if path == "changes" else source.get(["2019.M.1"])
    assert obj.id == "2019.M.1" and not isinstance(obj, UnreadableObject)
    assert names(emulator, [i.id for i in obj.items]) == ["2019_M_1_recto.tif", "2019_M_1_detail.jpg"]


def test_a_harvest_fails_a_group_that_keeps_changing_and_takes_it_whole_next_run(emulator, tmp_path, monkeypatch):
    """The group fails alone and holds the checkpoint at its listed time, so the next run lists it again."""
    monkeypatch.setenv("OTMM_PASSWORD", PASSWORD)
    config = {"state_dir": str(tmp_path / "state"), "pipelines": {"p": {
        "source": {"kind": "otmm", "base_url": emulator.url, "username": "tsuper", "password": "${OTMM_PASSWORD}",
                   "retry": FAST_RETRY, "group": GROUP_IS, "search": RECTO_ONLY},
        "store": {"kind": "local", "root": str(tmp_path / "store")}}}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    cfg = load_config(tmp_path / "config.yaml")
    churn = Churn(emulator)

    first = harvest(cfg, "p")
    assert first.counts == {"deposited": 0, "skipped": 0, "rejected": 0, "failed": 1}
    assert datetime.fromisoformat(first.checkpoint_after) <= utc("2024-01-05 10:00:00")  # not past the recto
    with Ledger.open(cfg, read_only=True) as ledger:
        (failed,) = ledger.items("p")
    assert (failed.object_id, failed.item_id, failed.status) == ("2019.M.1", OBJECT, "failed")
    assert re.fullmatch("the source cannot describe it: p: " + GROUP_KEPT_MOVING, failed.reason)

    churn.on = False
    second = harvest(cfg, "p")
    assert second.counts == {"deposited": 4, "skipped": 0, "rejected": 0, "failed": 0}
    with Ledger.open(cfg, read_only=True) as ledger:
        deposited = [i.item_id for i in ledger.items("p", "2019.M.1", status="deposited")]
    assert sorted(names(emulator, deposited)) == ["2019_M_1_detail.jpg", "2019_M_1_raking.tif",
                                                  "2019_M_1_recto.tif", "2019_M_1_verso.tif"]


@pytest.mark.parametrize("group", [None, GROUP], ids=["assets", "groups"])
def test_an_asset_that_cannot_be_read_stands_in_the_listing_in_its_place(emulator, group):
    broken = asset_id(emulator, "84_PA_1.png")
    emulator.inject(rf"GET /otmmapi/v6/assets/{broken}\?", Fault.http(404), times=None)
    listed = list(otmm(emulator.url, group=group).changes(None))
    (unreadable,) = [o for o in listed if isinstance(o, UnreadableObject)]
    assert unreadable.id == broken and "no asset" in unreadable.reason and not unreadable.gone
    assert unreadable.modified is not None
    assert len(listed) == (6 if group is None else 4)  # the others all the same


def withdrawn_notes(records) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in records if "nothing to harvest" in r.getMessage()]


def test_an_expired_asset_is_left_out_as_a_deleted_one_is_unless_told_to_harvest_it(emulator, caplog):
    """OpenText's pyxecm drops expired assets with the deleted ones (dam-apis.md 2.4): passed over as listed,
    with one note, and not there when asked for by id; `expired: harvest` takes them."""
    bust = asset_id(emulator, "84_PA_1.png")
    emulator.app.catalogue.assets[bust].expired = True
    with caplog.at_level(logging.INFO, logger="connectors.otmm"):
        listed = list(otmm(emulator.url).changes(None))
    assert sorted(names(emulator, [o.id for o in listed])) == sorted(set(NAMES) - {"84_PA_1.png"})
    assert emulator.requests(f"GET {API}/assets/{bust}") == []  # left out as listed, never read
    assert withdrawn_notes(caplog.records) == [
        (logging.INFO, f"otmm-test: asset {bust} is expired (expired: skip); nothing to harvest")]
    with pytest.raises(ObjectNotFound, match=rf"otmm-test: asset {bust} is expired \(expired: skip\)"):
        list(otmm(emulator.url).get([bust]))
    harvested = otmm(emulator.url, expired="harvest")
    assert sorted(names(emulator, [o.id for o in harvested.changes(None)])) == sorted(NAMES)
    assert [o.id for o in harvested.get([bust])] == [bust]


def test_an_expired_asset_seen_only_once_read_is_left_out_too(emulator, caplog):
    """An id list's assets are known as expired once read: passed over with the note, not failed."""
    bust, vase = asset_id(emulator, "84_PA_1.png"), asset_id(emulator, "2019_M_10.tif")
    emulator.app.catalogue.assets[bust].expired = True
    with caplog.at_level(logging.INFO, logger="connectors.otmm"):
        listed = list(otmm(emulator.url, discovery="ids", id_list={"ids": [bust, vase]}).changes(None))
    assert [o.id for o in listed] == [vase] and not isinstance(listed[0], UnreadableObject)
    assert withdrawn_notes(caplog.records) == [
        (logging.INFO, f"otmm-test: asset {bust} is expired (expired: skip); nothing to harvest")]


@pytest.mark.parametrize("path", ["changes", "get"])
def test_an_expired_member_has_left_its_group(emulator, path):
    emulator.app.catalogue.by_name("2019_M_1_verso.tif").expired = True
    source = otmm(emulator.url, group=GROUP_IS, search=RECTO_ONLY)
    (obj,) = source.changes(None) if path == "changes" else source.get(["2019.M.1"])
    assert names(emulator, [i.id for i in obj.items]) == ["2019_M_1_recto.tif", "2019_M_1_detail.jpg"]
    harvested = otmm(emulator.url, group=GROUP_IS, search=RECTO_ONLY, expired="harvest")
    (whole,) = harvested.changes(None) if path == "changes" else harvested.get(["2019.M.1"])
    assert names(emulator, [i.id for i in whole.items]) == NAMES[:3]


def test_metadata_is_flattened_and_mapped(emulator):
    source = otmm(emulator.url, include_unmapped=False, metadata_language="en",
                  source_url_template="{base_url}/otmm/ux-html/?p=asset&id={id}", metadata_map={
        "GTRUST.FIELD.TITLE": "title", "GTRUST.FIELD.DEPARTMENT": "department",
        "GTRUST.FIELD.KEYWORDS": "keywords", "asset.name": "file name"})
    (obj,) = source.get([asset_id(emulator, "2019_M_1_recto.tif")])
    assert {k: [(v.value, v.language) for v in vs] for k, vs in obj.metadata.items()} == {
        "title": [("Irises", "en")], "department": [("Paintings", "en")],
        "keywords": [("iris", "en"), ("flower", "en")], "file name": [("2019_M_1_recto.tif", "en")]}
    assert obj.source_url == f"{emulator.url}/otmm/ux-html/?p=asset&id={obj.id}"


def test_the_source_url_carries_the_object_id_percent_encoded(emulator):
    """Museum object numbers hold spaces; one with '&' or '#' would otherwise end the query value early."""
    emulator.app.catalogue.by_name("84_PA_1.png").fields["GTRUST.FIELD.OBJECT NUMBER"] = "84.PA.1 a&b#c/d"
    source = otmm(emulator.url, group=GROUP, source_url_template="{base_url}/otmm/ux-html/?p=object&number={id}")
    (obj,) = source.get(["84.PA.1 a&b#c/d"])
    assert obj.source_url == f"{emulator.url}/otmm/ux-html/?p=object&number=84.PA.1%20a%26b%23c%2Fd"
    listed = next(o for o in source.changes(None) if o.id == "84.PA.1 a&b#c/d")
    assert listed.source_url == obj.source_url


def test_a_source_url_template_writes_a_literal_brace_twice(emulator):
    bust = asset_id(emulator, "84_PA_1.png")
    (obj,) = otmm(emulator.url, source_url_template="{base_url}/ux-html/{{asset}}?id={id}").get([bust])
    assert obj.source_url == f"{emulator.url}/ux-html/{{asset}}?id={bust}"


@pytest.mark.parametrize("template, message", [
    ("{base_url}/ux-html/?id={idd}", "unknown placeholder {idd}; the template may use {id}, {base_url}"),
    ("{base_url}/ux-html/?id={id", "'{id' is not a placeholder (expected '}' before end of string; a literal brace "
                                   "is written twice); the template may use {id}, {base_url}"),
    ("{base_url}/ux-html/?id={id}}", "'}' is not a placeholder (Single '}' encountered in format string; a literal "
                                     "brace is written twice); the template may use {id}, {base_url}"),
    ("{base_url}/ux-html/?id={id!r}", "unknown placeholder {id!r}; the template may use {id}, {base_url}"),
    ("{delivery_base_url}/?id={id}", "unknown placeholder {delivery_base_url}; the template may use {id}, "
                                     "{base_url}"),  # Rosetta's
], ids=["misspelt", "unclosed", "stray-brace", "conversion", "other-connectors"])
def test_a_source_url_template_that_cannot_be_filled_is_refused_when_the_settings_load(template, message):
    """Not at every object's link, as a KeyError or a link to somewhere else."""
    with pytest.raises(ConfigError) as raised:
        open_source("otmm", {"base_url": "http://x", "username": "u", "password": "p",
                             "source_url_template": template}, "dam", prefix="sources.dam")
    assert str(raised.value) == (f"config.yaml: sources.dam.source_url_template: {message} "
                                 f"(got {template!r})")


def test_unmapped_fields_are_kept_under_their_field_ids(emulator):
    (obj,) = otmm(emulator.url, metadata_map={"GTRUST.FIELD.TITLE": "title"}).get(
        [asset_id(emulator, "84_PA_1.png")])
    assert obj.metadata["title"][0].value == "Bust"
    assert obj.metadata["GTRUST.FIELD.CREDIT LINE"][0].value.startswith("Digital image courtesy")
    assert obj.metadata["ARTESIA.FIELD.ASSET NAME"][0].value == "84_PA_1.png"
    assert "GTRUST.FIELD.TITLE" not in obj.metadata


# --- content -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("options, path, corpus", [
    ({}, r"/assets/[0-9a-f]{40}/contents\?disposition=attachment", "rgb8-tiff-lzw/kodim02-lzw.tif"),
    ({"content": "master"}, r"/renditions/", "rgb8-tiff-lzw/kodim02-lzw.tif"),
    ({"content": "rendition"}, r"/renditions/", "gray8/hopper_gray.jpg"),
    ({"content": "rendition", "rendition": "thumbnail"}, r"/renditions/", "png/png-rgb-64x56x8.png"),
], ids=["contents", "master-rendition", "preview", "thumbnail"])
def test_which_content_is_the_master_is_configuration(emulator, tmp_path, options, path, corpus):
    source = otmm(emulator.url, contents_params={"disposition": "attachment"}, **options)
    (obj,) = source.get([asset_id(emulator, "2019_M_1_recto.tif")])
    expected = (CORPUS / corpus).read_bytes()
    assert obj.items[0].size == len(expected)
    fetched = source.fetch(obj.items[0], tmp_path)
    assert fetched.path.read_bytes() == expected
    assert len(emulator.requests(path)) == 1


def test_a_missing_rendition_is_a_clear_error(emulator):
    with pytest.raises(SourceDataError, match="has no pdf_preview rendition"):
        list(otmm(emulator.url, content="rendition", rendition="pdf_preview").get(
            [asset_id(emulator, "84_PA_1.png")]))


def test_size_is_always_verified_and_the_checksum_when_configured(emulator, tmp_path):
    recto = asset_id(emulator, "2019_M_1_recto.tif")
    (plain,) = otmm(emulator.url, content_checksum="none").get([recto])
    assert plain.items[0].fixity is None
    emulator.inject("/contents", Fault.truncate(0.9), times=None)
    with pytest.raises(SourceUnavailable, match="body ended early"):
        otmm(emulator.url, content_checksum="none").fetch(plain.items[0], tmp_path)
    emulator.faults.clear()
    source = otmm(emulator.url, content_checksum="md5")
    (checked,) = source.get([recto])
    emulator.inject("/contents", Fault.corrupt())
    fetched = source.fetch(checked.items[0], tmp_path)
    assert fetched.fixity_verified
    assert fetched.path.read_bytes() == (CORPUS / "rgb8-tiff-lzw/kodim02-lzw.tif").read_bytes()
    emulator.inject("/contents", Fault.corrupt(), times=None)
    with pytest.raises(FetchIntegrityError):
        source.fetch(checked.items[0], tmp_path / "again")
    assert list((tmp_path / "again").iterdir()) == []


@pytest.mark.parametrize("fault", [Fault.http(429, retry_after=0), Fault.http(500), Fault.http(503), Fault.reset(),
                                   Fault.truncate(0.5), Fault.slow(2)],
                         ids=["429", "500", "503", "reset", "truncated", "slow"])
def test_harvest_and_download_survive_transient_faults(emulator, tmp_path, fault):
    emulator.inject("search/text", fault)
    emulator.inject(r"GET /otmmapi/v6/assets/[0-9a-f]{40}\?", fault)
    emulator.inject("/contents", fault)
    source = otmm(emulator.url, retry={**FAST_RETRY, "read_timeout_seconds": 0.5})
    objects = list(source.changes(None))
    assert len(objects) == 6
    fetched = source.fetch(objects[0].items[0], tmp_path)
    assert fetched.size == objects[0].items[0].size
    assert len(emulator.requests("search/text")) == 5 and len(emulator.requests("/contents")) == 2


# --- settings and the emulator standalone --------------------------------------------------------------------

def test_settings_are_validated_with_the_key_named():
    base = {"base_url": "http://x", "username": "u", "password": "p"}
    with pytest.raises(ConfigError, match="sources.dam.auth: oauth needs client_id and client_secret"):
        open_source("otmm", {**base, "auth": "oauth"}, "dam", prefix="sources.dam")
    with pytest.raises(ConfigError, match="search: modified_field_id and modified_operator_id go"):
        open_source("otmm", {**base, "search": {"modified_field_id": MODIFIED_FIELD}}, "dam")
    with pytest.raises(ConfigError, match="discovery: folder needs a `folder:` section"):
        open_source("otmm", {**base, "discovery": "folder"}, "dam")
    with pytest.raises(ConfigError, match="content: Input should be 'contents', 'master' or 'rendition'"):
        open_source("otmm", {**base, "content": "access-file"}, "dam")
    source = open_source("otmm", {**base, "password": "s3cret-value"}, "dam")
    assert "s3cret-value" not in repr(source.settings)


def test_modified_order_is_taken_only_with_the_search_sorted_ascending_on_the_modified_field():
    base = {"base_url": "http://x", "username": "u", "password": "p"}
    dated = {"modified_field_id": MODIFIED_FIELD, "modified_operator_id": "ARTESIA.OPERATOR.DATE.IS ON OR AFTER",
             "modified_order": True}
    for search, extra in (({**dated, "sort": f"desc_{MODIFIED_FIELD}"}, {}), ({**dated, "sort": "asc_NAME"}, {}),
                          (dated, {}), ({"modified_order": True, "sort": f"asc_{MODIFIED_FIELD}"}, {}),
                          ({**dated, "sort": f"asc_{MODIFIED_FIELD}"}, {"group": GROUP})):
        with pytest.raises(ConfigError, match=r"sources.dam.search.modified_order: true needs "
                                              r"discovery: search, no `group:`"):
            open_source("otmm", {**base, "search": search, **extra}, "dam", prefix="sources.dam")
    assert open_source("otmm", {**base, "search": {**dated, "sort": f"asc_{MODIFIED_FIELD}"}},
                       "dam").lists_in_modified_order
    assert not open_source("otmm", {**base, "search": {**dated, "modified_order": False,
                                                        "sort": f"asc_{MODIFIED_FIELD}"}},
                           "dam").lists_in_modified_order


def test_a_source_names_the_settings_that_sort_its_listing_where_there_are_any():
    """What a harvest cut short advises (harvesting.py): the keys under `source:`, with the site's field id."""
    base = {"base_url": "http://x", "username": "u", "password": "p"}
    dated = {"modified_field_id": MODIFIED_FIELD, "modified_operator_id": "ARTESIA.OPERATOR.DATE.IS ON OR AFTER"}
    assert open_source("otmm", {**base, "search": dated}, "dam").modified_order_setting == \
        f"search.sort: asc_{MODIFIED_FIELD} and search.modified_order: true"
    assert open_source("otmm", base, "dam").modified_order_setting == \
        "search.sort: asc_<search.modified_field_id> and search.modified_order: true"
    for unsortable in ({"group": GROUP}, {"discovery": "folder", "folder": {"folder_id": "f"}},
                       {"discovery": "ids", "id_list": {"ids": ["a"]}}):
        assert open_source("otmm", {**base, **unsortable}, "dam").modified_order_setting is None


def test_the_emulator_runs_standalone():
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "tests.emulators.otmm", "--port", str(port)],
                               cwd=CORPUS.parents[1], stdout=subprocess.PIPE, text=True)
    try:
        wait_for_port(port, process)
        url = f"http://127.0.0.1:{port}"
        assert "OTMM emulator on" in process.stdout.readline()
        assert len(list(otmm(url, group=GROUP).changes(None))) == 4
        assert requests.post(f"{url}/_emulator/expire-sessions", timeout=5).status_code == 200
        assert len(list(otmm(url).changes(utc("2024-05-01 00:00:00")))) == 1
    finally:
        process.terminate()
        process.wait(10)
        process.stdout.close()
