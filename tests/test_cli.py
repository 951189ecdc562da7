"""The CLI contract that scripts and later issues rely on (run as real subprocesses)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gcis_etl
from tests.conftest import CORPUS

GCIS = [str(Path(sys.executable).with_name("gcis-etl"))]


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(GCIS + list(args), capture_output=True, text=True, cwd=cwd, timeout=120)


def test_inspect_json_lines_have_the_contract_fields():
    files = [CORPUS / "icc-adobergb/example.tif", CORPUS / "zero-byte/empty.tif"]
    proc = run("inspect", "--json", *map(str, files))
    assert proc.returncode == 1  # one of them is rejected
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(rows) == 2
    for key in ("path", "format", "width", "height", "bands", "bit_depth", "interpretation", "icc", "pages",
                "exif", "xmp", "iptc", "verdict", "reasons", "warnings"):
        assert key in rows[0]
    assert rows[0]["verdict"] == "accept-after-conversion" and rows[0]["icc"] == "Adobe RGB (1998)"
    assert rows[1]["verdict"] == "reject" and "zero-byte" in rows[1]["reasons"][0]


def test_inspect_decodes_by_default_and_not_with_header_only():
    corrupt = str(CORPUS / "corrupt-but-decodable/corrupt.jpg")
    assert json.loads(run("inspect", "--json", corrupt).stdout)["verdict"] == "reject"
    assert json.loads(run("inspect", "--json", "--header-only", corrupt).stdout)["verdict"] == "accept"


def test_convert_json_and_exit_codes(tmp_path):
    proc = run("convert", "--json", str(CORPUS / "jpeg-baseline/flowers.jpeg"), str(tmp_path / "f.tif"))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    for key in ("status", "reason", "output", "width", "height", "levels", "bytes", "sha256", "seconds"):
        assert key in result
    assert result["status"] == "converted" and (result["width"], result["height"]) == (1920, 1080)
    assert result["levels"] == 4 and result["bytes"] == (tmp_path / "f.tif").stat().st_size
    rejected = run("convert", "--json", str(CORPUS / "wrong-extension/invalid.tif"), str(tmp_path / "x.tif"))
    assert rejected.returncode == 1 and json.loads(rejected.stdout)["status"] == "rejected"


def test_convert_never_replaces_its_master_and_says_why_it_cannot_write(tmp_path):
    master = tmp_path / "master.tif"
    master.write_bytes((CORPUS / "rgb8-tiff-uncompressed/hopper.tif").read_bytes())
    before = master.read_bytes()
    same = run("convert", "--json", str(master), str(master))
    assert same.returncode == 1 and "is the master itself" in json.loads(same.stdout)["reason"], same.stderr
    assert master.read_bytes() == before
    (tmp_path / "plain-file").write_text("")
    blocked = run("convert", "--json", str(master), str(tmp_path / "plain-file" / "out.tif"))
    assert blocked.returncode == 1 and "Traceback" not in blocked.stderr, blocked.stderr
    result = json.loads(blocked.stdout)
    assert result["status"] == "failed" and result["reason"].startswith(f"cannot write {tmp_path}/plain-file/out.tif")


def test_convert_refuses_a_name_iipsrv_cannot_serve_before_any_work_and_warns_of_a_misleading_one(tmp_path):
    master = str(CORPUS / "jpeg-baseline/flowers.jpeg")
    sequence = run("convert", master, str(tmp_path / "folio_pyr_001.tif"))
    assert sequence.returncode == 2 and "3-D sequence marker" in sequence.stderr and "Traceback" not in sequence.stderr
    assert list(tmp_path.iterdir()) == []
    misleading = run("convert", "--json", master, str(tmp_path / "access.jp2"))
    result = json.loads(misleading.stdout)
    assert misleading.returncode == 0 and result["status"] == "converted"
    assert "access.jp2: recipe ptiff-jpeg-q90 writes TIFF, which is usually named .tif or .tiff" in result["warnings"]
    assert not any("usually named" in w for w in json.loads(run("convert", "--json", master, str(
        tmp_path / "access.TIFF")).stdout)["warnings"])
    renamed = tmp_path / "folio_PYR_001.tif"  # the same file, under a name verification refuses in any case
    renamed.write_bytes((tmp_path / "access.TIFF").read_bytes())
    report = run("verify", "--json", str(renamed))
    assert report.returncode == 1 and any("3-D sequence marker" in e for e in json.loads(report.stdout)["errors"])


def test_inspect_passes_over_a_folder_among_its_files(tmp_path):
    (tmp_path / "sub").mkdir()
    good = tmp_path / "a.jpg"
    good.write_bytes((CORPUS / "jpeg-baseline/flowers.jpeg").read_bytes())
    proc = run("inspect", "--json", "--header-only", str(tmp_path / "sub"), str(good))
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line)["path"] for line in proc.stdout.splitlines()] == [str(good)]
    assert proc.stderr == f"{tmp_path / 'sub'}: a folder, passed over\n"
    only_folders = run("inspect", str(tmp_path / "sub"))
    assert only_folders.returncode == 2 and only_folders.stdout == "", only_folders.stderr
    assert "no file to inspect: every argument is a folder" in only_folders.stderr


def test_inspect_says_a_fifo_among_its_files_cannot_be_read_and_checks_the_others(tmp_path):
    fifo, good = tmp_path / "upload.tif", tmp_path / "a.jpg"
    os.mkfifo(fifo)
    good.write_bytes((CORPUS / "jpeg-baseline/flowers.jpeg").read_bytes())
    for mode in (["--header-only"], []):
        proc = run("inspect", "--json", *mode, str(fifo), str(good))
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert f"{fifo}: cannot read: it is a FIFO (named pipe), not a regular file, not checked" in proc.stderr
        assert [json.loads(line)["path"] for line in proc.stdout.splitlines()] == [str(good)]


def test_verify_exit_codes(tmp_path):
    assert run("convert", str(CORPUS / "png/exif.png"), str(tmp_path / "ok.tif")).returncode == 0
    good = run("verify", "--json", "--recipe", "ptiff-jpeg-q90", str(tmp_path / "ok.tif"))
    assert good.returncode == 0 and json.loads(good.stdout)["valid"] is True
    not_a_pyramid = run("verify", "--json", str(CORPUS / "rgb8-tiff-lzw/kodim02-lzw.tif"))
    report = json.loads(not_a_pyramid.stdout)
    assert not_a_pyramid.returncode == 1 and any("not tiled" in e for e in report["errors"])
    for usage in ([str(tmp_path / "missing.tif")], [str(tmp_path)], ["-r", "no-such-recipe", str(tmp_path / "ok.tif")],
                  ["-r", "jp2-openjpeg-lossy", str(tmp_path / "ok.tif")]):
        assert run("verify", *usage).returncode == 2, usage
    assert "2 on a usage or configuration error" in " ".join(run("verify", "--help").stdout.split())


def test_verify_checks_a_jp2_on_its_own(tmp_path):
    jp2 = tmp_path / "ok.jp2"
    assert run("convert", "-r", "jp2-openjpeg-lossy", str(CORPUS / "png/exif.png"), str(jp2)).returncode == 0
    good = run("verify", "--json", "-r", "jp2-openjpeg-lossy", str(jp2))
    assert good.returncode == 0 and json.loads(good.stdout)["valid"] is True, good.stdout
    other = json.loads(run("verify", "--json", "-r", "jp2-grok-htj2k", str(jp2)).stdout)
    assert "ht is False, expected True" in other["errors"]
    cut = tmp_path / "cut.jp2"
    cut.write_bytes(jp2.read_bytes()[:len(jp2.read_bytes()) // 2])
    broken = run("verify", "--json", str(cut))
    assert broken.returncode == 1 and any("jpylyzer: not a valid JP2" in e for e in json.loads(broken.stdout)["errors"])
    mismatch = run("verify", "-r", "ptiff-jpeg-q90", str(jp2))
    assert mismatch.returncode == 2 and "is a JP2, and recipe ptiff-jpeg-q90 makes pyramidal TIFF" in mismatch.stderr


def test_verify_prints_its_warnings_after_the_verdict_on_stderr_as_convert_does(tmp_path):
    """Only --json had them: the text said nothing of an HTJ2K codestream in a Part 1 wrapper."""
    jp2 = tmp_path / "ht.jp2"
    assert run("convert", "-r", "jp2-grok-htj2k", str(CORPUS / "png/exif.png"), str(jp2)).returncode == 0
    proc = run("verify", "-r", "jp2-grok-htj2k", str(jp2))
    assert proc.returncode == 0 and proc.stdout.startswith(f"{jp2}: valid access master"), proc
    assert proc.stderr.startswith("    warning: HTJ2K codestream in a JP2 (Part 1) wrapper: jpylyzer's rsiz test "
                                  "fails"), proc.stderr


def test_verify_names_the_file_by_its_absolute_path_as_inspect_and_convert_do(tmp_path, monkeypatch):
    assert run("convert", str(CORPUS / "png/exif.png"), str(tmp_path / "ok.tif")).returncode == 0
    good = run("verify", "--json", "ok.tif", cwd=tmp_path)
    assert good.returncode == 0 and json.loads(good.stdout)["path"] == str(tmp_path / "ok.tif"), good.stdout
    monkeypatch.chdir(tmp_path)
    missing = gcis_etl.verify("nosuch.tif")
    assert missing.path == str(tmp_path / "nosuch.tif") and str(tmp_path / "nosuch.tif") in missing.errors[0]


def test_gcis_migrate_takes_config_before_the_scripts_name_and_says_where_other_options_go(tmp_path):
    (tmp_path / "masters" / "a").mkdir(parents=True)
    (tmp_path / "masters" / "a" / "p1.png").write_bytes((CORPUS / "png/exif.png").read_bytes())
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "config.yaml").write_text(
        "state_dir: state\npipelines:\n  p:\n    source: {kind: filesystem, root: ../masters}\n"
        "    store: {kind: local, root: ../store}\n")
    migrate = [str(Path(sys.executable).with_name("gcis-migrate"))]
    before = subprocess.run(migrate + ["--config", "etc/config.yaml", "initial_load", "--pipeline", "p", "--dry-run"],
                            capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert before.returncode == 0 and "1 would process" in before.stdout, before.stdout + before.stderr
    misplaced = subprocess.run(migrate + ["--dry-run", "initial_load", "--pipeline", "p"], capture_output=True,
                               text=True, cwd=tmp_path, timeout=120)
    assert misplaced.returncode == 2 and "the script's options go after its name" in misplaced.stderr


def test_unknown_recipe_is_a_usage_error(tmp_path):
    proc = run("convert", "-r", "no-such-recipe", str(CORPUS / "png/exif.png"), str(tmp_path / "a.tif"))
    assert proc.returncode == 2 and "no-such-recipe" in proc.stderr and "ptiff-jpeg-q90" in proc.stderr


def test_broken_config_is_refused_with_file_and_key(tmp_path):
    bad = tmp_path / "config.yaml"
    bad.write_text("imaging:\n  max_megapixels: lots\n")
    proc = run("--config", str(bad), "inspect", str(CORPUS / "png/exif.png"))
    assert proc.returncode == 2
    assert f"{bad}: imaging.max_megapixels:" in proc.stderr and "'lots'" in proc.stderr


def test_config_policy_applies(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("imaging:\n  max_megapixels: 1\n")
    proc = run("--config", str(cfg), "inspect", "--json", str(CORPUS / "jpeg-baseline/flowers.jpeg"))
    row = json.loads(proc.stdout)
    assert row["verdict"] == "reject" and "over the 1 Mpx limit" in row["reasons"][0]
    cfg.write_text("imaging:\n  max_megapixels: 1.5\n")  # it used to read "2 Mpx is over the 2 Mpx limit"
    proc = run("--config", str(cfg), "inspect", "--json", str(CORPUS / "jpeg-baseline/flowers.jpeg"))
    assert "1920x1080 = 2.0736 Mpx is over the 1.5 Mpx limit" in json.loads(proc.stdout)["reasons"][0]


def test_commands_on_one_file_need_no_pipeline_secret_and_find_recipes_beside_the_config(tmp_path):
    """A pipeline's unset ${VAR} does not stop inspect, convert or verify; the policy and a recipe named
    from the config's folder still apply, whatever the working directory."""
    etc = tmp_path / "etc"
    (etc / "recipes").mkdir(parents=True)
    (etc / "recipes" / "house-444.yaml").write_text((Path(__file__).parent.parent / "recipes" / "ptiff-jpeg-q90.yaml")
                                                    .read_text().replace("name: ptiff-jpeg-q90", "name: house-444")
                                                    .replace('chroma: "4:2:0"', 'chroma: "4:4:4"'))
    cfg = etc / "config.yaml"
    cfg.write_text("imaging: {max_megapixels: 1.5}\n"
                   "pipelines:\n  museum:\n    source: {kind: otmm, base_url: 'https://otmm.example.org', "
                   "username: etl, password: '${GCIS_TEST_UNSET_SECRET}'}\n    store: {kind: local, root: st}\n")
    flowers, png, out = str(CORPUS / "jpeg-baseline/flowers.jpeg"), str(CORPUS / "png/exif.png"), tmp_path / "a.tif"
    row = json.loads(run("--config", str(cfg), "inspect", "--json", "--header-only", flowers, cwd=tmp_path).stdout)
    assert "over the 1.5 Mpx limit" in row["reasons"][0]
    converted = run("--config", str(cfg), "convert", "--json", "-r", "house-444", png, str(out), cwd=tmp_path)
    assert converted.returncode == 0, converted.stderr
    verified = run("--config", str(cfg), "verify", "--json", "-r", "house-444", str(out), cwd=tmp_path)
    assert verified.returncode == 0, verified.stdout
    assert "house-444" in run("--config", str(cfg), "recipes", cwd=tmp_path).stdout
    refused = run("--config", str(cfg), "config", "check", cwd=tmp_path)
    assert refused.returncode == 2 and "GCIS_TEST_UNSET_SECRET is not set" in refused.stderr


@pytest.mark.parametrize("command", ["inspect", "convert", "verify"])
def test_help_teaches_with_an_example(command):
    proc = run(command, "--help")
    assert proc.returncode == 0 and "Example" in proc.stdout


def test_verify_that_cannot_finish_under_the_isolation_limits_says_so_and_exits_1(tmp_path):
    """Verification runs in the conversion process: a crash there, or memory or time running out (here: less
    time than loading libvips takes), leaves the file unverified: one line naming it and why, no traceback."""
    assert run("convert", str(CORPUS / "png/exif.png"), str(tmp_path / "ok.tif")).returncode == 0
    (tmp_path / "config.yaml").write_text("isolation: {timeout_seconds: 0.01}\n")
    proc = run("--config", str(tmp_path / "config.yaml"), "verify", str(tmp_path / "ok.tif"))
    assert proc.returncode == 1, proc.stderr
    assert f"{tmp_path / 'ok.tif'}: not verified: timed out" in proc.stderr and "Traceback" not in proc.stderr
