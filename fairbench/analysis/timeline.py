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
        return self._service(tenant, t, self.rank(t))

    def service_before(self, tenant: np.ndarray, t: np.ndarray) -> np.ndarray:
        """S_tenant(t−), the left limit: S_tenant(t) less a jump at t (a request with no span
        ending at t). An interval may end just before a jump, so a supremum over intervals
        must read both sides of it."""
        t = np.asarray(t, dtype=np.float64)
        return self._service(tenant, t, np.searchsorted(self.grid, t, side="left"))

    def _service(self, tenant: np.ndarray, t: np.ndarray, rank: np.ndarray) -> np.ndarray:
        """Continue the tenant's last breakpoint of rank ≤ `rank` linearly to t: the rank of t
        itself (`rank`) reads S(t), the number of grid times below t reads S(t−)."""
        tenant = np.asarray(tenant, dtype=np.int64)
        idx = np.searchsorted(self.key, tenant * self.stride + rank, side="right") - 1
        mine = idx >= self.offsets[tenant]
        idx = np.maximum(idx, 0)
        if not len(self.times):
            return np.zeros(len(t))
        value = self.service[idx] + self.rate[idx] * (t - self.times[idx])
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
    uniformly; a request with no span adds its cost at its end. One sort of the run's times,
    then O(n) passes. With `names` (the distinct tenants, sorted), `client` is each request's
    index into them: the summary's codes, where a str per request cost a fleet run seconds."""
    if names is None:
        names = tuple(sorted(str(c) for c in set(client.tolist())))
        code = np.searchsorted(np.array(names), client.astype(str)).astype(np.int64)
    else:
        names, code = tuple(names), np.asarray(client, dtype=np.int64)
    n_t, n = len(names), len(code)
    # every time's rank (1 + its index in the grid, what searchsorted(grid, t, "right") gives
    # a time of the grid) from the grid's own sort: searching 3.5M times in the grid cost as
    # much as the sort (a 10-minute fleet run, issue 35); 0 for NaN, never read
    allv = np.concatenate([arrival_s, wait_end_s, start_s, end_s])
    finite = np.isfinite(allv)
    grid, where = np.unique(allv[finite], return_inverse=True)
    del allv
    ranks = np.zeros(4 * n, dtype=np.int32 if len(grid) < 2**31 - 1 else np.int64)
    ranks[finite] = where + 1
    del where, finite
    stride = len(grid) + 1
    weight = np.array([float(weights.get(name, 1.0)) for name in names])

    served = (cost > 0) & np.isfinite(start_s) & np.isfinite(end_s)
    c, s, e, w = code[served], start_s[served], end_s[served], cost[served] / weight[code[served]]
    s_rank, e_rank = ranks[2 * n : 3 * n][served], ranks[3 * n :][served]
    spread = (e - s) > 0
    r = np.where(spread, w / np.where(spread, e - s, 1.0), 0.0)
    cs, ss, es, rs = c[spread], s[spread], e[spread], r[spread]
    ev_c = np.concatenate([cs, cs, c[~spread]])
    ev_t = np.concatenate([ss, es, e[~spread]])
    ev_rank = np.concatenate([s_rank[spread], e_rank[spread], e_rank[~spread]])
    del s_rank, e_rank
    ev_rate = np.concatenate([rs, -rs, np.zeros(int((~spread).sum()))])
    ev_count = np.concatenate([np.ones(len(cs)), -np.ones(len(cs)), np.zeros(int((~spread).sum()))])
    ev_jump = np.concatenate([np.zeros(2 * len(cs)), w[~spread]])
    ev_key = ev_c * stride + ev_rank
    del ev_rank
    order = np.argsort(ev_key, kind="stable")
    ev_key = ev_key[order]
    first = (
        np.flatnonzero(np.concatenate([[True], ev_key[1:] != ev_key[:-1]]))
        if len(order)
        else (np.zeros(0, dtype=np.int64))
    )
    key = ev_key[first]
    tenant_of = key // stride
    times = ev_t[order][first]
    sum_at = lambda v: np.add.reduceat(v[order], first) if len(first) else np.zeros(0)  # noqa: E731
    drate, dcount, jump = sum_at(ev_rate), sum_at(ev_count), sum_at(ev_jump)
    active = np.rint(np.cumsum(dcount))  # every tenant starts and ends with none active
    cumrate = np.cumsum(drate)
    idle = active <= 0
    last_idle = np.maximum.accumulate(np.where(idle, np.arange(len(idle)), -1))
    rate = np.where(
        idle, 0.0, cumrate - np.where(last_idle >= 0, cumrate[np.maximum(last_idle, 0)], 0.0)
    )
    rate = np.maximum(rate, 0.0)  # the service rate on the segment after each breakpoint
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
    a_key, b_key = wc * stride + ranks[:n][waits], wc * stride + ranks[n : 2 * n][waits]
    del ranks
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
