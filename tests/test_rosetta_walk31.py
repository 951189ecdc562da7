"""Four slips a newcomer configuring Rosetta against the emulator met: a misspelt struct_map_type that silently
put every IE's files in fileSec order, a wrong sru.modified_index that only the second run found, a base_url
refused with a regular expression, and `auth_scheme: basic` refused while `Basic` was taken."""
from __future__ import annotations

import logging
from datetime import datetime, timezone

import pytest
import yaml

from connectors import open_source
from connectors.errors import SourceRequestFailed
from gcis_etl.config import load_config
from gcis_etl.errors import ConfigError
from gcis_etl.harvesting import HarvestOptions, harvest
from tests.emulators import FAST_RETRY
from tests.emulators.rosetta import SRU_DATE_INDEX, RosettaEmulator, seed
from tests.emulators.server import EmulatorServer

PASSWORD = "harvest-Secret-1"
SOAP = "POST /dpsws/repository/IEWebServices"
LIVE_IN_SET = ["IE1001", "IE1011", "IE1016", "IE1020", "IE1023"]
FILESEC_ORDER = ["FL1006", "FL1007", "FL1008"]  # IE1001's modified master; its PHYSICAL structMap: FL1008, 1006, 1007


@pytest.fixture
def emulator():
    with EmulatorServer(RosettaEmulator()) as server:
        yield server


def options(url: str, **overrides) -> dict:
    return {"kind": "rosetta", "base_url": url, "username": "harvester", "institution_code": "INS00",
            "password": PASSWORD, "oai": {"set": "gcis"}, "retry": FAST_RETRY, **overrides}


def rosetta(url: str, **overrides):
    settings = options(url, **overrides)
    del settings["kind"]
    return open_source("rosetta", settings, name="rosetta-test")


def config(tmp_path, source: dict):
    """config.yaml with one pipeline `p` reading `source`, loaded as the CLI loads it."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "pipelines": {"p": {
        "source": source, "store": {"kind": "local", "root": str(tmp_path / "store")}}}}))
    return load_config(path)


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


# --- struct_map_type ---------------------------------------------------------------------------------------------

def test_a_struct_map_type_no_ie_has_is_named_for_each_ie_and_said_to_be_likely_misspelt(emulator, caplog):
    """`struct_map_type: PHYSICL` took every IE's files in fileSec order without a word. An IE of one file has no
    order to lose: it is not named (every run named every one), but counts among those without the structMap."""
    with caplog.at_level(logging.WARNING, logger="connectors"):
        listed = list(rosetta(emulator.url, struct_map_type="PHYSICL").changes(None))
    assert [o.id for o in listed] == LIVE_IN_SET
    assert [i.id for i in listed[0].items] == FILESEC_ORDER
    several = [o.id for o in listed if len(o.items) > 1]
    assert several == ["IE1001", "IE1016"]
    assert warnings(caplog) == [
        f"rosetta-test: {pid} has no structMap of TYPE 'PHYSICL' (struct_map_type; its TYPEs: PHYSICAL, LOGICAL): "
        "its files were taken in fileSec order, which may not be their page order" for pid in several] + [
        "rosetta-test: not one of the 5 IEs described has a structMap of TYPE 'PHYSICL' (they have PHYSICAL, "
        "LOGICAL): is struct_map_type misspelt? Their files were taken in fileSec order, which may not be their "
        "page order"]

    caplog.clear()  # asked for by id (--object, retry, revisits), the same
    with caplog.at_level(logging.WARNING, logger="connectors"):
        (ie,) = rosetta(emulator.url, struct_map_type="PHYSICL").get(["IE1001"])
    assert [i.id for i in ie.items] == FILESEC_ORDER
    assert len(warnings(caplog)) == 2 and "not one of the 1 IEs described" in warnings(caplog)[1]

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="connectors"):
        (ie,) = rosetta(emulator.url, struct_map_type="PHYSICL").get(["IE1011"])
    assert len(ie.items) == 1
    assert len(warnings(caplog)) == 1 and "not one of the 1 IEs described" in warnings(caplog)[0]


def test_an_ie_without_the_struct_map_among_ies_with_it_is_named_alone(caplog):
    catalogue = seed()
    catalogue.entities["IE1001"].struct_maps = ("LOGICAL",)
    with EmulatorServer(RosettaEmulator(catalogue)) as server, caplog.at_level(logging.WARNING, logger="connectors"):
        listed = list(rosetta(server.url).changes(None))
    assert [i.id for i in listed[0].items] == FILESEC_ORDER
    assert [i.id for i in listed[2].items] == ["FL1018", "FL1019"]
    assert warnings(caplog) == [
        "rosetta-test: IE1001 has no structMap of TYPE 'PHYSICAL' (struct_map_type; its TYPEs: LOGICAL): its files "
        "were taken in fileSec order, which may not be their page order"]


def test_the_struct_map_type_is_matched_in_any_case_and_says_nothing_when_found(emulator, caplog):
    with caplog.at_level(logging.WARNING, logger="connectors"):
        (ie,) = rosetta(emulator.url, struct_map_type="physical").get(["IE1001"])
    assert [i.id for i in ie.items] == ["FL1008", "FL1006", "FL1007"]
    assert warnings(caplog) == []


# --- the SRU date clause on a first run -------------------------------------------------------------------------

def sru(**sru_overrides) -> dict:
    return {"discovery": "sru", "sru": {"modified_index": SRU_DATE_INDEX, "page_size": 2,
                                        "query": "IE.generalIECharacteristics.UserDefinedA=GCIS", **sru_overrides}}


def test_a_wrong_sru_modified_index_fails_the_first_run_before_any_ie_is_described(emulator, tmp_path):
    """A first run's query has no date clause: a wrong index passed the dry run and the first run, and failed the
    second. The clause is now tried once, since the epoch, as the listing starts."""
    wrong = "IE.objectCharacteristics.modifiedDate"
    message = (rf"^SRU query '\(IE.generalIECharacteristics.UserDefinedA=GCIS\) and {wrong}>=\"1970-01-01 00:00:00\"'"
               rf": Unsupported index \(info:srw/diagnostic/1/16\) {wrong} \(the date clause every later run adds, "
               r"tried once on this first run: check sru.modified_index and sru.modified_format against the "
               r"server's \?operation=explain\)$")
    with pytest.raises(SourceRequestFailed, match=message):
        next(rosetta(emulator.url, **sru(modified_index=wrong)).changes(None))
    assert len(emulator.requests("operation=searchRetrieve")) == 2 and emulator.requests(SOAP) == []

    cfg = config(tmp_path, options(emulator.url, **sru(modified_index=wrong)))
    with pytest.raises(SourceRequestFailed, match=message):
        harvest(cfg, "p", HarvestOptions(dry_run=True))
    assert emulator.requests(SOAP) == []


def test_the_probe_asks_for_one_record_and_takes_an_empty_result(emulator):
    emulator.app.sru_out_of_range_diagnostic = True  # an empty result answered with diagnostic 61
    assert list(rosetta(emulator.url, **sru(query='IE.dc.title="no such title"')).changes(None)) == []
    page, probe = emulator.requests("operation=searchRetrieve")
    assert probe.arg("maximumRecords") == "1" and probe.arg("startRecord") == "1" and probe.arg("auth") == "local"
    assert probe.arg("query") == f'(IE.dc.title="no such title") and {SRU_DATE_INDEX}>="1970-01-01 00:00:00"'
    assert page.arg("query") == '(IE.dc.title="no such title")'


def test_a_query_the_server_refuses_is_named_as_the_query_not_as_the_date_clause(emulator):
    """The first page goes first: a diagnostic on the probe is then the date clause's alone."""
    with pytest.raises(SourceRequestFailed, match=r"^SRU query '\(IE.dc.title=no such title\)': Query syntax error "
                                                  r"\(info:srw/diagnostic/1/10\) IE.dc.title=no such title$"):
        next(rosetta(emulator.url, **sru(query="IE.dc.title=no such title")).changes(None))
    assert len(emulator.requests("operation=searchRetrieve")) == 1


