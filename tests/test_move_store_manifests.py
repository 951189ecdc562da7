"""move_store after the switch (--delete-source): of a manifest that differs between the old store and the
pipeline's, the ledger tells which copy is current, whichever store it is in: a harvest may have republished it
into the old store between the copy and the switch. Real local stores and harvests, run as an operator runs them."""
from __future__ import annotations

import os
import shlex
import shutil
import time
from pathlib import Path

from gcis_etl.migration import store_settings
from gcis_etl.stores import open_store
from tests import test_migrations
from tests.conftest import CORPUS
from tests.test_migrations import PIPELINE, Site, image_references, ok, report_of

site = test_migrations.site  # the fixture: a config.yaml, four masters, a local store

OLD = "{kind: local, root: store}"
MANIFEST = "museum/b/manifest-v3.json"


def copy_then_switch_later(site: Site) -> Path:
    """Step 1 into stores/new (a relative root: under the store file's folder), and the pipeline switched to it."""
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    (site.root / "stores").mkdir()
    (site.root / "stores" / "new.yaml").write_text("kind: local\nroot: new\n")
    out = ok(site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", "stores/new.yaml"))
    new = site.root / "stores" / "new"
    assert f"at the new store, {new} (a relative root as resolved)" in out
    return new


def edit_b(site: Site, store: str) -> None:
    """b's master changes, and a harvest re-derives it under another key (another recipe's extension) into
    `store`: the old key is retired there, b's manifest republished there."""
    site.configure({"kind": "local", "root": store}, recipe="jp2-openjpeg-lossless")
    edited = site.root / "masters" / "b" / "x.jpg"
    shutil.copy(CORPUS / "gray8/hopper_gray.jpg", edited)
    os.utime(edited, (edited.stat().st_mtime + 5,) * 2)
    assert "1 deposited" in ok(site.run("gcis-etl", "harvest"))
    assert site.items()["b/x.jpg"][2] == "museum/b/b~2Fx.jpg.jp2"


def delete_source(site: Site, code: int = 0) -> str:
    return ok(site.migrate("move_store", "--pipeline", PIPELINE, "--from-store", OLD, "--delete-source"), code)


def csv_rows(out: str) -> dict[str, list[str]]:
    rows = Path(report_of(out)["csv_path"]).read_text().splitlines()[1:]
    return {row.split(",")[0]: row.split(",", 2)[1:] for row in rows if "deleted from the source" not in row}


def test_a_manifest_a_harvest_republished_into_the_old_store_before_the_switch_replaces_the_new_stores(site):
    """The walk: the stale manifest of the new store showed the retired access master, and was served."""
    new = copy_then_switch_later(site)
    edit_b(site, "store")  # the cron harvest, before config.yaml is switched
    current = site.stored()[MANIFEST]
    assert site.stored(new)[MANIFEST] != current

    site.configure({"kind": "local", "root": "stores/new"}, recipe="jp2-openjpeg-lossless")
    out = delete_source(site)
    assert report_of(out)["counts"] == {"present": 6, "copied": 1, "replaced": 1, "deleted from the source": 8}
    assert site.stored(new)[MANIFEST] == current and site.stored() == {}
    assert image_references(site.stored(new)) == {key for _, _, key in site.items().values()}
    outcome, reason = csv_rows(out)[MANIFEST]
    assert outcome == "replaced" and "stale: only the source's copy lists the access masters" in reason
    assert "nothing to do" not in ok(site.run("gcis-etl", "harvest"))  # and nothing left to heal


def test_a_manifest_republished_into_the_new_store_after_the_switch_is_kept(site):
    new = copy_then_switch_later(site)
    edit_b(site, "stores/new")
    current = site.stored(new)[MANIFEST]

    out = delete_source(site)
    assert report_of(out)["counts"] == {"present": 7, "newer in the target": 1, "deleted from the source": 7}
    assert site.stored(new)[MANIFEST] == current
    assert list(site.stored()) == ["museum/b/b~2Fx.jpg.tif"]  # retired in the new store: no ledger key names it
    outcome, reason = csv_rows(out)[MANIFEST]
    assert outcome == "newer in the target" and "only the target's copy lists the access masters" in reason


def put_manifest(root: Path, key: str, data: bytes) -> None:
    store = open_store(store_settings(f"{{kind: local, root: {root}}}", "--store"))
    store.put_bytes(key, data, content_type="application/ld+json")


def test_a_difference_the_ledger_cannot_settle_is_a_problem_the_source_keeps_and_its_remedy_settles(site):
    new = copy_then_switch_later(site)
    site.configure({"kind": "local", "root": "stores/new"})
    old = site.stored()
    put_manifest(new, MANIFEST, old["museum/a/manifest-v3.json"])  # neither shows b's access master
    put_manifest(site.store, MANIFEST, old["museum/c/manifest-v3.json"])
    wrong = site.stored()[MANIFEST]

    out = delete_source(site, code=1)
    assert f"failed: {MANIFEST}: " in out and "neither lists the access masters" in out
    remedy = f"gcis-etl harvest {PIPELINE} --force --object b"
    assert f"`{remedy}` republishes it into the pipeline's store" in out
    assert site.stored() == {MANIFEST: wrong}  # every other key deleted from the source; not this one

    ok(site.run(*shlex.split(remedy)))
    out = delete_source(site)
    assert report_of(out)["counts"] == {"present": 7, "newer in the target": 1, "deleted from the source": 1}
    assert site.stored() == {} and site.stored(new)[MANIFEST] == old[MANIFEST]


def test_a_manifest_differing_in_metadata_only_is_current_where_the_ledgers_last_publish_wrote_it(site):
    """Both copies show b's access masters (an item label changed): the source's was written by the last publish,
    the target's (the copy, a day before) was not."""
    (site.root / "masters" / "objects.csv").write_text(
        "object_id,file,label\na,a/p1.png,one\na,a/p2.jpg,two\nb,b/x.jpg,recto\nc,c/y.tif,why\n")
    new = copy_then_switch_later(site)
    day_ago = time.time() - 86400
    for path in new.rglob("*"):
        os.utime(path, (day_ago, day_ago))
    time.sleep(1)
    (site.root / "masters" / "objects.csv").write_text(
        "object_id,file,label\na,a/p1.png,one\na,a/p2.jpg,two\nb,b/x.jpg,verso\nc,c/y.tif,why\n")
    ok(site.run("gcis-etl", "harvest"))  # before the switch
    current = site.stored()[MANIFEST]
    assert b"verso" in current and b"recto" in site.stored(new)[MANIFEST]

    site.configure({"kind": "local", "root": "stores/new"})
    out = delete_source(site)
    assert report_of(out)["counts"]["replaced"] == 1
    assert site.stored(new)[MANIFEST] == current and site.stored() == {}
    outcome, reason = csv_rows(out)[MANIFEST]
    assert outcome == "replaced" and "the last publish wrote the source's copy" in reason
