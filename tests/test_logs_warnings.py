"""Python warnings under --log-json: an S3 source over https with verify_tls: false made urllib3 print its
InsecureRequestWarning as two raw lines on stderr for every request, which broke --log-json and made cron mail
every run. Now it is one JSON log line per host. Real MinIO over TLS (a self-signed certificate), gcis-etl in a
subprocess."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
import yaml
from botocore.config import Config

from tests.conftest import CORPUS
from tests.servers import free_port, minio_binary, terminate, wait_for_port

BIN = Path(sys.executable).parent
KEY, SECRET = "gcis-tls-access", "gcis-tls-secret-key"


@pytest.fixture
def tls_minio(tmp_path):
    """A MinIO serving https with a self-signed certificate for 127.0.0.1: its endpoint."""
    certs = tmp_path / "certs"
    certs.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(certs / "private.key"),
                    "-out", str(certs / "public.crt")], check=True, capture_output=True)
    port = free_port()
    proc = subprocess.Popen([minio_binary(), "server", str(tmp_path / "data"), "--address", f"127.0.0.1:{port}",
                             "--certs-dir", str(certs), "--quiet"],
                            env={**os.environ, "MINIO_ROOT_USER": KEY, "MINIO_ROOT_PASSWORD": SECRET,
                                 "MINIO_BROWSER": "off", "MINIO_UPDATE": "off"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, proc)
        yield f"https://127.0.0.1:{port}"
    finally:
        terminate(proc)


@pytest.mark.filterwarnings("ignore:Unverified HTTPS request")
def test_an_unverified_https_source_logs_one_json_warning_per_host_not_two_raw_lines_per_request(tmp_path, tls_minio):
    client = boto3.client("s3", endpoint_url=tls_minio, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                          region_name="us-east-1", verify=False, config=Config(s3={"addressing_style": "path"},
                                                                              retries={"max_attempts": 10}))
    client.create_bucket(Bucket="masters")
    for name, corpus in {"a/p1.png": "png/png-rgb-64x56x8.png", "b/x.jpg": "gray8/hopper_gray.jpg"}.items():
        client.put_object(Bucket="masters", Key=name, Body=(CORPUS / corpus).read_bytes())
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"state_dir": "state", "pipelines": {"museum": {
        "source": {"kind": "s3", "bucket": "masters", "endpoint_url": tls_minio, "verify_tls": False,
                   "access_key_id": KEY, "secret_access_key": SECRET, "addressing_style": "path"},
        "store": {"kind": "local", "root": "store"}}}}))
    run = subprocess.run([str(BIN / "gcis-etl"), "harvest", "--log-json"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "GCIS_CONFIG": str(tmp_path / "config.yaml")})
    assert run.returncode == 0, run.stdout + run.stderr
    lines = [json.loads(line) for line in run.stderr.splitlines()]  # every line JSON
    warned = [line for line in lines if line.get("warning") == "InsecureRequestWarning"]
    assert len(warned) == 1, run.stderr  # the run made many requests, all to one host
    assert warned[0]["level"] == "warning" and "'127.0.0.1'" in warned[0]["message"], warned
    assert SECRET not in run.stderr
    assert [line["status"] for line in lines if "status" in line] == ["completed"], run.stderr
