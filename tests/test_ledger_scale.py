"""The ledger's queries that a run makes per object, or every run, read the rows they return, not the pipeline's:
their results, and SQLite's plans for the statements the ledger runs (bench/ledger.py for the times)."""
from __future__ import annotations

import pickle
import sqlite3
from dataclasses import replace
from pathlib import Path

from gcis_etl.ledger import Ledger
from gcis_etl.recipes import Recipe, load_recipe
from gcis_etl.work import ItemResult, Outcome

P = "museum"


def plans(ledger: Ledger, call) -> tuple[object, list[str]]:
    """What `call` returns, and SQLite's plans of the SELECTs the ledger ran for it."""
    statements: list[str] = []
    ledger.db.set_trace_callback(statements.append)  # with the values bound: as run
    try:
        result = call()
        result = list(result) if not isinstance(result, (list, dict)) else result
    finally:
        ledger.db.set_trace_callback(None)
    selects = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
    assert selects
    return result, [" / ".join(row[-1] for row in ledger.db.execute("EXPLAIN QUERY PLAN " + s)) for s in selects]


def supersede_many(ledger: Ledger) -> dict[str, list[str]]:
    """Keys superseded for 40 objects in this pipeline (and the same ids in another), interleaved as a run
    would record them; object o17 has 11."""
    keys: dict[str, list[str]] = {}
    for n in range(11):
        for number in range(40):
            obj = f"o{number:02d}"
            if n < (11 if obj == "o17" else number % 4):
                key = f"{P}/{obj}/{obj}~2Fp{n:02d}.tif"
                ledger.supersede(P, obj, f"{obj}/p{n}", key, 1)
                ledger.supersede("other", obj, f"{obj}/p{n}", f"other/{obj}/{n}.tif", 1)
                keys.setdefault(obj, []).append(key)
    return keys


