"""The Rosetta connector over real HTTP against the Rosetta emulator (tests/emulators/rosetta.py)."""
from __future__ import annotations

import base64
import hashlib
import itertools
import logging
import subprocess
import sys
import traceback
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
import requests

from connectors import open_source
from connectors.base import Fixity, ListingCut, ListingMoved, UnreadableObject
from connectors.fetching import fetch_warnings
from connectors.errors import (AuthenticationFailed, FetchIntegrityError, ObjectNotFound, PermissionDenied,
                               SourceDataError, SourceRequestFailed, SourceUnavailable)
from connectors.rosetta import RosettaSettings, RosettaSource
from gcis_etl.errors import ConfigError
from gcis_etl.settings import parse
from tests.emulators import FAST_RETRY
from tests.emulators.catalogue import CORPUS, CorpusFile
from tests.emulators.faults import Fault
from tests.emulators.rosetta import (SRU_DATE_INDEX, Entity, Representation, RosettaCatalogue, RosettaEmulator,
                                     RosettaFile, seed)
from tests.emulators.server import EmulatorServer, Response
from tests.servers import free_port, wait_for_port

PASSWORD = "harvest-Secret-1"
OTHER_PASSWORD = "other-Secret-9"
LIVE_IN_SET = ["IE1001", "IE1011", "IE1016", "IE1020", "IE1023"]
SOAP = "POST /dpsws/repository/IEWebServices"


@pytest.fixture
def emulator():
    with EmulatorServer(RosettaEmulator()) as server:
        yield server


def rosetta(url: str, **overrides) -> RosettaSource:
    options = {"base_url": url, "username": "harvester", "institution_code": "INS00", "password": PASSWORD,
               "oai": {"set": "gcis"}, "retry": FAST_RETRY, **overrides}
    return open_source("rosetta", options, name="rosetta-test")


def sru(url: str, **sru_overrides) -> RosettaSource:
    return rosetta(url, discovery="sru", sru={"modified_index": SRU_DATE_INDEX, "page_size": 2,
                                              "query": "IE.generalIECharacteristics.UserDefinedA=GCIS",
                                              **sru_overrides})


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc)


def sru_pages(emulator) -> list:
    """The searchRetrieve requests of a first run's SRU listing, but the one probing its date clause (the second)."""
    pages = emulator.requests("operation=searchRetrieve")
    probe = pages.pop(1)
    assert probe.arg("maximumRecords") == "1" and f'{SRU_DATE_INDEX}>="1970-01-01 00:00:00"' in probe.arg("query")
    return pages


# --- discovery -----------------------------------------------------------------------------------------------

def test_oai_harvest_pages_through_resumption_tokens_and_skips_deleted_records(emulator):
    objects = list(rosetta(emulator.url).changes(None))
    assert [o.id for o in objects] == LIVE_IN_SET
    pages = emulator.requests("verb=ListIdentifiers")
    assert len(pages) == 3  # 6 records (one deleted), 2 per page
    assert "resumptionToken=" not in pages[0].target and all("resumptionToken=" in p.target for p in pages[1:])
    assert "IE1029" not in {r.arg("iePid") for r in emulator.requests(SOAP)}
    assert len(emulator.requests(SOAP)) == 5


def test_oai_list_records_verb_harvests_the_same_objects(emulator):
    source = rosetta(emulator.url, oai={"set": "gcis", "verb": "ListRecords"})
    assert [o.id for o in source.changes(None)] == LIVE_IN_SET
    assert emulator.requests("verb=ListRecords")


def test_incremental_harvest_returns_only_objects_changed_since(emulator):
    source = rosetta(emulator.url)
    assert [o.id for o in source.changes(utc("2024-03-01 00:00:00"))] == ["IE1016", "IE1020", "IE1023"]
    assert "from=2024-03-01T00%3A00%3A00Z" in emulator.requests("verb=ListIdentifiers")[0].target
    checkpoint = datetime.now(timezone.utc) - timedelta(seconds=5)
    assert list(source.changes(checkpoint)) == []
    emulator.app.catalogue.touch("IE1011")
    changed = list(source.changes(checkpoint))
    assert [o.id for o in changed] == ["IE1011"]
    assert changed[0].modified >= checkpoint


def test_until_closes_the_harvest_window(emulator):
    objects = rosetta(emulator.url).changes(utc("2024-01-01 00:00:00"), until=utc("2024-03-01 08:00:00"))
    assert [o.id for o in objects] == ["IE1001", "IE1011", "IE1016"]


def test_sru_harvest_pages_with_start_record(emulator):
    assert [o.id for o in sru(emulator.url).changes(None)] == LIVE_IN_SET
    starts = [r.arg("startRecord") for r in sru_pages(emulator)]
    assert starts == ["1", "3", "5"]
    assert all(r.arg("maximumRecords") == "2" and r.arg("auth") == "local" for r in sru_pages(emulator))


def test_sru_incremental_harvest_queries_the_configured_date_index(emulator):
    objects = list(sru(emulator.url).changes(utc("2024-04-01 00:00:00")))
    assert [o.id for o in objects] == ["IE1020", "IE1023"]
    query = emulator.requests("operation=searchRetrieve")[0].arg("query")
    assert f'{SRU_DATE_INDEX}>="2024-04-01 00:00:00"' in query


def test_an_sru_result_that_shrinks_between_two_pages_says_so_in_the_listing(emulator):
    """An IE deleted once page 1 is read moves every later one back a place: one is never served. The changed
    numberOfRecords comes as a ListingMoved, where the harvest learns that it must hold its checkpoint."""
    first = LIVE_IN_SET[0]
    emulator.before(r"startRecord=3", lambda: setattr(emulator.app.catalogue.entities[first], "deleted", True))
    listed = list(sru(emulator.url).changes(None))
    (shift,) = [o for o in listed if isinstance(o, ListingMoved)]
    assert shift.reason.startswith(f"SRU numberOfRecords went from {len(LIVE_IN_SET)} to {len(LIVE_IN_SET) - 1} "
                                   "between two pages (at startRecord=3)")
    assert [o.id for o in listed if not isinstance(o, ListingMoved)] == LIVE_IN_SET[:2] + LIVE_IN_SET[3:]


