"""An S3 source keeps no folder times (a folder source does: tests/test_filesystem_moves.py): a key deleted from an
object whose other keys are unchanged is not listed by an incremental run, so its page stays in the manifest, as
README says; `harvest --full` lists every object and republishes that one without it."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from gcis_etl.config import load_config
from gcis_etl.harvesting import harvest
from tests.emulators import FAST_RETRY
from tests.emulators.catalogue import CORPUS

IMAGES = "https://iiif.example.org/iiif"
GCIS = str(Path(sys.executable).with_name("gcis-etl"))


def test_a_key_deleted_from_an_object_is_seen_by_a_full_run_only(minio, s3_bucket, aws_env, tmp_path):
    client = minio.client()
    for page in ("p1", "p2"):
        client.put_object(Bucket=s3_bucket, Key=f"masters/objA/{page}.tif", Body=(CORPUS / "gray8/gray.tif").read_bytes())
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "pipelines": {"s3": {
        "source": {"kind": "s3", "bucket": s3_bucket, "prefix": "masters", "endpoint_url": minio.endpoint,
                   "addressing_style": "path", "retry": FAST_RETRY},
        "store": {"kind": "local", "root": str(tmp_path / "store")}, "overlap_seconds": 0,
        "manifests": {"manifest_base_url": "https://iiif.example.org/store", "image_service_base_url": IMAGES}}}}))
    cfg = load_config(tmp_path / "config.yaml")
    time.sleep(1.1)  # LastModified counts whole seconds: the checkpoint is then after both uploads
    assert harvest(cfg, "s3").counts["deposited"] == 2
    client.delete_object(Bucket=s3_bucket, Key="masters/objA/p2.tif")

    incremental = harvest(cfg, "s3")
    assert (incremental.status, sum(incremental.counts.values()), incremental.manifests) == ("completed", 0, 0)
    assert pages(tmp_path) == ["objA~2Fp1.tif.tif", "objA~2Fp2.tif.tif"]

    full = subprocess.run([GCIS, "--config", str(tmp_path / "config.yaml"), "harvest", "s3", "--full"],
                          capture_output=True, text=True, timeout=120)
    assert full.returncode == 0, full.stderr
    assert "run 3 completed: 0 deposited" in full.stdout and "1 skipped" in full.stdout, full.stdout
    assert pages(tmp_path) == ["objA~2Fp1.tif.tif"]


def test_full_cannot_go_with_a_narrower_listing(tmp_path):
    for narrower in (["--since", "7d"], ["--object", "objA"]):
        ran = subprocess.run([GCIS, "--config", str(tmp_path / "none.yaml"), "harvest", "--full", *narrower],
                             capture_output=True, text=True, timeout=60)
        assert ran.returncode == 2 and "--full lists the whole source" in ran.stderr, ran.stderr


def pages(tmp_path) -> list[str]:
    """The access masters the deposited manifest shows: the last segment of each canvas's image service id."""
    manifest = json.loads((tmp_path / "store" / "s3" / "objA" / "manifest-v3.json").read_text())
    return [c["items"][0]["items"][0]["body"]["service"][0]["@id"].rsplit("/", 1)[-1] for c in manifest["items"]]