def test_one_objects_superseded_keys_among_many_others_are_exactly_its_own_over_pages_read_through_its_index(
        tmp_path: Path):
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        keys = supersede_many(ledger)
        for page in (3, 11, 1000):  # pages that split it, that it fills exactly, that it does not fill
            found, used = plans(ledger, lambda: ledger.superseded(P, "o17", page=page))
            assert [(s.object_id, s.key) for s in found] == [("o17", key) for key in keys["o17"]]
            assert len(used) == 1 + (11 // page if page < 1000 else 0)  # and an empty page when it fills them
            assert set(used) == {"SEARCH superseded USING INDEX superseded_by_object "
                                 "(pipeline=? AND object_id=? AND key>?)"}
        assert [s.key for s in ledger.superseded(P, "o01", page=1)] == keys["o01"]
        found, [plan] = plans(ledger, lambda: ledger.superseded(P, "o00"))  # one with none
        assert found == [] and "superseded_by_object (pipeline=? AND object_id=? AND key>?)" in plan

        every, _ = plans(ledger, lambda: ledger.superseded(P, page=4))  # all of the pipeline's: as before
        assert [(s.object_id, s.key) for s in every] == [(obj, key) for obj in sorted(keys) for key in keys[obj]]
        assert ledger.superseded_count(P) == len(every)


def result(obj: str, n: int, outcome: Outcome, attempt: int = 1) -> ItemResult:
    return ItemResult(P, obj, f"{obj}/p{n}.tif", 10 - n, outcome, f"size:{n}", "default", "d1", attempt,
                      reason=None if outcome is Outcome.DEPOSITED else f"{outcome.value} {obj} {n}",
                      key=f"{P}/{obj}/{n}.tif" if outcome is Outcome.DEPOSITED else None)


def test_failed_items_are_listed_as_before_from_the_status_index_not_the_pipelines_items(tmp_path: Path):
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        run = ledger.begin_run(P, None, None, {})
        failed = []  # (object_id, sequence, item_id, attempts), as items(status="failed") orders them
        counts = {"deposited": 0, "skipped": 0, "rejected": 0, "failed": 0}
        for number in range(60):
            obj = f"o{number:02d}"
            for n in range(4):
                outcome = Outcome.FAILED if (number + n) % 9 == 0 else Outcome.REJECTED if n == 3 \
                    else Outcome.DEPOSITED
                attempts = 1 + (number + n) % 4 if outcome is Outcome.FAILED else 1
                for attempt in range(1, attempts + 1):
                    ledger.record(run, result(obj, n, outcome, attempt), None)
                counts[outcome.value] += 1
                if outcome is Outcome.FAILED:
                    failed.append((obj, 10 - n, f"{obj}/p{n}.tif", attempts))
        ledger.record(run, replace(result("o05", 0, Outcome.FAILED), pipeline="other"), None)
        failed.sort()
        assert len(failed) > 20 and {attempts for *_, attempts in failed} == {1, 2, 3, 4}

        listed, [plan] = plans(ledger, lambda: ledger.items(P, status="failed"))
        assert [(r.object_id, r.sequence, r.item_id, r.attempts) for r in listed] == failed
        assert plan.startswith("SEARCH items USING INDEX items_by_status (pipeline=? AND status=?)")
        first, [plan] = plans(ledger, lambda: ledger.items(P, status="failed", limit=5))
        assert first == listed[:5] and "items_by_status (pipeline=? AND status=?)" in plan

        # as a harvest asks, every run: those with attempts left, and those out of them, a page at a time
        for where, wanted in (("attempts<?", lambda a: a < 3), ("attempts>=?", lambda a: a >= 3)):
            found, used = plans(ledger, lambda: ledger.iter_items(P, f"status='failed' AND {where}", (3,), page=2))
            assert [(r.object_id, r.item_id) for r in found] == sorted((o, i) for o, _, i, a in failed if wanted(a))
            assert len(used) > 2 and all(p == "SEARCH items USING INDEX items_by_status "
                                              "(pipeline=? AND status=? AND (object_id,item_id)>(?,?))" for p in used)

        objects, [plan] = plans(ledger, lambda: ledger.objects_with(P, "failed"))
        assert objects == sorted({o for o, *_ in failed})
        assert plan == "SEARCH items USING COVERING INDEX items_by_status (pipeline=? AND status=?)"
        assert ledger.counts(P) == counts


def test_a_ledger_with_the_older_narrower_indexes_gets_the_new_ones_when_opened_keeping_its_rows(tmp_path: Path):
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        run = ledger.begin_run(P, None, None, {})
        ledger.record(run, result("a", 1, Outcome.FAILED), None)
        ledger.supersede(P, "a", "a/p1.tif", f"{P}/a/old.tif", run)
    db = sqlite3.connect(path)  # as the version before made them
    db.executescript("DROP INDEX items_by_status; DROP INDEX superseded_by_object; "
                     "CREATE INDEX items_status ON items (pipeline, status); "
                     "CREATE INDEX superseded_object ON superseded (pipeline, object_id);")
    db.close()

    with Ledger(path, read_only=True) as ledger:  # reads it as it is, changing nothing
        assert [r.item_id for r in ledger.items(P, status="failed")] == ["a/p1.tif"]
    with Ledger(path) as ledger:
        indexes = {row[0] for row in ledger.db.execute("SELECT name FROM sqlite_master WHERE type='index' AND "
                                                       "name NOT LIKE 'sqlite_autoindex%'")}
        assert indexes == {"items_by_status", "items_by_item", "superseded_by_object"}
        assert [r.item_id for r in ledger.items(P, status="failed")] == ["a/p1.tif"]
        found, [plan] = plans(ledger, lambda: ledger.superseded(P, "a"))
        assert [s.key for s in found] == [f"{P}/a/old.tif"] and "superseded_by_object" in plan


def test_a_recipes_digest_is_taken_once_and_is_no_field_and_a_copy_with_other_parameters_takes_its_own():
    recipe = load_recipe()
    digest = recipe.digest
    assert recipe.digest is digest  # kept, not taken again for every item a harvest plans
    assert "digest" not in recipe.model_dump() and "digest" not in Recipe.model_fields
    assert recipe == load_recipe() and hash(recipe) == hash(load_recipe())  # one taken or not: equal
    assert pickle.loads(pickle.dumps(recipe)).digest == digest == load_recipe().digest
    other = recipe.model_copy(update={"quality": recipe.quality - 10})
    assert other.digest != digest
    assert other.digest == Recipe.model_validate(recipe.model_dump() | {"quality": recipe.quality - 10}).digest
    assert recipe.model_copy().digest == digest