def test_an_sru_next_record_position_that_does_not_advance_ends_the_listing_with_an_error(emulator):
    """Following it would ask for the same page for ever, as a repeated OAI-PMH resumptionToken would."""
    emulator.app.sru_next_position = lambda start, maximum: start if start > 1 else start + maximum
    with pytest.raises(SourceDataError, match=r"^rosetta-test: SRU nextRecordPosition 3 does not advance past "
                                              r"startRecord=3 \(expected 5\): the server would serve the same page "
                                              "again$"):
        list(itertools.islice(sru(emulator.url).changes(None), 30))  # islice: the old loop never ended
    assert [r.arg("startRecord") for r in sru_pages(emulator)] == ["1", "3"]


def test_an_empty_sru_page_short_of_the_total_says_so_in_the_listing(emulator):
    """A server that stops serving past some depth while numberOfRecords counts every match: the run holds its
    checkpoint rather than pass over the IEs it was never given."""
    emulator.app.sru_deepest = 3
    listed = list(sru(emulator.url).changes(None))
    (shift,) = [o for o in listed if isinstance(o, ListingMoved)]
    assert type(shift) is ListingCut and shift.reason == (
        f"the server gave an empty SRU page at startRecord=3 of numberOfRecords {len(LIVE_IN_SET)}: the IEs past it "
        "were not served")
    assert [o.id for o in listed if not isinstance(o, ListingMoved)] == LIVE_IN_SET[:2]


def test_sru_result_beyond_rosettas_cap_is_refused_before_harvesting(emulator):
    with pytest.raises(SourceRequestFailed, match="matches 5 IEs, more than the 3"):
        next(sru(emulator.url, max_records=3).changes(None))
    assert emulator.requests(SOAP) == []



def test_sru_result_beyond_rosettas_cap_sorted_oldest_first_is_listed_up_to_the_cap_and_cut_there(emulator):
    """Sorted oldest first, a run takes the first max_records IEs and its checkpoint moves past them
    (harvesting: ListingCut), so a result bigger than the cap is got through run by run, never asking past it."""
    ordered = {"sort_by": f"{SRU_DATE_INDEX}/sort.ascending", "modified_order": True, "max_records": 3}
    listed = list(sru(emulator.url, **ordered).changes(None))
    assert [o.id for o in listed[:-1]] == LIVE_IN_SET[:3]
    assert type(listed[-1]) is ListingCut and listed[-1].reason == (
        "Rosetta serves the first 3 IEs of an SRU result (sru.max_records), and this one counts 5: the IEs past "
        "them were not served")
    assert [(p.arg("startRecord"), p.arg("maximumRecords")) for p in sru_pages(emulator)] == [("1", "2"), ("3", "1")]
    # a result within the cap is listed whole, with no cut
    assert not any(isinstance(o, ListingMoved) for o in sru(emulator.url, **{**ordered, "max_records": 6}
                                                            ).changes(None))

def test_sru_diagnostics_become_clear_errors(emulator):
    with pytest.raises(SourceRequestFailed, match="Unsupported index.*IE.no.such.index"):
        list(sru(emulator.url, modified_index="IE.no.such.index").changes(utc("2024-01-01 00:00:00")))


def test_an_sru_record_the_server_could_not_serve_is_one_ie_not_listed(emulator, caplog):
    """A surrogate diagnostic in a record's place stopped the whole listing ("run stopped: SRU query ...: Record
    temporarily unavailable (info:srw/diagnostic/1/64)"): it is that IE alone, which the next run lists again."""
    emulator.app.sru_unavailable = {"IE1011"}
    with caplog.at_level(logging.WARNING, logger="connectors"):
        listed = list(sru(emulator.url).changes(None))
    (moved,) = [o for o in listed if isinstance(o, ListingMoved)]
    assert type(moved) is ListingMoved and moved.reason == (
        "SRU record 2 of the result was not listed (a diagnostic in its place: Record temporarily unavailable "
        "(info:srw/diagnostic/1/64))")
    assert moved.reason in caplog.text
    assert [o.id for o in listed if not isinstance(o, ListingMoved)] == [p for p in LIVE_IN_SET if p != "IE1011"]
    # a record holding no IE PID (here one that ie_pid_pattern does not take) is the same
    emulator.app.sru_unavailable = set()
    listed = list(rosetta(emulator.url, discovery="sru", ie_pid_pattern=r"^IE10(01|11|16|20)$",
                          sru=sru(emulator.url).settings.sru.model_dump()).changes(None))
    assert [o.reason if isinstance(o, ListingMoved) else o.id for o in listed] == LIVE_IN_SET[:4] + [
        "SRU record 5 of the result was not listed (no dc:identifier of xsi:type 'PID' holding an IE PID)"]


def test_sru_diagnostic_61_after_the_result_shrank_is_a_moved_listing(emulator):
    """A server answering a startRecord past its result with diagnostic 61 (as SRU 1.2 says), not an empty page:
    past a result that shrank between pages it stopped the run ("First record position out of range
    (info:srw/diagnostic/1/61) 5"); it is the listing moving under the run, which holds its checkpoint."""
    emulator.app.sru_out_of_range_diagnostic = True
    deleted = LIVE_IN_SET[:2]
    emulator.before(r"startRecord=5", lambda: [setattr(emulator.app.catalogue.entities[pid], "deleted", True)
                                               for pid in deleted])
    listed = list(sru(emulator.url).changes(None))
    assert [o.id for o in listed[:-1]] == LIVE_IN_SET[:4]  # the fifth moved back onto a page already read
    assert type(listed[-1]) is ListingMoved and listed[-1].reason == (
        "SRU startRecord=5 is out of range of a result that counted 5 when the last page was read: IEs left the "
        "result while it was paged, and one may have been passed over")
    # on the first page, startRecord=1 is out of range of an empty result only: a quiet incremental run, not an
    # error that would stop every run while nothing changes
    assert list(sru(emulator.url).changes(utc("2030-01-01 00:00:00"))) == []


