"""deploy/iipsrv/region-guard.lua in front of the real lighttpd + iipsrv 1.1: regions that extend beyond an image's
right and bottom edges, which crash iipsrv on a TIFF and make it send an error text as a JPEG from a JP2, are cropped
to the image first; sizes that leave one side to the server (`w,`, `,h`, `pct:n`), which iipsrv renders a few pixels
off, are given as the exact `w,h`, and so is `!w,h`; a computed side under a pixel is a 400 (iipsrv fails on such
rows at an image's edge), or 1 on a TIFF region spanning the image; every response carries one
Access-Control-Allow-Origin; valid requests are served as before."""
from __future__ import annotations

import io

import pytest
import pyvips
from PIL import Image

from gcis_etl.iipsrv import Consumer, ServerSettings
from gcis_etl.jp2 import build_command, run_encoder
from gcis_etl.recipes import load_recipe
from tests.consumer import get

pytestmark = pytest.mark.slow

W, H = 1000, 700  # a libvips pyramid (1000x700, 500x350, 250x175) with a white 8x8 block in its bottom-right corner
JP2_W, JP2_H = 768, 512  # the same picture as JP2s made by our recipes
JP2_RECIPES = ("jp2-openjpeg-lossy", "jp2-grok-lossy", "jp2-grok-htj2k")
# A panorama on which iipsrv 1.1 gets all three one-sided sizes wrong (600x100 only `w,`), as a PTIFF and a JP2
PANO_W, PANO_H = 1000, 167
PANORAMAS = ("panorama.tif", "panorama.jp2")
# One row below the 512 grid: the bottom tile row at scale factor 2 is a 512x1 region, half a pixel high at 256,
EDGE_W, EDGE_H = 769, 513
EDGES = ("edge.tif", "edge.jp2")
STRIP_W = 5000  # a 5000x1 PTIFF


def white_corner(width: int, height: int) -> pyvips.Image:
    return pyvips.Image.black(width, height, bands=3).draw_rect([255, 255, 255], width - 8, height - 8, 8, 8,
                                                                fill=True)


@pytest.fixture(scope="module")
def consumer(tmp_path_factory):
    root = tmp_path_factory.mktemp("guard")
    images = root / "images"
    images.mkdir()
    white_corner(W, H).tiffsave(str(images / "corner.tif"), tile=True, pyramid=True, compression="jpeg",
                                tile_width=256, tile_height=256)
    reference = root / "reference.tif"
    white_corner(JP2_W, JP2_H).tiffsave(str(reference), compression="none", strip=True)
    for name in JP2_RECIPES:
        command = build_command(load_recipe(name), reference, images / f"{name}.jp2", size=(JP2_W, JP2_H))
        run_encoder(command.argv, timeout=60)
    panorama = white_corner(PANO_W, PANO_H)
    panorama.tiffsave(str(images / "panorama.tif"), tile=True, pyramid=True, compression="jpeg", tile_width=256,
                      tile_height=256)
    panorama.tiffsave(str(reference), compression="none", strip=True)
    command = build_command(load_recipe("jp2-openjpeg-lossy"), reference, images / "panorama.jp2",
                            size=(PANO_W, PANO_H))
    run_encoder(command.argv, timeout=60)
    edge = white_corner(EDGE_W, EDGE_H)
    edge.tiffsave(str(images / "edge.tif"), tile=True, pyramid=True, compression="jpeg", tile_width=256,
                  tile_height=256)
    edge.tiffsave(str(reference), compression="none", strip=True)
    command = build_command(load_recipe("jp2-openjpeg-lossy"), reference, images / "edge.jp2", size=(EDGE_W, EDGE_H))
    run_encoder(command.argv, timeout=60)
    pyvips.Image.black(STRIP_W, 1, bands=3).tiffsave(str(images / "strip.tif"), tile=True, pyramid=True,
                                                     compression="jpeg", tile_width=256, tile_height=256)
    server = ServerSettings(port=0, run_dir=root / "run", access_log=root / "run" / "access.log")
    with Consumer(server, images) as running:
        yield running


