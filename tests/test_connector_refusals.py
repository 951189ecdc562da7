"""What a refused request says: the server's words as its own connector reads them (OTMM's exception_body is OTMM's
alone: another server's JSON with that key is quoted as it is), and, for a 401, the settings the configured auth
authenticates with, never one it does not use. Over real HTTP against the emulators."""
from __future__ import annotations

import json
import re

import pytest

from connectors import open_source
from connectors.errors import AuthenticationFailed, SourceRequestFailed
from connectors.http import HttpSession, HttpSourceSettings
from connectors.redaction import Secret
from gcis_etl.settings import interpolate_env, parse
from tests.emulators import FAST_RETRY
from tests.emulators.otmm import OtmmEmulator
from tests.emulators.rosetta import RosettaEmulator
from tests.emulators.server import EmulatorServer, Request, Response

OTMM_SHAPED = {"exception_body": {"message": "Quota exceeded", "error_code": "QUOTA"}}
TOKEN = "gateway-Token-31"


class Gateway:
    """A server that is neither DAM: /otmm-shaped refuses in JSON that happens to use OTMM's key, /own in a shape of
    its own, /page with an HTML page; every other path answers 401."""

    def handle(self, request: Request) -> Response:
        if request.path == "/otmm-shaped":
            return Response.json(OTMM_SHAPED, 400)
        if request.path == "/own":
            return Response.json({"fault": {"reason": "No such collection"}}, 400)
        if request.path == "/page":
            return Response(400, b"<html><head><title>Bad gateway request</title></head></html>", "text/html")
        return Response.text("no", 401)

    def control(self, name: str, request: Request) -> Response:
        return Response.text("no controls", 404)


@pytest.fixture
def gateway():
    with EmulatorServer(Gateway()) as running:
        yield running


def refusal(http: HttpSession, url: str) -> str:
    with pytest.raises(SourceRequestFailed) as refused:
        http.request("GET", url)
    return str(refused.value)


def faults(body: str) -> str | None:
    """The gateway's own error shape, as a connector for it would read it."""
    try:
        return json.loads(body)["fault"]["reason"]
    except (ValueError, KeyError, TypeError):
        return None


# --- the server's words ------------------------------------------------------------------------------------

def test_a_json_body_in_otmms_shape_from_another_server_is_quoted_as_it_is(gateway):
    """Was "HTTP 400 Bad Request: Quota exceeded (QUOTA)": every HTTP source's errors were read as OTMM's."""
    http = HttpSession(HttpSourceSettings(base_url=gateway.url))
    said = refusal(http, f"{gateway.url}/otmm-shaped")
    assert said == f"GET {gateway.url}/otmm-shaped: HTTP 400 Bad Request: {json.dumps(OTMM_SHAPED)}"


def test_a_connectors_own_reading_of_its_servers_error_body_is_the_one_used(gateway):
    http = HttpSession(HttpSourceSettings(base_url=gateway.url), faults)
    assert refusal(http, f"{gateway.url}/own") == f"GET {gateway.url}/own: HTTP 400 Bad Request: No such collection"
    # a body its reading does not know is read as any web server's
    assert refusal(http, f"{gateway.url}/otmm-shaped").endswith(f": {json.dumps(OTMM_SHAPED)}")
    assert refusal(http, f"{gateway.url}/page").endswith(": HTTP 400 Bad Request: Bad gateway request")


# --- the settings a 401 names ------------------------------------------------------------------------------

def named(refused: pytest.ExceptionInfo) -> list[str]:
    """The settings a 401 says to fix."""
    return re.search(r"the source refused the configured credentials \(([^)]*)\)", str(refused.value))[1].split(", ")


@pytest.mark.parametrize("options, keys", [
    ({}, ["username", "password"]),
    # a client_secret left set is sent nowhere by a session's login
    ({"client_secret": "client-Secret-5", "bearer_otmm_token": True}, ["username", "password"]),
    ({"auth": "oauth", "client_id": "gcis-etl", "client_secret": "client-Secret-5"},
     ["username", "password", "client_id", "client_secret"]),
], ids=["session", "session-with-a-stray-client-secret", "oauth"])
def test_otmms_refusal_names_the_settings_its_auth_mode_logs_in_with(options, keys):
    with EmulatorServer(OtmmEmulator()) as emulator:
        source = open_source("otmm", {"base_url": emulator.url, "username": "tsuper", "password": "not-the-Secret",
                                      "retry": FAST_RETRY, **options}, name="otmm-test")
        with pytest.raises(AuthenticationFailed) as refused:
            list(source.changes(None))
    assert named(refused) == [f"source.{key}" for key in keys]
    assert str(refused.value).endswith(": Invalid username or password (AUTHENTICATION_FAILED)")  # OTMM's words


@pytest.mark.parametrize("options, keys", [
    ({"username": "harvester", "institution_code": "INS00"}, ["username", "institution_code", "password"]),
    # the login written whole in the username, sent under Rosetta's own scheme word
    ({"username": "harvester-institutionCode-INS00", "auth_scheme": "local"}, ["username", "password"]),
], ids=["institution-code", "login-in-username"])
def test_rosettas_refusal_names_the_settings_its_login_is_made_of(options, keys):
    with EmulatorServer(RosettaEmulator()) as emulator:
        source = open_source("rosetta", {"base_url": emulator.url, "password": "other-Secret-9",
                                         "oai": {"set": "gcis"}, "retry": FAST_RETRY, **options}, name="rosetta-test")
        with pytest.raises(AuthenticationFailed) as refused:
            list(source.get(["IE1001"]))
    assert named(refused) == [f"source.{key}" for key in keys]


class BearerSettings(HttpSourceSettings):
    """A connector of one's own that authenticates by token alone: its username only says whose token it is."""

    username: str
    token: Secret


def test_a_refused_token_is_named_without_a_username_the_auth_does_not_send(gateway, monkeypatch):
    """Was "(source.username, source.token from the environment)": every model's username was taken for a
    credential."""
    monkeypatch.setenv("GATEWAY_TOKEN", TOKEN)
    settings = parse(BearerSettings, interpolate_env({"base_url": gateway.url, "username": "harvester",
                                                      "token": "${GATEWAY_TOKEN}"}), "config.yaml")
    http = HttpSession(settings)
    http.headers["Authorization"] = f"Bearer {settings.token.get_secret_value()}"
    with pytest.raises(AuthenticationFailed) as refused:
        http.request("GET", f"{gateway.url}/api")
    assert named(refused) == ["source.token from the environment"]
    assert gateway.requests("/api")[0].headers["Authorization"] == f"Bearer {TOKEN}"