def test_an_sru_response_of_another_version_is_named_for_what_it_is(emulator):
    """SRU 2.0's namespace read as SRU 1.2 was "SRU numberOfRecords is not a number: None"."""
    sru2 = "http://docs.oasis-open.org/ns/search-ws/sruResponse"
    emulator.app.rewrite = lambda request, response: (
        Response.xml(response.body.replace(b"http://www.loc.gov/zing/srw/", sru2.encode())) if "/sru" in request.path
        else response)
    with pytest.raises(SourceDataError, match=rf"^SRU response: the document is {{{sru2}}}searchRetrieveResponse, not "
                                              r"an SRU 1.2 searchRetrieveResponse \({http://www.loc.gov/zing/srw/}\)$"):
        list(sru(emulator.url).changes(None))


def test_oai_protocol_errors_are_reported_and_empty_results_are_empty(emulator):
    assert list(rosetta(emulator.url, oai={"set": "no-such-set"}).changes(None)) == []
    with pytest.raises(SourceRequestFailed, match="cannotDisseminateFormat"):
        list(rosetta(emulator.url, oai={"set": "gcis", "metadata_prefix": "marc21"}).changes(None))


def test_an_oai_record_that_is_no_ie_is_skipped_with_a_warning_and_the_listing_goes_on(caplog):
    catalogue = seed()  # a collection record published to the harvested set, amid the IEs
    catalogue.entities["COL77"] = Entity("COL77", [("dc:title", "A collection", "en")], utc("2023-01-01 00:00:00"),
                                         utc("2024-01-20 00:00:00"), [])
    with EmulatorServer(RosettaEmulator(catalogue)) as server, caplog.at_level(logging.WARNING, logger="connectors"):
        assert [o.id for o in rosetta(server.url).changes(None)] == LIVE_IN_SET
        assert len(server.requests("verb=ListIdentifiers")) == 4  # every page, COL77's included
        assert "COL77" not in " ".join(r.body.decode() for r in server.requests(SOAP))
    assert "'oai:rosetta.emulator:COL77' does not match oai.identifier_pattern" in caplog.text
    assert "skipped" in caplog.text


def test_pid_list_from_a_file_with_comments(emulator, tmp_path):
    pids = tmp_path / "pids.txt"
    pids.write_text("# migration batch 1\nIE1016\n\nIE1001  # irises\n")
    source = rosetta(emulator.url, discovery="pids", pid_list={"file": str(pids), "ids": ["IE1020"]})
    assert [o.id for o in source.changes(None)] == ["IE1020", "IE1016", "IE1001"]
    assert [o.id for o in source.changes(utc("2024-02-01 00:00:00"))] == ["IE1020", "IE1016"]


def test_explicit_ids_and_unknown_ones(emulator):
    source = rosetta(emulator.url)
    assert [o.id for o in source.get(["IE1020", "IE1001"])] == ["IE1020", "IE1001"]
    with pytest.raises(ObjectNotFound, match="IE9999 does not exist"):
        list(source.get(["IE9999"]))
    assert len(emulator.requests(SOAP)) == 3  # an application fault is not retried
    with pytest.raises(ObjectNotFound, match="not an IE PID"):
        list(source.get(["FL1006"]))
    assert len(emulator.requests(SOAP)) == 3


# --- object detail -------------------------------------------------------------------------------------------

def test_the_modified_master_is_chosen_among_three_representations_in_structmap_order(emulator):
    (ie,) = rosetta(emulator.url).get(["IE1001"])
    assert [i.id for i in ie.items] == ["FL1008", "FL1006", "FL1007"]  # physical order, not fileGrp order
    assert [i.sequence for i in ie.items] == [1, 2, 3]
    assert [i.label for i in ie.items] == ["Recto", "Verso", "Detail"]
    assert [i.original_name for i in ie.items] == ["2019_M_1_recto.jpg", "2019_M_1_verso.jpg", "2019_M_1_detail.tif"]
    corpus = [CORPUS / "icc-srgb/jpg-icc.jpg", CORPUS / "jpeg-baseline/flowers.jpeg",
              CORPUS / "rgb8-tiff-jpeg/quad-jpeg.tif"]
    assert [i.size for i in ie.items] == [p.stat().st_size for p in corpus]
    assert [i.fixity.algorithm for i in ie.items] == ["sha256", "md5", "sha1"]  # sha1 preferred over md5
    assert ie.items[2].fixity.value == hashlib.sha1(corpus[2].read_bytes()).hexdigest()
    assert ie.modified == utc("2024-01-10 09:00:00")
    assert all(i.modified == utc("2024-01-10 09:00:00") for i in ie.items)
    assert all("dps_func=stream" in i.locator and f"dps_pid={i.id}" in i.locator for i in ie.items)


def test_the_preservation_type_is_configuration(emulator):
    (ie,) = rosetta(emulator.url, preservation_types=["PRESERVATION_MASTER"]).get(["IE1001"])
    assert [i.id for i in ie.items] == ["FL1003", "FL1004"]
    (ie,) = rosetta(emulator.url, preservation_types=["DERIVATIVE_COPY"], get_ie_flags=32).get(["IE1001"])
    assert [i.id for i in ie.items] == ["FL1010"]
    assert "<flags>32</flags>" in emulator.requests(SOAP)[-1].body.decode()


def test_derivative_copies_are_refused_without_the_getie_flag_that_includes_them():
    """getIE flag 0 leaves derivative copies out (dam-apis.md §1.5): every IE failed with "IE1001: no representation
    of preservation type DERIVATIVE_COPY (found: PRESERVATION_MASTER, MODIFIED_MASTER)"."""
    options = {"base_url": "http://x", "username": "u", "password": "p", "oai": {"set": "s"},
               "preservation_types": ["MODIFIED_MASTER", "DERIVATIVE_COPY"]}
    for flags in (0, 16):
        with pytest.raises(ConfigError, match=rf"preservation_types names DERIVATIVE_COPY, which getIE leaves out with "
                                              rf"get_ie_flags: {flags} \(flag 32 includes derivative copies: "
                                              rf"get_ie_flags: {flags + 32}\)$"):
            open_source("rosetta", {**options, "get_ie_flags": flags}, "main")
    assert open_source("rosetta", {**options, "get_ie_flags": 48}, "main").settings.get_ie_flags == 48


