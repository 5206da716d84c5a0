"""The key index's tail: which of `slice_ids`' commits above the index's version it must
read, by slice, and when it must fall back to a scan."""

from __future__ import annotations

import json

from slicewise.key_index import Run, Tail, keys_named, run_name, tail_of


def commit(version: int, operation: str = "WRITE", slice_id: str | None = None) -> dict:
    meta = json.dumps({"step": "silver", "slice_id": slice_id}) if slice_id else None
    return {"version": version, "operation": operation, "userMetadata": meta}


def test_the_slices_written_above_the_index_version_are_the_tail():
    history = [commit(7, slice_id="c"), commit(6, "OPTIMIZE"), commit(5, slice_id="b"),
               commit(4, slice_id="a")]  # fmt: skip
    assert tail_of(history, 4) == Tail(7, ("b", "c"))
    assert tail_of(history, 3) == Tail(7, ("a", "b", "c"))


def test_nothing_above_the_index_version_is_an_empty_tail():
    assert tail_of([commit(4, slice_id="a")], 4) == Tail(4, ())
    assert tail_of([commit(6, "VACUUM END"), commit(5, "VACUUM START")], 4) == Tail(6, ())


def test_a_history_that_does_not_reach_back_is_no_tail():
    assert tail_of([commit(9, slice_id="c"), commit(8, slice_id="b")], 4) is None


def test_a_commit_that_may_change_rows_without_naming_its_slice_is_no_tail():
    assert tail_of([commit(6), commit(5, slice_id="b")], 4) is None
    assert tail_of([commit(5, "DELETE")], 4) is None
    broken = {"version": 5, "operation": "WRITE", "userMetadata": "not json"}
    assert tail_of([broken], 4) is None


def test_a_run_s_tier_grows_with_its_keys_by_the_fanout():
    from slicewise.key_index import FANOUT, FIRST_TIER_KEYS, Run

    assert Run("000000000001-000000000009", 10).tier == 0
    assert Run("x-y", FIRST_TIER_KEYS).tier == 0
    assert Run("x-y", FIRST_TIER_KEYS + 1).tier == 1
    assert Run("x-y", FIRST_TIER_KEYS * FANOUT + 1).tier == 2
    assert Run("000000000001-000000000009", 10).span == (1, 9)


def test_a_runs_name_holds_its_versions_and_its_size():
    name = run_name(17, 32, 19_200)
    assert name == "000000000017-000000000032-19200"
    assert (Run(name, keys_named(name)).span, keys_named(name)) == ((17, 32), 19_200)
    assert Run(name, 400_000).tier == 1  # above 50,000, up to 50,000 x 8
    # A run named before names held sizes: its size is counted (`_runs`).
    assert keys_named("000000000000-000000000016") is None
    assert Run("000000000000-000000000016", 10).span == (0, 16)
