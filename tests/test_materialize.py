"""Plans: determinism, arrival statistics, mixes, phases and lengths within sample-size bands."""

from __future__ import annotations

import math
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairbench.plan.materialize import materialize
from fairbench.plan.model import load_plan
from fairbench.workload.errors import ScenarioError
from fairbench.workload.loading import parse_scenario
from fairbench.workload.prompts import count_tokens


def scenario(
    tenants: list[dict[str, Any]], workloads: dict[str, Any] | None = None, **run: Any
) -> Any:
    workloads = workloads or {"chat": {"prompt_tokens": 100, "output_tokens": 50}}
    run.setdefault("duration", "100s")
    return parse_scenario({"workloads": workloads, "tenants": tenants, "run": run})


def tenant(arrival: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "id": extra.pop("id", "t"),
        "mix": extra.pop("mix", "chat"),
        "arrival": arrival,
        **extra,
    }


def gamma_cv_se(cv: float, n: int) -> float:
    """Delta-method standard error of the sample CV of n gamma(k = 1/cv²) gaps (scale 1)."""
    k = 1.0 / (cv * cv)
    mu, var = k, k
    mu3, mu4 = 2 * k, 3 * k * k + 6 * k
    dm = -math.sqrt(var) / mu**2
    dv = 1 / (2 * mu * math.sqrt(var))
    return math.sqrt((dm * dm * var + dv * dv * (mu4 - var * var) + 2 * dm * dv * mu3) / n)


def gaps_of(plan: Any) -> np.ndarray:
    return np.diff(plan.columns["offset_ns"] / 1e9)


# ---------------------------------------------------------------- determinism


QUICK = {
    "tenants": [
        {
            "id": "a",
            "mix": {"chat": 2, "doc": 1},
            "arrival": {"process": "poisson", "rate": "30/s"},
            "phases": [{"start": "2s", "end": "4s", "multiplier": 3}],
        },
        {"id": "b", "mix": "doc", "arrival": {"process": "gamma", "rate": 5, "cv": 2}},
    ],
    "workloads": {
        "chat": {
            "prompt_tokens": {"dist": "lognormal", "median": 80, "p99": 400},
            "prefix": {"groups": 3, "tokens": 16},
        },
        "doc": {
            "endpoint": "completions",
            "prompt_tokens": {"dist": "uniform", "low": 1, "high": 9},
        },
    },
    "run": {"duration": "10s"},
}


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**63 - 1))
def test_same_seed_same_digest_and_columns(seed: int) -> None:
    scn = parse_scenario(QUICK)
    a, b = materialize(scn, seed), materialize(scn, seed)
    assert a.digest == b.digest
    for name, col in a.columns.items():
        assert np.array_equal(col, b.columns[name]), name
    assert np.all(np.diff(a.columns["offset_ns"]) >= 0)


def test_seed_zero_is_a_seed_and_seeds_differ() -> None:
    scn = parse_scenario(QUICK)
    digests = {materialize(scn, s).digest for s in (0, 1, 2)}
    assert len(digests) == 3
    assert materialize(scn).digest == materialize(scn, 0).digest


def test_digest_is_stable_across_processes() -> None:
    code = (
        "from fairbench.workload.scenario import parse_scenario; "
        "from fairbench.plan.materialize import "
        f"materialize; print(materialize(parse_scenario({QUICK!r}), 42).digest)"
    )
    out = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
        for _ in range(2)
    }
    assert out == {materialize(parse_scenario(QUICK), 42).digest}


def test_adding_a_tenant_leaves_the_others_draws_alone() -> None:
    one = parse_scenario({**QUICK, "tenants": QUICK["tenants"][:1]})
    two = parse_scenario(QUICK)
    p1, p2 = materialize(one, 5), materialize(two, 5)
    a2 = p2.columns["tenant"] == 0
    assert np.array_equal(p1.columns["offset_ns"], p2.columns["offset_ns"][a2])
    assert np.array_equal(p1.columns["prompt_tokens"], p2.columns["prompt_tokens"][a2])


