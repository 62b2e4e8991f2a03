"""Fairness over time: the VTC paper's service difference, and Jain's index per window.

Pure functions over arrays (one entry per request), so they serve fairbench's records and the
VTC artifact's published per-request results alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairbench.analysis.metrics import distinct_inverse, jain, nondecreasing
from fairbench.analysis.timeline import Timeline, build_timeline  # noqa: F401  (re-exported)


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
    clients, code = distinct_inverse(client)  # np.unique's, by counting where codes are ints
    serves = (end_s >= min_end_s) & ((end_s - start_s) >= min_span_s)
    step = (duration_s - warmup_s) / (n_ticks + 1)
    ticks = step * np.arange(1, n_ticks + 1)
    diffs = np.empty(n_ticks)
    k = len(clients)
    # the serving requests taken once, not per tick (4 gathers of the run × 19 ticks, issue 35)
    s_code, s_start, s_end, s_cost = code[serves], start_s[serves], end_s[serves], cost[serves]
    # arrivals in time order (a records window's are): a tick's are one slice, the same rows
    # in the same order as its mask picks, without two compares of the run per tick
    in_order = nondecreasing(arrival_s)
    for i, x in enumerate(ticks):
        lo, hi = x + warmup_s - window_s / 2, x + warmup_s + window_s / 2
        got = np.zeros(k)
        np.add.at(got, s_code, _service_in(s_start, s_end, s_cost, lo, hi))
        asked = np.zeros(k)
        if in_order:
            a, b = np.searchsorted(arrival_s, lo, "left"), np.searchsorted(arrival_s, hi, "right")
            np.add.at(asked, code[a:b], cost[a:b])
        else:
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
    the window (served something in it). Bursty load can look fair in short windows and unfair
    over the run, or the reverse: report both this series and the whole-run index.

    Each window is [lo, lo + window_s); a request's cost is spread uniformly over [start, end],
    one with no span counts whole in the window holding its end, and one never served (NaN
    start or end: censored, rejected) or costing nothing serves nothing. Why the explicit mask:
    a NaN spread into a tenant's sum dropped that tenant from every window, and so did a
    no-span request on absolute clock times, where end + 1e-9 rounds back to end (0 / 0)."""
    edges = np.arange(t0, t1, window_s)
    names, code = np.unique(np.asarray(client), return_inverse=True)  # once, not per window
    weight = np.array([weights.get(str(n), 1.0) for n in names])
    serves = (cost > 0) & np.isfinite(start_s) & np.isfinite(end_s)
    code, start, end, cost = code[serves], start_s[serves], end_s[serves], cost[serves]
    spread = end > start
    values = []
    for lo in edges:
        hi = lo + window_s
        part = np.where(
            spread,
            _service_in(start, np.where(spread, end, start + 1.0), cost, lo, hi),
            np.where((end >= lo) & (end < hi), cost, 0.0),
        )
        got = np.bincount(code, part, minlength=len(names))
        active = got > 0
        values.append(jain(got[active] / weight[active]) if active.any() else np.nan)
    return edges, np.array(values)


# ---------------------------------------------------------------- fairness among the backlogged
# Sparse: each tenant on its own breakpoints (fairbench.analysis.timeline), O(n) memory and
# O(n log n) time for any number of tenants; a pair is examined only where its bounds say it can
# beat the best found.

_SLACK = 1e-9  # relative: a bound within rounding of the best is still examined


@dataclass(frozen=True)
class BackloggedDifference:
    """The largest weighted service difference between two tenants over an interval in which
    both were continuously backlogged (cost units), the pair, and the time that pair both
    were backlogged."""

    max: float | None
    pair: tuple[str, str] | None
    both_backlogged_s: float


