"""The fairness figures' intervals (fairbench.analysis.fairness_ci): slowdown ratio and Jain by
batch-means jackknife, isolation from the two p99s' intervals, and the service difference's
honest refusal. Seeded and fast; the run-to-run table is benchmarks/bench_calibration.py.

Each check fails for what was printed before (no interval at all) and for the obvious shortcut:
the slowdown figures' requests taken as independent cover an AR(1) truth far below 95%.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from scipy import signal

from fairbench.analysis import censored
from fairbench.analysis import intervals as iv
from fairbench.analysis.columns import Cols
from fairbench.analysis.fairness_ci import (
    REASON_MAXIMUM,
    isolation_interval,
    log_se,
    slowdown_intervals,
    tenant_isolation_interval,
)
from fairbench.analysis.metrics import jain

REPO = Path(__file__).resolve().parents[1]


def _cols(slow: np.ndarray, tenant: np.ndarray, **extra: np.ndarray) -> Cols:
    n = len(slow)
    return Cols(
        e2e_x=np.ones(n, bool),
        e2e_t=slow * 1e9,
        unloaded=np.full(n, 1e9),
        tenant=tenant,
        t=np.arange(n, dtype=float) * 1e8,  # 10 requests per second
        ttft_t=np.zeros(n),  # nobody waits: every request its own contention episode
        ttft_x=np.ones(n, bool),
        **extra,
    )


def _queue_like(n: int, rng: np.random.Generator, phi: float = 0.95) -> np.ndarray:
    """exp of a Gaussian AR(1) of unit variance: a slowdown series whose neighbours wait
    together (mean e^0.5 whatever φ)."""
    e = rng.standard_normal(n) * math.sqrt(1 - phi * phi)
    e[0] = rng.standard_normal()
    return np.exp(signal.lfilter([1.0], [1.0, -phi], e))


def _coverage(scale_a: float, reps: int = 200, n: int = 3000) -> tuple[float, float, float]:
    """(worst ratio's coverage, Jain's, worst ratio's if the requests were independent)."""
    rng = np.random.default_rng(17)
    true_worst = max(scale_a, 1 / scale_a)
    true_jain = jain(np.array([scale_a, 1.0]))
    worst = jain_hits = naive = declined = 0
    for _ in range(reps):
        tenant = rng.integers(0, 2, n)
        # each tenant's own correlated series (a shared one would cancel in the ratio)
        own = np.where(tenant == 0, _queue_like(n, rng), _queue_like(n, rng))
        slow = own * np.where(tenant == 0, scale_a, 1.0)
        w, j = slowdown_intervals(_cols(slow, tenant))
        if w.declined:  # a lognormal request can carry the ratio alone (1% of these samples)
            declined += 1
            continue
        assert w.low <= w.high and j.low <= j.high <= 1.0
        worst += int(w.low <= true_worst <= w.high)
        jain_hits += int(j.low <= true_jain <= j.high)
        # the shortcut: Welch's t on the log ratio with every request independent
        a, b = slow[tenant == 0], slow[tenant == 1]
        ratio = a.mean() / b.mean()
        se = math.sqrt(a.var() / len(a) / a.mean() ** 2 + b.var() / len(b) / b.mean() ** 2)
        lo, hi = abs(math.log(ratio)) - 1.96 * se, abs(math.log(ratio)) + 1.96 * se
        naive += int(math.exp(lo) <= true_worst <= math.exp(hi))
    assert declined <= 0.05 * reps, declined
    given = reps - declined
    return worst / given, jain_hits / given, naive / given


def test_slowdown_intervals_cover_a_serially_correlated_truth() -> None:
    worst, jain_rate, naive = _coverage(1.5)
    assert 0.92 <= worst <= 0.99, worst
    assert 0.92 <= jain_rate <= 0.99, jain_rate
    assert naive < 0.8, naive  # requests as independent: what the shortcut would promise


def test_at_a_tie_the_interval_still_covers() -> None:
    """Equal tenants: the ratio's truth is 1 and Jain's 1, the edge of both ranges; a delta
    method on max ÷ min would shrink to nothing there, the image of log(ratio)'s interval
    covers whenever that interval covers 0."""
    worst, jain_rate, _ = _coverage(1.0, reps=150)
    assert 0.92 <= worst <= 0.99, worst
    assert 0.92 <= jain_rate <= 0.99, jain_rate


def test_a_short_run_declines_the_slowdown_interval_and_says_how_long_would_do() -> None:
    rng = np.random.default_rng(3)
    slow = _queue_like(200, rng, phi=0.99)
    w, j = slowdown_intervals(_cols(slow, rng.integers(0, 2, 200)))
    assert w.declined and j.declined
    assert "too short" in (w.reason or "") and " s at this rate" in (w.reason or "")


def test_a_ratio_made_by_one_backlog_episode_is_declined_with_what_would_do() -> None:
    """Near capacity under VTC a tenant's mean slowdown is made by a few long backlog episodes:
    a run without a large one read a low ratio with little spread, and the time-batch jackknife
    covered 70-77% of 60 seeds. Here tenant 0's requests wait together for a third of the run
    (their waits overlap: one episode) and carry most of the ratio's variance; declined, with
    the effective number of episodes and how long a run would do. The same slowdowns with
    nobody waiting (each request its own episode) keep their interval."""
    rng = np.random.default_rng(8)
    n = 3000
    tenant = rng.integers(0, 2, n)
    slow = np.exp(rng.standard_normal(n) * 0.2)
    burst = (np.arange(n) >= 1000) & (np.arange(n) < 2000)
    slow[burst & (tenant == 0)] *= np.linspace(2.0, 12.0, int((burst & (tenant == 0)).sum()))
    c = _cols(slow, tenant)
    c.ttft_t = np.where(burst, 2e10, 0.0)  # 20 s waits, arrivals 0.1 s apart: they overlap
    w, j = slowdown_intervals(c)
    assert w.declined and j.declined
    reason = w.reason or ""
    assert "effective independent contention episodes" in reason and " s if episodes" in reason
    assert "fairbench ab" in reason
    w2, _ = slowdown_intervals(_cols(slow, tenant))  # nobody waits: one episode a request
    assert not w2.declined
    c = _cols(slow, tenant)
    c.ttft_t = np.full(n, 1e12)  # an overloaded queue: everyone waits together, one episode
    w3, _ = slowdown_intervals(c)
    assert w3.declined and "one contention episode holds" in (w3.reason or "")


def test_more_tenants_get_a_jackknifed_figure_inside_its_range() -> None:
    rng = np.random.default_rng(5)
    tenant = rng.integers(0, 3, 4000)
    slow = _queue_like(4000, rng, 0.8) * np.array([1.0, 1.2, 2.0])[tenant]
    w, j = slowdown_intervals(_cols(slow, tenant))
    assert "delta method" in w.method
    assert 1.0 <= w.low < 2.0 < w.high
    assert 1 / 3 <= j.low <= j.high <= 1.0


def test_isolation_interval_is_the_log_ratio_of_the_two_sides() -> None:
    rng = np.random.default_rng(9)
    n = 4000
    mix = np.exp(rng.standard_normal(n)) * 2e7
    obs = censored.Observations(mix, np.ones(n, bool), np.arange(n, dtype=float))
    se_mix = log_se(obs)
    assert se_mix is not None and se_mix > 0
    solo = 1e7
    c = Cols(
        ttft_t=mix,
        ttft_o=np.ones(n, bool),
        ttft_x=np.ones(n, bool),
        tenant=np.zeros(n, dtype=np.int64),
        t=np.arange(n, dtype=float),
        solo_ttft=np.array([solo]),
        solo_ttft_se=np.array([0.05]),
    )
    it = tenant_isolation_interval(c, 0)
    value = censored.quantile(obs, 0.99)[0] / solo
    half = 1.959964 * math.hypot(se_mix, 0.05)
    assert math.isclose(it.low, value * math.exp(-half), rel_tol=1e-5)
    assert math.isclose(it.high, value * math.exp(half), rel_tol=1e-5)
    assert isolation_interval(c).low == it.low  # one tenant: the worst is its own
    c.solo_ttft_se[0] = np.nan  # a solo arm too short to bound its p99
    gone = tenant_isolation_interval(c, 0)
    assert gone.declined and "solo arm" in (gone.reason or "")
    c.solo_ttft[0] = np.nan
    assert (tenant_isolation_interval(c, 0).reason or "") == "no solo arm"


def test_a_run_prints_every_fairness_interval_or_why_not(tmp_path: Path) -> None:
    """A short simulated run: summary.json carries ci fields for the four figures (the service
    difference declined, with its reason), and the fairness line shows them."""
    from fairbench.pipeline import run_scenario
    from fairbench.report.markdown import fairness_line, figure_text
    from fairbench.run.rundir import RunOptions
    from fairbench.workload import parse_scenario, read_yaml

    data = read_yaml((REPO / "scenarios" / "calibration" / "queue.yaml").read_text())
    data = json.loads(json.dumps(data))
    data["run"].update(duration="90s", seed=3)
    for tenant in data["tenants"]:
        tenant["arrival"]["rate"] = "6/s"
    summary = run_scenario(parse_scenario(data), RunOptions(out=tmp_path, progress=False)).summary
    overall = summary["metrics"]["overall"]
    for name in ("isolation", "worst_slowdown_ratio", "jain_slowdown", "service_difference"):
        entry = overall[name]
        assert {"ci_low", "ci_high", "ci_method", "ci_confidence", "ci_reason"} <= set(entry)
        assert entry["ci_confidence"] == 0.95
        if entry["ci_low"] is None and entry["ci_high"] is None:
            assert entry["ci_reason"], name
        else:
            assert entry["ci_low"] <= entry["value"] <= entry["ci_high"], name
    assert overall["service_difference"]["ci_reason"] == REASON_MAXIMUM
    assert "no interval: a maximum over this run" in figure_text(summary, "service_difference")
    for tenant in ("a", "b"):
        assert "ci_method" in summary["metrics"]["tenant"][tenant]["isolation"]
    line = fairness_line(summary)
    assert "worst ÷ best slowdown" in line and "[" in line


def test_declined_intervals_keep_their_fields_null() -> None:
    it = iv.declined(0.95, "m", "why")
    assert it.fields() == {
        "ci_low": None,
        "ci_high": None,
        "ci_method": "m",
        "ci_confidence": 0.95,
        "ci_reason": "why",
    }


def test_the_worst_tenants_isolation_holds_every_tenant_at_once() -> None:
    """Two tenants: the worst's interval is [max low, max high] of the tenants' intervals at
    97.5% each (Bonferroni), so it is wider than either at 95% alone; at 95% each, two tenants'
    worst covered 89% on the calibration queue at 9/s."""
    rng = np.random.default_rng(21)
    n = 6000
    tenant = rng.integers(0, 2, n).astype(np.int64)
    mix = np.exp(rng.standard_normal(n)) * np.where(tenant == 0, 3e7, 2e7)
    c = Cols(
        ttft_t=mix,
        ttft_o=np.ones(n, bool),
        ttft_x=np.ones(n, bool),
        tenant=tenant,
        t=np.arange(n, dtype=float),
        solo_ttft=np.array([1e7, 1e7]),
        solo_ttft_se=np.array([0.04, 0.04]),
    )
    both = isolation_interval(c)
    alone = [tenant_isolation_interval(c, k) for k in (0, 1)]
    wide = [tenant_isolation_interval(c, k, 0.975) for k in (0, 1)]
    assert both.confidence == 0.95 and "Bonferroni" in both.method
    assert both.low == max(it.low for it in wide) and both.high == max(it.high for it in wide)
    assert both.high > max(it.high for it in alone)
