"""The OpenJPEG library iipsrv links (libopenjp2, Debian's 2.5.0), called in-process the way iipsrv calls it:
read the header, set the resolution factor and the area, decode. Verification decodes through it rather
than through opj_decompress processes: it is the decoder that will serve the file, and it costs a third of
the CPU (no process start, no whole-file read, no PPM round trip).

A decoder crash takes the calling process with it, so call this only in a conversion child (isolation)."""
from __future__ import annotations

import ctypes as C
import os
from functools import cache
from pathlib import Path

import numpy as np

_CODEC_JP2 = 2
_PARAMETERS_BYTES = 16384  # opj_dparameters_t is 8,252 bytes in 2.5.0; the library fills what it has


class DecodeError(Exception):
    """The library refused the file or an area of it; the message is its own complaints."""


class _Component(C.Structure):
    _fields_ = [(name, C.c_uint32) for name in ("dx", "dy", "w", "h", "x0", "y0", "prec", "bpp", "sgnd",
                                                 "resno_decoded", "factor")] + [
        ("data", C.POINTER(C.c_int32)), ("alpha", C.c_uint16)]


class _Image(C.Structure):
    _fields_ = [(name, C.c_uint32) for name in ("x0", "y0", "x1", "y1", "numcomps")] + [
        ("color_space", C.c_int), ("comps", C.POINTER(_Component)), ("icc_profile_buf", C.c_void_p),
        ("icc_profile_len", C.c_uint32)]


_MESSAGE = C.CFUNCTYPE(None, C.c_char_p, C.c_void_p)


@cache
def _library() -> C.CDLL:
    lib = C.CDLL("libopenjp2.so.7")  # the soname of OpenJPEG 2.x (Debian libopenjp2-7), iipsrv's
    signatures = {
        "opj_version": (C.c_char_p, []),
        "opj_stream_create_default_file_stream": (C.c_void_p, [C.c_char_p, C.c_int]),
        "opj_create_decompress": (C.c_void_p, [C.c_int]),
        "opj_set_default_decoder_parameters": (None, [C.c_void_p]),
        "opj_set_error_handler": (C.c_int, [C.c_void_p, _MESSAGE, C.c_void_p]),
        "opj_setup_decoder": (C.c_int, [C.c_void_p, C.c_void_p]),
        "opj_read_header": (C.c_int, [C.c_void_p, C.c_void_p, C.POINTER(C.POINTER(_Image))]),
        "opj_set_decoded_resolution_factor": (C.c_int, [C.c_void_p, C.c_uint32]),
        "opj_set_decode_area": (C.c_int, [C.c_void_p, C.POINTER(_Image)] + [C.c_int32] * 4),
        "opj_decode": (C.c_int, [C.c_void_p, C.c_void_p, C.POINTER(_Image)]),
        "opj_end_decompress": (C.c_int, [C.c_void_p, C.c_void_p]),
        "opj_image_destroy": (None, [C.POINTER(_Image)]),
        "opj_destroy_codec": (None, [C.c_void_p]),
        "opj_stream_destroy": (None, [C.c_void_p]),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype, function.argtypes = restype, argtypes
    return lib


def version() -> str:
    return _library().opj_version().decode()


def decode_rgb(path: Path, reduce: int = 0, area: tuple[int, int, int, int] | None = None) -> np.ndarray:
    """The JP2 at `path` decoded `reduce` resolutions down, over `area` (x0, y0, x1, y1 at full resolution;
    None: all of it), as 8-bit RGB rows (grey repeated, a fourth component dropped) like opj_decompress's
    PPM. Raises DecodeError with the library's complaint."""
    lib = _library()
    complaints: list[str] = []
    collect = _MESSAGE(lambda message, _: complaints.append(message.decode(errors="replace").strip()))
    stream = lib.opj_stream_create_default_file_stream(os.fsencode(path), 1)
    if not stream:
        raise DecodeError(f"cannot open {path}")
    codec = lib.opj_create_decompress(_CODEC_JP2)
    image = C.POINTER(_Image)()
    parameters = C.create_string_buffer(_PARAMETERS_BYTES)
    lib.opj_set_default_decoder_parameters(parameters)
    try:
        lib.opj_set_error_handler(codec, collect, None)
        decoded = (lib.opj_setup_decoder(codec, parameters) and lib.opj_read_header(stream, codec, C.byref(image))
                   and (not reduce or lib.opj_set_decoded_resolution_factor(codec, reduce))
                   and (area is None or lib.opj_set_decode_area(codec, image, *area))
                   and lib.opj_decode(codec, stream, image) and lib.opj_end_decompress(codec, stream))
        if not decoded:
            raise DecodeError("; ".join(dict.fromkeys(complaints)) or "the decoder failed without saying why")
        return _rgb(image.contents)
    finally:
        if image:
            lib.opj_image_destroy(image)
        lib.opj_destroy_codec(codec)
        lib.opj_stream_destroy(stream)


def _rgb(image: _Image) -> np.ndarray:
    """Values are kept as they are: only 8-bit unsigned JP2s (ours) are compared with a reference; of any
    other, what is checked is that it decodes, and to what size."""
    components = [image.comps[i] for i in range(image.numcomps)]
    first = components[0] if components else None
    if first is None or any((c.w, c.h, c.dx, c.dy) != (first.w, first.h, 1, 1) or not c.data for c in components):
        raise DecodeError(f"decoded as {image.numcomps} components of different sizes or subsampled")
    planes = [np.ctypeslib.as_array(c.data, (c.h, c.w)) for c in components]
    return np.dstack(planes[:3] if len(planes) >= 3 else planes[:1] * 3).clip(0, 255).astype(np.uint8)