def test_preservation_types_are_tried_in_order(emulator):
    source = rosetta(emulator.url, preservation_types=["MODIFIED_MASTER", "PRESERVATION_MASTER"])
    assert [i.id for o in source.get(["IE1001", "IE1026"]) for i in o.items] == \
        ["FL1008", "FL1006", "FL1007", "FL1028"]


def test_the_struct_map_type_is_configuration(emulator):
    (ie,) = rosetta(emulator.url, struct_map_type="LOGICAL").get(["IE1001"])
    assert [i.id for i in ie.items] == ["FL1007", "FL1006", "FL1008"]


def test_an_ie_with_two_representations_of_the_wanted_type(caplog):
    """The second was dropped with a log line alone: `representations: all` takes both, one after the other, each
    in its structMap's order; `first` (the default) still takes the first, and the log names the others."""
    def files(*pids: str) -> list[RosettaFile]:
        return [RosettaFile(pid, CorpusFile("gray8/gray.tif"), f"Vol. {pid[-1]}") for pid in pids]
    catalogue = RosettaCatalogue([Entity("IE3001", [("dc:title", "Two volumes", "en")], utc("2023-01-01 00:00:00"),
                                         utc("2024-01-02 00:00:00"), [
        Representation("REP3002", "MODIFIED_MASTER", files("FL3004", "FL3003")),
        Representation("REP3005", "PRESERVATION_MASTER", files("FL3006")),
        Representation("REP3007", "MODIFIED_MASTER", files("FL3009", "FL3008"))])])
    with EmulatorServer(RosettaEmulator(catalogue)) as server:
        with caplog.at_level(logging.WARNING, logger="connectors"):
            (first,) = rosetta(server.url).get(["IE3001"])
        (every,) = rosetta(server.url, representations="all").get(["IE3001"])
    assert [i.id for i in first.items] == ["FL3004", "FL3003"]
    assert ("IE3001: 2 MODIFIED_MASTER representations (REP3002, REP3007); taking the first, REP3002 "
            "(representations: all takes every one)") in caplog.text
    assert [(i.id, i.sequence) for i in every.items] == [("FL3004", 1), ("FL3003", 2), ("FL3009", 3), ("FL3008", 4)]


def test_an_ie_without_the_wanted_representation(emulator, caplog):
    (listed,) = rosetta(emulator.url, oai={"set": "other"}).changes(None)  # in its place: the listing goes on
    assert isinstance(listed, UnreadableObject) and listed.id == "IE1026" and not listed.gone
    assert "IE1026: no representation of preservation type MODIFIED_MASTER" in listed.reason
    assert listed.modified is not None  # the OAI datestamp: the run holds its checkpoint there
    skipping = rosetta(emulator.url, oai={"set": "other"}, missing_representation="skip")
    with caplog.at_level(logging.WARNING, logger="connectors"):
        assert list(skipping.changes(None)) == []
    assert "IE1026" in caplog.text and "skipped" in caplog.text
    with pytest.raises(ObjectNotFound):
        list(skipping.get(["IE1026"]))  # named explicitly: always an error


def test_an_ie_whose_wanted_representation_has_no_files_follows_the_same_policy(caplog):
    catalogue = RosettaCatalogue([
        Entity("IE2011", [("dc:title", "Empty", "en")], utc("2023-01-01 00:00:00"), utc("2024-01-02 00:00:00"),
               [Representation("REP2012", "MODIFIED_MASTER", [])]),
        Entity("IE2021", [("dc:title", "Normal", "en")], utc("2023-01-01 00:00:00"), utc("2024-01-03 00:00:00"),
               [Representation("REP2022", "MODIFIED_MASTER", [RosettaFile("FL2023", CorpusFile("gray8/gray.tif"),
                                                                          "Only")])])])
    with EmulatorServer(RosettaEmulator(catalogue)) as server:
        listed, normal = rosetta(server.url).changes(None)  # in its place: the run records it as failed
        assert isinstance(listed, UnreadableObject) and listed.id == "IE2011" and not listed.gone
        assert listed.reason == "IE2011: representation REP2012 (MODIFIED_MASTER) has no files"
        assert [i.id for i in normal.items] == ["FL2023"]
        skipping = rosetta(server.url, missing_representation="skip")
        with caplog.at_level(logging.WARNING, logger="connectors"):
            assert [o.id for o in skipping.changes(None)] == ["IE2021"]
        assert "IE2011: representation REP2012 (MODIFIED_MASTER) has no files; skipped" in caplog.text
        with pytest.raises(ObjectNotFound, match="has no files"):
            list(skipping.get(["IE2011"]))  # named explicitly: always an error


def test_descriptive_metadata_keeps_languages_and_order(emulator):
    first, multilingual = rosetta(emulator.url).get(["IE1001", "IE1016"])
    assert [(v.value, v.language) for v in multilingual.metadata["dc:title"]] == [("Le moulin", "fr"),
                                                                                  ("The mill", "en")]
    assert list(first.metadata) == ["dc:title", "dc:creator", "dcterms:created", "dc:identifier", "dc:rights"]
    assert first.metadata["dcterms:created"][0].value == "ca. 1890"
    assert first.source_url == f"{emulator.url}/delivery/DeliveryManagerServlet?dps_pid=IE1001"


@pytest.mark.parametrize("encoding", ["UTF-8", "UTF-16"])
def test_a_document_type_declaration_is_refused_in_any_encoding(emulator, encoding):
    """Searched for in the raw bytes, a DTD in UTF-16 passed and its internal entity was expanded (the title read
    "INJECTEDIrises, study sheet")."""
    def with_dtd(request, response):
        if request.method != "POST":
            return response
        envelope = response.body.decode("utf-8").partition("?>")[2].replace("Irises, study sheet", "&x;Irises")
        document = f'<?xml version="1.0" encoding="{encoding}"?><!DOCTYPE e [<!ENTITY x "INJECTED">]>{envelope}'
        return Response(200, document.encode(encoding), "text/xml")
    emulator.app.rewrite = with_dtd
    with pytest.raises(SourceDataError, match="^IE1001: getIE response: a document type declaration is not accepted$"):
        list(rosetta(emulator.url).get(["IE1001"]))


