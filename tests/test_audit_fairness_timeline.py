"""Known-truth audit of the fairness figures among the backlogged (fairbench.analysis.fairness):
the backlogged service difference and Jain's index among the backlogged, each against a
brute-force oracle written from its docstring alone.

The oracle knows nothing of breakpoints: a tenant's backlog is the union of its waits, S_i(t)
the sum over its served requests of cost ÷ weight spread uniformly over [start, end] (whole at
the end for a request with no span), and the supremum over intervals [t1, t2] in which both
tenants were backlogged of |ΔS_f − ΔS_g| is read off D = S_f − S_g at every point of the time
grid the run lives on (and D's left limit there: an interval may end just before a jump).
Random small runs cover ties (a coarse grid), no-span requests, zero cost, never-served and
never-waiting requests (NaN), one tenant, weights (some tenants with none) and run-clock times.
Every time is a binary fraction (grids of 1/64 s to 1 s), so the oracle's grid holds every
breakpoint exactly, on the run clock too: a disagreement is the code's, not rounding's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fairbench.analysis.fairness import (
    backlogged_jain,
    backlogged_service_difference,
    build_timeline,
)
from fairbench.analysis.metrics import jain

Intervals = list[tuple[float, float]]


def union(lo: np.ndarray, hi: np.ndarray) -> Intervals:
    """The set of times covered by the waits [lo, hi] of positive length (touching ones join)."""
    out: list[list[float]] = []
    for a, b in sorted(zip(lo.tolist(), hi.tolist(), strict=True)):
        if not (np.isfinite(a) and np.isfinite(b) and b > a):
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def both(f: Intervals, g: Intervals) -> Intervals:
    return [
        (max(a, c), min(b, d)) for a, b in f for c, d in g if min(b, d) > max(a, c)
    ]  # the pieces of positive length


def service(t: float, start: np.ndarray, end: np.ndarray, cost: np.ndarray, left: bool) -> float:
    """S(t) (or its left limit S(t−)) of one tenant's requests, cost already ÷ weight."""
    total = 0.0
    for s, e, c in zip(start, end, cost, strict=True):
        if not (c > 0 and np.isfinite(s) and np.isfinite(e)):
            continue
        if e > s:
            total += c * min(max((t - s) / (e - s), 0.0), 1.0)
        elif (t > e) if left else (t >= e):
            total += c
    return total


def tenants_of(run: tuple) -> dict[str, tuple]:
    client, weights, arrival, wait_end, start, end, cost = run
    out = {}
    for name in sorted(set(client.tolist())):
        m = client == name
        w = weights.get(name, 1.0)
        out[name] = (union(arrival[m], wait_end[m]), start[m], end[m], cost[m] / w)
    return out


def oracle_difference(run: tuple, step: float) -> tuple[float | None, tuple | None, float]:
    """max over pairs and both-backlogged [t1, t2] of |ΔS_f − ΔS_g|, the pair, its time both
    backlogged; every time of the run is a multiple of `step`."""
    per = tenants_of(run)
    names = list(per)
    best, pair, seconds = None, None, 0.0
    for i, f in enumerate(names):
        for g in names[i + 1 :]:
            pieces = both(per[f][0], per[g][0])
            if not pieces:
                continue
            found = -np.inf
            for lo, hi in pieces:
                d = []
                for k in range(round(lo / step), round(hi / step) + 1):
                    t = k * step
                    sides = (False, True) if t > lo else (False,)
                    for left in sides:
                        d.append(service(t, *per[f][1:], left) - service(t, *per[g][1:], left))
                found = max(found, max(d) - min(d))
            if best is None or found > best:
                best, pair, seconds = found, (f, g), sum(b - a for a, b in pieces)
    return best, pair, seconds


def oracle_jain(run: tuple, t0: float, t1: float, window_s: float) -> np.ndarray | None:
    """Per window [a, min(a + w, t1)]: Jain's index of S(b) − S(a) over the tenants backlogged
    ≥ half of it, NaN under two. None where a tenant's backlog is half the window to rounding
    (either reading is right)."""
    per = tenants_of(run)
    out = []
    for a in np.arange(t0, t1, window_s):
        b = min(a + window_s, t1)
        got = []
        for waits, start, end, cost in per.values():
            held = sum(max(0.0, min(y, b) - max(x, a)) for x, y in waits)
            if abs(held - 0.5 * (b - a)) < 1e-9:
                return None
            if held >= 0.5 * (b - a):
                got.append(
                    service(b, start, end, cost, False) - service(a, start, end, cost, False)
                )
        out.append(jain(np.array(got)) if len(got) >= 2 else np.nan)
    return np.array(out)


