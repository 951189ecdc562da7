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
