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
            try:
                lines = self.file.read_text().splitlines()
            except OSError as exc:
                raise SourceError(f"{self.file}: cannot read the id list: {exc.strerror}") from None
            ids += [line.split("#", 1)[0].strip() for line in lines]
        return [i.strip() for i in ids if i.strip()]
