"""The local executor fetches and deposits items beside those converting (transfer_slots), while no more than
`concurrency` conversion processes run: a slow download from the DAM holds no conversion process up."""
from __future__ import annotations

import os
import threading
import time

import psutil
import pytest
import yaml

from gcis_etl.config import load_config
from gcis_etl.errors import ConfigError
from tests.emulators.rosetta import RosettaCatalogue, RosettaEmulator
from tests.harvests import PATIENT_RETRY, ie, rosetta_source, serving

pytest_plugins = ("tests.harvests",)  # the `rig` fixture

MASTERS = ("rgb8-tiff-uncompressed/hopper.tif", "gray8/gray.tif", "rgb8-tiff-lzw/hopper_lzw.tif")
ITEMS = ("FL4102", "FL4103", "FL4104")  # ie() numbers the files of IE4100 from 4102
HOLD_SECONDS = 60  # far more than a small master's conversion and deposit on a loaded machine


def one_object() -> RosettaCatalogue:
    return RosettaCatalogue([ie(4100, "2024-01-01 10:00:00", *MASTERS)])


def conversion_children() -> set[int]:
    """The conversion processes (isolation.py's children) this process runs now: its own children only, as a
    process a conversion process forks bears the same command line until it execs (exiftool)."""
    found = set()
    for proc in psutil.Process(os.getpid()).children():
        try:
            if "_child_main" in " ".join(proc.cmdline()):
                found.add(proc.pid)
        except psutil.Error:
            continue
    return found


def test_the_next_item_is_fetched_converted_and_deposited_while_a_download_is_slow(rig):
    """concurrency 1, transfer_slots by default: the first item's download is held until the second item is in
    the store. With one item at a time (the executor before transfer_slots) that never happens and the hold
    runs out."""
    second = rig.image_key("IE4100", ITEMS[1])
    ran_out = threading.Event()

    def hold_until_second_deposited() -> None:
        deadline = time.monotonic() + HOLD_SECONDS
        while second not in rig.keys():
            if time.monotonic() > deadline:
                ran_out.set()
                return
            time.sleep(0.05)

    with serving(RosettaEmulator(one_object())) as emulator:
        emulator.before(f"dps_pid={ITEMS[0]}", hold_until_second_deposited)
        rig.write(rosetta_source(emulator.url, retry=PATIENT_RETRY), concurrency=1)

        report = rig.harvest()

    assert not ran_out.is_set(), "the second item was not deposited while the first one's download was held"
    assert report.status == "completed", report.note
    assert set(rig.statuses().values()) == {"deposited"} and len(rig.statuses()) == len(ITEMS)


def test_no_more_conversion_processes_than_concurrency(rig):
    """concurrency 1, transfer_slots 2: the three downloads are held until all three have started, so that three
    fetched masters want converting at once; only one conversion process ever runs, and every item deposits."""
    started = threading.Barrier(len(ITEMS), timeout=HOLD_SECONDS)
    seen: set[int] = set()
    most = 0
    running = threading.Event()

    def sample() -> None:
        nonlocal most
        while running.is_set():
            now = conversion_children()
            seen.update(now)
            most = max(most, len(now))
            time.sleep(0.005)

    with serving(RosettaEmulator(one_object())) as emulator:
        for item in ITEMS:
            emulator.before(f"dps_pid={item}", started.wait)
        rig.write(rosetta_source(emulator.url, retry=PATIENT_RETRY), concurrency=1, transfer_slots=2)
        running.set()
        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            report = rig.harvest()
        finally:
            running.clear()
            sampler.join()

    assert not started.broken, "the three downloads were not in flight at once"
    assert report.status == "completed", report.note
    assert set(rig.statuses().values()) == {"deposited"} and len(rig.statuses()) == len(ITEMS)
    assert seen and most == 1, f"{most} conversion processes at once ({len(seen)} in all)"
    assert conversion_children() == set()  # closed with the executor


@pytest.mark.parametrize("value, transfers", [(None, 3), (0, 0), (5, 5)])
def test_transfer_slots_default_to_concurrency(tmp_path, value, transfers):
    path = tmp_path / "config.yaml"
    run = {"concurrency": 3} | ({} if value is None else {"transfer_slots": value})
    path.write_text(yaml.safe_dump({"pipelines": {"museum": {
        "source": {"kind": "filesystem", "root": "masters"}, "store": {"kind": "local", "root": "store"}, **run}}}))
    assert load_config(path).pipeline("museum").settings.transfers == transfers


def test_negative_transfer_slots_are_refused(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"defaults": {"transfer_slots": -1}}))
    with pytest.raises(ConfigError, match=r"defaults\.transfer_slots: Input should be greater than or equal to 0"):
        load_config(path)