def test_plan_round_trips_through_parquet(tmp_path: Any) -> None:
    plan = materialize(parse_scenario(QUICK), 3)
    plan.save(tmp_path / "plan.parquet")
    back = load_plan(tmp_path / "plan.parquet")
    assert back.digest == plan.digest
    assert back.request(7).prompt() == plan.request(7).prompt()


# ---------------------------------------------------------------- arrival processes


def test_poisson_rate_and_cv_within_sample_bands() -> None:
    rate, duration = 50.0, 400.0
    plan = materialize(
        scenario([tenant({"process": "poisson", "rate": rate})], duration=duration), 1
    )
    n = len(plan)
    expected = rate * duration
    assert abs(n - expected) <= 4 * math.sqrt(expected)
    gaps = gaps_of(plan)
    assert abs(gaps.std() / gaps.mean() - 1.0) <= 4 * gamma_cv_se(1.0, len(gaps))


def test_constant_process_has_equal_gaps() -> None:
    plan = materialize(scenario([tenant({"process": "constant", "rate": "7/s"})], duration="60s"))
    gaps = np.diff(plan.columns["offset_ns"])
    assert len(plan) == 7 * 60
    assert gaps.max() - gaps.min() <= 1  # integer-ns rounding only
    assert plan.columns["offset_ns"][0] == 0


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_cv_as_asked(cv: float) -> None:
    plan = materialize(
        scenario([tenant({"process": "gamma", "rate": 100, "cv": cv})], duration="600s"), 2
    )
    gaps = gaps_of(plan)
    assert abs(gaps.std() / gaps.mean() - cv) <= 4 * gamma_cv_se(cv, len(gaps))
    expected = 100 * 600
    # A renewal count has variance ≈ t·cv²/mean-gap³ = λt·cv².
    assert abs(len(plan) - expected) <= 4 * math.sqrt(expected) * cv


def test_phase_multiplier_is_honoured() -> None:
    plan = materialize(
        scenario(
            [
                tenant(
                    {"process": "poisson", "rate": 20},
                    phases=[{"start": "100s", "end": "200s", "multiplier": 5}],
                )
            ],
            duration="300s",
        ),
        4,
    )
    t = plan.columns["offset_ns"] / 1e9
    inside = ((t >= 100) & (t < 200)).sum()
    outside = len(t) - inside
    assert abs(inside - 2000 * 5) <= 4 * math.sqrt(10000)
    assert abs(outside - 4000) <= 4 * math.sqrt(4000)


def test_onoff_is_silent_when_off() -> None:
    plan = materialize(
        scenario(
            [tenant({"process": "onoff", "rate": 30, "on": "5s", "off": "10s"})], duration="150s"
        ),
        6,
    )
    t = plan.columns["offset_ns"] / 1e9
    assert np.all((t % 15.0) < 5.0)
    assert abs(len(t) - 30 * 50) <= 4 * math.sqrt(1500)


def test_ramp_rate_grows_linearly() -> None:
    plan = materialize(
        scenario(
            [tenant({"process": "ramp", "start_rate": 0, "end_rate": 100, "over": "100s"})],
            duration="100s",
        ),
        8,
    )
    t = plan.columns["offset_ns"] / 1e9
    first, second = (t < 50).sum(), (t >= 50).sum()
    # ∫λ: 1250 in the first half, 3750 in the second.
    assert abs(first - 1250) <= 4 * math.sqrt(1250)
    assert abs(second - 3750) <= 4 * math.sqrt(3750)


def test_request_count_limit_gives_exactly_that_many() -> None:
    scn = parse_scenario(
        {
            "workloads": {"c": {"prompt_tokens": 5}},
            "tenants": [tenant({"process": "poisson", "rate": 3}, mix="c")],
            "run": {"requests": 1234},
        }
    )
    assert len(materialize(scn)) == 1234


# ---------------------------------------------------------------- mixes and lengths


def test_tenant_mix_proportions() -> None:
    scn = scenario(
        [tenant({"process": "poisson", "rate": 100}, mix={"chat": 3, "doc": 1})],
        workloads={
            "chat": {"prompt_tokens": 10},
            "doc": {"prompt_tokens": 10, "endpoint": "completions"},
        },
        duration="100s",
    )
    plan = materialize(scn, 9)
    n = len(plan)
    share = (plan.names("workload") == "chat").mean()
    assert abs(share - 0.75) <= 4 * math.sqrt(0.75 * 0.25 / n)


