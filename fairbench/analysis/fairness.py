"""Fairness over time: the VTC paper's service difference, and Jain's index per window.

Pure functions over arrays (one entry per request), so they serve fairbench's records and the
VTC artifact's published per-request results alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairbench.analysis.metrics import jain


@dataclass(frozen=True)
class ServiceDifference:
    """diff(tick) per tick, and the table the VTC paper reports: max, mean, population variance."""

    ticks_s: np.ndarray
    diff: np.ndarray

    @property
    def max(self) -> float:
        return float(self.diff.max())

    @property
    def mean(self) -> float:
        return float(self.diff.mean())

    @property
    def var(self) -> float:
        return float(self.diff.var())


def _service_in(
    start: np.ndarray, end: np.ndarray, cost: np.ndarray, lo: float, hi: float
) -> np.ndarray:
    """Cost spread uniformly over [start, end], the part inside [lo, hi]."""
    overlap = np.clip(np.minimum(end, hi) - np.maximum(start, lo), 0.0, None)
    return cost * overlap / (end - start)


def service_difference(
    client: np.ndarray,
    arrival_s: np.ndarray,
    start_s: np.ndarray,
    end_s: np.ndarray,
    cost: np.ndarray,
    duration_s: float,
    warmup_s: float = 30.0,
    window_s: float = 60.0,
    n_ticks: int = 19,
    min_end_s: float = 1.0,
    min_span_s: float = 1e-5,
) -> ServiceDifference:
    """The VTC paper's service difference (Sheng et al., OSDI 2024, §6.1, and its artifact).

    A request's cost (e.g. prompt + 2·output tokens) is spread uniformly over its service
    interval [start, end] (first token to done); requests ending before `min_end_s` or lasting
    under `min_span_s` contribute no service. At ticks x_i = (T − warmup)/(n_ticks + 1) · i,
    i = 1..n_ticks, the window is [x + warmup − w/2, x + warmup + w/2], and per client j:
        s_j = service inside the window / w,   r_j = cost of requests arriving in it / w
        diff = Σ_j min(max_k s_k − s_j, |r_j − s_j|)      (cost units per second)
    over every client seen. The min(...) term forgives a client that got less than the best
    served one only when it also asked for less: it measures unfairness, not low demand."""
    clients, code = np.unique(client, return_inverse=True)
    serves = (end_s >= min_end_s) & ((end_s - start_s) >= min_span_s)
    step = (duration_s - warmup_s) / (n_ticks + 1)
    ticks = step * np.arange(1, n_ticks + 1)
    diffs = np.empty(n_ticks)
    k = len(clients)
    for i, x in enumerate(ticks):
        lo, hi = x + warmup_s - window_s / 2, x + warmup_s + window_s / 2
        got = np.zeros(k)
        np.add.at(
            got, code[serves], _service_in(start_s[serves], end_s[serves], cost[serves], lo, hi)
        )
        asked = np.zeros(k)
        arrived = (arrival_s >= lo) & (arrival_s <= hi)
        np.add.at(asked, code[arrived], cost[arrived])
        s, r = got / window_s, asked / window_s
        diffs[i] = np.minimum(s.max() - s, np.abs(r - s)).sum()
    return ServiceDifference(ticks, diffs)


def windowed_jain(
    client: np.ndarray,
    start_s: np.ndarray,
    end_s: np.ndarray,
    cost: np.ndarray,
    weights: dict[str, float],
    t0: float,
    t1: float,
    window_s: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Jain's index of weighted service per window (start times, values), over clients active in
    the window. Bursty load can look fair in short windows and unfair over the run, or the
    reverse: report both this series and the whole-run index."""
    edges = np.arange(t0, t1, window_s)
    names, code = np.unique(np.asarray(client), return_inverse=True)  # once, not per window
    weight = np.array([weights.get(str(n), 1.0) for n in names])
    end = np.maximum(end_s, start_s + 1e-9)
    values = []
    for lo in edges:
        got = np.bincount(
            code, _service_in(start_s, end, cost, lo, lo + window_s), minlength=len(names)
        )
        active = got > 0
        values.append(jain(got[active] / weight[active]) if active.any() else np.nan)
    return edges, np.array(values)


# ---------------------------------------------------------------- fairness among the backlogged


