"""A small tmpfs mounted for a test (root only: CI runs as root), so that a disk fills or refuses writes for real."""
from __future__ import annotations

import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def tmpfs(folder: Path, options: str) -> Iterator[Path]:
    """A tmpfs at `folder` (made if missing) with mount's `options` ("size=1m", "ro,size=64k"), unmounted after."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)
