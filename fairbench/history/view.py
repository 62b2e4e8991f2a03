"""What `history show` prints: one metric's per-run points in time order with intervals, its
rolling figure, the drift of the last window against the baseline, the queue length's mean and
variance ratios, and change points. One function (`history_view`), a dict out (the `--json`).

Change points are found on the log of the values (a latency step is relative), with the
penalty and location intervals of fairbench.history.changepoints.
"""

from __future__ import annotations

import datetime as dt
import difflib
import math
from pathlib import Path
from typing import Any

from fairbench.history import changepoints, store, trends
from fairbench.history.errors import HistoryError


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat()


def _group(group: str | None) -> str:
    if not group or group == "overall":
        return "overall"
    dim, _, key = group.partition(".")
    if dim not in ("tenant", "class", "workload") or not key:
        raise HistoryError(f"--group: {group!r}; write tenant.ID, class.NAME or workload.NAME")
    return group


def load_points(
    db: Path, metric: str, group: str | None = None, scenario: str | None = None
) -> tuple[list[trends.Point], str]:
    """The metric's points (valid runs, in time order) and the scenario they are of: by default
    the newest run's, so runs of different scenarios are never mixed in one series."""
    grp = _group(group)
    rows = store.read(db, metric, grp, scenario)
    if not rows:
        held = store.names(db)
        for kind, name in (("metric", metric), ("group", grp), ("scenario", scenario)):
            if name is not None and name not in held[kind]:
                close = difflib.get_close_matches(name, held[kind], n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise HistoryError(f"{db}: no {kind} {name!r} in the store{hint}")
        raise HistoryError(f"{db}: no valid run holds {metric} for {grp}")
    if scenario is None:
        scenario = rows[-1].scenario
        rows = [r for r in rows if r.scenario == scenario]
    points = [
        trends.Point(r.run, r.started_at, r.value, r.ci_low, r.ci_high, r.lower_bound) for r in rows
    ]
    return points, scenario


def _queue(db: Path, scenario: str, window_s: float, baseline_s: float) -> dict[str, Any]:
    try:
        means, _ = load_points(db, "queue_depth_mean", None, scenario)
        variances, _ = load_points(db, "queue_depth_var", None, scenario)
    except HistoryError as error:
        return {"status": "cannot evaluate", "reason": str(error)}
    return trends.queue_ratios(means, variances, window_s, baseline_s)


def history_view(
    db: Path,
    metric: str,
    window_s: float,
    baseline_s: float | None = None,
    group: str | None = None,
    scenario: str | None = None,
) -> dict[str, Any]:
    """The `--json` of `history show` (keys: metric, group, scenario, points, rolling,
    change_points, drift, queue); baseline defaults to the window's length."""
    baseline_s = window_s if baseline_s is None else baseline_s
    points, scenario = load_points(db, metric, group, scenario)
    values = [p.value for p in points]
    logs = [math.log(v) for v in values] if all(v > 0 for v in values) else values
    cps = changepoints.change_points(logs)
    return {
        "metric": metric,
        "group": _group(group),
        "scenario": scenario,
        "points": [
            {
                "run": p.run,
                "time": _iso(p.time),
                "value": p.value,
                "ci_low": p.ci_low,
                "ci_high": p.ci_high,
                "lower_bound": p.lower_bound,
            }
            for p in points
        ],
        "rolling": [
            {**r, "time": _iso(float(r["time"]))}  # type: ignore[arg-type]
            for r in trends.rolling(points, window_s)
        ],
        "change_points": [
            {
                "run": points[c.at].run,
                "time": _iso(points[c.at].time),
                "ci": [_iso(points[c.low].time), _iso(points[c.high].time)],
                "ci_runs": [points[c.low].run, points[c.high].run],
                "shift": c.shift,
            }
            for c in cps
        ],
        "change_point_method": (
            "ruptures PELT, l2 cost on log values; penalty σ̂²·c_n for a 5% false-alarm rate "
            "per stationary series; 95% location interval: the likelihood-ratio region joined "
            "with a residual bootstrap of the split"
        ),
        "drift": trends.drift(points, window_s, baseline_s),
        "queue": _queue(db, scenario, window_s, baseline_s),
    }


def as_json(view: dict[str, Any]) -> dict[str, Any]:
    """What `history show --json` prints: exactly the issue's shape, `{"metric", "points":
    [{"run", "time", "value", "ci_low", "ci_high"}], "change_points": [{"run", "time", "ci"}],
    "drift": {...}}`. Everything else the view holds rides inside `drift` (its figures and
    method, plus `group`, `scenario`, `queue`, `rolling`, `lower_bound_runs` — the runs whose
    value is only a lower bound, a censored tail — and `change_point_method` with each change's
    `shift` and run interval), so a reader keyed on the shape gets it and loses nothing."""
    keep = ("run", "time", "value", "ci_low", "ci_high")
    return {
        "metric": view["metric"],
        "points": [{k: p[k] for k in keep} for p in view["points"]],
        "change_points": [
            {"run": c["run"], "time": c["time"], "ci": c["ci"]} for c in view["change_points"]
        ],
        "drift": {
            **view["drift"],
            "group": view["group"],
            "scenario": view["scenario"],
            "lower_bound_runs": [p["run"] for p in view["points"] if p["lower_bound"]],
            "queue": view["queue"],
            "rolling": view["rolling"],
            "change_point_method": view["change_point_method"],
            "change_point_details": [
                {"run": c["run"], "ci_runs": c["ci_runs"], "shift": c["shift"]}
                for c in view["change_points"]
            ],
        },
    }
