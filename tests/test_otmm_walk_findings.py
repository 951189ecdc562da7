"""The OTMM walk's findings, over real HTTP against the OTMM emulator: paging that loses an asset with no count
changing, verify_tls overridden by the environment, asset versions, assets without master content, presigned and
absolute content URLs, and a search refused for its settings."""
from __future__ import annotations

import subprocess
import ssl
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from connectors.base import ListingMoved, UnreadableObject
from connectors.errors import SourceRequestFailed
from gcis_etl.errors import ConfigError
from tests.emulators.catalogue import CorpusFile
from tests.emulators.otmm import API, MODIFIED_FIELD, ROOT, Asset, OtmmEmulator
from tests.emulators.server import EmulatorServer, Request, Response

from tests.test_connector_otmm import otmm


@pytest.fixture
def emulator():
    with EmulatorServer(OtmmEmulator()) as server:
        yield server


def names(server: EmulatorServer, objects) -> list[str]:
    by_id = {a.asset_id: a.name for a in server.app.catalogue.assets.values()}
    return sorted(by_id.get(o.id, o.id) for o in objects if not isinstance(o, ListingMoved))


# --- 1. an asset moving back onto a page already read, the count unchanged ------------------------------------

def test_an_asset_moved_back_onto_a_page_read_with_the_count_unchanged_is_served_and_the_move_said(emulator):
    """Before the second page, one asset of the first is deleted and one imported (sorting last): the total stays
    4, and 2019_M_10 moves back onto the first page. Only the overlapping page tells."""
    catalogue = emulator.app.catalogue

    def delete_one_import_one() -> None:
        recto = catalogue.by_name("2019_M_1_recto.tif")
        del catalogue.assets[recto.asset_id]
        now = datetime.now(timezone.utc).replace(microsecond=0)
        new = Asset("2019_new_4.png", CorpusFile("png/png-rgb-64x56x8.png"), ROOT, now, now, dict(recto.fields))
        catalogue.assets[new.asset_id] = new

    emulator.before(r"search/text\?.*after=[12](&|$)", delete_one_import_one)
    listed = list(otmm(emulator.url, search={"method": "GET", "page_size": 2, "keyword_query": "2019"}).changes())
    assert "2019_M_10.tif" in names(emulator, listed)
    (moved,) = [o for o in listed if isinstance(o, ListingMoved)]
    assert moved.reason.startswith("the search changed while it was paged (asset ")


def test_an_empty_page_after_a_full_one_that_reached_the_total_is_no_deep_paging_cap(emulator):
    """Pages of 2 (then 3, overlapping) reach all 6 assets before offset 4, past which the server serves none: the
    empty page ending the listing says nothing was left unserved."""
    emulator.app.deepest = 4
    listed = list(otmm(emulator.url).changes())
    assert len(listed) == 6 and not any(isinstance(o, ListingMoved) for o in listed)


# --- 2. verify_tls over the environment; a CA bundle that is not there -----------------------------------------

