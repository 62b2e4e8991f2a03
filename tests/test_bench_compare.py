"""`python benchmarks/bench_compare.py` runs as one command: at a tiny size (two fleet runs of
0.2 simulated minutes, 2 draws of each path) it prints its tables, the new bootstrap's draws
are the old one's to the bit, and it exits 0. Its speed target is the 10-minute fleet's, judged
by running the benchmark by hand, not here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_bench_compare_runs_at_a_tiny_size() -> None:
    done = subprocess.run(
        [sys.executable, "benchmarks/bench_compare.py", "--minutes", "0.2", "--draws", "2"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout
    assert done.returncode == 0, f"exit {done.returncode}\n{out[-3000:]}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr
    assert "compare's bootstrap: CPU s a draw" in out
    for path in ("baseline: Cols.take of the drawn rows", "new: DrawCols from the blocks"):
        assert path in out
    assert "PASS: the two paths' draws arrays are identical" in out
    assert "FAIL" not in out
    assert "not judged:" in out  # the speed target is not this size's
