"""config.yaml with pipelines: a table of broken configurations, each with the message an operator should see."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gcis_etl.config import load_config
from connectors.redaction import scrub
from gcis_etl.errors import ConfigError
from gcis_etl.settings import masked

ROOT = Path(__file__).resolve().parent.parent

GOOD_PIPELINE = {
    "source": {"kind": "filesystem", "root": "masters"},
    "store": {"kind": "local", "root": "store"},
    "manifests": {"manifest_base_url": "https://iiif.example.org/store",
                  "image_service_base_url": "https://iiif.example.org/iiif"},
}
BOTH_VERSIONS = {**GOOD_PIPELINE["manifests"], "versions": ["3.0", "2.1"]}


def write(tmp_path: Path, data) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


def with_pipeline(**changes) -> dict:
    pipeline = {**GOOD_PIPELINE, **changes}
    return {"pipelines": {"museum": {k: v for k, v in pipeline.items() if v is not None}}}


BROKEN = [
    ("no source", with_pipeline(source=None), "pipelines.museum.source: Field required"),
    ("no store", with_pipeline(store=None), "pipelines.museum.store: Field required"),
    ("unknown connector", with_pipeline(source={"kind": "dropbox"}),
     "pipelines.museum.source.kind: unknown source connector 'dropbox'; known: filesystem, otmm, rosetta, s3"),
    ("connector option missing", with_pipeline(source={"kind": "filesystem"}),
     "pipelines.museum.source.root: Field required"),
    ("connector option misspelt", with_pipeline(source={"kind": "filesystem", "root": "m", "grupping": {}}),
     "pipelines.museum.source.grupping: unknown key (did you mean 'grouping'?)"),
    ("unknown store kind", with_pipeline(store={"kind": "ftp"}),
     "pipelines.museum.store: Input tag 'ftp' found using 'kind' does not match any of the expected tags"),
    ("bad bucket name", with_pipeline(store={"kind": "s3", "bucket": "Not_A_Bucket"}),
     "pipelines.museum.store.bucket: String should match pattern"),
    ("unknown recipe", with_pipeline(recipe="ptiff-jpeg-q95"),
     "pipelines.museum.recipe: recipe 'ptiff-jpeg-q95' not found"),
    ("unknown default recipe, no pipeline", {"defaults": {"recipe": "nosuch"}},
     "defaults.recipe: recipe 'nosuch' not found"),
    ("S3 endpoint with credentials", with_pipeline(store={"kind": "s3", "bucket": "iiif",
                                                          "endpoint_url": "https://k:pw@s3.example.org"}),
     "pipelines.museum.store.endpoint_url: must not carry credentials"),
    ("background out of range", {"imaging": {"background": [255, 300, -1]}},
     "imaging.background.1: Input should be less than or equal to 255 (got 300)"),
    ("bad executor", with_pipeline(executor="threads"),
     "pipelines.museum.executor: Input should be 'local' or 'celery' (got 'threads')"),
    ("zero concurrency", with_pipeline(concurrency=0),
     "pipelines.museum.concurrency: Input should be greater than or equal to 1 (got 0)"),
    ("manifest URL without scheme", with_pipeline(manifests={**GOOD_PIPELINE["manifests"],
                                                             "manifest_base_url": "iiif.example.org"}),
     "pipelines.museum.manifests.manifest_base_url: must be an http(s) URL"),
    ("pipeline imaging override", with_pipeline(imaging={"max_megapixels": -1}),
     "pipelines.museum.imaging.max_megapixels: Input should be greater than 0 (got -1)"),
    ("bad pipeline name", {"pipelines": {"Museum Collection": GOOD_PIPELINE}},
     "pipelines.Museum Collection: a pipeline name is lower-case letters"),
    ("pipeline not a mapping", {"pipelines": {"museum": "rosetta"}},
     "pipelines.museum: expected a mapping with at least source:"),
    ("pipelines not a mapping", {"pipelines": ["museum"]}, "pipelines: expected a mapping of pipeline name"),
    ("bad default", {"defaults": {"max_attempts": 0}, **with_pipeline()},
     "defaults.max_attempts: Input should be greater than or equal to 1 (got 0)"),
    ("default inherited, then wrong", {"defaults": {"overlap_seconds": "soon"}, **with_pipeline()},
     "defaults.overlap_seconds: Input should be a valid number"),
    ("bad journal mode", {"ledger": {"journal_mode": "memory"}}, "ledger.journal_mode: Input should be 'wal'"),
    ("unknown top-level key", {"pipeline": {}}, "pipeline: unknown key (did you mean 'pipelines'?)"),
    ("unknown key, nothing close", {"vips": {}}, "vips: unknown key (keys here: cache, celery, defaults, imaging, "
                                                 "isolation, ledger, pipelines, state_dir)"),
    ("pipeline key misspelt", with_pipeline(concurency=3),
     "pipelines.museum.concurency: unknown key (did you mean 'concurrency'?)"),
    ("isolation key misspelt", {"isolation": {"vips_concurency": 2}},
     "isolation.vips_concurency: unknown key (did you mean 'vips_concurrency'?)"),
    ("S3 store key misspelt", with_pipeline(store={"kind": "s3", "bucket": "iiif", "endpointurl": "http://s3"}),
     "pipelines.museum.store.endpointurl: unknown key (did you mean 'endpoint_url'?)"),
    ("background by name", {"imaging": {"background": "white"}},
     "imaging.background: expected a list of 3 values, each 0-255, e.g. [255, 255, 255] (got 'white')"),
    ("source setting that fails its check for want of its variable",
     with_pipeline(source={"kind": "otmm", "base_url": "${GCIS_TEST_UNSET_URL}", "username": "etl",
                           "password": "${GCIS_TEST_UNSET_PASSWORD}"}),
     "pipelines.museum.source.base_url: environment variable GCIS_TEST_UNSET_URL is not set"),
    ("missing variable outside a source", with_pipeline(manifests={**GOOD_PIPELINE["manifests"],
                                                                   "manifest_base_url": "${GCIS_TEST_UNSET_URL}"}),
     "pipelines.museum.manifests.manifest_base_url: environment variable GCIS_TEST_UNSET_URL is not set"),
    ("source URL template with a misspelt placeholder",
     with_pipeline(source={"kind": "otmm", "base_url": "https://otmm.example.org", "username": "etl",
                           "password": "p", "source_url_template": "{base_url}/otmm/ux-html/?p=asset&id={idd}"}),
     "pipelines.museum.source.source_url_template: unknown placeholder {idd}; the template may use "
     "{id}, {base_url}"),
    ("source URL template with an unclosed placeholder",
     with_pipeline(source={"kind": "rosetta", "base_url": "https://rosetta.example.org", "username": "etl",
                           "password": "p", "oai": {"set": "gcis"},
                           "source_url_template": "{delivery_base_url}/delivery/DeliveryManagerServlet?dps_pid={id"}),
     "pipelines.museum.source.source_url_template: '{id' is not a placeholder (expected '}' before "
     "end of string; a literal brace is written twice); the template may use {id}, {delivery_base_url}"),
    ("CMYK profile missing", {"imaging": {"cmyk_fallback_profile": "profiles/fogra.icc"}},
     "imaging.cmyk_fallback_profile: no such file: "),
    ("not YAML", "pipelines: [unclosed", "not valid YAML"),
    # key templates on which the 2.1 document would overwrite the 3.0 one (or an object's images one another)
    ("manifest key without {version}, two versions",
     with_pipeline(store={"kind": "local", "root": "store",
                          "keys": {"manifest": "{pipeline}/{object_id}/manifest.json"}}, manifests=BOTH_VERSIONS),
     "pipelines.museum.store.keys.manifest: must use {version} when manifests.versions lists 3.0, 2.1"),
    ("collection key without {version}, two versions",
     with_pipeline(store={"kind": "s3", "bucket": "iiif", "keys": {"collection": "collections/{pipeline}.json"}},
                   manifests=BOTH_VERSIONS),
     "pipelines.museum.store.keys.collection: must use {version} when manifests.versions lists 3.0, 2.1"),
    ("image key without {item_id} or {sequence}",
     with_pipeline(store={"kind": "local", "root": "store", "keys": {"image": "{pipeline}/{object_id}.{ext}"}}),
     "pipelines.museum.store.keys.image: must use {item_id} or {sequence}"),
    ("manifest key without {object_id}",
     with_pipeline(store={"kind": "local", "root": "store", "keys": {"manifest": "{pipeline}/v{version}.json"}}),
     "pipelines.museum.store.keys.manifest: must use {object_id}"),
    # names that would match nothing, silently: every TIFF rejected, a decoder order or a limit never used
    ("format in lower case", {"imaging": {"accepted_formats": ["tiff", "JPEG"]}},
     "imaging.accepted_formats: unknown format 'tiff': formats are named as they are recognised "
     "from content (TIFF, BigTIFF, JPEG, PNG, JP2, J2K, "),
    ("decoders of a misspelt format", with_pipeline(imaging={"decoders": {"TIF": ["tifffile"]}}),
     "pipelines.museum.imaging.decoders: unknown format 'TIF'"),
    ("time limit of a misspelt recipe", {"celery": {"time_limits": {
        "default": {"soft_seconds": 10, "hard_seconds": 20}, "jp2-openjpeg-lossey": {"soft_seconds": 10,
                                                                                    "hard_seconds": 20}}}},
     "celery.time_limits: no recipe 'jp2-openjpeg-lossey' (recipes: jp2-grok-htj2k, "),
    ("time limits without a default", {"celery": {"time_limits": {"jp2-openjpeg-lossy": {"soft_seconds": 10,
                                                                                      "hard_seconds": 20}}}},
     "celery.time_limits: needs a 'default' entry"),  # a model's check naming its field: at that field's key
    ("background of two values", {"imaging": {"background": [255, 255]}},
     "imaging.background: expected a list of 3 values, each 0-255, e.g. [255, 255, 255] (got [255, 255])"),
    ("queue of a misspelt recipe", {"celery": {"queues": {"slow": {"recipes": ["ptiff-tiffile-q90"]}}}},
     "celery.queues.slow.recipes: no recipe 'ptiff-tiffile-q90' (recipes: "),
    ("cache of a misspelt pipeline", {"cache": {"pipelines": ["musuem"]}, **with_pipeline()},
     "cache.pipelines: no pipeline 'musuem' (pipelines: museum)"),
    ("manifests asking for more than the cache's iipsrv renders",
     {"cache": {"server": {"max_cvt": 4000}},
      **with_pipeline(manifests={**GOOD_PIPELINE["manifests"], "max_image_size": 5000})},
     "pipelines.museum.manifests.max_image_size: more than cache.server.max_cvt, the largest size the iipsrv "
     "serving this pipeline's images renders"),
]


@pytest.mark.parametrize("data, expected", [(d, e) for _, d, e in BROKEN], ids=[name for name, _, _ in BROKEN])
def test_broken_config_is_refused_with_file_key_and_expectation(tmp_path, data, expected, monkeypatch):
    monkeypatch.delenv("GCIS_TEST_UNSET_PASSWORD", raising=False)
    monkeypatch.delenv("GCIS_TEST_UNSET_URL", raising=False)
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert expected in message
    assert str(path) in message


@pytest.mark.parametrize("given", [[255, 255], [255, 300, 255, 0]], ids=["two", "four, one out of bounds"])
def test_a_fixed_size_list_of_another_size_is_one_error_at_its_key(tmp_path, given):
    """It was "imaging.background.2: Field required" (and one more line for each value out of bounds)."""
    path = write(tmp_path, {"imaging": {"background": given}})
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == (f"{path}: imaging.background: expected a list of 3 values, each 0-255, "
                                 f"e.g. [255, 255, 255] (got {given})")


def test_a_sources_unset_secret_is_needed_only_to_open_the_source(tmp_path, monkeypatch):
    """status, report and cache read the configuration but never the DAM: its password may be absent there.
    Opening the source fills it in, and fails naming the file, the key and the variable."""
    monkeypatch.delenv("GCIS_TEST_UNSET_PASSWORD", raising=False)
    path = write(tmp_path, with_pipeline(source={"kind": "rosetta", "base_url": "https://rosetta.example.org",
                                                 "username": "etl", "password": "${GCIS_TEST_UNSET_PASSWORD}",
                                                 "oai": {"set": "gcis"}}))
    cfg = load_config(path)
    with pytest.raises(ConfigError) as caught:
        cfg.pipeline("museum").source
    assert str(caught.value) == (f"{path}: pipelines.museum.source.password: environment variable "
                                 "GCIS_TEST_UNSET_PASSWORD is not set")
    monkeypatch.setenv("GCIS_TEST_UNSET_PASSWORD", "Harvest-pw-1")
    cfg = load_config(path)
    assert cfg.pipeline("museum").source.settings.password.get_secret_value() == "Harvest-pw-1"
    assert "Harvest-pw-1" not in str(cfg.printable())


def test_an_environment_value_is_not_filled_in_twice(tmp_path, monkeypatch):
    """A password may hold a literal ${...}: the source gets it as the environment holds it."""
    monkeypatch.setenv("GCIS_TEST_PASSWORD", "a${GCIS_TEST_UNSET_PASSWORD}b")
    monkeypatch.delenv("GCIS_TEST_UNSET_PASSWORD", raising=False)
    cfg = load_config(write(tmp_path, with_pipeline(source={
        "kind": "rosetta", "base_url": "https://rosetta.example.org", "username": "etl",
        "password": "${GCIS_TEST_PASSWORD}", "oai": {"set": "gcis"}})))
    assert cfg.pipeline("museum").source.settings.password.get_secret_value() == "a${GCIS_TEST_UNSET_PASSWORD}b"


def test_pipeline_inherits_defaults_and_overrides_single_policy_keys(tmp_path):
    data = {"imaging": {"max_megapixels": 500, "strict": False}, "isolation": {"timeout_seconds": 60},
            "defaults": {"concurrency": 3, "max_attempts": 5},
            "pipelines": {"museum": {**GOOD_PIPELINE, "max_attempts": 2, "imaging": {"max_megapixels": 200}},
                          "library": GOOD_PIPELINE}}
    cfg = load_config(write(tmp_path, data))
    museum, library = cfg.pipelines["museum"], cfg.pipelines["library"]
    assert (museum.concurrency, museum.max_attempts) == (3, 2)
    assert (library.concurrency, library.max_attempts) == (3, 5)
    assert museum.imaging.max_megapixels == 200 and museum.imaging.strict is False  # merged key by key
    assert library.imaging.max_megapixels == 500
    assert museum.isolation.timeout_seconds == 60


def test_manifests_ask_for_no_more_than_the_configured_iipsrv_renders_unless_told_otherwise(tmp_path):
    """cache.server.max_cvt is the one number: iipsrv's MAX_CVT and the manifests' limit. A pipeline sets its
    own only below it, or when this cache does not serve its images (another image server)."""
    def limits(data: dict) -> dict[str, int]:
        return {name: p.manifests.max_image_size for name, p in load_config(write(tmp_path, data)).pipelines.items()}

    assert limits(with_pipeline()) == {"museum": 5000}  # iipsrv's default, as deploy/iipsrv runs it
    pipelines = {"museum": GOOD_PIPELINE,
                 "library": {**GOOD_PIPELINE, "manifests": {**GOOD_PIPELINE["manifests"], "max_image_size": 300}},
                 "archive": {**GOOD_PIPELINE, "manifests": {**GOOD_PIPELINE["manifests"], "max_image_size": 9000}}}
    assert limits({"cache": {"pipelines": ["museum", "library"], "server": {"max_cvt": 600}},
                   "pipelines": pipelines}) == {"museum": 600, "library": 300, "archive": 9000}


def test_one_manifest_key_per_object_is_fine_when_one_version_is_deposited(tmp_path):
    keys = {"manifest": "{pipeline}/{object_id}/manifest.json", "collection": "collections/{pipeline}.json"}
    cfg = load_config(write(tmp_path, with_pipeline(store={"kind": "local", "root": "store", "keys": keys})))
    assert cfg.pipeline("museum").store.keys.manifest_key("museum", "o1", 3) == "museum/o1/manifest.json"


def test_relative_paths_are_relative_to_the_config_file(tmp_path, monkeypatch):
    folder = tmp_path / "etc"
    (folder / "profiles").mkdir(parents=True)
    (folder / "profiles" / "press.icc").write_bytes(b"")
    monkeypatch.chdir(tmp_path)  # a cron job's working directory is not the config's
    cfg = load_config(write(folder, {"imaging": {"cmyk_fallback_profile": "profiles/press.icc"},
                                     **with_pipeline(imaging={"cmyk_fallback_profile": "profiles/press.icc"})}))
    assert cfg.imaging.cmyk_fallback_profile == str(folder / "profiles/press.icc")
    assert cfg.pipelines["museum"].imaging.cmyk_fallback_profile == str(folder / "profiles/press.icc")
    assert cfg.state_dir == folder / "var/state"
    assert cfg.ledger_path == folder / "var/state/ledger.sqlite"
    assert cfg.pipelines["museum"].store.root == folder / "store"
    assert Path(cfg.pipelines["museum"].source.options["root"]) == folder / "masters"


def test_config_check_prints_the_resolved_config_with_secrets_masked(tmp_path):
    secret = "s3cr3t-Value-42"
    data = with_pipeline(source={"kind": "otmm", "base_url": "https://otmm.example.org", "username": "etl",
                                 "password": "${GCIS_TEST_PASSWORD}"})
    path = write(tmp_path, data)
    env = {"GCIS_TEST_PASSWORD": secret, "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "gcis_etl.cli", "--config", str(path), "config", "check"],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert secret not in done.stdout + done.stderr
    resolved = yaml.safe_load(done.stdout)
    assert resolved["pipelines"]["museum"]["source"]["password"] == "********"
    assert resolved["pipelines"]["museum"]["source"]["username"] == "etl"
    assert resolved["pipelines"]["museum"]["recipe"] == "ptiff-jpeg-q90"  # defaults filled in


def test_config_check_masks_every_value_from_the_environment_whatever_its_key(tmp_path):
    api_key, basic = "gateway-KEY-abcdef123", "dXNlcjpnYXRld2F5"
    data = with_pipeline(source={"kind": "otmm", "base_url": "https://otmm.example.org", "username": "etl",
                                 "password": "${GCIS_TEST_PASSWORD}",
                                 "extra_headers": {"X-Gateway": "${GCIS_TEST_API_KEY}",
                                                   "Authorization": "Basic ${GCIS_TEST_BASIC}",
                                                   "X-OTMM-Locale": "en_US"}})
    env = {"GCIS_TEST_PASSWORD": "pw-42", "GCIS_TEST_API_KEY": api_key, "GCIS_TEST_BASIC": basic,
           "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "gcis_etl.cli", "--config", str(write(tmp_path, data)),
                           "config", "check"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert api_key not in done.stdout and basic not in done.stdout
    headers = yaml.safe_load(done.stdout)["pipelines"]["museum"]["source"]["extra_headers"]
    assert headers == {"X-Gateway": "********", "Authorization": "********", "X-OTMM-Locale": "en_US"}


@pytest.mark.parametrize("key, value", [("X-Api-Key", "literal-key-1"), ("Authorization", "Bearer abc123"),
                                        ("Cookie", "session=abc123"), ("api_key", "k-9")])
def test_secret_looking_keys_are_masked_even_when_written_in_the_file(key, value):
    assert masked({"extra_headers": {key: value, "Accept-Language": "en"}}) == {
        "extra_headers": {key: "********", "Accept-Language": "en"}}


def test_a_password_written_into_a_url_is_masked():
    assert masked({"source": {"base_url": "https://etl:Hunter2-pw@otmm.example.org/otmmapi", "root": "m"}}) == {
        "source": {"base_url": "https://etl:********@otmm.example.org/otmmapi", "root": "m"}}


def test_a_password_from_the_environment_in_a_published_url_is_refused_unseen(tmp_path, monkeypatch):
    monkeypatch.setenv("GCIS_TEST_MAN_PASSWORD", "EnvSecret-4242")
    data = with_pipeline(manifests={**GOOD_PIPELINE["manifests"],
                                    "manifest_base_url": "https://stage:${GCIS_TEST_MAN_PASSWORD}@cdn.example/x"})
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, data))
    message = str(caught.value)
    assert "pipelines.museum.manifests.manifest_base_url: must not carry credentials" in message
    assert "EnvSecret-4242" not in message


def test_a_switch_under_a_secret_looking_key_is_shown():
    assert masked({"bearer_otmm_token": False, "client_secret": None}) == {"bearer_otmm_token": False,
                                                                           "client_secret": None}


def test_opening_an_otmm_source_keeps_its_header_values_out_of_messages(tmp_path, monkeypatch):
    monkeypatch.setenv("GCIS_TEST_API_KEY", "gateway-KEY-0f1e2d")
    data = with_pipeline(source={"kind": "otmm", "base_url": "https://otmm.example.org", "username": "etl",
                                 "password": "pw-42", "extra_headers": {"X-Gateway": "${GCIS_TEST_API_KEY}"}})
    load_config(write(tmp_path, data)).pipeline("museum").source  # opening touches no network
    assert scrub("401 from gateway: key gateway-KEY-0f1e2d refused") == "401 from gateway: key *** refused"


def test_an_absolute_path_from_the_environment_stays_absolute(tmp_path, monkeypatch):
    monkeypatch.setenv("GCIS_TEST_STATE", str(tmp_path / "elsewhere"))
    folder = tmp_path / "etc"
    folder.mkdir()
    cfg = load_config(write(folder, {"state_dir": "${GCIS_TEST_STATE}"}))
    assert cfg.state_dir == tmp_path / "elsewhere"
    assert cfg.printable()["state_dir"] == "********"


def test_config_check_exits_2_and_names_the_key(tmp_path):
    path = write(tmp_path, with_pipeline(concurrency="many"))
    done = subprocess.run([sys.executable, "-m", "gcis_etl.cli", "--config", str(path), "config", "check"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2
    assert f"{path}: pipelines.museum.concurrency: Input should be a valid integer" in done.stderr


def test_the_shipped_config_is_valid_and_harvests_the_samples():
    cfg = load_config(ROOT / "config.yaml")
    samples = cfg.pipeline("samples")
    assert samples.settings.source.kind == "filesystem"
    assert Path(samples.settings.source.options["root"]) == ROOT / "samples/masters"
    assert samples.settings.store.root == ROOT / "var/store"
    assert samples.manifests is not None
    assert samples.manifests.settings.max_image_size == cfg.cache.server.max_cvt == 5000


@pytest.mark.parametrize("data, key", [
    (with_pipeline(source={"kind": "otmm", "base_url": "https://otmm.example.org", "username": "etl",
                           "passwd": "${GCIS_TEST_PASSWORD}"}), "pipelines.museum.source.passwd"),
    (with_pipeline(concurrency="${GCIS_TEST_PASSWORD}"), "pipelines.museum.concurrency"),
], ids=["misspelt secret key", "secret in a number's place"])
def test_a_value_from_the_environment_is_never_shown_in_an_error(tmp_path, monkeypatch, data, key):
    monkeypatch.setenv("GCIS_TEST_PASSWORD", "hunter2-not-to-be-seen")
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, data))
    message = str(caught.value)
    assert f"{key}: " in message and "(got a value from the environment, not shown)" in message
    assert "hunter2" not in message


def test_credentials_written_into_the_config_are_never_shown_in_an_error(tmp_path):
    """S3 credentials come from boto3's chain, so these keys are refused; the refusal names them, never the
    values (an access key id was shown)."""
    data = with_pipeline(store={"kind": "s3", "bucket": "b", "aws_access_key_id": "AKIAEXAMPLEKEYID",
                                "aws_secret_access_key": "wJalrEXAMPLESECRET"})
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, data))
    message = str(caught.value)
    assert "pipelines.museum.store.aws_access_key_id: unknown key (keys here: " in message
    assert "pipelines.museum.store.aws_secret_access_key: unknown key (keys here: " in message
    assert "AKIAEXAMPLE" not in message and "EXAMPLESECRET" not in message


def test_a_recipe_given_by_path_can_be_named_in_the_celery_section(tmp_path):
    recipe = tmp_path / "house-ptiff.yaml"
    recipe.write_text((ROOT / "recipes" / "ptiff-jpeg-q90.yaml").read_text().replace(
        "name: ptiff-jpeg-q90", "name: house-ptiff"))
    data = {**with_pipeline(recipe=str(recipe)),
            "celery": {"time_limits": {"default": {}, "house-ptiff": {"soft_seconds": 10, "hard_seconds": 20}},
                       "queues": {"house": {"recipes": ["house-ptiff"]}}}}
    config = load_config(write(tmp_path, data))
    assert config.celery.queue_for(config.pipeline("museum").recipe) == "house"
    assert config.celery.limits_for(config.pipeline("museum").recipe).hard_seconds == 20


def recipe_file(folder: Path, name: str, quality: int = 80) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text((ROOT / "recipes" / "ptiff-jpeg-q90.yaml").read_text()
                    .replace("name: ptiff-jpeg-q90", f"name: {name}").replace("quality: 90", f"quality: {quality}"))
    return path


@pytest.mark.parametrize("recipe", ["museum-q80", "recipes/museum-q80.yaml"], ids=["name", "relative path"])
def test_a_recipe_is_found_beside_the_config_file_whatever_the_working_directory(tmp_path, monkeypatch, recipe):
    """The README's cron line runs `gcis-etl --config /etc/gcis-etl/config.yaml harvest` from cron's folder."""
    etc = tmp_path / "etc"
    recipe_file(etc / "recipes", "museum-q80")
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(tmp_path / "home")
    config = load_config(write(etc, {"defaults": {"recipe": recipe}, **with_pipeline(recipe=recipe)}))
    assert config.pipeline("museum").recipe.quality == 80
    assert config.defaults.recipe in ("museum-q80", str(etc / "recipes/museum-q80.yaml"))


def test_the_recipes_beside_the_config_file_come_before_the_shipped_ones(tmp_path, monkeypatch):
    recipe_file(tmp_path / "etc" / "recipes", "ptiff-jpeg-q90", quality=70)
    monkeypatch.chdir(ROOT)  # whose ./recipes holds the shipped one
    config = load_config(write(tmp_path / "etc", with_pipeline(recipe="ptiff-jpeg-q90")))
    assert config.pipeline("museum").recipe.quality == 70


def test_source_files_are_relative_to_the_config_file(tmp_path, monkeypatch):
    etc = tmp_path / "etc"
    (etc / "certs").mkdir(parents=True)
    (etc / "certs" / "ca.pem").write_text("")  # a bundle path must name a file
    monkeypatch.chdir(tmp_path)
    rosetta = {"kind": "rosetta", "base_url": "https://rosetta.example.org", "username": "etl", "password": "pw-42",
               "discovery": "pids",
               "pid_list": {"file": "pids.txt"}, "verify_tls": "certs/ca.pem"}
    otmm = {"kind": "otmm", "base_url": "https://otmm.example.org", "username": "etl", "password": "pw-42",
            "discovery": "ids", "id_list": {"file": "lists/ids.txt"}, "verify_tls": "${GCIS_TEST_VERIFY}"}
    monkeypatch.setenv("GCIS_TEST_VERIFY", "false")
    config = load_config(write(etc, {"pipelines": {"a": {**GOOD_PIPELINE, "source": rosetta},
                                                   "b": {**GOOD_PIPELINE, "source": otmm}}}))
    a, b = (config.pipeline(name).source.settings for name in ("a", "b"))
    assert (a.pid_list.file, a.verify_tls) == (etc / "pids.txt", str(etc / "certs/ca.pem"))
    assert (b.id_list.file, b.verify_tls) == (etc / "lists/ids.txt", False)  # a switch, not a bundle named false


@pytest.mark.parametrize("broken, shown", [
    ("name: broken\nencoder: ptiff\nquality: 90\n chroma: '4:2:0'\n", ["line 4, column 8"]),
    ("name: broken\nencoder: ptiff\nqualty: 90\ntile: 100\n", ["tile: Input should be a multiple of 16",
                                                                   "qualty: unknown key (did you mean 'quality'?)"]),
], ids=["not YAML", "two errors"])
def test_a_broken_recipe_named_by_a_pipeline_is_shown_whole(tmp_path, broken, shown):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "broken.yaml").write_text(broken)
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, with_pipeline(recipe="broken")))
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'config.yaml'}: pipelines.museum.recipe: "
                              f"{tmp_path / 'recipes' / 'broken.yaml'}: ")
    assert all(part in message for part in shown)


def test_config_check_shows_a_url_whose_variable_is_only_its_password(tmp_path):
    """README: a ${VARIABLE} value is a secret, "of a URL, only its password": the operator checks the host.
    A URL a variable put anywhere else (its host, its path, the whole URL) stays masked whole."""
    data = with_pipeline(source={"kind": "otmm", "base_url": "https://gateway:${GCIS_TEST_GATEWAY}@otmm.example.org/x",
                                 "username": "etl", "password": "${GCIS_TEST_PASSWORD}"})
    data["pipelines"]["museum"]["manifests"]["image_service_base_url"] = "https://${GCIS_TEST_IMAGE_HOST}/iiif"
    env = {"GCIS_TEST_GATEWAY": "Hunter2-pw", "GCIS_TEST_PASSWORD": "pw-4242", "GCIS_TEST_IMAGE_HOST": "images.internal",
           "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "gcis_etl.cli", "--config", str(write(tmp_path, data)),
                           "config", "check"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    for secret in ("Hunter2-pw", "pw-4242", "images.internal"):
        assert secret not in done.stdout
    pipeline = yaml.safe_load(done.stdout)["pipelines"]["museum"]
    assert pipeline["source"]["base_url"] == "https://gateway:********@otmm.example.org/x"
    assert pipeline["manifests"]["image_service_base_url"] == "********"
