"""One rule of what looks secret: the printed settings (gcis_etl.settings) and the connectors' messages and log
lines (connectors.redaction.scrub) mask the same query parameters, header keys and URL passwords."""
from __future__ import annotations

import pytest

from connectors.redaction import scrub
from gcis_etl.settings import masked, redacted

# What the two former copies masked between them, each spelt as a DAM, S3 or a gateway spells it.
SECRET_NAMES = ["pwd", "pass", "passwd", "password", "auth", "Authorization", "otmmauthtoken", "session_id",
                "sessionid", "token", "access_token", "X-Amz-Signature", "X-Amz-Credential", "X-Amz-Security-Token",
                "access_key", "AccessKeyId", "api_key", "apikey", "X-Api-Key", "secret", "client_secret",
                "credential", "signature", "pds_handle", "ticket", "digest", "Cookie"]
VALUE = "Value-77xq"


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_a_secret_named_query_parameter_is_masked_in_settings_and_in_messages(name):
    url = f"https://dam.example.org/api?page=2&{name}={VALUE}&format=json"
    assert redacted(url) == f"https://dam.example.org/api?page=2&{name}=***&format=json"
    assert masked({"base_url": url}) == {"base_url": f"https://dam.example.org/api?page=2&{name}=********&format=json"}
    assert scrub(f"GET {url} failed: 503") == f"GET {redacted(url)} failed: 503"
    # urllib3's request log line names the path only
    assert scrub(f'"GET /api?{name}={VALUE} HTTP/1.1" 200 12') == f'"GET /api?{name}=*** HTTP/1.1" 200 12'


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_a_secret_named_header_or_key_is_masked_in_printed_settings(name):
    assert masked({"extra_headers": {name: VALUE, "Accept-Language": "en"}}) == {
        "extra_headers": {name: "********", "Accept-Language": "en"}}


@pytest.mark.parametrize("name", ["page", "id", "format", "q", "version"])
def test_a_plain_parameter_is_shown(name):
    url = f"https://dam.example.org/api?{name}=42"
    assert redacted(url) == scrub(url) == url


@pytest.mark.parametrize("password", ["Pw-1", "p#w", "p?w", "p/w", "p;w"])
def test_a_url_password_is_masked_in_settings_and_in_messages_the_user_name_kept(password):
    url = f"https://etl:{password}@dam.example.org/api"
    assert redacted(url) == "https://etl:***@dam.example.org/api"
    assert scrub(f"cannot reach '{url}' (refused)") == "cannot reach 'https://etl:***@dam.example.org/api' (refused)"


def test_each_url_of_a_list_keeps_its_host_when_a_query_password_is_masked():
    urls = "sentinel://:pw1@h1:26379?password=pw2;sentinel://:pw3@h2:26379/0"
    assert redacted(urls) == scrub(urls) == "sentinel://:***@h1:26379?password=***;sentinel://:***@h2:26379/0"