@dataclass(frozen=True)
class Timeline:
    """Every tenant's cumulative weighted service and backlog on one set of breakpoints.

    `service[i, k]` is tenant i's service up to `edges[k]` divided by its weight (cost units:
    a request's cost spread uniformly over its service interval, first response to end);
    `backlogged[i, k]` says tenant i had a request waiting for the scheduler — passed over by
    it, not yet admitted or resumed (fairbench.analysis.backlog) — throughout the segment
    [edges[k], edges[k + 1]). Built in O(n log n); every figure below reads it in O(segments)
    or O(windows)."""

    tenants: tuple[str, ...]
    edges: np.ndarray
    service: np.ndarray
    backlogged: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.edges)


def build_timeline(
    client: np.ndarray,
    weights: dict[str, float],
    arrival_s: np.ndarray,
    wait_end_s: np.ndarray,
    start_s: np.ndarray,
    end_s: np.ndarray,
    cost: np.ndarray,
    extra_edges: np.ndarray | None = None,
) -> Timeline:
    """`arrival_s` and `wait_end_s`: when each request began and stopped waiting for the
    scheduler; NaN for requests that never did (never passed over, or rejected)."""
    names = tuple(sorted(str(c) for c in set(client.tolist())))
    code = np.searchsorted(np.array(names), client.astype(str))
    parts = [arrival_s, wait_end_s, start_s, end_s]
    if extra_edges is not None:
        parts.append(extra_edges)
    allv = np.concatenate(parts)
    edges = np.unique(allv[np.isfinite(allv)])
    k = len(edges)
    service = np.zeros((len(names), k))
    backlogged = np.zeros((len(names), max(k - 1, 0)), dtype=bool)
    if k == 0:
        return Timeline(names, edges, service, backlogged)
    lengths = np.diff(edges)
    served = (cost > 0) & np.isfinite(start_s) & np.isfinite(end_s)
    waits = np.isfinite(wait_end_s) & np.isfinite(arrival_s) & (wait_end_s > arrival_s)
    for i, name in enumerate(names):
        mine = code == i
        w = float(weights.get(name, 1.0))
        sel = mine & served
        s_idx = np.searchsorted(edges, start_s[sel])
        e_idx = np.searchsorted(edges, end_s[sel])
        span = end_s[sel] - start_s[sel]
        spread = span > 0
        rate = np.where(spread, cost[sel] / np.where(spread, span, 1.0), 0.0)
        rate_now = np.bincount(s_idx, rate, k)
        rate_now -= np.bincount(e_idx, rate, k)
        np.cumsum(rate_now, out=rate_now)  # the service rate on each segment
        row = service[i]
        row[1:] = rate_now[:-1] * lengths
        np.cumsum(row, out=row)
        row += np.cumsum(np.bincount(e_idx[~spread], cost[sel][~spread], k))
        row /= w
        del rate_now
        sel = mine & waits
        count = np.bincount(np.searchsorted(edges, arrival_s[sel]), minlength=k) - np.bincount(
            np.searchsorted(edges, wait_end_s[sel]), minlength=k
        )
        backlogged[i] = np.cumsum(count)[:-1] > 0
    return Timeline(names, edges, service, backlogged)


@dataclass(frozen=True)
class BackloggedDifference:
    """The largest weighted service difference between two tenants over an interval in which
    both were continuously backlogged (cost units), the pair, and the time that pair both
    were backlogged."""

    max: float | None
    pair: tuple[str, str] | None
    both_backlogged_s: float


def _pair_difference(tl: Timeline, f: int, g: int) -> tuple[float, float] | None:
    """The pair's largest |D(t2) − D(t1)| over its both-backlogged periods, and how long both
    were backlogged; None if they never were at once. O(segments)."""
    m = tl.backlogged[f] & tl.backlogged[g]
    if not m.any():
        return None
    inc = np.diff(tl.service[f] - tl.service[g])  # one pair at a time: O(segments) memory
    c = np.cumsum(np.where(m, inc, 0.0))
    del inc
    idx = np.flatnonzero(m)
    first = np.concatenate([[True], np.diff(idx) > 1])
    pos = np.flatnonzero(first)
    cc = c[idx]
    before = np.where(idx[pos] > 0, c[np.maximum(idx[pos] - 1, 0)], 0.0)
    hi = np.maximum(np.maximum.reduceat(cc, pos), before)
    lo = np.minimum(np.minimum.reduceat(cc, pos), before)
    return float((hi - lo).max()), float(tl.lengths[m].sum())


