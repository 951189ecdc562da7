"""gcis-etl: masters from the DAMs in, verified IIIF access masters out.

The library's front door, for a script or a notebook: one master or access master at a time (inspect,
convert, verify), recipes, and a configured harvest. The CLI and the Celery worker use the modules behind it.
"""
# Pillow before pyvips, in every process that imports gcis_etl: libvips brings the system's OpenJPEG into the
# global symbol scope, and a Pillow loaded after it binds to that one instead of its wheel's (seen with
# LD_DEBUG=bindings); with Debian's OpenJPEG 2.5.0 it then decodes an sYCC JPEG 2000 as RGB
# (tests/test_decoder_order.py).
import importlib
from pathlib import Path

importlib.import_module("PIL.Image")

from gcis_etl.conversion import check_decoding, convert
from gcis_etl.errors import (ConfigError, ConversionFailed, GcisError, RejectedMaster, VerificationFailed)
from gcis_etl.inspection import inspect
from gcis_etl.models import ConversionResult, ImageInfo, Status, Verdict, VerifyReport
from gcis_etl.policy import IsolationSettings
from gcis_etl.recipes import Recipe, load_recipe


def verify(path, expect=None, isolation_settings: IsolationSettings | None = None) -> VerifyReport:
    """Check the access-master contract in an isolated process (it decodes tiles through libtiff), under
    `isolation_settings` (config.yaml's isolation:, as for convert). `expect`: an Expectation, a recipe's
    Jp2Parameters, or a Recipe or recipe name (what it sets for the file's kind); a file that cannot be read is a
    report with that error. The path is made absolute, as the report names it (as inspect and convert do). Raises
    ConversionFailed when the check cannot finish (a decoder crashed, or memory or time ran out under the
    limits): the file is then neither valid nor invalid, only unverified."""
    from gcis_etl.conversion import verify_in_child
    from gcis_etl.isolation import IsolatedProcess
    if isinstance(expect, (str, Path)):  # a recipe's name or file, as convert() takes one
        expect = load_recipe(expect)
    with IsolatedProcess(isolation_settings) as worker:
        return worker.call(verify_in_child, str(Path(path).absolute()), expect)


_PIPELINE = {"load_config": "gcis_etl.config", "Config": "gcis_etl.config", "harvest": "gcis_etl.harvesting",
             "HarvestOptions": "gcis_etl.harvesting", "harvest_pipelines": "gcis_etl.harvesting",
             "PipelineOutcome": "gcis_etl.harvesting"}


def __getattr__(name: str):
    """Pipeline names load on first use: connectors import gcis_etl.errors, and the pipeline imports connectors."""
    if name in _PIPELINE:
        return getattr(importlib.import_module(_PIPELINE[name]), name)
    raise AttributeError(f"module 'gcis_etl' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The names __getattr__ loads on first use too: tab completion and dir() offer them."""
    return sorted({*globals(), *_PIPELINE})


__all__ = ["inspect", "convert", "verify", "check_decoding", "load_recipe", "Recipe", "ImageInfo",
           "load_config", "Config", "harvest", "HarvestOptions", "harvest_pipelines", "PipelineOutcome",
           "ConversionResult", "VerifyReport", "Status", "Verdict", "GcisError", "ConfigError",
           "RejectedMaster", "ConversionFailed", "VerificationFailed"]
