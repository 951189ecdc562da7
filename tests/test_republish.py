"""The manifests' settings changed (a new domain): `gcis-migrate initial_load` publishes every manifest again under
them, converting nothing, and the collection names each object once, under the new base URL."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.emulators.catalogue import CORPUS

BIN = Path(sys.executable).parent
MASTERS = {"o1/a.tif": "rgb8-tiff-uncompressed/hopper.tif", "o2/b.tif": "rgb8-tiff-lzw/hopper_lzw.tif"}
CONFIG = """\
state_dir: state
pipelines:
  p:
    source: {{kind: filesystem, root: masters}}
    store: {{kind: local, root: store}}
    manifests:
      manifest_base_url: {base}/store
      image_service_base_url: {base}/iiif
      versions: ["3.0", "2.1"]
"""


def run(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    done = subprocess.run([str(BIN / argv[0]), "--config", str(tmp_path / "config.yaml"), *argv[1:]],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_initial_load_moves_every_manifest_and_the_collection_to_a_new_base_url(tmp_path):
    for name, corpus in MASTERS.items():
        (tmp_path / "masters" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(CORPUS / corpus, tmp_path / "masters" / name)
    (tmp_path / "config.yaml").write_text(CONFIG.format(base="http://old.example"))
    run(tmp_path, "gcis-etl", "harvest")
    images = {p: p.stat().st_mtime_ns for p in (tmp_path / "store").rglob("*.tif")}
    assert len(images) == 2

    (tmp_path / "config.yaml").write_text(CONFIG.format(base="https://new.example"))
    loaded = run(tmp_path, "gcis-migrate", "initial_load", "--pipeline", "p")
    assert "2 skipped" in loaded.stdout and "2 manifests published" in loaded.stdout, loaded.stdout
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "store").rglob("*.tif")} == images  # nothing converted
    published = [p for p in (tmp_path / "store").rglob("*.json") if ".meta" not in p.parts]
    assert len(published) == 6  # two manifests in two versions, the collection in two
    for path in published:
        assert "old.example" not in path.read_text(), path
    v3 = json.loads((tmp_path / "store" / "collections" / "p-v3.json").read_text())
    v2 = json.loads((tmp_path / "store" / "collections" / "p-v2.json").read_text())
    assert [item["id"] for item in v3["items"]] == [f"https://new.example/store/p/{o}/manifest-v3.json"
                                                   for o in ("o1", "o2")]
    assert [m["@id"] for m in v2["manifests"]] == [f"https://new.example/store/p/{o}/manifest-v2.json"
                                                  for o in ("o1", "o2")]
