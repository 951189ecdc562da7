"""Misbehaving jobs for the isolation tests (run inside the child process)."""
import os
import signal
import threading
import time


def segfault() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


def hang(seconds: float) -> None:
    time.sleep(seconds)


def allocate(megabytes: int) -> int:
    return len(bytearray(megabytes * 1024 * 1024))


def exit_status(code: int) -> int:
    """What a subprocess of the child says of its exit: the encoders' and exiftool's failures are read so."""
    import subprocess
    return subprocess.run(["sh", "-c", f"exit {code}"]).returncode


def pid() -> int:
    return os.getpid()


def beside_thread() -> str:
    """The name of the thread isolation.beside runs work in."""
    from gcis_etl.isolation import beside
    return beside(lambda: threading.current_thread().name).result()


def decode_crashing_in_libvips_writes(job):
    """conversion.decode_in_child with every libvips write crashing the process, as a decoder crash does."""
    import pyvips

    from gcis_etl.conversion import decode_in_child
    pyvips.Image.tiffsave = lambda *args, **kwargs: segfault()
    return decode_in_child(job)
