"""Plot series from records: pure and downsampled, so a report renders fast whatever the run size.

Downsampling is for plots only: metrics always come from all records (fairbench.analysis.summary).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from fairbench.analysis import censored, frame_memo
from fairbench.analysis import metrics as m
from fairbench.analysis.columns import rows_of

MAX_POINTS = 400


def cdf(values: np.ndarray, max_points: int = MAX_POINTS) -> tuple[list[float], list[float]]:
    """An empirical CDF as at most `max_points` (value, fraction) pairs, exact at both ends."""
    v = np.sort(values[np.isfinite(values)])
    if not len(v):
        return [], []
    q = np.linspace(0.0, 1.0, min(max_points, len(v)))
    return np.quantile(v, q).tolist(), q.tolist()


def latency_cdfs(
    df: pd.DataFrame, by: str
) -> dict[str, dict[str, tuple[list[float], list[float]]]]:
    """metric -> group -> CDF of that latency in ms, for ok requests."""
    # the ok rows of each column, not a copy of the ok rows of the frame (all its columns);
    # each group's rows found once, not once per latency (issue 35)
    ok = (df["status"] == "ok").to_numpy(dtype=bool, na_value=False)
    # groups as codes in sorted-name order (frame_memo): no Python str per request
    codes, names = frame_memo.codes(df, by)
    groups = codes[ok]
    # each group's rows by index, taken from each latency (a mask gathers with a branch per
    # element: fairbench.analysis.columns.rows_of, issue 35)
    rows = {names[k]: rows_of(groups == k) for k in np.unique(groups).tolist() if k >= 0}
    out: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
    for name, fn in (("TTFT", m.ttft_ns), ("TPOT", m.tpot_ns), ("E2E", m.e2e_ns)):
        # the ok requests' latency in ms, made once for both groupings the report draws
        values = frame_memo.memo(df, ("ok latency ms", name), lambda f=fn: f(df)[ok] / 1e6)
        out[name] = {g: cdf(values[sel]) for g, sel in rows.items()}
    return out


def binned(t_s: np.ndarray, bin_s: float, t_end: float) -> np.ndarray:
    edges = np.arange(0.0, t_end + bin_s, bin_s)
    return np.histogram(t_s, bins=edges)[0]


def shares_over_time(
    df: pd.DataFrame,
    weights: dict[str, float],
    window_s: float,
    start_s: float | None = None,
    end_s: float | None = None,
) -> dict[str, Any]:
    """Per window: each tenant's share of the service delivered, and its weighted max-min fair
    share given its demand in that window: what it asked for (its requests arriving in it), or
    what it got where that is more (a backlog carried in from earlier windows is demand too).

    Service is counted as the summary counts it (fairbench.analysis.metrics.service_tokens, so
    the shares add up to the run's `fairness` block): a request is served from its first
    response to its last byte — a streamed one from its first token, one that streams no token
    (an embedding, a non-streamed completion) when its response arrives. Times are on the run
    clock (seconds since t0); windows run from `start_s` (default: the first intended send) to
    `end_s` (default: the last service; the report stops at the measurement window's end, after
    which only stragglers of the window are still being served)."""
    tenants = sorted(weights)
    empty: dict[str, Any] = {"t": [], "service": {}, "fair": {}, "total_tokens": []}
    cost_all = m.service_tokens(df)
    served = cost_all > 0  # the served rows of each column: no copy of the frame's rows
    if not served.any():
        return empty
    # the first response as TTFT counts it: the first token, or the response if none streamed
    start = (m.ttft_ns(df)[served] + df["t_intended_ns"].to_numpy(np.float64)[served]) / 1e9
    last = df["t_done_ns"].to_numpy(dtype=np.float64, na_value=np.nan)[served]
    last = (
        np.where(
            np.isnan(last),
            df["t_last_token_ns"].to_numpy(dtype=np.float64, na_value=np.nan)[served],
            last,
        )
        / 1e9
    )
    start = np.where(np.isnan(start), last, start)
    end = np.maximum(last, start)
    known = np.isfinite(start) & np.isfinite(end)
    start, end = start[known], end[known]
    cost = cost_all[served][known]
    who = frame_memo.name_codes(df, "tenant", tenants)  # codes into `tenants`
    names = who[served][known]
    if not len(start):
        return empty
    span = np.maximum(end - start, 1e-9)
    arrive = df["t_intended_ns"].to_numpy(float) / 1e9
    demand_cost = df["prompt_tokens"].to_numpy(float) + 2 * df["max_tokens"].to_numpy(float)
    w = np.array([weights[t] for t in tenants])
    out: dict[str, Any] = {
        "t": [],
        "service": {t: [] for t in tenants},
        "fair": {t: [] for t in tenants},
        "total_tokens": [],
    }
    first = float(arrive.min()) if start_s is None else float(start_s)
    # to the last service inclusive (an instant at the very end still falls in a window)
    stop = float(end.max()) + 1e-9 if end_s is None else float(end_s)
    # each tenant's requests apart once, in row order: a window's sum over them adds the same
    # numbers in the same order as a sum over the whole run under that tenant's mask, so the
    # shares are the same to the last bit, without a mask over every request per window and
    # tenant (7 of a fleet run's 19 report seconds at 1.9M requests, issue 35)
    own = [_TenantService(names == k, start, end, span, cost) for k in range(len(tenants))]
    asked = [_TenantDemand(who == k, arrive, demand_cost) for k in range(len(tenants))]
    for lo in np.arange(first, stop, window_s):
        hi = lo + window_s
        got = np.array([part.within(lo, hi) for part in own])
        want = np.array([part.within(lo, hi) for part in asked])
        total = got.sum()
        if total <= 0:
            continue
        fair = m.water_fill(np.maximum(want, got), w, total)
        out["t"].append(float(lo))
        out["total_tokens"].append(float(total))
        for k, t in enumerate(tenants):
            out["service"][t].append(float(got[k] / total))
            out["fair"][t].append(float(fair[k] / total))
    return out


class _TenantService:
    """One tenant's served requests (service from `start` to `end`, s; `cost` tokens)."""

    def __init__(
        self,
        rows: np.ndarray,
        start: np.ndarray,
        end: np.ndarray,
        span: np.ndarray,
        cost: np.ndarray,
    ) -> None:
        at = rows_of(rows)  # by index, for four columns (columns.rows_of, issue 35)
        self.start, self.end, self.span, self.cost = start[at], end[at], span[at], cost[at]
        self.instant = self.end - self.start <= 0

    def within(self, lo: float, hi: float) -> float:
        """The tokens of service delivered in [lo, hi): each request's share of its service
        that falls inside; a service with no duration (start == end) counted whole in the
        window that holds its instant."""
        overlap = (
            np.clip(np.minimum(self.end, hi) - np.maximum(self.start, lo), 0, None) / self.span
        )
        instant = self.instant & (self.start >= lo) & (self.start < hi)
        inside = np.where(self.instant, instant.astype(float), overlap)
        return float((self.cost * inside).sum())


class _TenantDemand:
    """One tenant's requests by arrival (s), with the tokens each asked for."""

    def __init__(self, rows: np.ndarray, arrive: np.ndarray, cost: np.ndarray) -> None:
        at = rows_of(rows)  # by index (columns.rows_of, issue 35)
        self.arrive, self.cost = arrive[at], cost[at]
        self.ordered = m.nondecreasing(self.arrive)

    def within(self, lo: float, hi: float) -> float:
        """The tokens asked for by requests arriving in [lo, hi): a slice when arrivals are in
        order (a run's records are), the same numbers a mask would pick."""
        if self.ordered:
            a, b = np.searchsorted(self.arrive, [lo, hi], side="left")
            return float(self.cost[a:b].sum())
        return float(self.cost[(self.arrive >= lo) & (self.arrive < hi)].sum())


def events_over_time(df: pd.DataFrame, bin_s: float = 1.0) -> dict[str, Any]:
    """Requests per second by outcome (rejections, errors, timeouts) by intended time, on the
    run clock (seconds since t0, as every time axis of the report)."""
    t = df["t_intended_ns"].to_numpy(float) / 1e9
    end = float(t.max()) if len(t) else 0.0
    out = {"t": np.arange(0.0, end + bin_s, bin_s)[:-1].tolist() if len(t) else []}
    for status in ("rejected", "error", "timeout"):
        out[status] = (binned(t[(df["status"] == status).to_numpy()], bin_s, end) / bin_s).tolist()
    return out


def server_series(metrics: pd.DataFrame | None, names: tuple[str, ...]) -> dict[str, Any]:
    """Scraped server samples over time (summed over labels); counters (`*_total`) become rates,
    with resets handled (fairbench.analysis.server_metrics)."""
    from fairbench.analysis import server_metrics as sm

    if metrics is None or not len(metrics):
        return {}
    out: dict[str, Any] = {}
    for name in names:
        if not (metrics["metric"] == name).any():
            continue
        if name.endswith("_total"):
            t, v = sm.counter_rate(metrics, name.removesuffix("_total"))
        else:
            t, v = sm.gauge(metrics, name)
        out[name] = {"t": t.tolist(), "v": v.tolist()}
    return out


def _thinned(t: np.ndarray, values: np.ndarray, max_points: int) -> tuple[list[float], ...]:
    """At most ~`max_points` points for a scatter, the worst 5% always kept (they matter most)."""
    step = max(1, len(t) // max_points)
    worst = np.argsort(values)[-max(1, max_points // 20) :]
    keep = np.union1d(np.arange(0, len(t), step), worst)
    return t[keep].tolist(), values[keep].tolist()


def send_lag(df: pd.DataFrame, max_points: int = 4000) -> dict[str, list[float]]:
    sent = df[df["t_sent_ns"].notna()]
    if not len(sent):
        return {"t": [], "lag_ms": []}
    t = sent["t_intended_ns"].to_numpy(float) / 1e9
    lag = (sent["t_sent_ns"].to_numpy(float) - sent["t_intended_ns"].to_numpy(float)) / 1e6
    xs, ys = _thinned(t, lag, max_points)
    return {"t": xs, "lag_ms": ys}


def receive_delay(df: pd.DataFrame, max_points: int = 4000) -> dict[str, list[float]]:
    """Per request, by intended time: the generator's receive delay (ms) at its first token."""
    if "rx_delay_ns" not in df.columns:
        return {"t": [], "delay_ms": []}
    rows = df[df["rx_delay_ns"].notna()]
    if not len(rows):
        return {"t": [], "delay_ms": []}
    t = rows["t_intended_ns"].to_numpy(float) / 1e9
    xs, ys = _thinned(t, rows["rx_delay_ns"].to_numpy(float) / 1e6, max_points)
    return {"t": xs, "delay_ms": ys}


def detect_step(
    values: np.ndarray, min_segment: int = 5, rel: float = 0.05, p_max: float = 0.01
) -> dict[str, Any] | None:
    """A lasting shift in a per-run series (the way asv flags a regression in its history): the
    split that best separates the means, if the two sides differ by a rank test (p < p_max) and
    by more than `rel`. One run's outlier is not a step; five runs a side are needed, the fewest
    with which a rank test can reach p < 0.01."""
    from scipy import stats as sps

    v = np.asarray(values, dtype=float)
    n = len(v)
    best = None
    for k in range(min_segment, n - min_segment + 1):
        a, b = v[:k], v[k:]
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            continue
        shift = (b.mean() - a.mean()) / abs(a.mean()) if a.mean() else 0.0
        if abs(shift) < rel:
            continue
        # exact for the small per-run series a history has (ties would otherwise force the
        # normal approximation, which cannot reach the smallest exact p-values)
        method = "exact" if len(a) + len(b) <= 40 else "asymptotic"
        p = float(sps.mannwhitneyu(a, b, alternative="two-sided", method=method).pvalue)
        if p < p_max and (best is None or abs(shift) > abs(best["shift"])):
            best = {"at": k, "shift": float(shift), "p": p}
    return best


def queue_depth(df: pd.DataFrame, step_s: float = 1.0) -> dict[str, list[float]]:
    """Waiting requests over time from the records: arrived (intended time) but not yet admitted
    (intended + queue time), for targets that report queue time (the reference scheduler).
    Times on the run clock (seconds since t0)."""
    queued = df["queue_time_ns"].notna().to_numpy()
    if not queued.any():
        return {"t": [], "depth": []}
    arrive = np.sort(df["t_intended_ns"].to_numpy(float)[queued] / 1e9)
    admit = np.sort(arrive + df["queue_time_ns"].to_numpy(float)[queued] / 1e9)
    grid = np.arange(0.0, float(arrive.max()) + step_s, step_s)
    depth = np.searchsorted(arrive, grid, side="right") - np.searchsorted(admit, grid, "right")
    return {"t": grid.tolist(), "depth": depth.tolist()}


def worst_slowdown_windows(
    df: pd.DataFrame,
    unloaded_ns: np.ndarray,
    window_s: float,
    start_s: float | None = None,
    timeout_s: float | None = None,
) -> tuple[list[float], list[float]]:
    """Per window (by intended time) the summary's worst_slowdown_ratio read over that window's
    requests: the slowest tenant's mean slowdown ÷ the fastest tenant's, a request's slowdown
    its E2E ÷ its unloaded latency, over the admitted requests (one that never finished counts
    to when it was last seen, as in the figure: the starved tenant's windows are the ones that
    matter). Window starts on the run clock (seconds since t0) from `start_s`, the summary's
    windowed Jain's grid, or else from the first intended send."""
    e2e = censored.e2e_rows(df, timeout_s)
    t = df["t_intended_ns"].to_numpy(float) / 1e9
    with np.errstate(invalid="ignore", divide="ignore"):
        slow = e2e.time / unloaded_ns
    # tenants as codes: a window's tenants and their rows without a string compare per row
    codes, _ = pd.factorize(df["tenant"].to_numpy())
    usable = e2e.eligible & np.isfinite(slow)
    starts, values = [], []
    first = (float(t.min()) if start_s is None else float(start_s)) if len(t) else 0.0
    for lo in np.arange(first, t.max(), window_s) if len(t) else []:
        sel = usable & (t >= lo) & (t < lo + window_s)
        means = [slow[sel & (codes == x)].mean() for x in np.unique(codes[sel]).tolist()]
        starts.append(float(lo))
        values.append(
            float(max(means) / min(means)) if len(means) > 1 and min(means) > 0 else float("nan")
        )
    return starts, values
