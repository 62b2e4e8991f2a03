"""Known-truth audit of the per-window service figures (fairbench.analysis.fairness): the VTC
paper's service difference and Jain's index per window, each against a brute-force oracle
written from its docstring alone (a loop over requests, no shared helper), on small random runs
with ties (times on a coarse grid), requests with no span, zero cost, never-served (NaN)
requests, one tenant, weights, and clock times as large as a real run's."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fairbench.analysis.fairness import service_difference, windowed_jain
from fairbench.analysis.metrics import jain


def oracle_windowed_jain(
    client: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    cost: np.ndarray,
    weights: dict[str, float],
    t0: float,
    t1: float,
    window_s: float,
) -> np.ndarray:
    """Per window [lo, lo + w): Jain's index of service ÷ weight over the clients served
    something in it; a request's cost spread over [start, end], whole at its end if it has no
    span; a never-served or free request serves nothing."""
    values = []
    for lo in np.arange(t0, t1, window_s):
        hi = lo + window_s
        got = []
        for name in sorted(set(client.tolist())):
            total = 0.0
            for c, s, e, x in zip(client, start, end, cost, strict=True):
                if c != name or not (np.isfinite(s) and np.isfinite(e) and x > 0):
                    continue
                if e > s:
                    total += x * max(0.0, min(e, hi) - max(s, lo)) / (e - s)
                elif lo <= e < hi:
                    total += x
            if total > 0:
                got.append(total / weights.get(name, 1.0))
        values.append(jain(np.array(got)) if got else np.nan)
    return np.array(values)


def oracle_vtc(
    client: np.ndarray,
    arrival: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    cost: np.ndarray,
    duration_s: float,
    warmup_s: float,
    window_s: float,
    min_end_s: float,
) -> np.ndarray:
    """diff at each of 19 ticks: Σ_j min(max_k s_k − s_j, |r_j − s_j|), s_j the service inside
    [x + warmup ∓ w/2] ÷ w of requests ending at or after min_end lasting ≥ 1e-5, r_j the cost
    of the requests arriving in it ÷ w, over every client seen."""
    names = sorted(set(client.tolist()))
    step = (duration_s - warmup_s) / 20
    out = []
    for i in range(1, 20):
        lo, hi = step * i + warmup_s - window_s / 2, step * i + warmup_s + window_s / 2
        s, r = np.zeros(len(names)), np.zeros(len(names))
        for c, a, b, e, x in zip(client, arrival, start, end, cost, strict=True):
            j = names.index(c)
            if e >= min_end_s and e - b >= 1e-5:
                s[j] += x * max(0.0, min(e, hi) - max(b, lo)) / (e - b) / window_s
            if lo <= a <= hi:
                r[j] += x / window_s
        out.append(float(np.minimum(s.max() - s, np.abs(r - s)).sum()))
    return np.array(out)


def random_run(seed: int, tenants: int, n: int, step: float) -> tuple[np.ndarray, ...]:
    """Times on a grid of `step` seconds over ~20 s (coarse: many ties), spans 0–3 s; steps
    are binary fractions, so the run clock (1.7e9 s) holds every time exactly and a request
    ending on a window's edge stays on it."""
    rng = np.random.default_rng(seed)
    client = rng.integers(0, tenants, n).astype(str)
    arrival = np.sort(rng.integers(0, int(20 / step), n)) * step
    start = arrival + rng.integers(0, int(3 / step) + 1, n) * step
    end = start + rng.integers(0, int(3 / step) + 1, n) * step
    cost = np.where(rng.random(n) < 0.9, rng.integers(1, 100, n), 0).astype(float)
    return client, arrival, start, end, cost


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 100_000),
    tenants=st.integers(1, 4),
    n=st.integers(1, 40),
    step=st.sampled_from([1 / 64, 0.5, 1.0]),
    never_served=st.booleans(),
    offset=st.sampled_from([0.0, 1.7e9]),
)
@example(seed=1, tenants=3, n=30, step=0.5, never_served=True, offset=0.0)
@example(seed=10, tenants=3, n=30, step=0.5, never_served=False, offset=1.7e9)
def test_windowed_jain_equals_its_definition(
    seed: int, tenants: int, n: int, step: float, never_served: bool, offset: float
) -> None:
    client, _, start, end, cost = random_run(seed, tenants, n, step)
    rng = np.random.default_rng(seed + 1)
    weights = {str(k): float(rng.integers(1, 4)) for k in range(tenants)}
    if never_served:
        start = np.where(rng.random(n) < 0.2, np.nan, start)
    _, got = windowed_jain(
        client, start + offset, end + offset, cost, weights, offset, offset + 20.0, 2.5
    )
    want = oracle_windowed_jain(client, start, end, cost, weights, 0.0, 20.0, 2.5)
    assert np.allclose(got, want, rtol=1e-6, atol=1e-6, equal_nan=True), (got, want)


def test_a_never_served_request_does_not_hide_its_tenant() -> None:
    """Bug fix: a's second request was never served (NaN start: it timed out waiting). Its NaN
    spread into a's sum and dropped a from every window, so a window where a got 10 and b 1
    read 1.0 (b alone, "fair") instead of Jain(10, 1) = 121/202."""
    client = np.array(["a", "a", "b"])
    start, end = np.array([0.0, np.nan, 0.0]), np.array([1.0, 5.0, 1.0])
    _, values = windowed_jain(client, start, end, np.array([10.0, 5.0, 1.0]), {}, 0.0, 1.0, 1.0)
    assert values[0] == pytest.approx(121 / 202)


def test_a_no_span_request_on_the_run_clock_counts_once() -> None:
    """Bug fix: on clock times (1.7e9 s) end + 1e-9 rounds to end, so a request with no span
    divided 0 by 0 and its tenant vanished from the window: a window where a got 10 and b 1
    read NaN (nobody served) instead of Jain(10, 1). Counted whole in the window holding its
    end, as the timeline counts it."""
    t = 1.7e9
    client = np.array(["a", "b"])
    start = end = np.array([t + 0.5, t + 0.5])
    cost = np.array([10.0, 1.0])
    _, values = windowed_jain(client, start, end, cost, {}, t, t + 2.0, 1.0)
    assert values[0] == pytest.approx(121 / 202) and np.isnan(values[1])


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 100_000),
    tenants=st.integers(1, 4),
    n=st.integers(1, 40),
    step=st.sampled_from([1 / 64, 0.5, 1.0]),
    warm=st.sampled_from([(0.0, 2.0, 0.0), (1.0, 3.0, 1.0)]),
)
def test_vtc_service_difference_equals_its_definition(
    seed: int, tenants: int, n: int, step: float, warm: tuple[float, float, float]
) -> None:
    client, arrival, start, end, cost = random_run(seed, tenants, n, step)
    duration = float(end.max())
    if duration <= 4.0:
        return
    warmup, window, min_end = warm
    got = service_difference(
        client, arrival, start, end, cost, duration, warmup, window, min_end_s=min_end
    )
    want = oracle_vtc(client, arrival, start, end, cost, duration, warmup, window, min_end)
    assert np.allclose(got.diff, want, rtol=1e-9, atol=1e-9), (got.diff, want)
