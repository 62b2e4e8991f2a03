"""Golden outputs: summary.json and the terminal table of three shipped simulated scenarios.

Code moves (issue 31) must leave every number and every printed line as it was; this test runs
``fairbench run`` on onoff, ramp and vtc-overload (virtual time, deterministic from the seed)
and compares byte for byte with tests/golden/run-*.  A change meant to move numbers
regenerates them: ``python tests/golden/regenerate.py`` (and the diff is reviewed in the commit).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "golden_regenerate", Path(__file__).parent / "golden" / "regenerate.py"
)
assert _SPEC is not None and _SPEC.loader is not None
regenerate = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(regenerate)


@pytest.mark.parametrize("name", regenerate.SCENARIOS)
def test_run_outputs_match_golden(name: str, tmp_path: Path) -> None:
    terminal, summary = regenerate.run_scenario(name, tmp_path / name)
    text_path, summary_path = regenerate.golden_paths(name)
    hint = "if the change is meant to move numbers: python tests/golden/regenerate.py"
    assert summary == summary_path.read_text(encoding="utf-8"), (
        f"{name} summary.json differs; {hint}"
    )
    assert terminal == text_path.read_text(encoding="utf-8"), (
        f"{name} terminal output differs; {hint}"
    )
