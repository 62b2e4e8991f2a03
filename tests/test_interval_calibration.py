"""Intervals keep their promise: coverage measured against known truth (seeded, fast subsets of
benchmarks/bench_calibration.py, whose full table is in docs/metrics.md).

Each check fails for the intervals fairbench printed before: the exact bootstrap covered the true
p99 of 100 i.i.d. lognormal values in 62% of cases and that of an AR(1) series with φ = 0.9 in
56% at n = 10,000; a stationary run's drift interval excluded 0 in 23–27 of 30 seeds.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from fairbench.analysis import calibration as cal
from fairbench.analysis import censored
from fairbench.analysis import intervals as iv

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("kind", "n", "q"),
    [
        ("lognormal", 50, 0.5),
        ("lognormal", 100, 0.9),
        ("lognormal", 100, 0.99),
        ("pareto", 300, 0.99),
        ("lognormal", 1000, 0.99),
    ],
)
def test_iid_percentile_intervals_cover_at_their_level(kind: str, n: int, q: float) -> None:
    c = cal.percentile_coverage(kind, n, q, reps=400, seed=11)
    assert c.declined <= 0.05 * c.reps
    # 400 replications: the binomial SE of a 95% coverage is 1.1%
    assert 0.92 <= c.rate <= 0.985, c.row()


def test_a_tail_the_sample_cannot_bound_is_one_sided_with_the_n_that_would() -> None:
    x = np.sort(cal.lognormal(100, np.random.default_rng(0)))
    it = iv.percentile_interval(x, 0.99, 0.95)
    assert math.isinf(it.high) and it.low <= x[-1]
    assert it.reason is not None and "needs n ≥ 368" in it.reason
    # the whole 5% on the lower side: the lower end is a one-sided 95% bound, and says so
    assert "one-sided 95%" in it.reason
    assert it.low == pytest.approx(iv._at_rank(x, iv._exact_ranks(100, 0.99, 0.05)[0]))
    assert iv.needed_n(0.99, 0.95) == 368
    bounded = iv.percentile_interval(np.sort(cal.lognormal(400, np.random.default_rng(0))), 0.99)
    assert math.isfinite(bounded.high) and bounded.reason is None


def test_serially_correlated_series_are_widened_not_resampled_as_independent() -> None:
    c = cal.percentile_coverage("ar1-0.9", 10_000, 0.99, reps=80, seed=5)
    assert c.declined == 0
    assert c.rate >= 0.88, c.row()  # the exact bootstrap: 56%
    x = cal.ar1_lognormal(10_000, np.random.default_rng(1), 0.9)
    obs = censored.Observations(x, np.ones(len(x), bool), np.arange(len(x), dtype=float))
    est = censored.quantile_estimate(obs, 0.99)
    assert est.interval is not None and "batch means" in est.interval.method


def test_a_rare_tail_of_a_correlated_series_is_widened_by_the_copula() -> None:
    """p99 of 1,000 requests of an AR(1) φ = 0.5 series: batch means see about one exceedance a
    batch and took the series for independent (89% coverage); the normal scores'
    autocorrelations, through a Gaussian copula, widen it; an i.i.d. series is left its exact
    interval (its lag-1 correlation is not significant). The widened ranks are continuity-
    corrected (n·q + ½ ± t·sd: the count below ξ is an integer); without the ½ these 300
    replications covered 98.0% (98.1% of 1,000), with it 96.6% (97.1%)."""
    c = cal.percentile_coverage("ar1-0.5", 1000, 0.99, reps=300, seed=1001)
    # a few samples' ten exceedances come in fewer than 5 bursts: declined, not narrow
    assert c.declined <= 0.05 * c.reps and 0.93 <= c.rate <= 0.975, c.row()
    dep = iv.with_factor(iv.Dependence(batch=34, batches=29), 2.0)
    low, high = iv._dependent_ranks(1000, 0.99, dep, 0.025)
    half = float(iv.sps.t.ppf(0.975, 28)) * math.sqrt(1000 * 0.99 * 0.01 * 2.0)
    assert low == pytest.approx(990.5 - half) and high == pytest.approx(990.5 + half)
    iid = cal.lognormal(1000, np.random.default_rng(3))
    acf = iv.normal_scores_acf(iid, 40)
    assert iv.copula_factor(acf, 1000, 0.99) == 1.0
    ar = cal.ar1_lognormal(1000, np.random.default_rng(3), 0.5)
    assert iv.copula_factor(iv.normal_scores_acf(ar, 40), 1000, 0.99) > 1.2


def test_a_run_too_short_for_its_correlation_declines_and_says_what_would_do() -> None:
    x = cal.ar1_lognormal(300, np.random.default_rng(2), 0.98)
    t = np.arange(300, dtype=float) * 1e8  # 10 requests per second
    est = censored.quantile_estimate(censored.Observations(x, np.ones(300, bool), t), 0.5)
    assert est.interval is not None and est.interval.declined
    assert math.isnan(est.low) and math.isnan(est.high)
    reason = est.interval.reason or ""
    assert "too short" in reason and "requests" in reason and " s at this rate" in reason
    # without time order the same values are taken as independent: an interval, not a refusal
    iid = censored.quantile_estimate(censored.Observations(x, np.ones(300, bool)), 0.5)
    assert iid.interval is not None and not iid.interval.declined


def test_stationary_drift_covers_zero_and_the_test_agrees_with_the_interval() -> None:
    c = cal.drift_coverage("lognormal", 5000, reps=200, seed=3)
    assert 0.90 <= c.rate <= 0.99, c.row()
    rng = np.random.default_rng(4)
    from fairbench.analysis.drift import drift

    for _ in range(40):
        x, t = cal.lognormal(5000, rng), np.arange(5000, dtype=float)
        ones = np.ones(1000, bool)
        d = drift(
            censored.Observations(x[:1000], ones, t[:1000]),
            censored.Observations(x[-1000:], ones, t[-1000:]),
        )
        excludes = not (d.interval.low <= 0 <= d.interval.high)
        assert excludes == (d.p_value < 0.05)


def test_a_real_drift_is_found() -> None:
    from fairbench.analysis.drift import drift

    rng = np.random.default_rng(6)
    x, t = cal.lognormal(10_000, rng), np.arange(10_000, dtype=float)
    x[-2000:] *= 1.5
    ones = np.ones(2000, bool)
    d = drift(
        censored.Observations(x[:2000], ones, t[:2000]),
        censored.Observations(x[-2000:], ones, t[-2000:]),
    )
    assert d.interval.low > 0.1 and d.p_value < 0.01  # a 50% move, found


def test_censored_percentiles_cover_with_kaplan_meier() -> None:
    rng = np.random.default_rng(7)
    truth = math.exp(1.2815515655446004)  # lognormal p90
    covered = given = 0
    for _ in range(300):
        x = cal.lognormal(400, rng)
        cut = rng.exponential(20.0, 400)  # independent right-censoring, about 5%
        obs = censored.Observations(np.minimum(x, cut), x <= cut)
        est = censored.quantile_estimate(obs, 0.9)
        if est.interval is None or est.interval.declined:
            continue
        given += 1
        covered += est.low <= truth <= est.high
    assert given >= 290 and 0.92 <= covered / given <= 0.985


def test_censored_tpot_is_bounded_by_max_tokens_not_tokens_so_far() -> None:
    import pandas as pd

    df = pd.DataFrame(
        {
            "status": ["timeout"],
            "t_intended_ns": [0.0],
            "t_sent_ns": [0.0],
            "t_first_token_ns": [1e9],
            "t_last_token_ns": [2e9],
            "t_end_ns": [3e9],
            "output_tokens": [3.0],
            "max_tokens": [101.0],
        }
    )
    rows = censored.tpot_rows(df)
    # 2 s since the first token, at most 100 more tokens: at least 20 ms per token (dividing by
    # the 2 tokens seen would claim ≥ 1 s per token, which a fast finish would break)
    assert not rows.observed[0] and rows.time[0] == pytest.approx(2e9 / 100)


@pytest.mark.slow
def test_run_to_run_on_the_simulator_the_p99_interval_covers_the_long_run_value(
    tmp_path: Path,
) -> None:
    """30 seeds of a stationary queue: each run's TTFT p99 interval against the p99 pooled over
    all 30 runs (the long-run value). The old intervals covered it in 13–30% of runs. At 9/s per
    tenant a 120 s run sees its p99 exceeded in two or three bursts: most runs decline, saying
    how long a run would do, and those that give an interval cover (before the burst count and
    the batch means' effective degrees of freedom: every run gave one, 83% covered at 300 s)."""
    from fairbench.pipeline import run_scenario
    from fairbench.run.records import read_records
    from fairbench.run.rundir import RunOptions
    from fairbench.workload import parse_scenario, read_yaml

    base = read_yaml((REPO / "scenarios" / "calibration" / "queue.yaml").read_text())
    lows, highs, pooled = [], [], []
    for seed in range(30):
        data = json.loads(json.dumps(base))
        data["run"].update(duration="120s", seed=500 + seed)
        scn = parse_scenario(data)
        out = tmp_path / str(seed)
        outcome = run_scenario(scn, RunOptions(out=out, progress=False))
        entry = outcome.summary["metrics"]["overall"]["ttft_p99"]
        assert entry["ci_method"] and entry["ci_confidence"] == 0.95
        lows.append(math.nan if entry["ci_low"] is None else entry["ci_low"])
        declined = entry["ci_low"] is None and entry["ci_high"] is None
        if declined:
            reason = entry["ci_reason"] or ""
            assert "too short for its own correlation" in reason, reason
            assert " s at this rate" in reason, reason
        highs.append(
            math.nan if declined else (math.inf if entry["ci_high"] is None else entry["ci_high"])
        )
        df = read_records(out / "records.parquet")
        lo, hi = scn.run.warmup * 1e9, (scn.run.duration - scn.run.cooldown) * 1e9
        df = df[(df["t_intended_ns"] >= lo) & (df["t_intended_ns"] <= hi)]
        pooled.append(censored.ttft_rows(df, scn.run.timeout).select())
    everything = censored.Observations(
        np.concatenate([o.time for o in pooled]), np.concatenate([o.observed for o in pooled])
    )
    truth_ms = censored.quantile(everything, 0.99)[0] / 1e6
    c = cal.run_coverage("sim", truth_ms, lows, highs)
    assert c.given >= 5, c.row()
    assert c.rate >= 0.9, c.row()


def test_a_window_series_mean_covers_and_declines_below_five_windows() -> None:
    """jain_backlogged's interval (the mean of a per-window index): under 5 windows it declines
    and says how many windows, and seconds, would do; 5–29 windows are taken as independent
    (t over the windows); from 30 on, batch means carry serial correlation — an AR(1) series of
    400 windows (φ = 0.7) is covered near its level, where t over the windows as if independent
    would not be; an index pinned at 1 gives [1, 1], never past its range."""
    from fairbench.analysis.intervals import window_mean_interval

    few = window_mean_interval(np.array([0.9, 0.92, 0.88, 0.91]), bounds=(0.0, 1.0), window_s=30)
    assert few.declined and "≥ 5" in (few.reason or "") and "150 s" in (few.reason or "")
    pinned = window_mean_interval(np.ones(12), bounds=(0.0, 1.0))
    assert (pinned.low, pinned.high) == (1.0, 1.0)
    rng = np.random.default_rng(7)
    covered = naive = given = 0
    for _ in range(300):
        e = rng.normal(0.0, 0.02, 400)
        x = np.empty(400)
        x[0] = e[0]
        for i in range(1, 400):
            x[i] = 0.7 * x[i - 1] + e[i]
        x += 0.9
        it = window_mean_interval(x, bounds=(0.0, 1.0))
        if it.declined:
            continue
        given += 1
        covered += int(it.low <= 0.9 <= it.high)
        half = 1.97 * x.std(ddof=1) / np.sqrt(len(x))
        naive += int(x.mean() - half <= 0.9 <= x.mean() + half)
    assert given >= 270, given
    assert 0.90 <= covered / given <= 0.99, covered / given
    assert naive / given < 0.80, naive / given  # what ignoring the correlation would promise
    small = [window_mean_interval(rng.normal(0.9, 0.03, 8)) for _ in range(400)]
    rate = np.mean([s.low <= 0.9 <= s.high for s in small])
    assert 0.92 <= rate <= 0.98, rate


def test_more_unfinished_than_the_tail_makes_the_percentile_a_lower_bound() -> None:
    """An overloaded queue cut at its end: early arrivals finished, late ones (which would
    wait longest) were cut early. Kaplan–Meier reaches p99 at the largest finished latency
    (vtc-overload printed 447,638 ms [447,099, 447,638] with 60% unfinished), which only its
    independent-censoring assumption supports; with more unfinished than the 1% beyond p99
    the figure is the lower bound that holds whatever they would have taken. At most that many
    unfinished leave Kaplan–Meier's value, between the bound and the finished order statistic."""
    arrival = np.arange(1000, dtype=float)
    latency = 1.0 + 2.0 * arrival  # a growing queue
    end = 1200.0
    done = arrival + latency <= end
    seen = end - arrival - 5.0  # an unfinished request was last seen a little before the end
    obs = censored.Observations(np.where(done, latency, seen), done, arrival)
    assert 0.5 < (~done).mean() < 0.8
    est = censored.quantile_estimate(obs, 0.99)
    assert est.bound and est.value == np.sort(obs.time)[989]
    # a queue that grows all run long is too short for its own correlation: the bound stands,
    # with no confidence claimed for it
    assert est.interval is not None and est.interval.declined
    assert "more than the 10 beyond p99): ≥ value, no bound at 95%" in (est.interval.reason or "")
    assert "too short for its own correlation" in (est.interval.reason or "")
    # 5 unfinished of 1,000 (under the 10 beyond p99): Kaplan–Meier's value, within the bounds
    few = np.ones(1000, dtype=bool)
    few[:5] = False
    mixed = censored.Observations(np.where(few, latency, latency / 2), few)
    value, bound = censored.quantile(mixed, 0.99)
    assert not bound
    assert np.sort(mixed.time)[989] <= value <= np.sort(mixed.time[few])[989]


def test_a_tail_in_a_few_large_bursts_gets_the_degrees_of_freedom_of_its_bursts() -> None:
    """Exceedances in 30 bursts, three of them 50 times the others: their count rests on the
    three, so τ's degrees of freedom are few (`cluster_df`: 6.0); bursts of one size give many
    (57: Ferro–Segers splits each in two); fewer than 4 bursts say nothing (None)."""
    sizes = [2] * 27 + [100] * 3
    series = np.concatenate([np.r_[np.ones(s, bool), np.zeros(200, bool)] for s in sizes])
    heavy = iv.cluster_df(series)
    assert heavy is not None and heavy < 8
    even = np.concatenate([np.r_[np.ones(5, bool), np.zeros(200, bool)] for _ in range(30)])
    assert (iv.cluster_df(even) or 0.0) > 40
    assert iv.cluster_df(np.r_[np.zeros(50, bool), True, np.zeros(50, bool), True, True]) is None


def test_a_bursty_run_s_p90_interval_covers_the_long_run_p90(tmp_path: Path) -> None:
    """Seed 1019 of the calibration queue (9/s per tenant, 300 s) saw its p90 exceedances in
    38 bursts of very unequal size; with the batch means' 13.9 degrees of freedom its TTFT p90
    interval was [71.5, 185.7] ms against the long-run p90 of 66.2 ms (pooled over 200 seeds,
    1000–1199). The bursts' own degrees of freedom (3.8) cover it: [61.9, 222.2] ms."""
    from fairbench.pipeline import run_scenario
    from fairbench.run.rundir import RunOptions
    from fairbench.workload import parse_scenario, read_yaml

    data = read_yaml((REPO / "scenarios" / "calibration" / "queue.yaml").read_text())
    data["run"].update(seed=1019)
    outcome = run_scenario(parse_scenario(data), RunOptions(out=tmp_path, progress=False))
    entry = outcome.summary["metrics"]["overall"]["ttft_p90"]
    assert entry["ci_low"] is not None and entry["ci_low"] < 66.2 < entry["ci_high"], entry


def test_a_cell_is_judged_by_its_coverage_s_own_clopper_pearson_interval() -> None:
    """benchmarks/bench_calibration.py judges each cell by the 95% Clopper–Pearson interval of
    its coverage against [93%, 97%], so the suite fails on under-coverage it can show and not on
    the luck of the draws: 60 of 60 (interval 94.0–100%) and 974 of 1,000 (96.2–98.3%) are in
    goal; 981 of 1,000 (97.0–98.9%) is above (conservative); 850 of 1,000 is below; 19 given
    are not judged (their interval spans 82–100%)."""
    from benchmarks.bench_calibration import coverage_interval, judge

    low, high = coverage_interval(974, 1000)
    assert low == pytest.approx(0.96213, abs=1e-4) and high == pytest.approx(0.98295, abs=1e-4)
    assert judge(60, 60) == "in goal"
    assert judge(974, 1000) == "in goal"
    assert judge(270, 300) == "in goal"  # 90.0%, but 300 draws cannot rule out 93%
    assert judge(981, 1000) == "above"
    assert judge(997, 1000) == "above"
    assert judge(850, 1000) == "below"
    assert judge(255, 300) == "below"  # 85.0% of 300: 80.5–88.8%
    assert judge(19, 19) == "not judged" and judge(0, 0) == "not judged"
    assert all(math.isnan(v) for v in coverage_interval(0, 0))


def test_a_lower_bound_in_censored_mass_is_a_one_sided_95_percent_bound() -> None:
    """Two more unfinished than the 10 beyond p99 (12 of 1,000, each cut just before it would
    have finished): the value, the 990th of the times seen, bounds only the sample's p99 and
    lay above the true p99 in about half the samples (`[value, ∞)` covered 58.5% of 400); the
    binomial rank's time, T_(l) ≤ X_(l) ≤ ξ with 95% probability, covers 94.2%."""
    rng = np.random.default_rng(12)
    truth = cal.truth("lognormal", 0.99)
    covered = 0
    for _ in range(400):
        x = cal.lognormal(1000, rng)
        cut = np.zeros(1000, dtype=bool)
        cut[rng.choice(1000, 12, replace=False)] = True
        obs = censored.Observations(np.where(cut, 0.999 * x, x), ~cut)
        est = censored.quantile_estimate(obs, 0.99)
        assert est.bound and math.isinf(est.high) and est.low <= est.value
        assert "one-sided 95% lower bound" in (est.interval.reason or "")
        covered += int(est.low <= truth)
    assert 0.93 <= covered / 400 <= 0.99, covered
