"""JP2 recipes that validate field by field but that opj_compress / grk_compress cannot make are refused at
load, naming why; their near neighbours still convert (real encoders, a small image made here)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import pyvips
import yaml

from gcis_etl.conversion import convert
from gcis_etl.errors import ConfigError
from gcis_etl.recipes import load_recipe

RECIPES = Path(__file__).resolve().parent.parent / "recipes"


def edited(tmp_path: Path, shipped: str, **jp2) -> Path:
    """A one-key edit of a shipped recipe, saved under a new name."""
    data = yaml.safe_load((RECIPES / f"{shipped}.yaml").read_text())
    name = f"edited-{len(list(tmp_path.glob('*.yaml')))}"
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**data, "name": name, "jp2": {**data["jp2"], **jp2}}))
    return path


@pytest.mark.parametrize("shipped, change, reason", [
    ("jp2-openjpeg-lossy", {"progression": "LRCP"}, "opj_compress cannot divide into tile-parts with precincts "
                                                    "and progression LRCP"),
    ("jp2-openjpeg-lossless", {"progression": "RLCP", "tile_parts": "C"}, "progression RLCP"),
    ("jp2-openjpeg-lossy", {"tile_parts": "L"}, "jp2.tile_parts: L (by layer) fails with openjpeg"),
    ("jp2-grok-lossy", {"tile_parts": "L"}, "jp2.tile_parts: L (by layer) fails with grok"),
    ("jp2-grok-lossy", {"ht": True}, "jp2.ht: grok writes one quality layer with the HT block coder, not 6"),
    ("jp2-openjpeg-lossless", {"ht": True}, "jp2.ht: opj_compress cannot write HTJ2K"),
    ("jp2-openjpeg-lossy", {"precincts": [[4, 4]]}, "jp2.precincts: openjpeg halves the last size, [4, 4], at "
                                                    "each lower resolution: with 6 levels it reaches 1 at "
                                                    "resolution 4"),
    ("jp2-grok-lossy", {"precincts": [[256, 256], [16, 16]]}, "reaches 1 at resolution 1"),
    ("jp2-openjpeg-lossless", {"precincts": [[64, 16]]}, "make the last size at least 64 a side"),
    ("jp2-openjpeg-lossy", {"levels": 9, "tiles": [256, 256]},
     "jp2.tiles: openjpeg needs tiles of at least 2^levels = 512 a side for 9 levels, got [256, 256]: use larger "
     "tiles or at most 8 levels"),
    ("jp2-grok-lossy", {"levels": 10}, "jp2.tiles: grok needs tiles of at least 2^levels = 1024 a side"),
], ids=["opj LRCP", "opj RLCP", "opj by layer", "grok by layer", "grok HT layers", "opj HT", "opj precincts to 1",
        "grok precincts to 1", "opj precincts to 1 in height", "opj levels beyond the tiles",
        "grok levels beyond the tiles"])
def test_what_the_encoder_cannot_make_is_refused_at_load(tmp_path, shipped, change, reason):
    with pytest.raises(ConfigError, match=re.escape(reason)):
        load_recipe(edited(tmp_path, shipped, **change))


@pytest.mark.parametrize("shipped, change", [
    ("jp2-openjpeg-lossy", {"progression": "LRCP", "tile_parts": None}),
    ("jp2-openjpeg-lossy", {"tile_parts": "C"}),
    ("jp2-grok-lossy", {"progression": "LRCP"}),
    ("jp2-grok-htj2k", {"reversible": False, "rates": [2]}),
    ("jp2-openjpeg-lossy", {"precincts": [[256, 256], [256, 256], [16, 16]]}),
    ("jp2-grok-lossy", {"precincts": [[256, 256], [256, 256], [16, 16]]}),
    ("jp2-openjpeg-lossy", {"levels": 8, "tiles": [256, 256]}),
    ("jp2-grok-lossy", {"levels": 8, "tiles": [256, 256]}),
], ids=["opj LRCP, no tile-parts", "opj by component", "grok LRCP", "grok HT lossy, one layer",
        "opj precincts to 2 at resolution 1, below the code-block", "grok precincts to 2 at resolution 1",
        "opj levels up to the tiles", "grok levels up to the tiles"])
def test_the_neighbours_of_what_is_refused_convert(tmp_path, shipped, change):
    master = tmp_path / "master.tif"
    pyvips.Image.xyz(700, 500).extract_band(0).cast("uchar").bandjoin([128, 64]).copy(
        interpretation="srgb").tiffsave(str(master))
    result = convert(master, tmp_path / "out.jp2", load_recipe(edited(tmp_path, shipped, **change)))
    assert result.ok, result.reason
