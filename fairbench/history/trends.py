"""Trends over a history: the rolling figure, the drift of the last window against a baseline,
and ratios of the queue length's mean and variance. Pure: points in, figures out.

The unit of replication is the run (or, for imported production data, one time bucket): the
requests inside one run share its burst periods, so only run-to-run variation says how much a
figure moves by chance (the same reason compare's A/B replicates runs, docs/architecture.md).

Windows end at the newest point: the window is (end − window, end], the baseline the stretch of
`baseline` seconds before it, (end − window − baseline, end − window].

Ratio intervals (drift, queue mean and variance ratios): with every value positive and at least
two points on each side, the ratio of geometric means with a Welch t interval on the difference
of mean logs (95%): latency and variance figures are positive and multiplicative, and Welch does
not assume equal spread in the two windows. Otherwise (a zero among the values) the ratio of
arithmetic means with a percentile bootstrap over the points of each side (2,000 resamples,
95%, fixed seed); with few points per side that interval is too narrow, which is why the log
method is preferred where it applies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
MIN_PER_SIDE = 2
BOOTSTRAP = 2000


@dataclass(frozen=True)
class Point:
    """One run's (or one time bucket's) figure; `time` in seconds since the epoch."""

    run: str
    time: float
    value: float
    ci_low: float | None = None
    ci_high: float | None = None
    lower_bound: bool = False


def _t(df: float) -> float:
    from scipy import stats

    return float(stats.t.ppf(0.5 + CONFIDENCE / 2, df))


def rolling(points: list[Point], window_s: float) -> list[dict[str, object]]:
    """At each point, the mean of the points in the trailing window (t − window, t], with a
    Student t interval over those points (95%); a window with one point carries that point's own
    interval. A window holding a lower bound is itself a lower bound."""
    out: list[dict[str, object]] = []
    times = np.array([p.time for p in points])
    values = np.array([p.value for p in points])
    for p in points:
        inside = (times > p.time - window_s) & (times <= p.time)
        v = values[inside]
        if len(v) >= 2:
            half = _t(len(v) - 1) * float(np.std(v, ddof=1)) / math.sqrt(len(v))
            low, high = float(v.mean()) - half, float(v.mean()) + half
        else:
            low, high = p.ci_low, p.ci_high
        out.append(
            {
                "run": p.run,
                "time": p.time,
                "value": float(v.mean()),
                "ci_low": low,
                "ci_high": high,
                "n": len(v),
                "lower_bound": any(q.lower_bound for q, k in zip(points, inside, strict=True) if k),
            }
        )
    return out


def split(points: list[Point], window_s: float, baseline_s: float) -> tuple[list[Point], ...]:
    """(baseline points, window points), by the windows this module's docstring states."""
    if not points:
        return [], []
    end = max(p.time for p in points)
    cut = end - window_s
    start = cut - baseline_s
    return [p for p in points if start < p.time <= cut], [p for p in points if p.time > cut]


def too_short(points: list[Point], window_s: float, baseline_s: float) -> str | None:
    """Why the history cannot support a window-against-baseline figure, or None. The baseline
    must hold MIN_PER_SIDE points and reach back into its own first half (a baseline of 28 days
    made of the last three days before the window is not a 28-day baseline)."""
    base, win = split(points, window_s, baseline_s)
    if len(win) < MIN_PER_SIDE or len(base) < MIN_PER_SIDE:
        return (
            f"the history is too short: {len(base)} points in the baseline and {len(win)} in the "
            f"window (needs {MIN_PER_SIDE} each)"
        )
    end = max(p.time for p in points)
    half = end - window_s - baseline_s / 2
    if min(p.time for p in base) > half:
        days = (end - min(p.time for p in points)) / 86400
        return (
            f"the history is too short: it spans {days:.1f} days, and the baseline's first half "
            "holds no point"
        )
    return None