def test_lognormal_median_and_p99_in_quantile_bands() -> None:
    scn = scenario(
        [tenant({"process": "poisson", "rate": 200})],
        workloads={
            "chat": {
                "prompt_tokens": {"dist": "lognormal", "median": 300, "p99": 3000, "max": 10**6}
            }
        },
    )
    lengths = materialize(scn, 10).columns["prompt_tokens"]
    n = len(lengths)
    for q, target in ((0.5, 300), (0.99, 3000)):
        below = (lengths <= target).mean()
        assert abs(below - q) <= 4 * math.sqrt(q * (1 - q) / n) + 1 / target


def test_uniform_and_empirical_lengths() -> None:
    scn = scenario(
        [tenant({"process": "poisson", "rate": 100}, mix={"u": 1, "e": 1})],
        workloads={
            "u": {"prompt_tokens": {"dist": "uniform", "low": 3, "high": 5}},
            "e": {"prompt_tokens": {"dist": "empirical", "values": [10, 1000], "weights": [9, 1]}},
        },
    )
    plan = materialize(scn, 11)
    u = plan.columns["prompt_tokens"][plan.names("workload") == "u"]
    e = plan.columns["prompt_tokens"][plan.names("workload") == "e"]
    assert set(np.unique(u)) == {3, 4, 5}
    assert set(np.unique(e)) == {10, 1000}
    assert abs((e == 1000).mean() - 0.1) <= 4 * math.sqrt(0.09 / len(e))


def test_embeddings_have_no_output_and_do_not_stream() -> None:
    scn = scenario(
        [tenant({"process": "poisson", "rate": 10}, mix="emb")],
        workloads={"emb": {"endpoint": "embeddings", "prompt_tokens": 64}},
    )
    plan = materialize(scn)
    assert plan.columns["max_tokens"].max() == 0
    assert not plan.columns["stream"].any()


def test_prefix_groups_share_leading_text_and_prompts_count_exactly() -> None:
    scn = scenario(
        [tenant({"process": "poisson", "rate": 20})],
        workloads={
            "chat": {
                "prompt_tokens": {"dist": "uniform", "low": 50, "high": 90},
                "prefix": {"groups": 2, "tokens": 32, "zipf": 0},
            }
        },
        duration="5s",
    )
    plan = materialize(scn, 12)
    by_group: dict[int, list[str]] = {}
    for i in range(len(plan)):
        req = plan.request(i)
        text = req.prompt()
        assert count_tokens(text) == req.prompt_tokens
        by_group.setdefault(req.prefix_group, []).append(text)
    assert set(by_group) == {0, 1}
    for texts in by_group.values():
        heads = {" ".join(t.split()[:32]) for t in texts}
        assert len(heads) == 1
    assert by_group[0][0].split()[:32] != by_group[1][0].split()[:32]
    tails = {" ".join(t.split()[32:40]) for t in by_group[0]}
    assert len(tails) == len(by_group[0])  # the rest of each prompt is its own


def test_absurd_rates_are_refused_before_drawing() -> None:
    scn = scenario([tenant({"process": "poisson", "rate": 1e12})], duration="1h")
    with pytest.raises(ScenarioError, match=r"tenants\[0\]\.arrival: would plan"):
        materialize(scn)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rate=st.floats(min_value=0.5, max_value=200),
    cv=st.floats(min_value=0.2, max_value=5),
    mult=st.floats(min_value=0, max_value=10),
    seed=st.integers(min_value=0, max_value=10**9),
)
def test_any_gamma_with_phase_is_sorted_and_within_horizon(
    rate: float, cv: float, mult: float, seed: int
) -> None:
    scn = scenario(
        [
            tenant(
                {"process": "gamma", "rate": rate, "cv": cv},
                phases=[{"start": 1, "end": 3, "multiplier": mult}],
            )
        ],
        duration="5s",
    )
    offsets = materialize(scn, seed).columns["offset_ns"]
    assert np.all(np.diff(offsets) >= 0)
    assert offsets.size == 0 or (offsets[0] >= 0 and offsets[-1] < 5_000_000_000)
