"""A sweep's simulated points run at once in separate processes, `parallel: auto` on every core.

Why (issue 35 item 5): a platform team sweeps fleet configurations; each point is one core's
work for seconds to minutes, so a sweep must use every core, and must prove it does: here two
points meet at a barrier that a sequential sweep could never pass.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fairbench.decide.sweep import parallelism, run_sweep
from fairbench.workload.errors import ScenarioError

SCENARIO = {
    "name": "sw",
    "workloads": {"c": {"prompt_tokens": 100, "output_tokens": 20}},
    "tenants": [{"id": "a", "mix": "c", "arrival": {"process": "poisson", "rate": 20}}],
    "run": {"duration": "5s"},
    "target": {"kind": "sim"},
    "scheduler": {"policy": "fifo", "max_num_seqs": 4},
}


def meet(run_dir: Path) -> None:
    """A point's after-run hook (module level: the pool pickles it): say this process is here,
    then wait for the other point's process. Points run one after another never meet."""
    here = run_dir.parent
    (here / f"at-{run_dir.name}").write_text(str(os.getpid()))
    deadline = time.monotonic() + 120
    while len(list(here.glob("at-*"))) < 2:
        if time.monotonic() > deadline:
            raise RuntimeError("the other point never ran at the same time")
        time.sleep(0.05)


def test_points_run_at_once_in_processes(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(SCENARIO))
    sweep = {"scenario": "s.yaml", "grid": {"scheduler.policy": ["fifo", "vtc"]}, "parallel": 2}
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    rows = run_sweep(tmp_path / "sweep.yaml", tmp_path / "out", after_run=meet)
    assert all(not r.get("error") for r in rows), rows
    pids = {int(p.read_text()) for p in (tmp_path / "out").glob("at-*")}
    assert len(pids) == 2 and os.getpid() not in pids


def test_auto_is_every_core() -> None:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert parallelism("auto", "s.yaml") == cores
    assert parallelism(3, "s.yaml") == 3


@pytest.mark.parametrize("bad", [0, -1, "many", 1.5, True, None])
def test_bad_parallel_names_the_field(bad: object) -> None:
    with pytest.raises(ScenarioError, match=r"parallel: .* give an integer >= 1 or auto"):
        parallelism(bad, "s.yaml")


def test_bad_parallel_on_the_command_line_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(SCENARIO))
    (tmp_path / "sweep.yaml").write_text(
        yaml.safe_dump({"scenario": "s.yaml", "grid": {"run.seed": [1]}, "parallel": "many"})
    )
    proc = subprocess.run(
        [sys.executable, "-m", "fairbench.cli", "sweep", str(tmp_path / "sweep.yaml")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
    assert len(lines) == 1 and "parallel: 'many'" in lines[0], lines
