"""Known-truth audit of the decisions (fairbench.decide: compare, gate, power).

Promises checked: an A-vs-A comparison says better/worse no more often than its stated rate;
the gate's noise band fails pure noise no more than 2.5% a rule side; where the data cannot
decide, the answer is `cannot evaluate` or `inconclusive`, never a verdict from an interval of
zero width. Rates are judged with binomial bounds on seeded Monte Carlo draws.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from fairbench.analysis import registry
from fairbench.analysis.registry import Name
from fairbench.decide import compare as cmp
from fairbench.decide.gate import evaluate, noise_band, parse_rules
from fairbench.decide.runs import RunData
from fairbench.workload.loading import load_scenario
from fairbench.workload.models import Scenario
from tests.test_compare import sim_run

REPO = Path(__file__).resolve().parents[1]


def _short() -> Scenario:
    """incident-fifo cut to 30 s without phases (as tests/test_compare.py's `_short_incident`)."""
    scn = load_scenario(REPO / "scenarios" / "incident-fifo.yaml")
    run = scn.run.model_copy(update={"duration": 30.0, "warmup": 2.0, "cooldown": 2.0})
    tenants = [t.model_copy(update={"phases": []}) for t in scn.tenants]
    return scn.model_copy(update={"run": run, "tenants": tenants})


def _sim(scn: Scenario, seed: int, policy: str, service_difference: float) -> RunData:
    """A noise-free simulated run in memory (tests/test_compare.py's `sim_run`), with a
    timeline figure in its summary (a timeline row is not recomputed from the records)."""
    run = sim_run(scn, seed, policy, noise_seed=0, noise=0.0)
    run.summary["metrics"] = {"overall": {"service_difference": {"value": service_difference}}}
    return run


def test_copies_of_one_deterministic_pair_are_not_run_to_run_evidence() -> None:
    """Bug fixed here: two copies of one noise-free pair (a deterministic target replays a seed
    identically; `compare` pairs repeats of one plan in order) gave every pair the same change,
    so the t interval over the pairs had zero width, p = 0, and a timeline figure (only that
    interval) was called `worse` at [+50%, +50%]. The copies show no run-to-run noise: as the
    gate says of identical baseline runs, that cannot be evaluated."""
    scn = _short()
    a, b = _sim(scn, 5, "fifo", 100.0), _sim(scn, 5, "dwrr", 150.0)
    rows = [Name(registry.get("service_difference")), Name(registry.get("ttft_p99"))]
    got = cmp.compare_scenario_pairs(
        [(a, b), (a, b)], scn, resamples=50, deterministic=True, rows=rows
    )
    sd = got.get("service_difference")
    assert sd is not None and sd.verdict == "cannot evaluate", sd
    assert "identical" in sd.reason and "seeds" in sd.reason
    p99 = got.get("ttft_p99")
    assert p99 is not None and p99.verdict in ("cannot evaluate", "no significant change")


def test_runs_that_differ_but_change_alike_keep_their_verdict() -> None:
    """The rule above is for copies: two pairs of different seeds whose figures differ (100 and
    200 under FIFO) but change alike (+50% each) are evidence of a change, not repeats, and are
    judged as before (review of 184ffe4: starved 0 → 1 in every pair would have been refused)."""
    scn = _short()
    pairs = [
        (_sim(scn, 5, "fifo", 100.0), _sim(scn, 5, "dwrr", 150.0)),
        (_sim(scn, 6, "fifo", 200.0), _sim(scn, 6, "dwrr", 300.0)),
    ]
    rows = [Name(registry.get("service_difference"))]
    got = cmp.compare_scenario_pairs(pairs, scn, resamples=50, deterministic=True, rows=rows)
    sd = got.get("service_difference")
    assert sd is not None and sd.verdict != "cannot evaluate", sd
    assert "identical" not in (sd.reason or "")


@settings(deadline=None, max_examples=100)
@given(
    diffs=st.lists(st.floats(-1.0, 1.0, allow_nan=False), min_size=2, max_size=8),
    confidence=st.sampled_from([0.9, 0.95, 0.99]),
)
def test_the_t_interval_over_pairs_is_student_t_and_its_p_agrees(
    diffs: list[float], confidence: float
) -> None:
    """`_t_interval` against scipy's one-sample t test: the interval excludes 0 exactly when
    p < 1 − confidence (the verdict reads the interval, the report prints p)."""
    d = np.array(diffs)
    low, high, p = cmp._t_interval(d, confidence)
    if float(d.std(ddof=1)) == 0.0:
        assert low == high == float(d.mean())
        return
    want = sps.ttest_1samp(d, 0.0)
    assert math.isclose(p, float(want.pvalue), rel_tol=1e-9, abs_tol=1e-12)
    ci = want.confidence_interval(confidence)
    assert math.isclose(low, float(ci.low), rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(high, float(ci.high), rel_tol=1e-9, abs_tol=1e-12)
    if abs(p - (1 - confidence)) > 1e-9:
        assert (low > 0 or high < 0) == (p < 1 - confidence)


def test_pure_noise_fails_a_gate_of_three_relative_rules_at_most_2_5_percent() -> None:
    """Three relative rules on independent lognormal figures (Bonferroni: each band at
    1 − 5%/3): a candidate drawn from the baseline's own distribution fails the gate in at
    most 2.5% of 3,000 gates, judged by the binomial: more than the 99.9% quantile of
    Binomial(3,000, 0.025) fails the promise. A zero allowance, so only the band decides."""
    rng = np.random.default_rng(41)
    names = ("ttft_p99", "e2e_p99", "goodput")
    rules = parse_rules(
        {
            "rules": [
                f"{n}: no significant {'decrease' if n == 'goodput' else 'increase'} > 0%"
                for n in names
            ]
        }
    )

    def summary(values: np.ndarray) -> dict[str, object]:
        overall = {n: {"value": float(v)} for n, v in zip(names, values, strict=True)}
        return {
            "valid": True,
            "scenario": "s",
            "schema_version": 2,
            "metrics": {"overall": overall},
        }

    gates = fails = 0
    for k in (3, 5):
        for _ in range(1500):
            draws = np.exp(rng.normal(math.log(200.0), 0.25, (k + 1, 3)))
            results, blocker = evaluate(rules, [summary(v) for v in draws[:k]], summary(draws[k]))
            assert blocker is None and all(r.outcome in ("pass", "fail") for r in results)
            gates += 1
            fails += any(r.outcome == "fail" for r in results)
    assert fails <= int(sps.binom.ppf(0.999, gates, 0.025)), (fails, gates)
    assert fails >= int(sps.binom.ppf(0.001, gates, 0.02))  # and the band is not vacuous


@settings(deadline=None, max_examples=60)
@given(
    logs=st.lists(st.floats(-5, 5, allow_nan=False), min_size=2, max_size=8, unique=True),
    confidence=st.sampled_from([0.95, 0.9833333333333333, 0.99]),
)
def test_the_noise_band_is_the_t_prediction_interval_on_logs(
    logs: list[float], confidence: float
) -> None:
    """Oracle: mean ± t(k − 1) · s · √(1 + 1/k) on the logs, written out with numpy."""
    values = [math.exp(x) for x in logs]
    centre, low, high = noise_band(values, confidence)
    x = np.array(logs)
    k = len(x)
    half = sps.t.ppf(0.5 + confidence / 2, k - 1) * x.std(ddof=1) * math.sqrt(1 + 1 / k)
    assert math.isclose(math.log(centre), x.mean(), abs_tol=1e-9)
    assert math.isclose(math.log(low), x.mean() - half, abs_tol=1e-9)
    assert math.isclose(math.log(high), x.mean() + half, abs_tol=1e-9)


@settings(deadline=None, max_examples=60)
@given(
    sd=st.floats(0.01, 0.5),
    change=st.sampled_from([0.02, 0.05, -0.05, 0.1, 0.3, -0.3]),
    confidence=st.sampled_from([0.9, 0.95]),
)
def test_pairs_needed_is_the_least_n_every_n_tried(
    sd: float, change: float, confidence: float
) -> None:
    """Oracle: power(n) at every n from 2 up; pairs_needed starts its search near the normal
    approximation, so it must not skip a smaller n that already has the power."""
    from fairbench.decide import power as pw

    need = pw.pairs_needed(sd, change, confidence)
    assert need is not None
    first = next(n for n in range(2, need + 1) if pw.power(n, sd, change, confidence) >= pw.POWER)
    assert first == need
