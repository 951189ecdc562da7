"""gcis-etl: masters from the DAMs in, verified IIIF access masters out.

The library's front door, for a script or a notebook: one master or access master at a time (inspect,
convert, verify), recipes, a configured harvest, and the migration scripts (migrate: the fixity audit among
them). The CLI and the Celery worker use the modules behind it.
Nothing here reads config.yaml by itself: pass a load_config()'s `imaging` and `isolation` to the calls. Many
masters in one thread convert faster through one reused IsolatedProcess (`worker=`) than with a new one each.
"""
# Pillow before pyvips, in every process that imports gcis_etl: libvips brings the system's OpenJPEG into the
# global symbol scope, and a Pillow loaded after it binds to that one instead of its wheel's (seen with
# LD_DEBUG=bindings); with Debian's OpenJPEG 2.5.0 it then decodes an sYCC JPEG 2000 as RGB
# (tests/test_decoder_order.py).
from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

importlib.import_module("PIL.Image")

if TYPE_CHECKING:
    from gcis_etl.models import VerifyReport
    from gcis_etl.policy import IsolationSettings


def verify(path, expect=None, isolation_settings: IsolationSettings | None = None) -> VerifyReport:
    """Check the access-master contract in an isolated process (it decodes tiles through libtiff), under
    `isolation_settings` (config.yaml's isolation:, as for convert). `expect`: an Expectation, a recipe's
    Jp2Parameters, or a Recipe or recipe name (what it sets for the file's kind); a file that cannot be read is a
    report with that error. The path is made absolute, as the report names it (as inspect and convert do). Raises
    ConversionFailed when the check cannot finish (a decoder crashed, or memory or time ran out under the
    limits): the file is then neither valid nor invalid, only unverified."""
    from gcis_etl.conversion import verify_in_child
    from gcis_etl.isolation import IsolatedProcess
    from gcis_etl.recipes import load_recipe
    if isinstance(expect, (str, Path)):  # a recipe's name or file, as convert() takes one
        expect = load_recipe(expect)
    with IsolatedProcess(isolation_settings) as worker:
        return worker.call(verify_in_child, str(Path(path).absolute()), expect)


_LAZY = {**dict.fromkeys(("convert", "check_decoding"), "gcis_etl.conversion"),
         **dict.fromkeys(("ConfigError", "ConversionFailed", "GcisError", "RejectedMaster", "SourceError",
                          "VerificationFailed"), "gcis_etl.errors"),
         "IsolatedProcess": "gcis_etl.isolation",
         "LockHeld": "gcis_etl.locks",
         "RunReport": "gcis_etl.reports",
         "inspect": "gcis_etl.inspection",
         **dict.fromkeys(("ConversionResult", "ImageInfo", "Status", "Verdict", "VerifyReport"), "gcis_etl.models"),
         **dict.fromkeys(("Recipe", "load_recipe"), "gcis_etl.recipes"),
         **dict.fromkeys(("load_config", "Config"), "gcis_etl.config"),
         **dict.fromkeys(("harvest", "HarvestOptions", "harvest_pipelines", "PipelineOutcome"), "gcis_etl.harvesting"),
         **dict.fromkeys(("migrate", "MigrationReport"), "gcis_etl.migration")}


def __getattr__(name: str):
    """The front door's names load on first use: the command line imports gcis_etl before anything else, and
    importing the imaging and pipeline modules (numpy, pyvips, pydantic: ~0.2 s) before it has installed its
    signal handling made a Ctrl-C then a traceback. Connectors import gcis_etl.errors, and the pipeline imports
    connectors."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gcis_etl' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The names __getattr__ loads on first use too: tab completion and dir() offer them."""
    return sorted({*globals(), *_LAZY})


__all__ = ["inspect", "convert", "verify", "check_decoding", "IsolatedProcess", "load_recipe", "Recipe", "ImageInfo",
           "load_config", "Config", "harvest", "HarvestOptions", "harvest_pipelines", "PipelineOutcome", "RunReport",
           "migrate", "MigrationReport",
           "ConversionResult", "VerifyReport", "Status", "Verdict", "GcisError", "ConfigError",
           "RejectedMaster", "ConversionFailed", "VerificationFailed", "LockHeld", "SourceError"]
