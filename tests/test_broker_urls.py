"""Broker and result backend URLs: what is accepted at load, and that no password of theirs, nor any secret
from the environment, is shown when the settings are printed or an error names them."""
from __future__ import annotations

from urllib.parse import quote

import pytest

from gcis_etl.distributed import CelerySettings
from gcis_etl.errors import ConfigError
from gcis_etl.settings import environment_values, interpolate_env, masked, parse, redacted


@pytest.mark.parametrize("password", ["Xy7#TopSecret", "Xy7?TopSecret", "Xy7/TopSecret", "12#34TopSecret"])
def test_a_password_with_unencoded_reserved_characters_is_refused_at_load_without_showing_it(password):
    for key, data in (("broker_url", {"broker_url": f"redis://:{password}@127.0.0.1:6379/0"}),
                      ("result_backend", {"broker_url": "amqp://rabbit//",
                                          "result_backend": f"redis://gcis:{password}@127.0.0.1:6379/1"})):
        with pytest.raises(ConfigError, match=rf"celery\.{key}: .*percent-encode the reserved characters") as error:
            parse(CelerySettings, data, "config.yaml", "celery")
        assert "TopSecret" not in str(error.value) and "***" in str(error.value)
    encoded = CelerySettings(broker_url=f"redis://:{quote(password, safe='')}@127.0.0.1:6379/0")
    assert "TopSecret" not in encoded.model_dump_json()


def test_every_password_of_a_url_list_is_masked():
    assert redacted("sentinel://:pw1@h1:26379;sentinel://:pw2@h2:26379;sentinel://u:pw3@h3:26379/0") == \
        "sentinel://:***@h1:26379;sentinel://:***@h2:26379;sentinel://u:***@h3:26379/0"
    assert redacted("amqp://gcis:pw1@rabbit1//;amqp://gcis:pw2@rabbit2//") == \
        "amqp://gcis:***@rabbit1//;amqp://gcis:***@rabbit2//"
    assert redacted("redis://default:pw1@h:6379/0?password=pw2&db=3") == "redis://default:***@h:6379/0?password=***&db=3"
    for unencoded in ("ab#cd", "ab?cd", "ab/cd", "ab@cd"):
        assert redacted(f"redis://:{unencoded}@h:6379/0") == "redis://:***@h:6379/0"
    assert redacted("amqp://guest@rabbit:5672//") == "amqp://guest@rabbit:5672//"  # no password: nothing to hide


def test_a_secret_from_the_environment_is_masked_inside_any_string_short_values_and_plain_variables_are_not(
        monkeypatch):
    monkeypatch.setenv("REDIS_PASSWORD", "TopSecret")
    monkeypatch.setenv("OTMM_PW", "hunter22")   # not secret by name, but put under a secret-named key
    monkeypatch.setenv("API_TOKEN", "1")        # too short to look for inside other strings
    monkeypatch.setenv("REDIS_HOST", "127.0.0.1")
    data = interpolate_env({"celery": {"broker_url": "redis://:${REDIS_PASSWORD}@${REDIS_HOST}:6379/0"},
                            "otmm": {"password": "${OTMM_PW}", "retries": "${API_TOKEN}"}})
    hidden = environment_values(data)
    printed = masked({"derived": "redis://:TopSecret@127.0.0.1:6379/0/", "note": "hunter22 in a sentence",
                      "endpoint_url": "http://127.0.0.1:9000", "replicas": "1",
                      "otmm": {"password": "hunter22"}, "whole": "redis://:TopSecret@127.0.0.1:6379/0"}, hidden)
    assert printed == {"derived": "redis://:********@127.0.0.1:6379/0/", "note": "******** in a sentence",
                       "endpoint_url": "http://127.0.0.1:9000", "replicas": "1",
                       "otmm": {"password": "********"}, "whole": "********"}