def image(consumer, path: str, identifier: str = "corner.tif") -> Image.Image:
    r = get(f"{consumer.iiif_url}/{identifier}/{path}")
    assert r.status == 200, (path, r.status)
    return Image.open(io.BytesIO(r.body)).convert("L")


def crashes(consumer) -> int:
    return (consumer.server.run_dir / "error.log").read_text().count("child signalled")


@pytest.mark.parametrize("region, size", [
    (f"{W - 1},{H - 1},10,10", "full"),        # 1x1 cropped, read by iipsrv as a 10x downscale
    (f"{W - 2},{H - 2},10,10", "full"),
    ("pct:99.9,99.9,5,5", "full"),
    (f"{W - 1}%2C{H - 1}%2C10%2C10", "full"),  # iipsrv decodes the commas itself
    (f"{W - 1},{H - 1},10,10", "5,"),
])
def test_a_region_over_the_bottom_right_corner_is_cropped_and_kills_no_iipsrv(consumer, region, size):
    before = crashes(consumer)
    served = image(consumer, f"{region}/{size}/0/default.jpg")
    assert crashes(consumer) == before
    expected = 5 if size == "5," else (2 if region.startswith(f"{W - 2}") else 1)
    assert served.size == (expected, expected)
    assert sum(served.getdata()) / expected ** 2 > 128, list(served.getdata())  # the white corner, not black


def test_an_encoded_slash_does_not_get_a_region_past_the_guard(consumer):
    before = crashes(consumer)
    r = get(f"{consumer.iiif_url}/corner.tif%2F{W - 1},{H - 1},10,10%2Ffull%2F0%2Fdefault.jpg")
    assert r.status == 200 and crashes(consumer) == before


def test_valid_regions_at_the_edges_keep_their_pixels(consumer):
    assert image(consumer, f"{W - 10},{H - 10},10,10/full/0/default.jpg").size == (10, 10)
    right = image(consumer, f"{W - 5},0,10,{H}/full/0/default.jpg")  # over one edge only: iipsrv crops it itself
    assert right.size == (5, H)
    assert image(consumer, "768,512,232,188/full/0/default.jpg").size == (232, 188)  # the edge tile of the grid
    assert image(consumer, "512,512,488,188/244,/0/default.jpg").size == (244, 94)
    corner = image(consumer, f"{W - 16},{H - 16},32,32/full/0/default.jpg")  # cropped to 16x16
    assert corner.size == (16, 16)
    assert max(corner.crop((0, 0, 6, 6)).getdata()) < 50 and min(corner.crop((10, 10, 16, 16)).getdata()) > 200
    assert image(consumer, "full/!500,500/0/default.jpg").size == (500, 350)


def test_a_region_wholly_outside_is_a_400_and_iipsrv_is_reached_only_through_the_prefix(consumer):
    assert get(f"{consumer.iiif_url}/corner.tif/{W},0,5,5/full/0/default.jpg").status == 400
    assert get(f"{consumer.iiif_url}/corner.tif/{W - 1},{H - 1},1x,1/full/0/default.jpg").status == 400
    direct = get(f"{consumer.url}/iipsrv.fcgi?IIIF=corner.tif/{W - 1},{H - 1},10,10/full/0/default.jpg")
    assert (direct.status, direct.headers.get("access-control-allow-origin")) == (404, "*")


def test_info_json_is_cached_for_less_time_than_images(consumer):
    assert get(f"{consumer.iiif_url}/corner.tif/info.json").headers["cache-control"] == "max-age=600"
    assert get(f"{consumer.iiif_url}/corner.tif/0,0,256,256/256,/0/default.jpg").headers["cache-control"] \
        == "max-age=86400"


@pytest.mark.parametrize("recipe", JP2_RECIPES)
@pytest.mark.parametrize("region, expected", [
    (f"{JP2_W - 1},{JP2_H - 1},10,10", (1, 1)),
    (f"0,{JP2_H - 1},10,10", (10, 1)),  # over one edge: iipsrv crops a region's width, not its height
    ("pct:99.9,99.9,5,5", (1, 1)),
])
def test_a_region_over_a_jp2s_edge_is_cropped_and_served_as_a_jpeg(consumer, recipe, region, expected):
    # uncropped, iipsrv 1.1 answers 200 image/jpeg with OpenJPEG's error text as the body
    assert image(consumer, f"{region}/full/0/default.jpg", f"{recipe}.jp2").size == expected


