"""Sweeps, Pareto fronts and the knee search."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from fairbench.analysis.registry import MetricError, metric_value
from fairbench.decide.sweep import expand, knee, pareto_front, run_sweep, scale_load
from fairbench.workload.errors import ScenarioError


def test_pareto_front_by_hand() -> None:
    # goodput (max), ttft (min)
    points = np.array([[10, 100], [12, 150], [9, 120], [12, 100]], dtype=float)
    assert list(pareto_front(points, ["max", "min"])) == [False, False, False, True]
    points = np.array([[10, 100], [12, 150], [math.nan, 1]], dtype=float)
    assert list(pareto_front(points, ["max", "min"])) == [True, True, False]


def test_knee_bisection_brackets_the_threshold() -> None:
    calls: list[float] = []

    def holds(x: float) -> bool:
        calls.append(x)
        return x <= 3.7

    best, trail = knee(holds, 0.5, 16.0, tolerance=0.02)
    assert best is not None and 3.7 / 1.02 <= best <= 3.7
    assert [t[0] for t in trail] == calls
    assert knee(lambda x: False, 1, 2)[0] is None
    assert knee(lambda x: True, 1, 2)[0] == 2


def test_expand_grid_and_points() -> None:
    points = expand({"grid": {"a": [1, 2], "b": ["x", "y", "z"]}, "seeds": [1, 2]})
    assert len(points) == 12 and points[0].params == {"a": 1, "b": "x"} and points[0].seed == 1
    assert len(expand({"points": [{"a": 1}, {"a": 5}]})) == 2
    with pytest.raises(ScenarioError):
        expand({"grid": {"a": []}})
    with pytest.raises(ScenarioError):
        expand({"grid": {"a": [1]}, "points": []})


def test_scale_load() -> None:
    raw = {
        "tenants": [
            {"arrival": {"process": "poisson", "rate": "10/s"}},
            {"arrival": {"process": "ramp", "start_rate": 2, "end_rate": 4}},
        ],
        "traces": {"t": {"time_scale": 2.0}},
    }
    scaled = scale_load(raw, 3.0)
    assert scaled["tenants"][0]["arrival"]["rate"] == 30.0
    assert scaled["tenants"][1]["arrival"]["end_rate"] == 12.0
    assert scaled["traces"]["t"]["time_scale"] == pytest.approx(2 / 3)
    assert raw["tenants"][0]["arrival"]["rate"] == "10/s"  # the input is untouched


def test_metric_value_names_and_paths() -> None:
    entry = lambda v: {"value": v, "lower_bound": False}  # noqa: E731
    summary = {
        "metrics": {
            "overall": {"goodput": entry(4.0)},
            "class": {"interactive": {"ttft_p99": entry(250.0), "slo_attainment": entry(0.97)}},
        },
        "slo_classes": {"interactive": {"latency_ms": {"ttft": {"p99": 250.0}}}},
    }
    assert metric_value(summary, "goodput") == 4.0
    assert metric_value(summary, "ttft_p99.interactive") == 250.0  # a class, the first form
    assert metric_value(summary, "ttft_p99.class.interactive") == 250.0
    assert metric_value(summary, "slo_attainment.interactive") == 0.97
    assert metric_value(summary, "slo_classes.interactive.latency_ms.ttft.p99") == 250.0
    assert math.isnan(metric_value(summary, "ttft_p99.tenant.nobody"))  # no such group: no value
    with pytest.raises(MetricError, match="unknown metric 'jain'"):
        metric_value(summary, "jain")


def test_sweep_runs_every_point_in_parallel(tmp_path: Path) -> None:
    scenario = {
        "name": "sw",
        "workloads": {"c": {"prompt_tokens": 100, "output_tokens": 20}},
        "tenants": [
            {"id": "a", "mix": "c", "arrival": {"process": "poisson", "rate": 20}},
            {"id": "b", "mix": "c", "arrival": {"process": "poisson", "rate": 5}},
        ],
        "run": {"duration": "20s"},
        "target": {"kind": "sim"},
        "scheduler": {"policy": "fifo", "max_num_seqs": 4},
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(scenario))
    (tmp_path / "sweep.yaml").write_text(
        yaml.safe_dump(
            {"scenario": "s.yaml", "grid": {"scheduler.policy": ["fifo", "vtc"]}, "parallel": 2}
        )
    )
    rows = run_sweep(tmp_path / "sweep.yaml", tmp_path / "out")
    assert [r["params"] for r in rows] == [
        {"scheduler.policy": "fifo"},
        {"scheduler.policy": "vtc"},
    ]
    for row in rows:
        header = json.loads((Path(row["run_dir"]) / "run.json").read_text())
        assert header["target"]["policy"] == row["params"]["scheduler.policy"]
        assert row["valid"]
    assert len(json.loads((tmp_path / "out" / "sweep.json").read_text())) == 2
