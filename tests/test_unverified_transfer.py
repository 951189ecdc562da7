"""A source that gives no checksum (OTMM with `content_checksum: none`, its default) cannot tell a corrupted
download from a corrupt master: a master rejected from such a download is downloaded again, and two downloads that
differ fail the item (retried) instead of rejecting it until the master changes in the source. Over the OTMM
emulator's HTTP, with a real harvest into MinIO."""
from __future__ import annotations

from dataclasses import replace

from tests.emulators.catalogue import CorpusFile
from tests.emulators.faults import Fault
from tests.emulators.otmm import OtmmEmulator
from tests.harvests import otmm_source, serving
from tests.test_otmm_group_leave import catalogue

pytest_plugins = ("tests.harvests",)  # the `rig` fixture


def test_a_master_corrupted_in_transfer_is_failed_and_retried_not_rejected(rig):
    source = catalogue()
    png = source.by_name("2020_X_1_b.png").asset_id
    with serving(OtmmEmulator(source)) as emulator:
        rig.write(otmm_source(emulator.url, content_checksum="none"))
        emulator.inject(f"{png}/contents", Fault.corrupt(), times=1)
        first = rig.harvest()
        assert first.counts == {"deposited": 2, "skipped": 0, "rejected": 0, "failed": 1}
        reason = rig.peek(f"SELECT reason FROM items WHERE item_id='{png}'")[0][0]
        assert "two downloads of the master differ" in reason and "damaged transfer" in reason, reason

        again = rig.harvest()
        assert again.counts["deposited"] == 1 and again.counts["rejected"] == 0, again.counts
        assert rig.statuses()[("2020.X.1", png)] == "deposited"


def test_a_master_that_is_corrupt_in_the_source_is_still_rejected(rig):
    """Two downloads of a truly corrupt master agree: rejected, with the decoder's reason, as before."""
    source = catalogue()
    broken = replace(source.by_name("2020_X_2.tif"), name="2020_X_3.jpg", master=CorpusFile("truncated/truncated.jpg"),
                     fields={"GTRUST.FIELD.TITLE": "Broken", "GTRUST.FIELD.OBJECT NUMBER": "2020.X.3",
                             "GTRUST.FIELD.SEQUENCE": "1"})
    source.assets[broken.asset_id] = broken
    with serving(OtmmEmulator(source)) as emulator:
        rig.write(otmm_source(emulator.url, content_checksum="none"))
        run = rig.harvest()
    assert run.counts == {"deposited": 3, "skipped": 0, "rejected": 1, "failed": 0}
    reason = rig.peek("SELECT reason FROM items WHERE object_id='2020.X.3'")[0][0]
    assert "two downloads" not in reason and "Premature end" in reason, reason
