"""Explicit lists of object ids (migrations, reprocessing): inline in the settings or one per line in a file."""
from __future__ import annotations

from pathlib import Path

from gcis_etl.errors import SourceError
from gcis_etl.settings import Settings


class IdListSettings(Settings):
    """`ids` inline and/or `file`: one id per line, blank lines and '#' comments ignored. Read on every use."""

    file: Path | None = None
    ids: tuple[str, ...] = ()

    def read(self) -> list[str]:
        ids = list(self.ids)
        if self.file:
            ids += [line.split("#", 1)[0].strip() for line in read_text(self.file).splitlines()]
        return [i.strip() for i in ids if i.strip()]


def read_text(path: Path) -> str:
    """An id list's text: UTF-8, with or without the byte order mark Windows editors save (read as part of the
    first id, it would lose that object). Anything else is a SourceError naming the line to fix."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SourceError(f"{path}: cannot read the id list: {exc.strerror}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise SourceError(f"{path}: line {line} is not UTF-8 (byte {data[exc.start]:#04x}): save the id list as "
                          f"UTF-8") from None
