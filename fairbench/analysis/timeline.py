"""Every tenant's cumulative service and backlog, sparse: each tenant on its own breakpoints.

Why: the fairness figures among the backlogged (fairbench.analysis.fairness) read each tenant's
weighted service S_i(t) and the periods in which it waited for the scheduler. A dense table of
tenants × all breakpoints costs O(tenants · n) memory (1,000 tenants × 1M records: ~32 GB), so
instead each tenant keeps only its own service breakpoints (the starts and ends of its requests)
and its own merged backlog periods: O(n) in all, built with one sort (issue 33 item 3).

S_i is piecewise linear between tenant i's breakpoints, plus a jump at the end of a request with
no service span; it is right-continuous (its value at t counts a jump at t; `service_before`
reads the left limit). Any (tenant, time) query is answered in O(log n), vectorized, through an
integer key: tenant × (G + 1) + rank of the time among all the run's G distinct times + 1, which
orders breakpoints by tenant then time without the precision a float offset would lose.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Timeline:
    """`times`/`key`/`service`/`rate`: every tenant's service breakpoints, by tenant then time:
    S at the breakpoint (÷ weight, jumps at it included) and the rate on the segment after it.
    `wait_lo`/`wait_hi`/`wait_key`/`wait_offsets`: each tenant's merged periods of waiting for
    the scheduler (fairbench.analysis.backlog), by tenant then start. `grid`: the run's sorted
    distinct times, whose ranks build the keys."""

    tenants: tuple[str, ...]
    grid: np.ndarray
    times: np.ndarray
    key: np.ndarray
    service: np.ndarray
    rate: np.ndarray
    offsets: np.ndarray
    wait_lo: np.ndarray
    wait_hi: np.ndarray
    wait_key: np.ndarray
    wait_offsets: np.ndarray

    @property
    def stride(self) -> int:
        return len(self.grid) + 1

    def rank(self, t: np.ndarray) -> np.ndarray:
        """1 + the index of the largest grid time ≤ t (0 before every one)."""
        return np.searchsorted(self.grid, t, side="right")

    def service_at(self, tenant: np.ndarray, t: np.ndarray) -> np.ndarray:
        """S_tenant(t) for each pair, right-continuous; 0 before a tenant's first breakpoint."""
        t = np.asarray(t, dtype=np.float64)
        return self.service_ranked(tenant, t, self.rank(t))

    def service_before(self, tenant: np.ndarray, t: np.ndarray) -> np.ndarray:
        """S_tenant(t−), the left limit: S_tenant(t) less a jump at t (a request with no span
        ending at t). An interval may end just before a jump, so a supremum over intervals
        must read both sides of it."""
        t = np.asarray(t, dtype=np.float64)
        return self.service_ranked(tenant, t, np.searchsorted(self.grid, t, side="left"))

    def service_ranked(self, tenant: np.ndarray, t: np.ndarray, rank: np.ndarray) -> np.ndarray:
        """Continue the tenant's last breakpoint of rank ≤ `rank` linearly to t: the rank of t
        itself (`rank`) reads S(t), the number of grid times below t reads S(t−). For a caller
        that knows the ranks (fairness._ranges: one search for both tenants of a pair)."""
        tenant = np.asarray(tenant, dtype=np.int64)
        idx = np.searchsorted(self.key, tenant * self.stride + rank, side="right") - 1
        mine = idx >= self.offsets[tenant]
        idx = np.maximum(idx, 0)
        if not len(self.times):
            return np.zeros(len(t))
        value = self.service[idx] + self.rate[idx] * (t - self.times[idx])
        return np.where(mine, value, 0.0)

    def at_breakpoint(
        self, idx: np.ndarray, first: np.ndarray | int, before: bool = False
    ) -> np.ndarray:
        """S(t) of the tenant whose breakpoint `idx` is, at its own time t (`before`: S(t−)),
        `first` that tenant's first index (`offsets`): `service_ranked` at the index its search
        finds, the breakpoint (the one before it for t−), with no search."""
        at = idx - 1 if before else idx
        mine = at >= first
        at = np.maximum(at, 0)
        t = self.times[idx]
        value = self.service[at] + self.rate[at] * (t - self.times[at])
        return np.where(mine, value, 0.0)

    def backlog_at(self, tenant: np.ndarray, t: np.ndarray) -> np.ndarray:
        """How long `tenant` had waited for the scheduler by time t (its backlogged seconds)."""
        tenant = np.asarray(tenant, dtype=np.int64)
        t = np.asarray(t, dtype=np.float64)
        if not len(self.wait_lo):
            return np.zeros(len(t))
        length = self.wait_hi - self.wait_lo
        before = np.cumsum(length) - length  # within the whole array; made per tenant below
        first = self.wait_offsets[tenant]
        base = np.where(first < len(before), before[np.minimum(first, len(before) - 1)], 0.0)
        idx = np.searchsorted(self.wait_key, tenant * self.stride + self.rank(t), side="right") - 1
        mine = idx >= first
        idx = np.maximum(idx, 0)
        held = before[idx] - base + np.clip(t - self.wait_lo[idx], 0.0, length[idx])
        return np.where(mine, held, 0.0)

    def periods(self, tenant: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = self.wait_offsets[tenant], self.wait_offsets[tenant + 1]
        return self.wait_lo[a:b], self.wait_hi[a:b]


def build_timeline(
    client: np.ndarray,
    weights: dict[str, float],
    arrival_s: np.ndarray,
    wait_end_s: np.ndarray,
    start_s: np.ndarray,
    end_s: np.ndarray,
    cost: np.ndarray,
    names: Sequence[str] | None = None,
) -> Timeline:
    """`arrival_s` and `wait_end_s`: when each request began and stopped waiting for the
    scheduler; NaN for requests that never did (never passed over, or rejected). `start_s`,
    `end_s`: its service interval (first response to end), over which its cost is spread
    uniformly; a request with no span adds its cost at its end. One stable sort of the
    service events' times and a radix sort by tenant, then O(n) passes. With `names` (the
    distinct tenants, sorted), `client` is each request's index into them: the summary's codes,
    where a str per request cost a fleet run seconds.

    Why no grid of every time first (np.unique of the 4·n times, then an argsort of tenant ×
    stride + rank): two sorts and the arrays of both, and at fleet size the time went to the
    kernel faulting fresh pages in, not to the sorts. Sorting the events by time gives most of
    the grid (their distinct times), the other times (the waits', the unserved requests') are
    merged in, and the floats are summed over the same events in the same order: every array is
    the same to the bit (tests/test_timeline_identity.py). A 10-minute 80-replica fleet run (1.92M
    requests, issue 35; bench_sim --stages, 3 runs each, interleaved): backlogged_fairness
    3.5-4.0 -> 1.8-2.1 CPU s, the summary 10.0-11.7 -> 9.1-10.1 (group_block, now the first to
    fault those pages in, +0.6); a process building its timeline alone peaks at 390-414 MB,
    not 706."""
    if names is None:
        names = tuple(sorted(str(c) for c in set(client.tolist())))
        code = np.searchsorted(np.array(names), client.astype(str)).astype(np.int64)
    else:
        names, code = tuple(names), np.asarray(client, dtype=np.int64)
    n_t = len(names)
    weight = np.array([float(weights.get(name, 1.0)) for name in names])
    served = (cost > 0) & np.isfinite(start_s) & np.isfinite(end_s)
    c, s, e = code[served], start_s[served], end_s[served]
    w = cost[served] / weight[c]
    span = e - s
    spread = span > 0
    r = np.where(spread, w / np.where(spread, span, 1.0), 0.0)
    del span
    # the events: each spread request's start, its end, then each no-span request's end
    m = int(spread.sum())
    ev_t = np.concatenate([s[spread], e[spread], e[~spread]])
    del s, e
    narrow = n_t < 2**15 and (not len(c) or int(c.min()) >= -(2**15))  # a radix sort's width
    c = c.astype(np.int16 if narrow else np.int64)
    order, first, distinct, group_time, group_tenant = _event_order(
        ev_t, np.concatenate([c[spread], c[spread], c[~spread]])
    )
    times = ev_t[order[first]]
    del ev_t, c

    # the grid: the events' distinct times and every other finite time of the run (the waits',
    # the unserved requests'), whose ranks key the waits
    has_a, has_b = np.isfinite(arrival_s), np.isfinite(wait_end_s)
    rest_s, rest_e = ~served & np.isfinite(start_s), ~served & np.isfinite(end_s)
    rest = np.concatenate([arrival_s[has_a], wait_end_s[has_b], start_s[rest_s], end_s[rest_e]])
    rest, rest_at = np.unique(rest, return_inverse=True)
    grid, distinct_rank, rest_rank = _merge(distinct, rest)
    del distinct, rest
    stride = len(grid) + 1
    key = group_tenant.astype(np.int64) * stride + distinct_rank[group_time]
    tenant_of = key // stride
    del distinct_rank, group_time, group_tenant

    drate, active, jump = _sums(order, first, m, r[spread], w[~spread])
    del order
    cumrate = np.cumsum(drate)
    idle = active <= 0
    last_idle = np.maximum.accumulate(np.where(idle, np.arange(len(idle)), -1))
    rate = np.where(
        idle, 0.0, cumrate - np.where(last_idle >= 0, cumrate[np.maximum(last_idle, 0)], 0.0)
    )
    rate = np.maximum(rate, 0.0)  # the service rate on the segment after each breakpoint
    del active, cumrate, idle, last_idle
    offsets = np.searchsorted(tenant_of, np.arange(n_t + 1), side="left")
    service = np.empty(len(times))
    for i in range(n_t):  # a cumulative sum per tenant, so no tenant carries another's rounding
        a, b = offsets[i], offsets[i + 1]
        if a == b:
            continue
        inc = np.zeros(b - a)
        inc[1:] = rate[a : b - 1] * np.diff(times[a:b])
        service[a:b] = np.cumsum(inc) + np.cumsum(jump[a:b])

    waits = np.isfinite(wait_end_s) & np.isfinite(arrival_s) & (wait_end_s > arrival_s)
    wc, wa, wb = code[waits], arrival_s[waits], wait_end_s[waits]
    n_a = int(has_a.sum())
    a_rank = rest_rank[rest_at[:n_a]][waits[has_a]]  # a waiting request's times are finite
    b_rank = rest_rank[rest_at[n_a : n_a + int(has_b.sum())]][waits[has_b]]
    a_key, b_key = wc * stride + a_rank, wc * stride + b_rank
    del rest_rank, rest_at
    order = np.argsort(a_key, kind="stable")
    a_key, b_key, wa, wb = a_key[order], b_key[order], wa[order], wb[order]
    reach = np.maximum.accumulate(b_key) if len(b_key) else b_key
    # a period starts where a wait begins after every earlier one of its tenant ended (touching
    # waits merge: the tenant never stopped waiting)
    starts = (
        np.flatnonzero(np.concatenate([[True], a_key[1:] > reach[:-1]]))
        if len(a_key)
        else (np.zeros(0, dtype=np.int64))
    )
    ends = np.concatenate([starts[1:] - 1, [len(a_key) - 1]]) if len(starts) else starts
    wait_lo = wa[starts]
    wait_hi = grid[reach[ends] - reach[ends] // stride * stride - 1] if len(ends) else wb[:0]
    wait_key = a_key[starts]
    wait_offsets = np.searchsorted(wait_key // stride, np.arange(n_t + 1), side="left")
    return Timeline(
        names, grid, times, key, service, rate, offsets, wait_lo, wait_hi, wait_key, wait_offsets
    )


def _event_order(
    ev_t: np.ndarray, ev_c: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The events by tenant, then time, then their own order (`order`), the first of each
    (tenant, time) group (`first`), the events' distinct times (sorted) and each group's time
    (an index into them) and tenant. One stable sort by time, then a stable sort by tenant (a
    radix sort where the codes fit 16 bits): the order the one argsort of tenant × stride + rank
    gave, with no grid of every time to rank against first."""
    by_time = np.argsort(ev_t, kind="stable")
    at = ev_t[by_time]
    new = np.empty(len(at), dtype=bool)
    new[:1] = True
    np.not_equal(at[1:], at[:-1], out=new[1:])
    distinct = at[new]
    del at
    time_of = np.cumsum(new, dtype=np.int64)
    time_of -= 1
    tenant_by_time = ev_c[by_time]
    by_tenant = np.argsort(tenant_by_time, kind="stable")
    order = by_time[by_tenant]
    del by_time
    time_of = time_of[by_tenant]
    tenant = tenant_by_time[by_tenant]
    del tenant_by_time, by_tenant
    # a group begins where the time or the tenant changes
    np.not_equal(time_of[1:], time_of[:-1], out=new[1:])
    new[1:] |= tenant[1:] != tenant[:-1]
    first = np.flatnonzero(new)
    return order, first, distinct, time_of[first], tenant[first]


def _merge(distinct: np.ndarray, rest: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sorted union of two sorted arrays of distinct values (np.unique of both, without a
    sort), and the rank (1 + index in it) of each value of either."""
    at = np.searchsorted(distinct, rest)
    dup = at < len(distinct)
    dup[dup] = distinct[at[dup]] == rest[dup]
    added = np.flatnonzero(~dup)
    slot = at[added] + np.arange(len(added))
    grid = np.empty(len(distinct) + len(added))
    own = np.ones(len(grid), dtype=bool)
    own[slot] = False
    grid[slot] = rest[added]
    distinct_rank = np.flatnonzero(own) + 1
    grid[own] = distinct
    rest_rank = np.empty(len(rest), dtype=np.int64)
    rest_rank[added] = slot + 1
    rest_rank[dup] = distinct_rank[at[dup]]
    return grid, distinct_rank, rest_rank


def _sums(
    order: np.ndarray, first: np.ndarray, spread: int, rate: np.ndarray, jump: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per (tenant, time) group: the change in service rate, the number of requests in service
    after it (every tenant starts and ends with none), and the jump (no-span costs). Events
    `order`ed, `spread` starts then as many ends, then the no-span ends: each float summed by
    np.add.reduceat over the group's events in that order, as before (its pairwise sum fixes
    the bits), through two reused buffers; the count from the order itself, exact in integers."""
    n_groups = len(first)
    if not n_groups:
        return np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0)
    values = np.zeros(len(order))
    values[:spread] = rate
    np.negative(rate, out=values[spread : 2 * spread])
    held = np.take(values, order)
    drate = np.add.reduceat(held, first)
    values[: 2 * spread] = 0.0
    values[2 * spread :] = jump
    np.take(values, order, out=held)
    jumps = np.add.reduceat(held, first)
    del values, held
    step = (order < spread).astype(np.int8)
    step -= (order >= spread) & (order < 2 * spread)
    active = np.cumsum(step, dtype=np.int64)
    last = np.empty(n_groups, dtype=np.int64)
    last[:-1] = first[1:] - 1
    last[-1] = len(order) - 1
    return drate, active[last], jumps
