"""The report's slowdown-ratio series is the summary's worst_slowdown_ratio read per window: over
one window that holds the whole measurement window it is the summary's figure, the same
population (admitted requests, the unfinished ones counted to when they were last seen) and the
same formula. It once averaged the ok requests only, which dropped a starved tenant's unfinished
requests from exactly the windows where it was starved (vtc-overload's plot ended at 120 s of
600), and the report did not read the columns that say when an unfinished request was last
seen."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fairbench.analysis.blocks import unloaded_ns
from fairbench.analysis.series import worst_slowdown_windows
from fairbench.pipeline import run_scenario
from fairbench.report.run import report_records
from fairbench.run import RunOptions
from fairbench.workload.loading import parse_scenario, read_yaml

REPO = Path(__file__).resolve().parents[1]


def test_one_window_over_the_measurement_window_is_the_summarys_figure(tmp_path: Path) -> None:
    path = REPO / "scenarios" / "vtc-overload.yaml"
    scn = parse_scenario(read_yaml(path.read_text()), str(path), path.parent)
    outcome = run_scenario(scn, RunOptions(out=tmp_path / "run", progress=False))
    summary = outcome.summary
    df = report_records(outcome.run_dir / "records.parquet")  # the columns the report reads
    lo, hi = summary["window_s"]
    t = df["t_intended_ns"] / 1e9
    window = df[(t >= lo) & (t <= hi)]
    assert (window["status"] != "ok").any()  # the case: unfinished requests in the window
    unloaded, _ = unloaded_ns(window, scn)
    starts, values = worst_slowdown_windows(window, unloaded, hi - lo + 1.0, lo, scn.run.timeout)
    want = summary["metrics"]["overall"]["worst_slowdown_ratio"]["value"]
    assert starts == [lo] and values == pytest.approx([want], rel=1e-6)
    # per window: a value wherever two tenants had admitted requests, from the summary's grid
    step = summary["fairness"]["jain_windows"]["window_s"]
    starts, values = worst_slowdown_windows(window, unloaded, step, lo, scn.run.timeout)
    assert starts[0] == lo and np.isfinite(values).all()
