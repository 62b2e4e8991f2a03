"""summary.json is strict JSON: a figure with no value is null, never a bare NaN (which
`json.dumps` writes by default and strict parsers — jq, JavaScript's JSON.parse, most CI
tools — refuse). The drift block's Kendall tau over fewer than three non-overlapping windows
was NaN (a 90 s fleet run's summary.json held `"trend_tau": NaN`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from fairbench.analysis.blocks import drift_block
from fairbench.pipeline import run_scenario
from fairbench.run import RunOptions
from fairbench.workload.loading import parse_scenario, read_yaml

REPO = Path(__file__).resolve().parents[1]


def _strict(text: str) -> Any:
    def refuse(name: str) -> None:
        raise ValueError(f"{name} in summary.json")

    return json.loads(text, parse_constant=refuse)


def test_a_run_s_summary_is_strict_json_and_a_short_drift_series_has_no_tau(
    tmp_path: Path,
) -> None:
    path = REPO / "scenarios" / "onoff.yaml"
    scn = parse_scenario(read_yaml(path.read_text()), str(path), path.parent)
    outcome = run_scenario(scn, RunOptions(out=tmp_path / "run", progress=False))
    _strict((outcome.run_dir / "summary.json").read_text(encoding="utf-8"))
    df = pd.read_parquet(outcome.run_dir / "records.parquet")
    # windows of 60 s every 30 s over 180 s: two non-overlapping ones, too few for a tau
    block = drift_block(df, 60.0, 30.0)
    assert block["drift"] is not None and block["drift"]["trend_tau"] is None
    _strict(json.dumps(block))
