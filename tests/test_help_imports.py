"""`fairbench --help` stays light (issue 35: under 0.3 s), and the errors whose classes the CLI
no longer imports up front still end in one line and exit 2.

The help registers every command, so what it imports is every CLI module's top level; the
scenario model (pydantic) and the trace readers (numpy) were most of its cost before they
moved into the commands that use them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli import REPO, run_cli

ENV = {**os.environ, "PYTHONPATH": str(REPO)}


# A command's own help may import pydantic: typer's parameter adapters do, not fairbench.
CASES = [
    (["--help"], ("numpy", "pydantic", "fairbench.workload.models")),
    (["run", "--help"], ("numpy", "fairbench.workload.models")),
    (["sweep", "--help"], ("numpy", "fairbench.workload.models")),
]


@pytest.mark.parametrize(("argv", "heavy"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_help_imports_neither_the_scenario_model_nor_numpy(
    argv: list[str], heavy: tuple[str, ...]
) -> None:
    code = (
        "import sys\n"
        "from fairbench.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        f"print(' '.join(m for m in {heavy!r} if m in sys.modules))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=ENV, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "", f"{argv} imported {proc.stdout.splitlines()[-1]}"


def test_a_trace_error_is_one_line_and_exit_2(tmp_path: Path) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1,\n')
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "name: t\n"
        "workloads: {w: {endpoint: completions, prompt_tokens: 8}}\n"
        f"traces: {{m: {{format: mooncake, path: {trace}}}}}\n"
        "tenants: [{id: a, mix: w, arrival: {process: trace, trace: m}}]\n"
        "target: {kind: sim}\n"
    )
    proc = run_cli("plan", str(scenario))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "not valid JSON" in lines[0] and "Traceback" not in proc.stderr