def backlogged_service_difference(tl: Timeline) -> BackloggedDifference:
    """max over tenant pairs (f, g) and intervals [t1, t2] in which both are backlogged of
    |W_f(t1, t2)/w_f − W_g(t1, t2)/w_g|.

    This is the quantity VTC bounds (Sheng et al., "Fairness in Serving Large Language Models",
    OSDI 2024, Theorem 4.2: ≤ 2·max(w_p·L_input, w_q·M) for backlogged clients): a fair
    scheduler keeps it small and bounded however long the run, while FIFO lets it grow with the
    length of any period in which a heavy tenant's backlog is served ahead of a light one's.
    Unlike the whole-run demand gap, it counts only time in which both tenants wanted service.
    Within one both-backlogged period the difference D(t) is piecewise linear, so the largest
    |D(t2) − D(t1)| is its range over the period's breakpoints.

    Exact, without trying every pair: service only grows, so over an interval in which both
    were backlogged |ΔW_f − ΔW_g| ≤ max(B_f, B_g), B = a tenant's weighted service while it was
    backlogged. Tenants are taken by B, largest first, and the search stops at the first whose
    B cannot beat the best pair found; each tenant is paired with the least-served first.
    `both_backlogged_s` is the reported pair's time both were backlogged."""
    n = len(tl.tenants)
    if n < 2 or not len(tl.lengths):
        return BackloggedDifference(None, None, 0.0)
    inc = np.diff(tl.service, axis=1)
    bound = np.where(tl.backlogged, inc, 0.0).sum(axis=1)
    del inc
    order = np.argsort(-bound, kind="stable")
    best: float | None = None
    pair: tuple[str, str] | None = None
    both = 0.0
    for a, f in enumerate(order):
        if best is not None and bound[f] <= best:
            break  # no pair with f, or with any tenant after it, can beat `best`
        for g in order[::-1][: n - a - 1]:  # the least served first: the likeliest partner
            found = _pair_difference(tl, int(f), int(g))
            if found is not None and (best is None or found[0] > best):
                best, both = found
                lo, hi = sorted((int(f), int(g)))
                pair = (tl.tenants[lo], tl.tenants[hi])
    return BackloggedDifference(best, pair, both)


def backlogged_service_difference_all_pairs(tl: Timeline) -> BackloggedDifference:
    """The same figure by trying every pair, O(tenants² · segments): the reference the pruned
    search is tested and benchmarked against."""
    best: float | None = None
    pair: tuple[str, str] | None = None
    both = 0.0
    n = len(tl.tenants)
    for f in range(n):
        for g in range(f + 1, n):
            found = _pair_difference(tl, f, g)
            if found is not None and (best is None or found[0] > best):
                best, both = found
                pair = (tl.tenants[f], tl.tenants[g])
    return BackloggedDifference(best, pair, both)


def backlogged_jain(
    tl: Timeline, t0: float, t1: float, window_s: float, min_backlogged: float = 0.5
) -> tuple[np.ndarray, np.ndarray]:
    """Jain's index, per window, of weighted service over the tenants backlogged for at least
    `min_backlogged` of that window; NaN where fewer than two were (no contention, nothing to be
    fair about). Jain, Chiu and Hawe, DEC-TR-301 (1984): (Σx)²/(n·Σx²), 1 when equal, 1/n when
    one takes all. Counting only the backlogged is what makes it fail: a tenant that asked for
    little is not starved by being served little, but one that waited while another was served
    is. Cost O(segments + windows) per tenant."""
    starts = np.arange(t0, t1, window_s) if t1 > t0 else np.zeros(0)
    if not len(starts) or not len(tl.edges):
        return starts, np.full(len(starts), np.nan)
    ends = np.minimum(starts + window_s, t1)
    n = len(tl.tenants)
    got = np.empty((n, len(starts)))
    waited = np.empty((n, len(starts)))
    for i in range(n):  # a tenant at a time: O(segments) memory, not O(tenants × segments)
        service = tl.service[i]
        got[i] = np.interp(ends, tl.edges, service) - np.interp(starts, tl.edges, service)
        held = np.concatenate([[0.0], np.cumsum(np.where(tl.backlogged[i], tl.lengths, 0.0))])
        waited[i] = np.interp(ends, tl.edges, held) - np.interp(starts, tl.edges, held)
        del held
    include = waited >= min_backlogged * (ends - starts)
    values = np.full(len(starts), np.nan)
    for w in range(len(starts)):
        sel = include[:, w]
        if sel.sum() >= 2:
            values[w] = jain(got[sel, w])
    return starts, values
