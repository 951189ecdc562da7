"""What a walk of move_store found in its limit and its words: `--limit N` looked at the ledger's first N keys
on every run, those moved already counting, so a run again never went on; a dry run said "would copy" of a key
the real run counts as "replaced"; after a switch to a store published elsewhere, nothing said the copied
manifests still name the old store's base URL. Local stores, gcis-migrate in a subprocess."""
from __future__ import annotations

import os
import time

from tests.test_migrations import MANIFESTS, PIPELINE, folder_site, ok, report_of

OTHER = "{kind: local, root: other}"


def test_a_limit_counts_the_keys_a_run_copies_so_each_run_again_goes_on(tmp_path):
    site = folder_site(tmp_path)
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    runs = [report_of(ok(site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", OTHER, "--limit", "3")))
            for _ in range(3)]
    assert [(run["status"], run["counts"]) for run in runs] == [
        ("stopped", {"copied": 3}), ("stopped", {"present": 3, "copied": 3}), ("completed", {"present": 6, "copied": 2})]
    assert "stopped at the limit of 3 keys copied or deleted" in runs[1]["notes"][0]
    assert site.stored(site.root / "other") == site.stored()


def test_a_dry_run_says_it_would_replace_what_the_real_run_replaces(tmp_path):
    site = folder_site(tmp_path)
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    key = next(iter(site.stored()))
    (site.root / "other" / key).parent.mkdir(parents=True)
    (site.root / "other" / key).write_bytes(b"another tool's object")
    out = ok(site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", OTHER, "--dry-run"))
    assert out.startswith("move_store: dry-run: ") and "1 would replace" in out and "7 would copy" in out, out
    out = ok(site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", OTHER))
    assert report_of(out)["counts"] == {"replaced": 1, "copied": 7}, out


def test_a_switch_to_a_new_manifest_base_url_is_named_until_the_manifests_are_published_again(tmp_path):
    site = folder_site(tmp_path)
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    an_hour_ago = time.time() - 3600
    for published in site.store.rglob("*.json"):  # as in a store in use: the last publish wrote the target's
        os.utime(published, (an_hour_ago, an_hour_ago))
    out = ok(site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", OTHER))
    assert "manifests.manifest_base_url" in out and f"`gcis-migrate initial_load --pipeline {PIPELINE}`" in out
    moved = {**MANIFESTS, "manifest_base_url": "https://new.example.org/store"}
    site.configure({"kind": "local", "root": "other"}, manifests=moved)
    out = ok(site.migrate("move_store", "--pipeline", PIPELINE, "--from-store", "{kind: local, root: store}"))
    [stale] = [note for note in report_of(out)["notes"] if "manifest_base_url" in note]
    assert stale.startswith(f"the manifests in the target name {MANIFESTS['manifest_base_url']}/"), stale
    assert "not https://new.example.org/store/" in stale
    assert stale.endswith(f"`gcis-migrate initial_load --pipeline {PIPELINE}` publishes them again under it")

    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    out = ok(site.migrate("move_store", "--pipeline", PIPELINE, "--from-store", "{kind: local, root: store}",
                          "--delete-source"))
    assert "manifest_base_url" not in out, out
    assert site.stored() == {}


def test_keys_that_fail_every_run_do_not_count_against_the_limit(tmp_path):
    """A damaged access master fails on every run (its bytes are not the ledger's): counted, a run of --limit 1
    stopped on the first of them every time, and never went on."""
    site = folder_site(tmp_path)
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    damaged = [key for key in site.stored() if not key.endswith(".json")]
    for key in damaged:
        (site.store / key).write_bytes(b"damaged")
    runs = [report_of(ok(site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", OTHER, "--limit", "1"),
                         1)) for _ in range(2)]
    assert [run["counts"].get("copied", 0) for run in runs] == [1, 1]
    assert runs[1]["counts"].get("present") == 1 and runs[1]["counts"]["failed"] == len(damaged)
