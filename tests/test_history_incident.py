"""A simulated 14-"day" history made from the incident scenario (scenarios/incident-fifo.yaml,
the simulator, 30-second runs, one run a day, a new seed each day): from day 7 on, the cause
is switched on (the batch tenant's 4k-prompt rate rises by two thirds, 1.5/s -> 2.5/s, as a new
report job would), and the history must put its change point on day 7, with an interval, and
the drift rule must fail the gate; the days before it alone must not."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
import yaml

from fairbench.history.rundata import add_runs
from fairbench.history.view import history_view

REPO = Path(__file__).resolve().parents[1]
DAY = 86400.0
CAUSE_DAY = 7


def _scenario(day: int) -> object:
    """The day's scenario, through the overrides `fairbench run --set` applies."""
    from fairbench.cli.inputs import apply_overrides
    from fairbench.workload.loading import parse_scenario

    data = yaml.safe_load((REPO / "scenarios/incident-fifo.yaml").read_text(encoding="utf-8"))
    sets = [
        f"run={{duration: 30s, warmup: 2s, cooldown: 2s, seed: {100 + day}}}",
        "tenants.vip.phases=[]",  # the burst is not the cause here
    ]
    if day >= CAUSE_DAY:
        sets.append("tenants.reports.arrival.rate=2.5/s")  # the cause, switched on
    data, _ = apply_overrides(data, sets, "--set")
    return parse_scenario(data)


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fairbench.pipeline import run_scenario
    from fairbench.run import RunOptions

    root = tmp_path_factory.mktemp("incident")
    start = dt.datetime(2026, 11, 1, 9, 0, tzinfo=dt.UTC)
    runs = []
    for day in range(14):
        out = root / f"day-{day:02d}"
        run_scenario(_scenario(day), RunOptions(out=out, workers=1, progress=False))  # type: ignore[arg-type]
        header = json.loads((out / "run.json").read_text(encoding="utf-8"))
        header["started_at"] = (start + dt.timedelta(days=day)).isoformat()  # a day apart
        (out / "run.json").write_text(json.dumps(header), encoding="utf-8")
        runs.append(out)
    db = root / "history.duckdb"
    assert add_runs(db, runs) == (14, 0)
    assert add_runs(db, runs) == (0, 14)  # idempotent
    return db


def test_the_change_point_is_on_the_day_the_cause_began(history: Path) -> None:
    view = history_view(history, "ttft_p99", 7 * DAY, 7 * DAY)
    times = [p["time"] for p in view["points"]]
    assert times == sorted(times) and len(times) == 14
    assert len(view["change_points"]) == 1, view["change_points"]
    cp = view["change_points"][0]
    assert cp["run"] == f"day-{CAUSE_DAY:02d}"
    low, high = cp["ci_runs"]
    assert low <= f"day-{CAUSE_DAY:02d}" <= high
    assert cp["shift"] > 0.05
    assert view["drift"]["status"] == "ok" and view["drift"]["ci_low"] > 0.05


def test_the_drift_rule_fails_the_gate_and_the_quiet_days_pass(
    history: Path, tmp_path: Path
) -> None:
    from fairbench.decide.gate import evaluate, exit_code, parse_rules

    rule = f"drift(ttft_p99, window=7d, baseline=7d, db={history}) <= 5%"
    summary = json.loads((history.parent / "day-13" / "summary.json").read_text())
    results, blocker = evaluate(parse_rules({"rules": [rule]}), None, summary)
    assert results[0].outcome == "fail", results[0].detail
    assert exit_code(results, blocker) == 1
    quiet = tmp_path / "quiet.duckdb"
    add_runs(quiet, [history.parent / f"day-{d:02d}" for d in range(CAUSE_DAY)])
    view = history_view(quiet, "ttft_p99", 3 * DAY, 3 * DAY)
    assert view["change_points"] == []
    rule = f"drift(ttft_p99, window=3d, baseline=3d, db={quiet}) <= 5%"
    results, blocker = evaluate(parse_rules({"rules": [rule]}), None, summary)
    assert results[0].outcome == "pass", results[0].detail
    rule = f"drift(ttft_p99, window=7d, baseline=28d, db={quiet}) <= 5%"
    results, blocker = evaluate(parse_rules({"rules": [rule]}), None, summary)
    assert results[0].outcome == "error" and "too short" in results[0].detail
    assert exit_code(results, blocker) == 2