def test_a_run_with_a_date_clause_sends_no_probe(emulator):
    source = rosetta(emulator.url, **sru())
    assert [o.id for o in source.changes(datetime(2024, 4, 1, tzinfo=timezone.utc))] == ["IE1020", "IE1023"]
    (page,) = emulator.requests("operation=searchRetrieve")
    assert page.arg("maximumRecords") == "2" and f'{SRU_DATE_INDEX}>="2024-04-01 00:00:00"' in page.arg("query")


# --- base_url and auth_scheme -----------------------------------------------------------------------------------

@pytest.mark.parametrize("url, why", [
    ("127.0.0.1:18801", "the scheme is missing (http:// or https:// before the host)"),
    ("htp://127.0.0.1:18801", "the scheme is neither http:// nor https://"),
    ("http:///rosetta", "no host after the scheme"),
], ids=["no-scheme", "misspelt-scheme", "no-host"])
@pytest.mark.parametrize("key", ["base_url", "delivery_base_url"])
def test_a_url_that_is_not_one_says_what_is_expected(tmp_path, url, why, key):
    """It said "String should match pattern '^https?://[^/?#]+'"."""
    source = options("https://rosetta.example.org", **{key: url})
    with pytest.raises(ConfigError) as raised:
        config(tmp_path, source).pipeline("p").source
    assert str(raised.value) == (f"{tmp_path / 'config.yaml'}: pipelines.p.source.{key}: expected an http(s) URL "
                                 f"such as https://host[:port][/prefix]: {why} (got {url!r})")


def test_a_url_with_an_upper_case_scheme_or_a_prefix_is_taken(tmp_path):
    for url in ("HTTPS://rosetta.example.org", "https://rosetta.example.org:8443/prefix"):
        assert config(tmp_path, options(url)).pipeline("p").source.settings.base_url == url


@pytest.mark.parametrize("written, sent", [("basic", "Basic"), ("BASIC", "Basic"), ("Local", "local")])
def test_the_auth_scheme_word_is_taken_in_any_case_and_sent_as_spelt_canonically(emulator, tmp_path, written, sent):
    source = config(tmp_path, options(emulator.url, auth_scheme=written)).pipeline("p").source
    assert source.settings.auth_scheme == sent
    list(source.get(["IE1011"]))
    assert emulator.requests(SOAP)[0].headers["Authorization"].startswith(f"{sent} ")


def test_an_unknown_auth_scheme_word_is_still_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"pipelines.p.source.auth_scheme: Input should be 'Basic' or 'local'"):
        config(tmp_path, options("https://rosetta.example.org", auth_scheme="Bearer")).pipeline("p").source