@pytest.fixture
def tls_emulator(tmp_path):
    """The emulator over TLS, its certificate signed by a CA made here; another CA's bundle beside it."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp_path)

    for ca in ("ca", "other"):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.pem",
                "-days", "1", "-subj", f"/CN=test {ca}")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=127.0.0.1")
    (tmp_path / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.pem", "-days", "1", "-extfile", "san.ext")
    server = EmulatorServer(OtmmEmulator())
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "server.pem", tmp_path / "server.key")
    server._httpd.socket = context.wrap_socket(server._httpd.socket, server_side=True)
    with server:
        yield f"https://127.0.0.1:{server._httpd.server_address[1]}", tmp_path


@pytest.mark.parametrize("variable", ["REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"])
@pytest.mark.parametrize("verify", ["ca.pem", False])
def test_verify_tls_wins_over_a_ca_bundle_in_the_environment(tls_emulator, monkeypatch, variable, verify):
    url, certs = tls_emulator
    monkeypatch.setenv(variable, str(certs / "other.pem"))  # a bundle that does not sign the emulator's certificate
    source = otmm(url, verify_tls=str(certs / verify) if verify else False)
    assert len([o for o in source.changes() if not isinstance(o, ListingMoved)]) == 6


def test_a_ca_bundle_that_is_not_there_is_refused_with_the_settings_and_gone_since_is_a_source_error(tmp_path):
    with pytest.raises(ConfigError, match=r"verify_tls.*no CA bundle at /nonexistent/ca\.pem: expected true, "
                                          r"false, or the path of a CA bundle file"):
        otmm("https://127.0.0.1:9", verify_tls="/nonexistent/ca.pem")
    bundle = tmp_path / "ca.pem"
    bundle.write_text("")
    source = otmm("https://127.0.0.1:9", verify_tls=str(bundle))
    bundle.unlink()
    with pytest.raises(SourceRequestFailed, match=rf"cannot set up TLS with verify_tls '{bundle}'"):
        list(source.changes())


# --- 3. versions ------------------------------------------------------------------------------------------------

def check_in(server: EmulatorServer, name: str) -> Asset:
    """A new version of `name`'s master, checked in: a new asset, the old one no longer the latest."""
    catalogue = server.app.catalogue
    old = catalogue.by_name(name)
    now = datetime.now(timezone.utc).replace(microsecond=0)
    new = Asset(f"{name};v2", CorpusFile("rgb8-tiff-lzw/hopper_lzw.tif"), old.folder, old.imported, now,
                dict(old.fields), original_asset_id=old.asset_id, version=2)
    old.latest_version = False
    catalogue.assets[new.asset_id] = new
    return new


def test_an_old_version_is_passed_over_as_a_deleted_asset_is_unless_every_version_is_asked_for(emulator):
    check_in(emulator, "84_PA_1.png")
    latest = names(emulator, otmm(emulator.url).changes())
    assert "84_PA_1.png" not in latest and "84_PA_1.png;v2" in latest
    assert {"84_PA_1.png", "84_PA_1.png;v2"} <= set(names(emulator, otmm(emulator.url, versions="all").changes()))


def test_a_group_shows_the_latest_version_of_its_member_only(emulator):
    new = check_in(emulator, "2019_M_1_verso.tif")
    group = {"field_id": "GTRUST.FIELD.OBJECT NUMBER", "sequence_field_id": "GTRUST.FIELD.SEQUENCE"}
    (obj,) = otmm(emulator.url, group=group).get(["2019.M.1"])
    assert sorted(i.original_name for i in obj.items) == sorted(
        ["kodim02-lzw.tif", "hopper_lzw.tif", "bentheim_pulver_turm.jpg"])
    assert new.asset_id in [i.id for i in obj.items]


# --- 5. no master content ---------------------------------------------------------------------------------------

def test_an_asset_without_master_content_is_read_under_contents_and_said_so_under_master(emulator, tmp_path):
    asset = emulator.app.catalogue.by_name("84_PA_1.png")
    asset.has_master = False
    (obj,) = otmm(emulator.url).get([asset.asset_id])
    assert obj.items[0].size is None and obj.items[0].original_name == "84_PA_1.png"
    (unreadable,) = [o for o in otmm(emulator.url, content="master").changes()
                     if isinstance(o, UnreadableObject)]
    assert unreadable.reason.endswith(f"otmm-test: asset {asset.asset_id} has no master content")


# --- 6, 7. presigned and absolute content URLs -----------------------------------------------------------------

class Bucket:
    """A storage host serving one file at any path: a URL whose `expires` is past answers 403, as S3 does."""

    def __init__(self, file: CorpusFile):
        self.file = file
        self.refusing: int | None = None  # a status every request gets

    def handle(self, request: Request) -> Response:
        if self.refusing:
            return Response.text("no", self.refusing)
        if float(request.arg("expires", "inf")) < time.time():
            return Response(403, b"<Error><Code>AccessDenied</Code><Message>Request has expired</Message></Error>",
                            "application/xml")
        return Response(200, self.file.path, self.file.mime)

    def control(self, name: str, request: Request) -> Response:
        return Response.text("?", 404)


@pytest.fixture
def bucket(emulator):
    with EmulatorServer(Bucket(emulator.app.catalogue.by_name("2019_M_10.tif").master)) as server:
        yield server


