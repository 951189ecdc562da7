"""Conversion recipes: YAML parameter sets in recipes/, validated on load, identified by name and digest.

The digest is taken over the validated, canonical parameters, so re-formatting a file does not force a
re-encode, but changing any parameter does (the ledger compares digests).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from gcis_etl.errors import ConfigError
from gcis_etl.formats import names_of
from gcis_etl.settings import Settings, parse, read_yaml

DEFAULT_RECIPE = "ptiff-jpeg-q90"
_REPO_RECIPES = Path(__file__).resolve().parent.parent / "recipes"


class MetadataRule(Settings):
    """Which embedded metadata travels from master to access master (exiftool tag names or groups)."""

    keep: tuple[str, ...] = ("EXIF:all", "XMP:all", "IPTC:all")
    exclude: tuple[str, ...] = ("MakerNotes:all", "IFD1:all", "ThumbnailImage", "PreviewImage",
                                "ICC_Profile:all", "Orientation")


JP2_ENCODERS = ("kakadu", "openjpeg", "grok")
PTIFF_ENCODERS = ("ptiff", "tifffile")  # our streaming writer (main path); tifffile + OpenCV + Pillow ImageCms
_PTIFF_ONLY = ("tile", "quality", "chroma", "fast_dct", "encode_threads")
Interpolation = Literal["area", "linear", "cubic", "lanczos4", "nearest"]  # OpenCV INTER_*
_KDU_KEYS = {"Clevels": "levels", "Clayers": "layers", "Corder": "progression"}


class Jp2Parameters(Settings):
    """JPEG 2000 coding parameters, in Kakadu's terms; openjpeg/grok arguments are derived from them.

    For kakadu, `kdu_args` is the exact vector passed to kdu_compress (the seed's parameter sets); the
    structured fields then describe what verification expects and must agree with it."""

    levels: int = Field(6, ge=1, le=32, description="wavelet decompositions (Clevels; opj/grk -n is levels+1)")
    layers: int = Field(1, ge=1, le=64, description="quality layers (Clayers)")
    precincts: tuple[tuple[int, int], ...] = ((256, 256), (256, 256), (128, 128))
    code_block: tuple[int, int] = (64, 64)
    progression: Literal["LRCP", "RLCP", "RPCL", "PCRL", "CPRL"] = "RPCL"
    tiles: tuple[int, int] | None = Field((512, 512), description="None: the whole image is one tile")
    rates: tuple[float, ...] = Field((), description="bits per pixel per layer (kdu -rate); () = lossless")
    reversible: bool = Field(False, description="5-3 reversible wavelet (Creversible); with no rates: lossless")
    plt: bool = Field(True, description="PLT markers (ORGgen_plt): packet lengths for fast random access")
    tile_parts: Literal["R", "L", "C"] | None = Field("R", description="tile-part division (ORGtparts)")
    sop: bool = True
    eph: bool = True
    ht: bool = Field(False, description="HTJ2K block coder (Part 15, Cmodes=HT)")
    kdu_args: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _consistent(self) -> "Jp2Parameters":
        if any(r <= 0 for r in self.rates):
            raise ValueError("rates must be positive bits per pixel")
        if not self.rates and not self.reversible:
            raise ValueError("lossless coding (no rates) needs reversible: true")
        if self.tiles and min(self.tiles) < 1:
            raise ValueError(f"tiles must be positive sizes (or null for one tile), got {list(self.tiles)}")
        for size in (*self.precincts, self.code_block):
            if any(v < 4 or v & (v - 1) for v in size):
                raise ValueError(f"precinct and code-block sizes must be powers of two >= 4, got {list(size)}")
        width, height = self.code_block
        if max(width, height) > 1024 or width * height > 4096:  # JPEG 2000 Part 1's limits on code-blocks
            raise ValueError(f"code_block must be at most 1024 a side and 4096 in area, got {list(self.code_block)}")
        return self

    @property
    def lossless(self) -> bool:
        return self.reversible and not self.rates


class Recipe(Settings):
    """How a master becomes an access master: the encoder and its parameters. load_recipe reads one from a file
    (its name is the file's); one built in code (`Recipe(name=..., quality=85)`) raises pydantic's
    ValidationError, and one derived with model_copy(update=...) a ConfigError. `digest` identifies the
    parameters: the ledger records it with each deposit, and `gcis-migrate reencode` (or --force) re-derives what
    another digest made. It covers the name and every field but the description, defaults included: a new field
    must default to None (which the digest leaves out) unless every access master deposited is to be re-derived."""

    name: str
    description: str = ""
    encoder: Literal["ptiff", "tifffile", "kakadu", "openjpeg", "grok"] = "ptiff"
    tile: int = Field(256, ge=16, le=4096, multiple_of=16)
    quality: int = Field(90, ge=1, le=100)
    chroma: Literal["4:2:0", "4:4:4"] = "4:2:0"
    fast_dct: bool = Field(False, description="libjpeg-turbo's faster, slightly less accurate DCT")
    encode_threads: int = Field(1, ge=1, le=16, description="tile-encoding threads beside the decoder "
                                "(tifffile: threads for the colour transform and for tile encoding)")
    # None for the other encoders, so that their digests stay what they were before this field existed
    interpolation: Interpolation | None = Field(
        None, description="tifffile only: OpenCV interpolation of each 2x pyramid reduction (default area)")
    extension: str = ".tif"
    metadata: MetadataRule = MetadataRule()
    jp2: Jp2Parameters | None = Field(None, description="required for the JPEG 2000 encoders, refused for ptiff")

    @model_validator(mode="before")
    @classmethod
    def _encoder_defaults(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("encoder") in JP2_ENCODERS and "extension" not in data:
            return {**data, "extension": ".jp2"}
        if isinstance(data, dict) and data.get("encoder") == "tifffile" and data.get("interpolation") is None:
            return {**data, "interpolation": "area"}
        return data

    @field_validator("chroma", mode="before")
    @classmethod
    def _sexagesimal_chroma(cls, value: object) -> object:
        """YAML 1.1 reads an unquoted 4:2:0 as the base-60 number 14520 (4:4:4: 14644): take it as meant. Any
        other such number is told as written, not as the number ("got 14522" for 4:2:2)."""
        if not isinstance(value, int) or isinstance(value, bool):
            return value
        meant = {14520: "4:2:0", 14644: "4:4:4"}.get(value)
        written = _sexagesimal(value)
        if meant is None and written.count(":") == 2:
            raise PydanticCustomError("value_error", "YAML reads an unquoted {written} as the number {number}: "
                                      "write it quoted, '{written}'; chroma is '4:2:0' or '4:4:4'",
                                      {"written": written, "number": value})
        return meant or value

    @model_validator(mode="after")
    def _fields_match_encoder(self) -> "Recipe":
        try:
            self._check_fields()
        except _Misfit as misfit:
            raise misfit.error(self) from None
        return self

    def _check_fields(self) -> None:
        # The scratch file and the store key end with it, and the cache copies only names ending with one of
        # its `extensions` (the same form): a path (/, ..) or a space in it would write elsewhere or go unseen.
        if not re.fullmatch(r"\.[a-z0-9]+", self.extension):
            raise _Misfit("extension", "must be a dot and lower-case letters or digits (.tif, .jp2)")
        if self.encoder != "tifffile" and self.interpolation is not None:
            raise _Misfit("interpolation", f"applies only to encoder tifffile, not {self.encoder}")
        if self.encoder in PTIFF_ENCODERS:
            if self.extension in names_of("JP2") | names_of("J2K"):
                raise _Misfit("extension", f"names JPEG 2000, but encoder {self.encoder} writes TIFF (.tif)")
            if self.jp2 is not None:
                raise _Misfit("jp2", "applies only to the encoders " + ", ".join(JP2_ENCODERS))
            if self.encoder == "tifffile" and self.fast_dct:
                raise _Misfit("fast_dct", "imagecodecs (encoder tifffile) has no fast DCT")
            return
        misplaced = sorted(set(_PTIFF_ONLY) & self.model_fields_set)
        if misplaced:
            raise _Misfit(tuple(misplaced), f"applies only to encoder ptiff or tifffile, not {self.encoder}")
        if self.jp2 is None:
            raise _Misfit("jp2", f"parameters are required for encoder {self.encoder}")
        if self.extension != ".jp2":
            raise _Misfit("extension", f"must be .jp2 for encoder {self.encoder}")
        if self.encoder == "kakadu":
            _check_kdu_args(self.jp2)
        elif self.jp2.kdu_args:
            raise _Misfit("jp2.kdu_args", f"applies only to encoder kakadu, not {self.encoder}")
        elif self.jp2.layers > 1 and len(self.jp2.rates) != self.jp2.layers:
            raise _Misfit("jp2.rates", f"{self.encoder} needs one rate per layer ({self.jp2.layers}), "
                                       f"got {len(self.jp2.rates)}")
        else:
            _check_opj_grk(self.encoder, self.jp2)

    @functools.cached_property
    def digest(self) -> str:
        """Taken once (a harvest asks for it for every item); the recipe is frozen, and model_copy drops it."""
        # exclude_none: recipes without a jp2 section keep the digests they had before it existed
        canonical = json.dumps(self.model_dump(mode="json", exclude={"description"}, exclude_none=True),
                               sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Recipe:
        """A copy; with `update`, a recipe derived in code, validated as a recipe file is (ConfigError naming each
        key: pydantic's own model_copy checks nothing, and a tile of 300 or a quality of 180 went to the encoder).
        It has another digest, which a harvest compares, but keeps this recipe's name unless `update` gives one:
        give it one when results and the ledger must not name the recipe it came from. A section given as a dict
        replaces this recipe's whole (`{"jp2": {"levels": 5}}` drops its rates): to change one of its keys, pass
        `recipe.jp2.model_copy(update={...})`."""
        if not update:
            copied = super().model_copy(deep=deep)
            copied.__dict__.pop("digest", None)  # taken again, of the same parameters
            return copied
        # the keys this recipe set, as a file sets them (encoder defaults and misplaced keys are judged as there)
        data = {**self.model_dump(exclude_unset=True),
                **{key: value.model_dump(exclude_unset=True) if isinstance(value, Settings) else value
                   for key, value in update.items()}}
        return parse(Recipe, data, f"<recipe {self.name!r} derived in code>")


class _Misfit(ValueError):
    """Recipe keys whose values do not fit the others. Raised from the model's own check, pydantic's error named no
    key ("<top>: extension must be ..."): it is raised as each key's error instead."""

    def __init__(self, keys: str | tuple[str, ...], problem: str):
        super().__init__(problem)
        self.keys = (keys,) if isinstance(keys, str) else keys

    def error(self, recipe: Recipe) -> ValidationError:
        """The error at each key (jp2.tiles: inside the jp2 section). A top-level key's value is shown after the
        problem, as for pydantic's own errors; a jp2 key's problem states the values it weighs, and the section is
        given as the input, which is not shown again."""
        details = []
        for key in self.keys:
            path = tuple(key.split("."))
            value = getattr(recipe, path[0]) if len(path) == 1 else recipe.jp2
            kind = "missing" if value is None else "value_error"  # as pydantic's own "Field required": no "got None"
            shown = value.model_dump() if isinstance(value, Settings) else value
            details.append(InitErrorDetails(type=PydanticCustomError(kind, "{problem}", {"problem": str(self)}),
                                            loc=path, input=shown))
        return ValidationError.from_exception_data(type(recipe).__name__, details)


def _sexagesimal(number: int) -> str:
    """`number` as YAML 1.1 reads an unquoted 4:2:2 (base 60, digit by digit): 14522 -> "4:2:2"."""
    digits = []
    while True:
        number, digit = divmod(number, 60)
        digits.append(str(digit))
        if not number:
            return ":".join(reversed(digits))


def _check_kdu_args(jp2: Jp2Parameters) -> None:
    """The verbatim kdu_compress vector must say what the structured fields (used to verify) say."""
    if not jp2.kdu_args:
        raise _Misfit("jp2.kdu_args", "the kdu_compress parameters are required for encoder kakadu")
    given = dict(a.split("=", 1) for a in jp2.kdu_args if a.split("=", 1)[0] in _KDU_KEYS)
    for key, field in _KDU_KEYS.items():
        if key in given and given[key] != str(getattr(jp2, field)):
            raise _Misfit("jp2.kdu_args", f"{key}={given[key]} disagrees with jp2.{field}: "
                                          f"{getattr(jp2, field)}")
    if jp2.ht != any(a.startswith("Cmodes=") and "HT" in a for a in jp2.kdu_args):
        raise _Misfit("jp2.kdu_args", f"Cmodes=HT {'missing' if jp2.ht else 'present'} but jp2.ht is "
                                      f"{jp2.ht}")
    settings = dict(a.split("=", 1) for a in jp2.kdu_args if "=" in a)
    if (settings.get("Creversible") == "yes") != jp2.reversible:
        raise _Misfit("jp2.kdu_args", f"Creversible={settings.get('Creversible', 'no (default)')} disagrees "
                                      f"with jp2.reversible: {jp2.reversible}")
    tiles = f"{{{jp2.tiles[1]},{jp2.tiles[0]}}}" if jp2.tiles else None  # Kakadu's order: {rows,columns}
    if settings.get("Stiles") != tiles:
        raise _Misfit("jp2.kdu_args", f"Stiles={settings.get('Stiles', 'none (one tile)')} disagrees with "
                                      f"jp2.tiles: {list(jp2.tiles) if jp2.tiles else None}")


def max_levels(jp2: Jp2Parameters) -> int | None:
    """The most wavelet levels opj_compress and grk_compress make right with these tiles and precincts (None: they
    set no bound), which _check_opj_grk holds a recipe to and gcis_etl.jp2 holds the levels it fits to an image to."""
    bounds = ([_tile_levels(jp2.tiles)] if jp2.tiles else []) + (
        [_precinct_levels(jp2.precincts)] if jp2.precincts else [])
    return min(bounds, default=None)


def _tile_levels(tiles: tuple[int, int]) -> int:
    return min(tiles).bit_length() - 1


def _precinct_levels(precincts: tuple[tuple[int, int], ...]) -> int:
    return len(precincts) - 1 + min(precincts[-1]).bit_length() - 1


def _check_opj_grk(encoder: str, jp2: Jp2Parameters) -> None:
    """What opj_compress (2.5) and grk_compress (10.0) cannot make although the fields validate: every
    conversion would fail, in the encoder or in verification."""
    if jp2.ht and encoder == "openjpeg":
        raise _Misfit("jp2.ht", "opj_compress cannot write HTJ2K; use encoder grok or kakadu")
    if jp2.tiles and jp2.levels > _tile_levels(jp2.tiles):
        # opj_compress: "Number of resolutions is too high in comparison to the size of tiles"; grk_compress
        # writes a file whose reductions are wrong (17 dB where 30 are asked)
        raise _Misfit("jp2.tiles", f"{encoder} needs tiles of at least 2^levels = {2 ** jp2.levels} a side for "
                                   f"{jp2.levels} levels, got {list(jp2.tiles)}: use larger tiles or at most "
                                   f"{_tile_levels(jp2.tiles)} levels")
    if jp2.ht and jp2.layers > 1:
        raise _Misfit("jp2.ht", f"{encoder} writes one quality layer with the HT block coder, not "
                                f"{jp2.layers} (verification would fail): set layers: 1")
    if jp2.precincts:
        # the encoders halve the last listed size for each lower resolution (a size below 1 becomes 2); JPEG 2000
        # Part 1 allows a precinct of 1 only at resolution 0 (jpylyzer: precinctSizeXIsValid)
        last, listed = jp2.precincts[-1], len(jp2.precincts)
        smallest = 2 ** (jp2.levels - listed + 1)  # what is still 2 at resolution 1
        if jp2.levels > _precinct_levels(jp2.precincts):
            reaches = jp2.levels - _precinct_levels(jp2.precincts)
            raise _Misfit("jp2.precincts", f"{encoder} halves the last size, {list(last)}, at each lower "
                                           f"resolution: with {jp2.levels} levels it reaches 1 at resolution "
                                           f"{reaches}, where JPEG 2000 allows 1 only at resolution 0 (the file "
                                           f"would be invalid): make the last size at least {smallest} a side, "
                                           f"list sizes for more resolutions, or use fewer levels")
    if jp2.tile_parts == "L":
        raise _Misfit("jp2.tile_parts", f"L (by layer) fails with {encoder} from a few layers and levels on "
                                        f"(3 layers at 7 levels, 4 at 5, 6 at 3: the encoder fails or writes an "
                                        f"invalid JP2): use R or C")
    if encoder == "openjpeg" and jp2.tile_parts and jp2.precincts and jp2.progression in ("LRCP", "RLCP"):
        raise _Misfit("jp2.tile_parts", f"opj_compress cannot divide into tile-parts with precincts and "
                                        f"progression {jp2.progression} (\"Cannot encode tile\"): use RPCL, PCRL "
                                        f"or CPRL, or tile_parts: null")


def recipe_dirs(folder: str | Path | None = None) -> list[Path]:
    """GCIS_RECIPES (colon-separated), then the recipes/ beside the config file (`folder`: its folder; ./recipes
    without one), then the recipes shipped beside the package: a cron job finds the recipes its config.yaml
    names whatever its working directory."""
    dirs = [Path(p) for p in os.environ.get("GCIS_RECIPES", "").split(os.pathsep) if p]
    return dirs + [Path(folder or Path.cwd()) / "recipes", _REPO_RECIPES]


def recipe_files(folder: str | Path | None = None) -> dict[str, Path]:
    """Each recipe that can be named (a recipe's name is its file's), by the first file of that name in
    recipe_dirs(folder) order: what load_recipe finds, recipe_names and `gcis-etl recipes` list."""
    found: dict[str, Path] = {}
    for directory in recipe_dirs(folder):
        for path in sorted(directory.iterdir()) if directory.is_dir() else ():
            if is_recipe_file(path) and path.is_file():
                found.setdefault(path.stem, path)
    return found


def recipe_names(folder: str | Path | None = None) -> list[str]:
    """The recipes that can be named."""
    return sorted(recipe_files(folder))


def is_recipe_file(name_or_path: str | Path) -> bool:
    """A recipe is given by path when it has a YAML file's suffix, by name otherwise."""
    return Path(name_or_path).suffix in (".yaml", ".yml")


def load_recipe(name_or_path: str | Path = DEFAULT_RECIPE, folder: str | Path | None = None) -> Recipe:
    """A recipe by name (searched in recipe_dirs(folder)) or by path to a YAML file."""
    path = Path(name_or_path)
    if not is_recipe_file(path):
        files = recipe_files(folder)
        if str(name_or_path) not in files:
            raise ConfigError(f"recipe {name_or_path!r} not found (known: {', '.join(sorted(files)) or 'none'})")
        path = files[str(name_or_path)]
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of recipe parameters")
    recipe = parse(Recipe, data, str(path))
    if recipe.name != path.stem:
        raise ConfigError(f"{path}: name: must equal the file name {path.stem!r} (got {recipe.name!r})")
    return recipe

