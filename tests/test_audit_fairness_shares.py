"""Known-truth audit of the demand-aware share figures: weighted max-min fair shares
(metrics.water_fill) and the summary's `fairness` block (Jain over service ÷ fair share), each
against an oracle from its docstring: the level found by bisection, not by the code's loop."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairbench.analysis.metrics import jain, water_fill
from fairbench.analysis.summary import fairness_block


def oracle_fill(demand: dict[str, float], weight: dict[str, float], capacity: float) -> dict:
    """min(demand, L·weight) per tenant, L raised until the shares sum to the capacity or every
    demand is met (bisection on L)."""
    target = min(capacity, sum(demand.values()))
    if target <= 0:
        return dict.fromkeys(demand, 0.0)
    lo, hi = 0.0, 1e12
    for _ in range(300):
        mid = (lo + hi) / 2
        if sum(min(demand[t], mid * weight[t]) for t in demand) < target:
            lo = mid
        else:
            hi = mid
    return {t: min(demand[t], hi * weight[t]) for t in demand}


@settings(max_examples=100, deadline=None)
@given(
    demands=st.lists(
        st.one_of(st.just(0.0), st.integers(0, 20).map(float), st.floats(0.0, 1e4)),
        min_size=1,
        max_size=6,
    ),
    weights=st.lists(st.sampled_from([0.5, 1.0, 2.0, 3.0]), min_size=6, max_size=6),
    capacity=st.one_of(st.just(0.0), st.floats(0.0, 5e4)),
)
def test_water_fill_equals_its_definition(
    demands: list[float], weights: list[float], capacity: float
) -> None:
    names = [str(i) for i in range(len(demands))]
    weights = weights[: len(demands)]
    want = oracle_fill(
        dict(zip(names, demands, strict=True)), dict(zip(names, weights, strict=True)), capacity
    )
    got = water_fill(np.array(demands), np.array(weights), capacity)
    assert np.allclose(got, [want[t] for t in names], rtol=1e-9, atol=1e-6)


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 100_000), n=st.integers(0, 40), tenants=st.integers(1, 4))
def test_the_fairness_block_equals_its_definition(seed: int, n: int, tenants: int) -> None:
    """Service = 1·prompt + 2·output of served requests (ok, or any output); demand = 1·prompt
    + 2·max_tokens of every request (rejected ones too); capacity = all service; Jain over
    tenants with a fair share > 0 of service ÷ fair share; a tenant of the scenario that sent
    nothing has no ratio."""
    rng = np.random.default_rng(seed)
    names = [f"t{j}" for j in range(tenants)]
    weights = {t: float(rng.choice([0.5, 1.0, 2.0, 3.0])) for t in names}
    sent_by = names[: max(1, tenants - int(rng.integers(0, 2)))]  # maybe one sends nothing
    df = pd.DataFrame(
        {
            "tenant": rng.choice(sent_by, n) if n else np.array([], dtype=object),
            "status": rng.choice(["ok", "rejected", "timeout", "error"], n),
            "prompt_tokens": rng.integers(0, 100, n),
            "output_tokens": rng.integers(0, 50, n),
            "max_tokens": rng.integers(50, 100, n),
        }
    )
    df.loc[df["status"] == "rejected", "output_tokens"] = 0
    got = fairness_block(df, weights)
    served = ((df["status"] == "ok") | (df["output_tokens"] > 0)) * (
        df["prompt_tokens"] + 2 * df["output_tokens"]
    )
    service = {t: float(served[df["tenant"] == t].sum()) for t in names}
    asked = df["prompt_tokens"] + 2 * df["max_tokens"]
    demand = {t: float(asked[df["tenant"] == t].sum()) for t in names}
    fair = oracle_fill(demand, weights, sum(service.values()))
    ratios = [service[t] / fair[t] for t in names if fair[t] > 0]
    if ratios:
        assert got["jain_service"] == pytest.approx(jain(np.array(ratios)), rel=1e-6)
    else:
        assert got["jain_service"] is None
    for t in names:
        entry = got["tenants"][t]
        assert entry["service_tokens"] == service[t] and entry["demand_tokens"] == demand[t]
        assert math.isclose(entry["fair_share_tokens"], fair[t], rel_tol=1e-6, abs_tol=1e-6)
        assert (entry["share_of_fair"] is None) == (fair[t] <= 0)