def random_run(seed: int, tenants: int, n: int, step: float, mode: str) -> tuple:
    rng = np.random.default_rng(seed)
    client = rng.integers(0, tenants, n).astype(str)
    top = max(round(10 / step), 2)
    arrival = np.sort(rng.integers(0, top, n)) * step
    waits = rng.random(n) < rng.uniform(0.2, 1.0)  # the rest never waited for the scheduler
    wait_end = arrival + rng.integers(0, max(round(2 / step), 1) + 1, n) * step
    start = wait_end + rng.integers(0, max(round(0.5 / step), 1) + 1, n) * step
    end = start + rng.integers(0, max(round(1.5 / step), 1) + 1, n) * step  # 0: no span
    start = np.where(rng.random(n) < 0.1, np.nan, start)  # never served (timed out waiting)
    cost = np.where(rng.random(n) < 0.85, rng.integers(1, 100, n), 0).astype(float)
    weights = {str(k): float(rng.integers(1, 4)) for k in range(tenants)}
    if mode == "no span":
        end = start.copy()
    elif mode == "fractional weights":
        weights = {k: float(rng.uniform(0.1, 5.0)) for k in weights}
    elif mode == "some unweighted":
        weights = {k: v for k, v in weights.items() if rng.random() < 0.5}
    return (
        client,
        weights,
        np.where(waits, arrival, np.nan),
        np.where(waits, wait_end, np.nan),
        start,
        end,
        cost,
    )


MODES = ("plain", "no span", "fractional weights", "some unweighted")


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 100_000),
    tenants=st.integers(1, 5),
    n=st.integers(1, 40),
    step=st.sampled_from([1 / 64, 0.25, 0.5, 1.0]),
    mode=st.sampled_from(MODES),
    clock=st.sampled_from([0.0, 1.7e9]),
)
def test_backlogged_figures_equal_their_definitions(
    seed: int, tenants: int, n: int, step: float, mode: str, clock: float
) -> None:
    run = random_run(seed, tenants, n, step, mode)
    client, weights, *times, cost = run
    tl = build_timeline(client, weights, *(t + clock for t in times), cost)
    tol = 1e-3 if clock else 1e-7  # run-clock times keep ~2e-7 s of a rate
    got = backlogged_service_difference(tl)
    want, pair, seconds = oracle_difference(run, step)
    if want is None:  # never two tenants backlogged at once: no value, never 0 or "unfair"
        assert got.max is None and got.pair is None and got.both_backlogged_s == 0.0
    else:
        assert got.max is not None and abs(got.max - want) <= tol * max(1.0, want), (got, want)
        if got.pair == pair:
            assert abs(got.both_backlogged_s - seconds) <= tol * max(1.0, seconds)
    for window in (0.5, 1.0, 2.5):
        _, values = backlogged_jain(tl, clock, clock + 13.0, window)
        expect = oracle_jain(run, 0.0, 13.0, window)
        if expect is None:
            continue
        assert np.allclose(values, expect, rtol=tol, atol=tol, equal_nan=True), (
            window,
            values,
            expect,
        )


def test_one_tenant_and_disjoint_backlogs_read_no_value() -> None:
    """One tenant: no pair, no value. Two tenants backlogged one after the other (touching at
    t = 5, no time both waited): no value and no contended window, never 0 or unfair."""
    client = np.array(["a", "a"])
    times = np.array([0.0, 1.0]), np.array([5.0, 6.0]), np.array([5.0, 6.0]), np.array([7.0, 8])
    tl = build_timeline(client, {}, *times, np.array([10.0, 20.0]))
    assert backlogged_service_difference(tl).max is None
    assert np.isnan(backlogged_jain(tl, 0.0, 10.0, 5.0)[1]).all()
    client = np.array(["a", "b"])
    arrival, wait_end = np.array([0.0, 5.0]), np.array([5.0, 10.0])
    tl = build_timeline(client, {}, arrival, wait_end, wait_end, wait_end + 1, np.ones(2))
    sd = backlogged_service_difference(tl)
    assert sd.max is None and sd.pair is None and sd.both_backlogged_s == 0.0
    assert np.isnan(backlogged_jain(tl, 0.0, 10.0, 1.0)[1]).all()


def test_a_run_without_contention_says_so_beside_its_zero(tmp_path: Path) -> None:
    """Bug fix: with no two tenants ever backlogged, summary.json's service difference read 0
    with the maximum's reason, "the value is exact for this run", as if 0 had been measured
    over backlogged intervals; its interval reason now says there were none."""
    import yaml

    from fairbench.analysis.fairness_ci import REASON_NO_CONTENTION
    from fairbench.pipeline import run_scenario
    from fairbench.run import RunOptions
    from fairbench.workload.loading import parse_scenario
    from tests.test_fairness_contention import SCENARIO  # 200/s and 5/s on two replicas

    scn = parse_scenario(yaml.safe_load(SCENARIO.replace("POLICY", "fifo")))
    summary = run_scenario(scn, RunOptions(out=tmp_path / "run")).summary
    entry = summary["metrics"]["overall"]["service_difference"]
    assert summary["fairness"]["service_difference"]["reason"] == "no contention"
    assert entry["value"] == 0.0 and entry["ci_reason"] == REASON_NO_CONTENTION
    assert summary["metrics"]["overall"]["jain_backlogged"]["value"] is None
