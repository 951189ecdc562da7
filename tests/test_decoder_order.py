"""imaging.decoders: every format has a decoder to try, and trying none never reads as the master's fault."""
from __future__ import annotations

import pytest
import pyvips

from gcis_etl.decoding import open_master
from gcis_etl.errors import ConfigError, ConversionFailed
from gcis_etl.inspection import inspect
from gcis_etl.policy import ImagingPolicy
from gcis_etl.settings import parse


@pytest.mark.parametrize("order", [[], ["vips", "pillow", "vips"]], ids=["none", "one twice"])
def test_a_decoder_order_lists_each_decoder_once_and_at_least_one(order):
    with pytest.raises(ConfigError, match=r"config.yaml: imaging.decoders: Value error, JPEG: list each decoder "
                                          r"at most once, and at least one of them"):
        parse(ImagingPolicy, {"decoders": {"JPEG": order}}, "config.yaml", "imaging")


def test_no_decoder_to_try_is_a_failure_not_a_rejection(tmp_path):
    path = tmp_path / "small.jpg"
    pyvips.Image.black(32, 24, bands=3).jpegsave(str(path))
    info = inspect(path, ImagingPolicy())
    with pytest.raises(ConversionFailed, match=r"no decoder to try for JPEG \(imaging.decoders\)"):
        open_master(info, (), strict=True)
    assert open_master(info, ("pillow",), strict=True).decoder == "pillow"