def test_dnx_dates_are_read_in_the_configured_time_zone(emulator):
    (ie,) = rosetta(emulator.url, timezone="America/Los_Angeles").get(["IE1001"])
    assert ie.modified == utc("2024-01-10 17:00:00")


NEW_YORK = ZoneInfo("America/New_York")
DST_EDGES = {  # the server's clock, an edit (UTC) and the harvest window (UTC) with one end close to it
    "repeated hour: an edit in its second pass, the window opening in its first":
        (NEW_YORK, "2024-11-03 06:30:00", "2024-11-03 05:55:00", "2024-11-04 00:00:00"),
    "repeated hour: an edit in its first pass, the window closing in its second":
        (NEW_YORK, "2024-11-03 05:30:00", "2024-11-02 00:00:00", "2024-11-03 06:10:00"),
    "skipped hour, written by a clock left on daylight time, the window closing":
        (timezone(timedelta(hours=-4)), "2024-03-10 06:30:00", "2024-03-09 00:00:00", "2024-03-10 07:00:00"),
    "skipped hour, written by a clock left on standard time, the window opening":
        (timezone(timedelta(hours=-5)), "2024-03-10 07:30:00", "2024-03-10 07:10:00", "2024-03-11 00:00:00"),
}


@pytest.mark.parametrize("discovery", ["pids", "sru"])
@pytest.mark.parametrize("clock, edited, since, until", DST_EDGES.values(), ids=DST_EDGES)
def test_an_edit_at_a_clock_time_a_dst_change_repeats_or_skips_is_listed_in_every_window_it_may_belong_to(
        discovery, clock, edited, since, until):
    """DNX dates carry no offset: 01:30 in New York on 3 November 2024 is 05:30 or 06:30 UTC, and 02:30 on
    10 March (a time skipped there) 06:30 or 07:30. Either way the edit is listed by a window holding either
    reading, whether IEs come from a PID list or from an SRU query (which the server answers by comparing its
    clock times as text), while edits well outside the window stay out. Its `modified` is the earliest reading,
    which a checkpoint can move to without passing the edit."""
    ies = {"IE3001": "2024-01-01 00:00:00", "IE3002": edited, "IE3003": "2024-12-01 00:00:00"}
    catalogue = RosettaCatalogue([
        Entity(pid, [("dc:title", pid, "en")], utc("2023-01-01 00:00:00"), utc(modified), [Representation(
            f"REP{pid}", "MODIFIED_MASTER", [RosettaFile(f"FL{pid}", CorpusFile("gray8/gray.tif"), "Image")])])
        for pid, modified in ies.items()])
    with EmulatorServer(RosettaEmulator(catalogue, zone=clock)) as server:
        source = rosetta(server.url, timezone="America/New_York", discovery=discovery,
                         sru={"modified_index": SRU_DATE_INDEX}, pid_list={"ids": list(ies)})
        (listed,) = source.changes(utc(since), utc(until))
    assert listed.id == "IE3002" and listed.modified <= utc(edited)


# --- an HTML page in Rosetta's place --------------------------------------------------------------------------

def test_an_html_page_in_place_of_the_ie_web_service_stops_the_listing(emulator):
    """A proxy's login or maintenance page answered 200 was taken for a malformed record: every IE failed alone
    ("IE1001: getIE response: not well-formed XML (mismatched tag: line 1, column 58)"), spent its attempts, and the
    run completed and moved its checkpoint. It is Rosetta not being there: the WSDL is that page too
    (source_down), so the listing stops at the first IE."""
    emulator.inject("IEWebServices", Fault.page(), times=None)
    source = rosetta(emulator.url)
    with pytest.raises(SourceUnavailable, match=r"^IE1001: getIE response: the server answered with an HTML page "
                                                r"titled 'Single Sign-On - Login' \(Content-Type text/html\), not SOAP: a "
                                                r"login or maintenance page in front of the source\?$"):
        list(source.changes(None))
    assert len(emulator.requests(SOAP)) == 1
    with pytest.raises(SourceUnavailable, match=r"^GET http://\S+/IEWebServices\?wsdl: the server answered with an "
                                                r"HTML page titled 'Single Sign-On - Login' \(Content-Type text/html\), not "
                                                r"the IEWebServices WSDL"):
        source.reachable()


def test_an_html_page_in_place_of_one_getie_while_the_service_answers_is_that_ies_failure(emulator):
    emulator.inject("POST /dpsws", Fault.page(), times=None)
    listed = list(rosetta(emulator.url).changes(None))
    assert [o.id for o in listed] == LIVE_IN_SET and all(isinstance(o, UnreadableObject) for o in listed)
    assert listed[0].reason == ("IE1001: getIE response: the server answered with an HTML page titled 'Single Sign-On - "
                                "Login' (Content-Type text/html), not SOAP: a login or maintenance page in front of "
                                "the source? (the source answers otherwise)")


def test_a_soap_answer_labelled_text_html_is_still_read(emulator):
    emulator.app.rewrite = lambda request, response: Response(response.status, response.body, "text/html")
    assert [i.id for o in rosetta(emulator.url).get(["IE1001"]) for i in o.items] == ["FL1008", "FL1006", "FL1007"]


XHTML = (b'<?xml version="1.0" encoding="UTF-8"?>\n<html xmlns="http://www.w3.org/1999/xhtml"><head><title>Session\n'
         b' expired</title></head><body><p>Please log in.</p></body></html>')


@pytest.mark.parametrize("page, content_type, title", [
    (b"<!DOCTYPE html><html><body>Session expired</body></html>", "text/html;charset=UTF-8", ""),
    (XHTML, "text/xml", " titled 'Session expired'"),
    (XHTML, "application/xhtml+xml", " titled 'Session expired'"),
    (b"<head><title>Maintenance</title></head><p>Back soon<br>", "text/html", " titled 'Maintenance'")],
    ids=["doctype", "xhtml-as-xml", "xhtml", "fragment"])