def test_an_expired_presigned_url_is_asked_for_again_once_and_then_blamed_on_its_host(emulator, bucket, tmp_path):
    asset = emulator.app.catalogue.by_name("2019_M_10.tif")
    issued = []

    def presign(_asset: Asset) -> str:
        issued.append(time.time() - 3600 if not issued else time.time() + 60)  # the first one stale
        return f"{bucket.url}/bucket/{_asset.asset_id}?expires={issued[-1]:.0f}"

    emulator.app.contents_redirect = presign
    source = otmm(emulator.url, relogin_statuses=[401, 403])
    (obj,) = source.get([asset.asset_id])
    assert source.fetch(obj.items[0], tmp_path).path.read_bytes() == Path(asset.master.path).read_bytes()
    assert len(emulator.requests(f"{asset.asset_id}/contents")) == 2 and len(bucket.requests("/bucket/")) == 2
    assert len(emulator.requests(f"POST {API}/sessions")) == 1  # a 403 from the bucket is no reason to log in

    emulator.app.contents_redirect = lambda a: f"{bucket.url}/bucket/{a.asset_id}?expires=1"  # stale every time
    host = bucket.url.removeprefix("http://")
    with pytest.raises(SourceRequestFailed, match=rf"HTTP 403 Forbidden from {host}, where the source redirected "
                                                  rf"it .*{host} refused it, not the source"):
        source.fetch(obj.items[0], tmp_path)
    assert len(emulator.requests(f"POST {API}/sessions")) == 1


@pytest.mark.parametrize("elsewhere", [False, True], ids=["on-the-api-host", "on-another-host"])
def test_an_absolute_content_url_is_used_as_it_is_with_credentials_on_the_api_host_only(emulator, bucket, tmp_path,
                                                                                       elsewhere):
    asset = emulator.app.catalogue.by_name("2019_M_10.tif")
    emulator.app.content_url_base = bucket.url if elsewhere else emulator.url
    source = otmm(emulator.url, content="master")
    (obj,) = source.get([asset.asset_id])
    assert obj.items[0].locator == f"{(bucket if elsewhere else emulator).url}{API}/renditions/" \
                                   f"{asset.content_id('master')}"
    assert source.fetch(obj.items[0], tmp_path).path.read_bytes() == Path(asset.master.path).read_bytes()
    if elsewhere:
        (fetch,) = bucket.requests("/renditions/")
        assert not {"otmmauthtoken", "X-Requested-By", "Cookie"} & set(fetch.headers.keys())
    else:
        (fetch,) = emulator.requests("/renditions/")
        assert fetch.headers["otmmauthtoken"]


@pytest.mark.parametrize("status", [401, 403])
def test_a_refusal_from_another_hosts_content_url_is_no_verdict_on_the_configured_user(emulator, bucket, tmp_path,
                                                                                      status):
    asset = emulator.app.catalogue.by_name("2019_M_10.tif")
    emulator.app.content_url_base, bucket.app.refusing = bucket.url, status
    source = otmm(emulator.url, content="master", relogin_statuses=[401, 403])
    (obj,) = source.get([asset.asset_id])
    host = bucket.url.removeprefix("http://")
    with pytest.raises(SourceRequestFailed, match=rf"HTTP {status} .* from {host}, asked without the source's "
                                                  rf"credentials .*{host} refused it, not the source"):
        source.fetch(obj.items[0], tmp_path)
    assert len(bucket.requests("/renditions/")) == 1 and len(emulator.requests(f"POST {API}/sessions")) == 1


# --- 8. a search refused for its settings ---------------------------------------------------------------------

def test_a_search_refused_as_a_bad_request_names_the_search_settings(emulator):
    source = otmm(emulator.url, search={"modified_field_id": MODIFIED_FIELD, "modified_value_format": "%d/%m/%Y",
                                        "modified_operator_id": "ARTESIA.OPERATOR.DATE.IS ON OR AFTER"})
    with pytest.raises(SourceRequestFailed, match=r"HTTP 400 .*check the search settings under source\.search "
                                                  r"\(modified_field_id, modified_operator_id, modified_value_format"):
        list(source.changes(datetime(2024, 2, 1, tzinfo=timezone.utc)))
