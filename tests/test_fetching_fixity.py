"""Digest names as sources and settings spell them, and a source fixity the fetch cannot check."""
from __future__ import annotations

import hashlib
import os
from contextlib import contextmanager

import pytest

from connectors.base import Fixity, SourceItem
from connectors.errors import FetchIntegrityError
from connectors.fetching import Body, fetch_verified, fetch_warnings, fixity, hashlib_name
from connectors.retry import RetryPolicy
from tests.emulators import FAST_RETRY

DATA = os.urandom(1 << 16)


@pytest.mark.parametrize("spelling, name", [
    ("MD5", "md5"), ("md5", "md5"), ("SHA1", "sha1"), ("SHA-1", "sha1"), ("SHA-256", "sha256"),
    ("sha256", "sha256"), ("SHA 512", "sha512"), ("CRC32", None), ("Adler-32", None), ("", None)])
def test_digest_names_are_read_as_rosetta_and_settings_spell_them(spelling, name):
    assert hashlib_name(spelling) == name


def fetch(tmp_path, given: Fixity | None, data: bytes = DATA):
    """`data` streamed as the bytes of an item of DATA's size whose source gave `given`."""
    @contextmanager
    def open_body(budget):
        yield Body(iter([data[:1000], data[1000:]]), len(data))
    item = SourceItem(id="FL1", sequence=1, original_name="m.tif", size=len(DATA), modified=None, fixity=given)
    return fetch_verified(item, tmp_path, open_body, RetryPolicy(**FAST_RETRY))


def test_a_fixity_in_a_source_spelling_is_verified_and_says_nothing(tmp_path):
    fetched = fetch(tmp_path, fixity("SHA-256", hashlib.sha256(DATA).hexdigest().upper()))
    assert fetched.fixity_verified and fetch_warnings(fetched) == ()
    with pytest.raises(FetchIntegrityError, match="sha256 .* does not match the source's fixity"):
        fetch(tmp_path / "again", fixity("SHA-256", hashlib.sha256(DATA).hexdigest()),
              DATA[:-1] + bytes([DATA[-1] ^ 0xFF]))


def test_a_fixity_that_cannot_be_checked_is_reported_not_passed_as_verified(tmp_path):
    altered = DATA[:-1] + bytes([DATA[-1] ^ 0xFF])
    fetched = fetch(tmp_path, fixity("CRC32", "1A2B3C4D"), altered)
    assert fetched.path.read_bytes() == altered and not fetched.fixity_verified
    [warning] = fetch_warnings(fetched)
    assert warning.startswith("the source's crc32 fixity cannot be checked (only md5, sha1, sha224, sha256, ")
    assert "the master was not verified against it" in warning


def test_a_master_without_fixity_has_nothing_to_report(tmp_path):
    fetched = fetch(tmp_path, None)
    assert not fetched.fixity_verified and fetch_warnings(fetched) == ()