def _gather(offsets: np.ndarray, tenants: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The indices of the given tenants' rows (by tenant, in the order given) and each row's
    tenant: np.repeat over the slices, without a Python loop."""
    lo, hi = offsets[tenants], offsets[tenants + 1]
    count = hi - lo
    total = int(count.sum())
    within = np.arange(total) - np.repeat(np.cumsum(count) - count, count)
    return np.repeat(lo, count) + within, np.repeat(tenants, count)


def _expand(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For ranges [lo, hi): every index in them and which range it came from."""
    count = np.maximum(hi - lo, 0)
    within = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    return np.repeat(lo, count) + within, np.repeat(np.arange(len(lo)), count)


def _pieces(tl: Timeline, f: int, gs: np.ndarray) -> tuple[np.ndarray, ...]:
    """The intervals in which f and each of `gs` were both backlogged: (g, lo, hi), positive
    length, by g in the order given."""
    f_lo, f_hi = tl.periods(f)
    idx, g = _gather(tl.wait_offsets, gs)
    c, d = tl.wait_lo[idx], tl.wait_hi[idx]
    k0 = np.searchsorted(f_hi, c, side="right")  # the first of f's periods ending after c
    k1 = np.searchsorted(f_lo, d, side="left")  # past the last starting before d
    k, which = _expand(k0, k1)
    return g[which], np.maximum(c[which], f_lo[k]), np.minimum(d[which], f_hi[k])


def _ranges(tl: Timeline, f: int, g: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max − min of D = S_f − S_g over each piece [lo, hi]: D is piecewise linear between the
    two tenants' breakpoints, so its extremes lie at the ends or at a breakpoint inside, on
    either side of it: a request with no span jumps S at its end, and an interval may end just
    before the jump (D(t−), read at every point but lo) or just after it (D(t))."""
    if not len(lo):
        return np.zeros(0)
    f_times = tl.times[tl.offsets[f] : tl.offsets[f + 1]]
    fi, f_which = _expand(
        np.searchsorted(f_times, lo, side="right"), np.searchsorted(f_times, hi, side="left")
    )
    ends = np.concatenate([lo, hi])
    rank_ends = tl.rank(ends)
    gi, g_which = _expand(
        np.searchsorted(tl.key, g * tl.stride + rank_ends[: len(lo)], side="right"),
        np.searchsorted(tl.key, g * tl.stride + rank_ends[len(lo) :], side="left"),
    )
    piece = np.arange(len(lo))
    which = np.concatenate([piece, piece, f_which, g_which])
    f_at, g_at = tl.offsets[f] + fi, gi  # the breakpoints inside, by their index
    f_t, g_t = tl.times[f_at], tl.times[gi]
    gf, gg = g[f_which], g[g_which]
    # S(t) and S(t−) of both tenants at every point, each rank among the grid's times read
    # once: a breakpoint's time is in the grid, its key holds its rank, one more than the grid
    # times below it, and its own tenant's value is read at its index. The ranks and indices
    # `service_at` and `service_before` search for, the same arithmetic, so the same values to
    # the bit (issue 35: these searches were the 10-minute fleet's backlogged difference under
    # three-tier, 0.51 -> 0.19 CPU s)
    rank_f, rank_g = tl.key[f_at] % tl.stride, tl.key[g_at] % tl.stride
    below_hi = np.searchsorted(tl.grid, hi, side="left")
    f_first, g_first = tl.offsets[f], tl.offsets[gg]
    g_ends = g[np.concatenate([piece, piece])]
    d = np.concatenate(
        [
            tl.service_ranked(np.full(len(ends), f), ends, rank_ends)
            - tl.service_ranked(g_ends, ends, rank_ends),
            tl.at_breakpoint(f_at, f_first) - tl.service_ranked(gf, f_t, rank_f),
            tl.service_ranked(np.full(len(g_t), f), g_t, rank_g) - tl.at_breakpoint(g_at, g_first),
            tl.service_ranked(np.full(len(hi), f), hi, below_hi)
            - tl.service_ranked(g[piece], hi, below_hi),
            tl.at_breakpoint(f_at, f_first, before=True) - tl.service_ranked(gf, f_t, rank_f - 1),
            tl.service_ranked(np.full(len(g_t), f), g_t, rank_g - 1)
            - tl.at_breakpoint(g_at, g_first, before=True),
        ]
    )
    inner = slice(len(lo), None)  # every point but lo: its left limit too
    which = np.concatenate([which, which[inner]])
    order = np.argsort(which, kind="stable")
    d, which = d[order], which[order]
    first = np.flatnonzero(np.concatenate([[True], which[1:] != which[:-1]]))
    return np.maximum.reduceat(d, first) - np.minimum.reduceat(d, first)


def _row(tl: Timeline, f: int, gs: np.ndarray, best: float | None) -> tuple[np.ndarray, np.ndarray]:
    """Each g's largest difference with f (NaN where never both backlogged, or where its bound
    shows it cannot reach `best` nor the row's best) and their both-backlogged seconds."""
    value = np.full(len(gs), -np.inf)
    both = np.zeros(len(gs))
    g, lo, hi = _pieces(tl, f, gs)
    if not len(g):
        return np.full(len(gs), np.nan), both
    slot = np.searchsorted(gs, g, sorter=np.argsort(gs))
    slot = np.argsort(gs)[slot]
    np.add.at(both, slot, hi - lo)
    m = len(g)
    sf = tl.service_at(np.full(2 * m, f), np.concatenate([lo, hi]))
    sg = tl.service_at(np.concatenate([g, g]), np.concatenate([lo, hi]))
    gain_f, gain_g = sf[m:] - sf[:m], sg[m:] - sg[:m]
    lower = np.abs(gain_f - gain_g)  # the difference end to end: the range is at least this
    upper = np.maximum(gain_f, gain_g)  # both only grow: the range is at most the larger gain
    floor = max(float(lower.max()), best if best is not None else -np.inf)
    look = upper * (1 + _SLACK) + _SLACK >= floor
    np.maximum.at(value, slot[look], _ranges(tl, f, g[look], lo[look], hi[look]))
    seen = np.zeros(len(gs), dtype=bool)
    seen[slot] = True
    return np.where(seen, value, np.nan), both


def _bounds(tl: Timeline) -> tuple[np.ndarray, np.ndarray]:
    """Per tenant: B, its weighted service while backlogged, and P, the most it got in one
    backlogged period. Over an interval in which both were backlogged |ΔW_f − ΔW_g| is at most
    the larger gain, so no pair can beat max(P_f, P_g) (≤ max(B_f, B_g))."""
    n = len(tl.tenants)
    tenant = np.repeat(np.arange(n), np.diff(tl.wait_offsets))
    gain = tl.service_at(tenant, tl.wait_hi) - tl.service_at(tenant, tl.wait_lo)
    total = np.bincount(tenant, gain, minlength=n)
    most = np.zeros(n)
    np.maximum.at(most, tenant, gain)
    return total, most


def backlogged_service_difference(tl: Timeline) -> BackloggedDifference:
    """max over tenant pairs (f, g) and intervals [t1, t2] in which both are backlogged of
    |W_f(t1, t2)/w_f − W_g(t1, t2)/w_g|.

    This is the quantity VTC bounds (Sheng et al., "Fairness in Serving Large Language Models",
    OSDI 2024, Theorem 4.2: ≤ 2·max(w_p·L_input, w_q·M) for backlogged clients): a fair
    scheduler keeps it small and bounded however long the run, while FIFO lets it grow with the
    length of any period in which a heavy tenant's backlog is served ahead of a light one's.
    Unlike the whole-run demand gap, it counts only time in which both tenants wanted service.
    Within one both-backlogged period the difference D(t) is piecewise linear with jumps (a
    request with no span adds its cost at its end), so the largest |D(t2) − D(t1)| is its range
    over the period's breakpoints, read on both sides of each.

    Exact, without trying every pair: tenants are taken by B (their service while backlogged),
    largest first, and the search stops at the first whose B cannot beat the best pair found;
    each tenant's partners (the least served first) are examined together, skipping those whose
    bound max(P_f, P_g) cannot beat it, and within a pair only the both-backlogged periods whose
    larger gain can. `both_backlogged_s` is the reported pair's time both were backlogged."""
    n = len(tl.tenants)
    if n < 2 or not len(tl.wait_lo):
        return BackloggedDifference(None, None, 0.0)
    total, most = _bounds(tl)
    order = np.argsort(-total, kind="stable")
    best: float | None = None
    pair: tuple[str, str] | None = None
    both = 0.0
    for a, f in enumerate(order[:-1]):
        if best is not None and total[f] * (1 + _SLACK) + _SLACK < best:
            break  # no pair with f, or with any tenant after it, can beat `best`
        partners = order[a + 1 :][::-1]  # the least served first: the likeliest partner
        if best is not None:
            partners = partners[np.maximum(most[f], most[partners]) * (1 + _SLACK) + _SLACK >= best]
        if not len(partners):
            continue
        value, seconds = _row(tl, int(f), partners, best)
        if not np.isfinite(value).any():
            continue  # never both backlogged, or no period that could beat `best`
        top = float(np.nanmax(value[np.isfinite(value)]))
        if best is None or top > best:
            j = int(np.flatnonzero(value == top)[0])  # the first partner reaching it
            best, both = top, float(seconds[j])
            lo, hi = sorted((int(f), int(partners[j])))
            pair = (tl.tenants[lo], tl.tenants[hi])
    return BackloggedDifference(best, pair, both)


def backlogged_service_difference_all_pairs(tl: Timeline) -> BackloggedDifference:
    """The same figure by trying every pair without a bound, O(tenants² · n): the reference the
    pruned search is tested and benchmarked against."""
    best: float | None = None
    pair: tuple[str, str] | None = None
    both = 0.0
    n = len(tl.tenants)
    for f in range(n):
        for g in range(f + 1, n):
            gl, lo, hi = _pieces(tl, f, np.array([g]))
            if not len(gl):
                continue
            found = float(_ranges(tl, f, gl, lo, hi).max())
            if best is None or found > best:
                best, both = found, float((hi - lo).sum())
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
    is. Cost O((tenants · windows) log n)."""
    starts = np.arange(t0, t1, window_s) if t1 > t0 else np.zeros(0)
    if not len(starts) or not len(tl.grid):
        return starts, np.full(len(starts), np.nan)
    ends = np.minimum(starts + window_s, t1)
    n, w = len(tl.tenants), len(starts)
    tenant = np.repeat(np.arange(n), w)
    a, b = np.tile(starts, n), np.tile(ends, n)
    got = (tl.service_at(tenant, b) - tl.service_at(tenant, a)).reshape(n, w)
    waited = (tl.backlog_at(tenant, b) - tl.backlog_at(tenant, a)).reshape(n, w)
    include = waited >= min_backlogged * (ends - starts)
    values = np.full(w, np.nan)
    for k in np.flatnonzero(include.sum(axis=0) >= 2):
        values[k] = jain(got[include[:, k], k])
    return starts, values
