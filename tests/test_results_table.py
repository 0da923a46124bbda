"""README's numbers and the table that opens benchmarks/RESULTS.md are the
recorded figures as `python benchmarks/run.py --table` renders them: one
current figure a row, read from the latest recorded result of its benchmark,
with the figure compared in the same run and the run's date. A result file
re-recorded, or a hand edit of either table, without regenerating fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import current  # noqa: E402  (benchmarks/current.py)


def block(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    assert current.BEGIN in text and current.END in text, f"{path.name} has no generated table"
    return text.split(current.BEGIN, 1)[1].split(current.END, 1)[0].strip("\n")


def test_readme_and_results_hold_the_generated_tables():
    assert block(ROOT / "benchmarks" / "RESULTS.md") == current.results_table(), \
        "benchmarks/RESULTS.md: run `python benchmarks/run.py --table --write`"
    assert block(ROOT / "README.md") == current.readme_table(), "README.md: run `python benchmarks/run.py --table --write`"


def test_each_row_is_dated_and_names_what_measured_it():
    for row in current.rows():
        assert row["date"][:4].isdigit(), row
        assert "benchmarks/" in row["source"] and row["ours"], row


def test_run_py_table_measures_nothing():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--table"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == current.results_table()