def test_a_jp2s_corner_keeps_its_pixels(consumer):
    corner = image(consumer, f"{JP2_W - 16},{JP2_H - 16},32,32/full/0/default.jpg", "jp2-openjpeg-lossy.jp2")
    assert corner.size == (16, 16)
    assert max(corner.crop((0, 0, 6, 6)).getdata()) < 50 and min(corner.crop((10, 10, 16, 16)).getdata()) > 200


@pytest.mark.parametrize("identifier, width, height", [("corner.tif", W, H), ("jp2-openjpeg-lossy.jp2", JP2_W, JP2_H)])
def test_a_pct_region_starting_in_the_last_pixel_is_that_pixel(consumer, identifier, width, height):
    # 99.95% of the width lies in its last pixel, though it rounds to the width: the region is not outside
    served = image(consumer, "pct:99.95,99.95,1,1/full/0/default.jpg", identifier)
    assert served.size == (1, 1) and served.getpixel((0, 0)) > 128
    assert get(f"{consumer.iiif_url}/{identifier}/pct:100,0,1,1/full/0/default.jpg").status == 400
    assert get(f"{consumer.iiif_url}/{identifier}/0,{height},1,1/full/0/default.jpg").status == 400


@pytest.mark.parametrize("identifier", PANORAMAS)
@pytest.mark.parametrize("region, size, expected", [
    ("full", "8,", (8, 1)),               # iipsrv 1.1 alone: 6x1 (the width from its rounded height)
    ("full", "469,", (469, 78)),          # 469 * 167 / 1000 = 78.3
    ("full", ",32", (192, 32)),           # 191.6 wide; alone: 192x31
    ("full", ",100", (599, 100)),
    ("full", "pct:2", (20, 3)),           # 3.34 high; alone: 18x3
    ("full", "pct:10", (100, 17)),        # alone: 100x16
    ("full", "PCT:10", (100, 17)),        # iipsrv reads sizes in any case
    ("square", "8,", (8, 8)),
    ("square", "pct:9", (15, 15)),
    ("pct:0,0,50,50", "13,", (13, 2)),    # a 500x83.5 region; alone: 12x2
    ("100,20,700,120", ",13", (76, 13)),
    ("995,150,20,20", "pct:60", (3, 10)),  # of the region as cropped (5x17)
    ("full", "!300,18", (108, 18)),       # best fit: 107.8 wide; alone: 110x18
    ("full", "!300,300", (300, 50)),
    ("0,0,500,100", "!7,300", (7, 1)),    # 1.4 high
    (f"{PANO_W - 1}%2C0%2C1%2C{PANO_H}", "1%2C", (1, PANO_H)),  # iipsrv decodes the commas itself
])
def test_a_one_sided_size_is_served_exactly(consumer, identifier, region, size, expected):
    assert image(consumer, f"{region}/{size}/0/default.jpg", identifier).size == expected


@pytest.mark.parametrize("identifier", PANORAMAS)
def test_every_width_keeps_the_panoramas_aspect_ratio(consumer, identifier):
    # whole-image sizes as a viewer asks for them: the height rounded to the nearest pixel (none of these is a half)
    for width in range(7, 1200, 23):  # from the first with a height of 1
        served = image(consumer, f"full/{width},/0/default.jpg", identifier)
        assert served.size == (width, int(width * PANO_H / PANO_W + 0.5)), width


@pytest.mark.parametrize("region, size", [("full", size) for size in (
    "+235,", "235.5,", "^235,", ",1x", "pct:1e1", "pct:", ",", "0,", ",0", "pct:0")] + [
    ("0,0,1,100", ",2")])  # 0.02 pixels wide
def test_a_malformed_or_empty_one_sided_size_is_a_400(consumer, region, size):
    assert get(f"{consumer.iiif_url}/panorama.tif/{region}/{size}/0/default.jpg").status == 400