@pytest.mark.parametrize("discovery", ["oai", "sru"])
def test_an_html_page_in_place_of_a_listing_is_rosetta_not_being_there(emulator, page, content_type, title, discovery):
    """Was "SRU response: a document type declaration is not accepted" or "SRU numberOfRecords is not a number:
    None" (OAI-PMH's likewise)."""
    emulator.inject("oaiprovider|/sru", Fault.page(page, content_type), times=None)
    source = sru(emulator.url) if discovery == "sru" else rosetta(emulator.url)
    what = "SRU response" if discovery == "sru" else "OAI-PMH response"
    expected = "an SRU response" if discovery == "sru" else "OAI-PMH"
    with pytest.raises(SourceUnavailable) as raised:
        list(source.changes(None))
    assert str(raised.value) == (f"{what}: the server answered with an HTML page{title} (Content-Type "
                                 f"{content_type.partition(';')[0]}), not {expected}: a login or maintenance page in "
                                 "front of the source?")


def test_an_html_page_in_place_of_a_file_is_rosetta_not_being_there_not_a_cut_transfer(emulator, tmp_path):
    """Was "received 82 bytes, the source records 85267", retried as a transfer cut short until it gave up."""
    (ie,) = rosetta(emulator.url).get(["IE1020"])
    emulator.inject("DeliveryManagerServlet", Fault.page(), times=None)
    with pytest.raises(SourceUnavailable, match=r"^FL1022: delivery: the server answered with an HTML page titled "
                                                r"'Single Sign-On - Login', not the file's bytes"):
        rosetta(emulator.url).fetch(ie.items[0], tmp_path)
    assert len(emulator.requests("DeliveryManagerServlet")) == 1
    assert list(tmp_path.iterdir()) == []


# --- download and auth ---------------------------------------------------------------------------------------

def test_every_file_is_fetched_with_its_fixity_verified(emulator, tmp_path):
    (ie,) = rosetta(emulator.url).get(["IE1001"])
    source = rosetta(emulator.url)
    for item, name in zip(ie.items, ["icc-srgb/jpg-icc.jpg", "jpeg-baseline/flowers.jpeg",
                                     "rgb8-tiff-jpeg/quad-jpeg.tif"]):
        fetched = source.fetch(item, tmp_path)
        assert fetched.fixity_verified and fetched.path.read_bytes() == (CORPUS / name).read_bytes()
    scheme, token = emulator.requests("DeliveryManagerServlet")[0].headers["Authorization"].split(" ")
    assert scheme == "Basic"
    assert base64.b64decode(token).decode() == f"harvester-institutionCode-INS00:{PASSWORD}"


def test_the_auth_scheme_word_is_configuration(emulator):
    list(rosetta(emulator.url, auth_scheme="local").get(["IE1011"]))
    assert emulator.requests(SOAP)[0].headers["Authorization"].startswith("local ")


def test_delivery_and_harvest_hosts_soap_action_and_delivery_parameters_are_configuration(tmp_path):
    catalogue = RosettaEmulator().catalogue
    with EmulatorServer(RosettaEmulator(catalogue)) as app_server, \
            EmulatorServer(RosettaEmulator(catalogue)) as delivery_server:
        source = rosetta(app_server.url, delivery_base_url=delivery_server.url, soap_action="getIE",
                         delivery_params={"dps_custom_att_1": "staff"}, fixity_preference=["md5"])
        (ie,) = source.changes(utc("2024-04-01 00:00:00"), until=utc("2024-04-02 00:00:00"))
        assert source.fetch(ie.items[0], tmp_path).fixity_verified
        (irises,) = source.get(["IE1001"])
        assert irises.items[2].fixity.algorithm == "md5"  # FL1007 has SHA1 and MD5; md5 is the only preference
        assert app_server.requests("oaiprovider|DeliveryManagerServlet") == []
        assert len(delivery_server.requests("verb=ListIdentifiers")) == 1
        (download,) = delivery_server.requests("DeliveryManagerServlet")
        assert download.arg("dps_custom_att_1") == "staff" and download.arg("dps_pid") == "FL1022"
        assert app_server.requests(SOAP)[0].headers["SOAPAction"] == '"getIE"'
        assert ie.source_url.startswith(delivery_server.url)


@pytest.mark.parametrize("fault", [Fault.http(429, retry_after=0), Fault.http(500), Fault.http(503),
                                   Fault.reset(), Fault.truncate(0.4), Fault.slow(2)],
                         ids=["429", "500", "503", "reset", "truncated", "slow"])
def test_discovery_and_description_survive_transient_faults(emulator, fault):
    emulator.inject("verb=ListIdentifiers", fault)
    emulator.inject(SOAP, fault, times=2)
    source = rosetta(emulator.url, retry={**FAST_RETRY, "read_timeout_seconds": 0.5})
    assert [o.id for o in source.changes(None)] == LIVE_IN_SET
    assert len(emulator.requests(SOAP)) == 7


@pytest.mark.parametrize("fault", [Fault.truncate(0.5), Fault.corrupt(), Fault.http(503), Fault.reset(),
                                   Fault.http(429, retry_after=0), Fault.slow(2)],
                         ids=["truncated", "wrong-fixity", "503", "reset", "429", "slow"])
def test_a_faulty_download_is_retried_until_verified(emulator, tmp_path, fault):
    (ie,) = rosetta(emulator.url).get(["IE1020"])
    emulator.inject("dps_pid=FL1022", fault)
    fetched = rosetta(emulator.url, retry={**FAST_RETRY, "read_timeout_seconds": 0.5}).fetch(ie.items[0], tmp_path)
    assert fetched.path.read_bytes() == (CORPUS / "rgb8-tiff-lzw/kodim02-lzw.tif").read_bytes()
    assert len(emulator.requests("dps_pid=FL1022")) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["FL1022.tif"]


