"""The sparse timeline (each tenant on its own breakpoints) against the dense one it replaced
(every tenant on every breakpoint, issue 33 item 3), kept here as the oracle: on random small
runs the backlogged service difference, its pair, the pair's both-backlogged time and Jain's
index among the backlogged agree to rounding."""

from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fairbench.analysis.fairness import (
    backlogged_jain,
    backlogged_service_difference,
    backlogged_service_difference_all_pairs,
    build_timeline,
)
from fairbench.analysis.metrics import jain


def dense(client, weights, arrival, wait_end, start, end, cost):
    """The former build_timeline: service (tenants × edges) and backlog (tenants × segments),
    and the service's left limits at the edges (less a no-span request's jump at its end)."""
    names = tuple(sorted(str(c) for c in set(client.tolist())))
    code = np.searchsorted(np.array(names), client.astype(str))
    allv = np.concatenate([arrival, wait_end, start, end])
    edges = np.unique(allv[np.isfinite(allv)])
    k = len(edges)
    service = np.zeros((len(names), k))
    before = np.zeros((len(names), k))
    backlogged = np.zeros((len(names), max(k - 1, 0)), dtype=bool)
    lengths = np.diff(edges)
    served = (cost > 0) & np.isfinite(start) & np.isfinite(end)
    waits = np.isfinite(wait_end) & np.isfinite(arrival) & (wait_end > arrival)
    for i, name in enumerate(names):
        sel = (code == i) & served
        s_idx, e_idx = np.searchsorted(edges, start[sel]), np.searchsorted(edges, end[sel])
        span = end[sel] - start[sel]
        spread = span > 0
        rate = np.where(spread, cost[sel] / np.where(spread, span, 1.0), 0.0)
        rate_now = np.cumsum(np.bincount(s_idx, rate, k) - np.bincount(e_idx, rate, k))
        row = service[i]
        row[1:] = rate_now[:-1] * lengths
        np.cumsum(row, out=row)
        jump = np.bincount(e_idx[~spread], cost[sel][~spread], k)
        row += np.cumsum(jump)
        row /= float(weights.get(name, 1.0))
        before[i] = row - jump / float(weights.get(name, 1.0))
        sel = (code == i) & waits
        count = np.bincount(np.searchsorted(edges, arrival[sel]), minlength=k) - np.bincount(
            np.searchsorted(edges, wait_end[sel]), minlength=k
        )
        backlogged[i] = np.cumsum(count)[:-1] > 0
    return names, edges, service, backlogged, before


def dense_difference(names, edges, service, backlogged, before):
    """Per pair, per run of both-backlogged segments [edges[i], edges[j]]: the range of
    D = S_f − S_g over D at every edge of it and D's left limit at every edge but the first
    (an interval may end just before a no-span request's jump)."""
    best, pair, both = None, None, 0.0
    for f in range(len(names)):
        for g in range(f + 1, len(names)):
            m = backlogged[f] & backlogged[g]
            if not m.any():
                continue
            right, left = service[f] - service[g], before[f] - before[g]
            found = -np.inf
            i = 0
            while i < len(m):
                if not m[i]:
                    i += 1
                    continue
                j = i
                while j < len(m) and m[j]:
                    j += 1
                values = np.concatenate([right[i : j + 1], left[i + 1 : j + 1]])
                found = max(found, float(values.max() - values.min()))
                i = j
            if best is None or found > best:
                best, both, pair = found, float(np.diff(edges)[m].sum()), (names[f], names[g])
    return best, pair, both


def dense_jain(names, edges, service, backlogged, before, t0, t1, window_s):
    starts = np.arange(t0, t1, window_s)
    ends = np.minimum(starts + window_s, t1)
    held = np.concatenate(
        [np.zeros((len(names), 1)), np.cumsum(np.where(backlogged, np.diff(edges), 0.0), 1)], 1
    )
    out = []
    for a, b in zip(starts, ends, strict=True):
        got = np.array([np.interp(b, edges, s) - np.interp(a, edges, s) for s in service])
        # a difference of two equal cumulative sums read by interpolation: 0 up to rounding
        # (5.7e-14 once), and Jain over tenants that all got nothing is NaN, not 1/n
        got[np.abs(got) < 1e-9] = 0.0
        waited = np.array([np.interp(b, edges, h) - np.interp(a, edges, h) for h in held])
        sel = waited >= 0.5 * (b - a)
        out.append(jain(got[sel]) if sel.sum() >= 2 else np.nan)
    return np.array(out)


@settings(max_examples=60, deadline=None)
@given(tenants=st.integers(1, 8), n=st.integers(1, 150), seed=st.integers(0, 100_000))
@example(tenants=4, n=46, seed=432)  # the extreme is a left limit at a no-span request's end
@example(tenants=2, n=32, seed=18610)  # a window whose backlogged tenants all got nothing
@example(tenants=5, n=33, seed=146)  # the same, with three of five backlogged
def test_sparse_timeline_equals_the_dense_one(tenants: int, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    client = rng.integers(0, tenants, n).astype(str)
    # times on a 10 ms grid, so waits touch and service spans share breakpoints often
    arrival = np.sort(rng.integers(0, 1000, n)) / 100
    waits = rng.random(n) < 0.7
    wait_end = arrival + rng.integers(0, 200, n) / 100
    start = wait_end + rng.integers(0, 50, n) / 100
    end = start + rng.integers(0, 150, n) / 100  # some with no span: cost lands at the end
    cost = np.where(rng.random(n) < 0.9, rng.integers(1, 100, n), 0).astype(float)
    weights = {str(k): float(rng.integers(1, 4)) for k in range(tenants)}
    args = (
        client,
        weights,
        np.where(waits, arrival, np.nan),
        np.where(waits, wait_end, np.nan),
        start,
        end,
        cost,
    )
    tl = build_timeline(*args)
    old = dense(*args)
    want_max, want_pair, want_both = dense_difference(*old)
    got = backlogged_service_difference(tl)
    every = backlogged_service_difference_all_pairs(tl)
    if want_max is None:
        assert got.max is None and every.max is None
    else:
        assert got.max is not None and np.isclose(got.max, want_max, rtol=1e-9, atol=1e-9)
        assert every.max is not None and np.isclose(every.max, want_max, rtol=1e-9, atol=1e-9)
        if np.isclose(every.max, want_max, rtol=0, atol=0):
            assert every.pair == want_pair and np.isclose(every.both_backlogged_s, want_both)
    # Jain: the dense reading interpolated across a no-span request's jump (its cost spread
    # back over the segment before), the sparse one does not; off the jumps they agree
    spans = (args[4], np.maximum(args[5], args[4] + 0.01))
    spread = (*args[:4], *spans, cost)
    _, values = backlogged_jain(build_timeline(*spread), 0.0, 14.0, 1.005)
    assert np.allclose(values, dense_jain(*dense(*spread), 0.0, 14.0, 1.005), equal_nan=True)
