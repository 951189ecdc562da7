"""Conversion recipes: YAML parameter sets in recipes/, validated on load, identified by name and digest.

The digest is taken over the validated, canonical parameters, so re-formatting a file does not force a
re-encode, but changing any parameter does (the ledger compares digests).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from gcis_etl.errors import ConfigError
from gcis_etl.settings import Settings, parse, read_yaml

DEFAULT_RECIPE = "ptiff-jpeg-q90"
_REPO_RECIPES = Path(__file__).resolve().parent.parent / "recipes"


class MetadataRule(Settings):
    """Which embedded metadata travels from master to access master (exiftool tag names or groups)."""

    keep: tuple[str, ...] = ("EXIF:all", "XMP:all", "IPTC:all")
    exclude: tuple[str, ...] = ("MakerNotes:all", "IFD1:all", "ThumbnailImage", "PreviewImage",
                                "ICC_Profile:all", "Orientation")


class Recipe(Settings):
    name: str
    description: str = ""
    encoder: Literal["ptiff"] = "ptiff"
    tile: int = Field(256, ge=16, le=4096, multiple_of=16)
    quality: int = Field(90, ge=1, le=100)
    chroma: Literal["4:2:0", "4:4:4"] = "4:2:0"
    fast_dct: bool = Field(False, description="libjpeg-turbo's faster, slightly less accurate DCT")
    encode_threads: int = Field(1, ge=1, le=16, description="tile-encoding threads beside the decoder")
    extension: str = ".tif"
    metadata: MetadataRule = MetadataRule()

    @model_validator(mode="after")
    def _extension_has_dot(self) -> "Recipe":
        if not self.extension.startswith("."):
            raise ValueError(f"extension must start with a dot, got {self.extension!r}")
        return self

    @property
    def digest(self) -> str:
        canonical = json.dumps(self.model_dump(mode="json", exclude={"description"}), sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def recipe_dirs() -> list[Path]:
    """GCIS_RECIPES (colon-separated), then ./recipes, then the recipes shipped beside the package."""
    dirs = [Path(p) for p in os.environ.get("GCIS_RECIPES", "").split(os.pathsep) if p]
    return dirs + [Path.cwd() / "recipes", _REPO_RECIPES]


def load_recipe(name_or_path: str | Path = DEFAULT_RECIPE) -> Recipe:
    """A recipe by name (searched in recipe_dirs()) or by path to a YAML file."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        candidates = [d / f"{name_or_path}.yaml" for d in recipe_dirs()]
        path = next((c for c in candidates if c.is_file()), None)
        if path is None:
            known = sorted({p.stem for d in recipe_dirs() if d.is_dir() for p in d.glob("*.yaml")})
            raise ConfigError(f"recipe {name_or_path!r} not found (known: {', '.join(known) or 'none'})")
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of recipe parameters")
    recipe = parse(Recipe, data, str(path))
    if recipe.name != path.stem:
        raise ConfigError(f"{path}: name: must equal the file name {path.stem!r} (got {recipe.name!r})")
    return recipe
