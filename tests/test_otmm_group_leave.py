"""An OTMM asset withdrawn from its group (expired, or flagged deleted, and still listed and readable) has left the
group: the group is described again without it and its manifests go out again, over the emulator's HTTP and a
real harvest into MinIO."""
from __future__ import annotations

import logging

import pytest
import requests

from connectors import open_source
from connectors.otmm import OtmmSource
from tests.emulators.catalogue import CorpusFile, utc
from tests.emulators.faults import Fault
from tests.emulators.otmm import ROOT, Asset, Folder, OtmmCatalogue, OtmmEmulator
from tests.harvests import OTMM_PASSWORD, otmm_source, serving

pytest_plugins = ("tests.harvests",)  # the `rig` fixture

GROUP, SINGLE = "2020.X.1", "2020.X.2"


def catalogue() -> OtmmCatalogue:
    """A two-asset group and a one-asset object."""
    def asset(name: str, corpus: str, number: str, sequence: str) -> Asset:
        return Asset(name, CorpusFile(corpus), ROOT, utc("2024-01-01 10:00:00"), utc("2024-01-02 10:00:00"),
                     {"GTRUST.FIELD.TITLE": "Album", "GTRUST.FIELD.OBJECT NUMBER": number,
                      "GTRUST.FIELD.SEQUENCE": sequence})

    return OtmmCatalogue([asset("2020_X_1_a.tif", "rgb8-tiff-uncompressed/hopper.tif", GROUP, "1"),
                          asset("2020_X_1_b.png", "png/png-rgb-64x56x8.png", GROUP, "2"),
                          asset("2020_X_2.tif", "gray8/gray.tif", SINGLE, "1")], [Folder(ROOT, "GCIS Masters", None)])


def otmm(url: str) -> OtmmSource:
    """The harvest's source settings, opened in this process."""
    options = {key: value for key, value in otmm_source(url).items() if key != "kind"}
    return open_source("otmm", {**options, "password": OTMM_PASSWORD}, name="otmm-test")


def withdraw(url: str, asset_id: str, flag: str) -> None:
    response = requests.post(f"{url}/_emulator/withdraw", params={"asset_id": asset_id, "flag": flag}, timeout=5)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("flag", ["expired", "deleted"])
def test_a_withdrawn_member_leaves_its_group_and_the_manifest_is_republished_without_it(rig, flag):
    source = catalogue()
    kept, left = (source.by_name(n).asset_id for n in ("2020_X_1_a.tif", "2020_X_1_b.png"))
    with serving(OtmmEmulator(source)) as emulator:
        rig.write(otmm_source(emulator.url))
        assert rig.harvest().counts == {"deposited": 3, "skipped": 0, "rejected": 0, "failed": 0}
        rig.check_manifests(GROUP, [kept, left])

        withdraw(emulator.url, left, flag)
        run = rig.harvest()
        assert run.counts == {"deposited": 0, "skipped": 1, "rejected": 0, "failed": 0}  # the group, the kept alone
        rig.check_manifests(GROUP, [kept])  # one canvas
        assert len(rig.document(f"{rig.pipeline}/{GROUP}/manifest-v2.json")["sequences"][0]["canvases"]) == 1


def test_a_group_whose_last_member_is_withdrawn_is_not_described_with_it(caplog):
    """Nothing of the group is left to harvest: a note, as for a withdrawn asset on its own (withdrawals never
    reach the store)."""
    with serving(OtmmEmulator(catalogue())) as emulator:
        only = emulator.app.catalogue.by_name("2020_X_2.tif").asset_id
        withdraw(emulator.url, only, "expired")
        with caplog.at_level(logging.INFO, logger="connectors.otmm"):
            listed = list(otmm(emulator.url).changes(utc("2024-06-01 00:00:00")))
    assert listed == []
    assert [r.getMessage() for r in caplog.records if only in r.getMessage()] == [
        f"otmm-test: asset {only} is expired (expired: skip); it has left group {SINGLE}, which has no other "
        "member: nothing to harvest"]


def test_an_asset_listed_withdrawn_and_gone_when_read_is_left_out_not_failed(caplog):
    """Gone, it cannot tell its group (that is only in its own fields): left out as listed, as before."""
    with serving(OtmmEmulator(catalogue())) as emulator:
        left = emulator.app.catalogue.by_name("2020_X_1_b.png").asset_id
        withdraw(emulator.url, left, "deleted")
        emulator.inject(rf"GET /otmmapi/v6/assets/{left}\?", Fault.http(404), times=None)
        with caplog.at_level(logging.INFO, logger="connectors.otmm"):
            listed = list(otmm(emulator.url).changes(utc("2024-06-01 00:00:00")))
    assert listed == []  # not an UnreadableObject: no failure
    assert f"otmm-test: asset {left} is deleted; nothing to harvest" in [r.getMessage() for r in caplog.records]
