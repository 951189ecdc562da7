"""A valid master with megabytes of metadata before its image data is read from its header like any other: the
header walk does not stop at a buffer (JPEG) nor inflate text chunks (PNG), whose metadata is exiftool's to read."""
from __future__ import annotations

import hashlib
import io
import struct

from PIL import Image, ImageCms, PngImagePlugin

from gcis_etl.inspection import inspect
from gcis_etl.models import Verdict
from tests.conftest import CORPUS

# XMP of 5 MB (a title, an XML comment of spaces): over the 4 MB the JPEG walk read, over Pillow's 1 MB for a PNG
# text chunk
BIG_XMP = (b"<x:xmpmeta xmlns:x='adobe:ns:meta/'><rdf:RDF xmlns:rdf='http://www.w3.org/1999/02/22-rdf-syntax-ns#'>"
           b"<rdf:Description xmlns:dc='http://purl.org/dc/elements/1.1/'><dc:title><rdf:Alt><rdf:li xml:lang="
           b"'x-default'>Irises</rdf:li></rdf:Alt></dc:title></rdf:Description></rdf:RDF><!--" + b" " * (5 << 20)
           + b"--></x:xmpmeta>")


def test_a_jpeg_with_megabytes_of_extended_xmp_before_its_frame_header_is_accepted(tmp_path):
    """Extended XMP: APP1 segments of 64 KB each, between SOI and the frame header."""
    jpeg = (CORPUS / "jpeg-baseline/flowers.jpeg").read_bytes()
    guid = hashlib.md5(BIG_XMP).hexdigest().upper().encode()
    segments = b""
    for at in range(0, len(BIG_XMP), 65000):
        body = (b"http://ns.adobe.com/xmp/extension/\0" + guid + struct.pack(">II", len(BIG_XMP), at)
                + BIG_XMP[at:at + 65000])
        segments += b"\xff\xe1" + struct.pack(">H", 2 + len(body)) + body
    master = tmp_path / "extended-xmp.jpg"
    master.write_bytes(jpeg[:2] + segments + jpeg[2:])
    info = inspect(master)
    assert info.verdict is Verdict.ACCEPT, info.reasons
    assert (info.width, info.height, info.bands, info.xmp) == (1920, 1080, 3, True)


def test_a_png_with_megabytes_of_compressed_xmp_is_accepted_with_its_profile_and_transparency(tmp_path):
    """Pillow inflated the iTXt on its way to the image data, refused it past its MAX_TEXT_CHUNK, and the master
    was rejected as corrupt. The header read still takes the ICC profile and the transparency from their chunks,
    and still rejects a header chunk whose checksum is wrong."""
    text = PngImagePlugin.PngInfo()
    text.add_itxt("XML:com.adobe.xmp", BIG_XMP.decode(), zip=True)
    profile = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    buffer = io.BytesIO()
    Image.new("RGB", (40, 30), (10, 20, 30)).save(buffer, "PNG", pnginfo=text, icc_profile=profile,
                                                   transparency=(10, 20, 30))
    png = buffer.getvalue()
    assert png.index(b"iTXt") < png.index(b"IDAT") and len(png) < len(BIG_XMP) // 100
    master = tmp_path / "xmp.png"
    master.write_bytes(png)
    info = inspect(master)
    assert info.verdict is Verdict.ACCEPT_AFTER_CONVERSION, info.reasons
    assert (info.width, info.height, info.xmp, info.alpha) == (40, 30, True, True)
    assert info.icc and "sRGB" in info.icc
    assert info.reasons == ("flatten alpha/extra samples",)
    damaged = bytearray(png)
    damaged[png.index(b"iTXt") + 40] ^= 1
    (tmp_path / "damaged.png").write_bytes(damaged)
    assert inspect(tmp_path / "damaged.png").reasons == ("corrupt or truncated PNG header: bad checksum in its "
                                                         "iTXt chunk",)


def far_bigtiff(path, width: int, height: int, orientation: int, directory_at: int = 2 ** 31 + 4096,
                bits: tuple[int, int, int] = (8, 8, 8)) -> None:
    """An uncompressed RGB BigTIFF whose one directory lies past 2 GB, as libtiff puts it after the pixels of a
    large master; the gap is a hole, so the file takes a few kB of disk."""
    pixels = bytes(i % 251 for i in range(width * height * 3))
    short, long8 = (lambda v: struct.pack("<H", v)), (lambda v: struct.pack("<Q", v))
    entries = [(256, 3, 1, short(width)), (257, 3, 1, short(height)), (258, 3, 3, struct.pack("<HHH", *bits)),
               (259, 3, 1, short(1)), (262, 3, 1, short(2)), (273, 16, 1, long8(16)), (274, 3, 1, short(orientation)),
               (277, 3, 1, short(3)), (278, 3, 1, short(height)), (279, 16, 1, long8(len(pixels)))]
    with open(path, "wb") as f:
        f.write(b"II" + struct.pack("<HHHQ", 43, 8, 0, directory_at) + pixels)
        f.seek(directory_at)
        f.write(struct.pack("<Q", len(entries)))
        for tag, kind, count, value in entries:
            f.write(struct.pack("<HHQ", tag, kind, count) + value.ljust(8, b"\0"))
        f.write(struct.pack("<Q", 0))


def test_a_bigtiff_whose_directory_lies_past_2_gb_keeps_its_orientation(tmp_path):
    """exiftool passes over 64-bit offsets past 2 GB unless LargeFileSupport is set, with a warning read as "no
    tags": a rotated 800 Mpx master came out unrotated, and verified."""
    master = tmp_path / "far.tif"
    far_bigtiff(master, 24, 16, orientation=6)
    info = inspect(master)
    assert (info.format, info.orientation, info.exif) == ("BigTIFF", 6, True)
    assert "apply orientation 6" in info.reasons


def test_a_tiff_whose_bands_have_different_bit_depths_is_rejected_with_the_reason(tmp_path):
    """tifffile gives the depths as a tuple (RGB 5-6-5, or a damaged tag): inspect raised a TypeError."""
    master = tmp_path / "565.tif"
    far_bigtiff(master, 24, 16, orientation=1, directory_at=4096, bits=(5, 6, 5))
    info = inspect(master)
    assert info.verdict is Verdict.REJECT
    assert info.reasons == ("unsupported BigTIFF: its bands have different bit depths (5, 6, 5) (packed RGB such as "
                            "5-6-5, or a damaged BitsPerSample tag), which no decoder here converts",)
