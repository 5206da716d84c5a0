"""The chaos record: runs appended across sessions sum into one table (no services)."""

from __future__ import annotations

import json
import subprocess

from chaos_log import Row, append, code_version, main, summed


def test_runs_recorded_apart_sum_per_scenario_and_failures_fail_the_report(tmp_path, capsys):
    record = tmp_path / "runs.jsonl"
    append(record, Row("zombie", runs=1, struck=3, events=280, quarantined=9), 1, 300.0, None)
    append(record, Row("zombie", runs=1, struck=2, events=270, quarantined=8), 2, 310.0, None)
    append(record, Row("mixed", runs=1, struck=4, events=290, quarantined=7), 3, 290.0, None)

    rows, records = summed(record)
    assert [(r.scenario, r.runs, r.struck, r.events, r.quarantined) for r in rows] == [
        ("zombie", 2, 5, 550, 17),
        ("mixed", 1, 4, 290, 7),
    ]
    assert [r["seed"] for r in records] == [1, 2, 3]
    assert all(r["commit"] for r in records)
    assert main([str(record)]) == 0
    assert "| zombie attempt outlives its retry | 2 | 0 | 5 | 550 | 0 | 0 | 0 | 17 |" in (
        capsys.readouterr().out
    )

    append(record, Row("mixed", runs=1, failed=1), 4, 900.0, "AssertionError: gate failed")
    assert main([str(record)]) == 1
    assert "failed: mixed seed 4" in capsys.readouterr().out
    append(record, Row("boundary", runs=1, events=10, lost=1), 5, 300.0, None)
    assert json.loads(record.read_text().splitlines()[-1])["lost"] == 1
    assert [r.clean for r in summed(record)[0]] == [False, True, False]


def test_no_record_is_an_error_not_an_empty_table(tmp_path, capsys):
    assert main([str(tmp_path / "none.jsonl")]) == 1
    assert "no chaos runs recorded" in capsys.readouterr().out


def test_runs_count_for_the_last_commit_that_changed_the_exercised_code(tmp_path):
    def git(*args: str) -> str:
        run = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args]
        return subprocess.run(run, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "bronze.py").write_text("v1")
    git("add", "-A")
    git("commit", "-qm", "code")
    code = git("rev-parse", "--short", "HEAD")
    (tmp_path / "README.md").write_text("runs recorded")
    git("add", "-A")
    git("commit", "-qm", "docs only")
    docs = git("rev-parse", "--short", "HEAD")

    assert code_version(docs, tmp_path) == code
    assert code_version(f"{docs}+changes", tmp_path) == f"{code}+changes"
    assert code_version("0000000", tmp_path) == "0000000"