def ratio(base: list[float], win: list[float], seed: int = 0) -> dict[str, object]:
    """window ÷ baseline with its 95% interval and the method used (see the module docstring)."""
    b, w = np.asarray(base, dtype=float), np.asarray(win, dtype=float)
    if len(b) < MIN_PER_SIDE or len(w) < MIN_PER_SIDE:
        return {"ratio": None, "ci_low": None, "ci_high": None, "method": "too few points"}
    if (b > 0).all() and (w > 0).all():
        lb, lw = np.log(b), np.log(w)
        vb, vw = lb.var(ddof=1) / len(lb), lw.var(ddof=1) / len(lw)
        diff = lw.mean() - lb.mean()
        se = math.sqrt(vb + vw)
        if se > 0:
            df = (vb + vw) ** 2 / (vb**2 / (len(lb) - 1) + vw**2 / (len(lw) - 1))
            half = _t(df) * se
        else:
            half = 0.0
        return {
            "ratio": math.exp(diff),
            "ci_low": math.exp(diff - half),
            "ci_high": math.exp(diff + half),
            "method": "ratio of geometric means, Welch t interval on logs, runs as units, 95%",
        }
    if b.mean() <= 0:
        return {"ratio": None, "ci_low": None, "ci_high": None, "method": "baseline mean is 0"}
    rng = np.random.default_rng(seed)
    rb = rng.choice(b, size=(BOOTSTRAP, len(b))).mean(axis=1)
    rw = rng.choice(w, size=(BOOTSTRAP, len(w))).mean(axis=1)
    ok = rb > 0
    rs = rw[ok] / rb[ok]
    tail = (1 - CONFIDENCE) / 2
    return {
        "ratio": float(w.mean() / b.mean()),
        "ci_low": float(np.quantile(rs, tail)),
        "ci_high": float(np.quantile(rs, 1 - tail)),
        "method": "ratio of means, percentile bootstrap over runs (2000 resamples), 95%",
    }


def drift(points: list[Point], window_s: float, baseline_s: float) -> dict[str, object]:
    """The relative change of the window against the baseline (window ÷ baseline − 1), with its
    interval; `status` is `ok` or `cannot evaluate` with the reason."""
    out: dict[str, object] = {
        "window_s": window_s,
        "baseline_s": baseline_s,
        "confidence": CONFIDENCE,
    }
    reason = too_short(points, window_s, baseline_s)
    base, win = split(points, window_s, baseline_s)
    out.update(n_baseline=len(base), n_window=len(win))
    if reason is not None:
        return {**out, "status": "cannot evaluate", "reason": reason}
    r = ratio([p.value for p in base], [p.value for p in win])
    if r["ratio"] is None:
        return {**out, "status": "cannot evaluate", "reason": str(r["method"])}
    rel = lambda v: None if v is None else float(v) - 1.0  # noqa: E731
    return {
        **out,
        "status": "ok",
        "baseline_mean": float(np.mean([p.value for p in base])),
        "window_mean": float(np.mean([p.value for p in win])),
        "relative": rel(r["ratio"]),
        "ci_low": rel(r["ci_low"]),
        "ci_high": rel(r["ci_high"]),
        "lower_bound": any(p.lower_bound for p in win),
        "method": r["method"],
    }


def queue_ratios(
    means: list[Point], variances: list[Point], window_s: float, baseline_s: float
) -> dict[str, object]:
    """The queue length's mean and variance in the window against the baseline, as ratios with
    their intervals (the field's early warning: mean flat, variance up)."""
    out: dict[str, object] = {}
    for name, pts in (("mean", means), ("variance", variances)):
        reason = too_short(pts, window_s, baseline_s)
        if reason is not None:
            out[name] = {"status": "cannot evaluate", "reason": reason}
            continue
        base, win = split(pts, window_s, baseline_s)
        r = ratio([p.value for p in base], [p.value for p in win])
        out[name] = {
            "status": "ok" if r["ratio"] is not None else "cannot evaluate",
            "baseline": float(np.mean([p.value for p in base])),
            "window": float(np.mean([p.value for p in win])),
            **r,
        }
    return out