def test_a_file_whose_only_fixity_cannot_be_checked_is_fetched_with_a_warning_saying_so(tmp_path):
    """Rosetta may record CRC32 alone: the master is fetched, and its outcome must not read as verified."""
    only_crc = RosettaFile("FL2033", CorpusFile("gray8/gray.tif"), "Only", ("CRC32",))
    catalogue = RosettaCatalogue([Entity("IE2031", [("dc:title", "CRC", "en")], utc("2023-01-01 00:00:00"),
                                         utc("2024-01-03 00:00:00"),
                                         [Representation("REP2032", "MODIFIED_MASTER", [only_crc])])])
    with EmulatorServer(RosettaEmulator(catalogue)) as server:
        (ie,) = rosetta(server.url).get(["IE2031"])
        assert ie.items[0].fixity == Fixity("crc32", only_crc.source.digest("crc32"))
        fetched = rosetta(server.url).fetch(ie.items[0], tmp_path)
    assert not fetched.fixity_verified and fetched.path.read_bytes() == (CORPUS / "gray8/gray.tif").read_bytes()
    assert fetch_warnings(fetched) == ("the source's crc32 fixity cannot be checked (only md5, sha1, sha224, sha256, "
                                       "sha384, sha512 can): the master was not verified against it",)


def test_a_download_that_never_matches_its_fixity_is_never_handed_on(emulator, tmp_path):
    (ie,) = rosetta(emulator.url).get(["IE1020"])
    emulator.inject("dps_pid=FL1022", Fault.corrupt(), times=None)
    with pytest.raises(FetchIntegrityError, match="FL1022: md5 .* does not match"):
        rosetta(emulator.url).fetch(ie.items[0], tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_fixity_preference_spelled_as_rosetta_spells_it_still_checks_the_download(emulator, tmp_path):
    source = rosetta(emulator.url, fixity_preference=["SHA-256", "MD5"])
    assert source.settings.fixity_preference == ("sha256", "md5")
    (ie,) = source.get(["IE1020"])
    assert ie.items[0].fixity.algorithm == "md5"  # the emulator's files carry an MD5
    emulator.inject("dps_pid=FL1022", Fault.corrupt(), times=None)
    with pytest.raises(FetchIntegrityError, match="FL1022: md5 .* does not match"):
        source.fetch(ie.items[0], tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("options", [{"password": "wrong-password"}, {"institution_code": "INS99"},
                                     {"institution_code": None}], ids=["password", "institution", "no-institution"])
def test_refused_credentials_fail_at_once_and_are_not_disclosed(emulator, options):
    source = rosetta(emulator.url, **options)
    with pytest.raises(AuthenticationFailed) as raised:
        list(source.get(["IE1001"]))
    assert len(emulator.requests(SOAP)) == 1
    text = "".join(traceback.format_exception(raised.value))
    assert "wrong-password" not in text and PASSWORD not in text


def test_a_user_without_the_role_gets_permission_errors(emulator, tmp_path):
    (ie,) = rosetta(emulator.url).get(["IE1011"])
    curator = rosetta(emulator.url, username="curator", password="curator-Secret-2")
    with pytest.raises(PermissionDenied, match="UserAuthorizeException"):
        list(curator.get(["IE1011"]))
    with pytest.raises(PermissionDenied, match="HTTP 403"):
        curator.fetch(ie.items[0], tmp_path)
    assert len(emulator.requests("DeliveryManagerServlet")) == 1


def test_injected_auth_faults_are_not_retried(emulator, tmp_path):
    (ie,) = rosetta(emulator.url).get(["IE1011"])
    emulator.inject("DeliveryManagerServlet", Fault.http(401))
    with pytest.raises(AuthenticationFailed):
        rosetta(emulator.url).fetch(ie.items[0], tmp_path)
    emulator.inject("DeliveryManagerServlet", Fault.http(403))
    with pytest.raises(PermissionDenied):
        rosetta(emulator.url).fetch(ie.items[0], tmp_path)
    assert len(emulator.requests("DeliveryManagerServlet")) == 2
    assert list(tmp_path.iterdir()) == []


def test_credentials_stay_out_of_debug_logs_during_a_faulty_harvest(emulator, tmp_path, caplog):
    emulator.inject(SOAP, Fault.http(503), times=3)
    emulator.inject("DeliveryManagerServlet", Fault.truncate(), times=2)
    with caplog.at_level(logging.DEBUG):
        source = sru(emulator.url)
        for obj in source.changes(None):
            source.fetch(obj.items[0], tmp_path)
        with pytest.raises(AuthenticationFailed) as raised:
            list(rosetta(emulator.url, password=OTHER_PASSWORD).get(["IE1001"]))
    assert caplog.text.count("retrying in") == 5  # the faults happened, so there was plenty to log
    basic = base64.b64encode(f"harvester-institutionCode-INS00:{PASSWORD}".encode()).decode()
    for text in (caplog.text, "".join(traceback.format_exception(raised.value))):
        assert PASSWORD not in text and basic not in text and OTHER_PASSWORD not in text


# --- settings ------------------------------------------------------------------------------------------------

def test_settings_are_validated_with_the_key_named():
    with pytest.raises(ConfigError, match=r"config.yaml: sources.main.discovery: oai needs oai.set"):
        open_source("rosetta", {"base_url": "http://x", "username": "u", "password": "p"}, "main",
                    prefix="sources.main")
    with pytest.raises(ConfigError, match=r"sources.main.sru.modified_index: Field required"):
        open_source("rosetta", {"base_url": "http://x", "username": "u", "password": "p", "discovery": "sru",
                                "sru": {}}, "main", prefix="sources.main")
    for blank in ("", "  "):  # SRU requires a query: a first run (no date clause) failed, so every run was a first
        with pytest.raises(ConfigError, match=r"sources.main.sru.query: SRU needs a CQL query selecting the IEs"):
            open_source("rosetta", {"base_url": "http://x", "username": "u", "password": "p", "discovery": "sru",
                                    "sru": {"modified_index": "IE.modified", "query": blank}}, "main",
                        prefix="sources.main")
    with pytest.raises(ConfigError, match=r"passwd: unknown key \(did you mean 'password'\?\)"):
        open_source("rosetta", {"base_url": "http://x", "username": "u", "password": "p", "passwd": "p",
                                "oai": {"set": "s"}}, "main")
    with pytest.raises(ConfigError, match="timezone: unknown time zone 'Mars/Olympus'"):
        open_source("rosetta", {"base_url": "http://x", "username": "u", "password": "p", "oai": {"set": "s"},
                                "timezone": "Mars/Olympus"}, "main")
    with pytest.raises(ConfigError, match=r"sources.main.fixity_preference: cannot check 'CRC32', "
                                          r"'sha-3': name digests among md5, sha1, sha224, sha256, sha384, sha512 "
                                          r"\(Rosetta's spelling, as MD5 or SHA-256, will do\)"):
        open_source("rosetta", {"base_url": "http://x", "username": "u", "password": "p", "oai": {"set": "s"},
                                "fixity_preference": ["CRC32", "MD5", "sha-3"]}, "main", prefix="sources.main")


@pytest.mark.parametrize("template, message", [
    ("{base_url}/delivery/DeliveryManagerServlet?dps_pid={id}",
     "unknown placeholder {base_url}; the template may use {id}, {delivery_base_url}"),  # OTMM's
    ("{delivery_base_url}/delivery/DeliveryManagerServlet?dps_pid={id",
     "'{id' is not a placeholder (expected '}' before end of string; a literal brace is written twice); the "
     "template may use {id}, {delivery_base_url}"),
], ids=["other-connectors", "unclosed"])
def test_a_source_url_template_that_cannot_be_filled_is_refused_when_the_settings_load(template, message):
    with pytest.raises(ConfigError) as raised:
        open_source("rosetta", {"base_url": "http://x", "username": "u", "password": "p", "oai": {"set": "s"},
                                "source_url_template": template}, "main", prefix="sources.main")
    assert str(raised.value) == (f"config.yaml: sources.main.source_url_template: {message} "
                                 f"(got {template!r})")


def test_modified_order_is_taken_only_with_sru_sorted_ascending_on_the_modified_index():
    base = {"base_url": "http://x", "username": "u", "password": "p", "discovery": "sru"}
    index = "IE.objectCharacteristics.modificationDate"
    for sort_by in (None, f"{index}/sort.descending", "IE.dc.title/sort.ascending"):
        with pytest.raises(ConfigError, match=rf"sources.main.sru.modified_order: true needs sort_by: "
                                              rf"<modified_index>/sort.ascending \({index}/sort.ascending\)"):
            open_source("rosetta", {**base, "sru": {"modified_index": index, "sort_by": sort_by,
                                                    "modified_order": True}}, "main", prefix="sources.main")
    for sort_by in (index, f"{index}/sort.ascending"):
        assert open_source("rosetta", {**base, "sru": {"modified_index": index, "sort_by": sort_by,
                                                       "modified_order": True}}, "main").lists_in_modified_order
    assert not open_source("rosetta", {**base, "sru": {"modified_index": index, "sort_by": index}},
                           "main").lists_in_modified_order
    assert not open_source("rosetta", {**base, "discovery": "oai", "oai": {"set": "s"}},
                           "main").lists_in_modified_order


def test_a_source_names_the_settings_that_sort_its_listing_where_there_are_any():
    """What a harvest cut short advises (harvesting.py): SRU sorts; an OAI set or a PID list cannot."""
    base = {"base_url": "http://x", "username": "u", "password": "p"}
    index = "IE.objectCharacteristics.modificationDate"
    assert open_source("rosetta", {**base, "discovery": "sru", "sru": {"modified_index": index}},
                       "main").modified_order_setting == f"sru.sort_by: {index}/sort.ascending and " \
                                                         "sru.modified_order: true"
    for unsortable in ({"oai": {"set": "s"}}, {"discovery": "pids", "pid_list": {"ids": ["IE1"]}}):
        assert open_source("rosetta", {**base, **unsortable}, "main").modified_order_setting is None


def test_the_password_is_never_shown_by_settings(monkeypatch):
    source = open_source("rosetta", {"base_url": "http://x", "username": "u", "password": 123456789,
                                     "oai": {"set": "s"}}, "main")
    assert source.settings.password.get_secret_value() == "123456789"
    assert "123456789" not in repr(source.settings) and "123456789" not in str(source.settings)
    monkeypatch.delenv("GCIS_TEST_UNSET_PASSWORD", raising=False)
    with pytest.raises(ConfigError, match=r"^config.yaml: sources.main.password: environment variable "
                                          r"GCIS_TEST_UNSET_PASSWORD is not set$"):
        open_source("rosetta", {"base_url": "http://x", "username": "u", "password": "${GCIS_TEST_UNSET_PASSWORD}",
                                "oai": {"set": "s"}}, "main", prefix="sources.main")
    with pytest.raises(ConfigError, match=r"password: still holds a \$\{VAR\} reference"):
        parse(RosettaSettings, {"base_url": "http://x", "username": "u", "password": "${ROSETTA_PASSWORD}",
                                "oai": {"set": "s"}}, "config.yaml")


# --- the emulator standalone ---------------------------------------------------------------------------------

def test_the_emulator_runs_standalone_with_a_fault_control_endpoint():
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "tests.emulators.rosetta", "--port", str(port)],
                               cwd=CORPUS.parents[1], stdout=subprocess.PIPE, text=True)
    try:
        wait_for_port(port, process)
        url = f"http://127.0.0.1:{port}"
        assert "Rosetta emulator on" in process.stdout.readline()
        assert [o.id for o in rosetta(url).changes(utc("2024-04-01 00:00:00"))] == ["IE1020", "IE1023"]
        control = requests.post(f"{url}/_emulator/faults", json={"pattern": "verb=Identify", "fault": "status",
                                                                 "status": 503, "times": 1}, timeout=5)
        assert control.status_code == 200
        assert requests.get(f"{url}/oaiprovider/request?verb=Identify", timeout=5).status_code == 503
        assert requests.get(f"{url}/oaiprovider/request?verb=Identify", timeout=5).status_code == 200
    finally:
        process.terminate()
        process.wait(10)
        process.stdout.close()