def test_sizes_the_guard_leaves_alone_are_served_as_iipsrv_serves_them(consumer):
    assert image(consumer, "full/full/0/default.jpg", "panorama.tif").size == (PANO_W, PANO_H)
    assert image(consumer, "full/300,40/0/default.jpg", "panorama.tif").size == (300, 40)
    assert image(consumer, "0,0,256,167/256,/0/default.jpg", "panorama.tif").size == (256, 167)
    assert image(consumer, "full/pct:600/0/default.jpg", "panorama.tif").size == (5000, 835)  # over MAX_CVT: capped


@pytest.mark.parametrize("identifier, expected", [("panorama.tif", (1, 1)), ("panorama.jp2", None)])
def test_a_best_fit_under_a_pixel_is_one_on_a_whole_tiff_and_a_400_on_a_jp2(consumer, identifier, expected):
    # 1x0.167; iipsrv alone answers 200 image/jpeg with its HTML error text as the body
    r = get(f"{consumer.iiif_url}/{identifier}/full/!1,1/0/default.jpg")
    if expected:
        assert r.status == 200 and Image.open(io.BytesIO(r.body)).size == expected
    else:
        assert r.status == 400 and r.headers["content-type"] == "text/plain"


@pytest.mark.parametrize("identifier", EDGES)
@pytest.mark.parametrize("path", [
    f"0,{EDGE_H - 1},512,1/256,/0/default.jpg",       # Mirador's bottom-row tile at half resolution (0.5 high)
    f"{EDGE_W - 1},0,1,512/,256/0/default.jpg",       # its right-column tile
    f"512,{EDGE_H - 1},257,1/pct:50/0/default.jpg",
])
def test_a_side_under_a_pixel_at_an_edge_is_a_400_not_a_crash_or_an_error_as_a_jpeg(consumer, identifier, path):
    # rounded up to 1, iipsrv renders it from the half-size level, where that row is empty: a TIFF crashes its
    # process, a JP2 gets OpenJPEG's error text as a JPEG cached for a day
    before = crashes(consumer)
    assert get(f"{consumer.iiif_url}/{identifier}/{path}").status == 400
    assert crashes(consumer) == before


@pytest.mark.parametrize("identifier", EDGES)
def test_the_other_tiles_of_the_thin_edges_are_served(consumer, identifier):
    assert image(consumer, f"0,{EDGE_H - 1},512,1/512,/0/default.jpg", identifier).size == (512, 1)
    assert image(consumer, "512,0,257,513/129,/0/default.jpg", identifier).size == (129, 257)
    assert image(consumer, "full/385,/0/default.jpg", identifier).size == (385, 257)


@pytest.mark.parametrize("path, expected", [
    ("full/157,/0/default.jpg", (157, 1)),            # in info.json's sizes, and what Mirador asks
    ("0,0,4096,1/256,/0/default.jpg", (256, 1)),      # its tiles
    ("4096,0,904,1/57,/0/default.jpg", (57, 1)),
    ("full/!100,100/0/default.jpg", (100, 1)),
])
def test_a_one_pixel_strip_is_served_one_pixel_high(consumer, path, expected):
    assert image(consumer, path, "strip.tif").size == expected


@pytest.mark.parametrize("path, status", [
    ("corner.tif/0,0,256,256/256,/0/default.jpg", 200),  # a tile
    ("corner.tif/full/!200,200/0/default.jpg", 200),      # a size
    ("corner.tif/full/full/0/default.jpg", 200),
    ("edge.jp2/0,0,512,512/256,/0/default.jpg", 200),
    ("corner.tif/info.json", 200),
    ("corner.tif/full/full/0/bogus.jpg", 400),            # iipsrv's error
    ("missing.tif/full/full/0/default.jpg", 404),
    ("corner.tif/5000,0,5,5/full/0/default.jpg", 400),    # the guard's
])
def test_every_response_carries_one_access_control_allow_origin(consumer, path, status):
    # iipsrv 1.1 sends it with info.json and errors only
    answer = get(f"{consumer.iiif_url}/{path}")  # a second header would read "*, *"
    assert (answer.status, answer.headers.get("access-control-allow-origin")) == (status, "*")
