"""Metrics on hand-built inputs with hand-computed answers, and the VTC paper's table."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairbench.analysis import metrics as m
from fairbench.analysis.fairness import service_difference, windowed_jain

# The VTC artifact's published per-request results, unchanged but xz-compressed (origin and
# licence: tests/data/SOURCES.md).
VTC = Path(__file__).resolve().parent / "data" / "vtc"

# ---------------------------------------------------------------- Jain and water-filling


def test_jain_hand_values() -> None:
    assert m.jain(np.array([1.0, 1.0, 1.0, 1.0])) == 1.0
    assert m.jain(np.array([1.0, 0.0, 0.0, 0.0])) == 0.25
    # (1+2+3)^2 / (3 * (1+4+9)) = 36/42
    assert m.jain(np.array([1.0, 2.0, 3.0])) == pytest.approx(36 / 42)


# Zeros or normal floats: scaling a subnormal can flush it to 0, where Jain is undefined (NaN).
@given(
    st.lists(st.one_of(st.just(0.0), st.floats(1e-300, 1e6)), min_size=1, max_size=20),
    st.floats(1e-3, 1e3),
)
def test_jain_bounds_and_scale_invariance(xs: list[float], scale: float) -> None:
    x = np.array(xs)
    if x.sum() == 0:
        return
    j = m.jain(x)
    assert 1 / len(x) - 1e-12 <= j <= 1 + 1e-12
    assert m.jain(x * scale) == pytest.approx(j)


def test_water_filling_hand_example() -> None:
    # capacity 120: tenant 0 wants only 10; the other 110 splits 1:2 -> 36.67 and 73.33
    share = m.water_fill(np.array([10.0, 50.0, 100.0]), np.array([1.0, 1.0, 2.0]), 120.0)
    assert share == pytest.approx([10.0, 110 / 3, 220 / 3])


@given(
    st.lists(st.tuples(st.floats(0, 1e4), st.floats(0.1, 10)), min_size=1, max_size=10),
    st.floats(0, 2e4),
)
def test_water_filling_respects_demand_weight_and_capacity(
    pairs: list[tuple[float, float]], capacity: float
) -> None:
    demand = np.array([d for d, _ in pairs])
    weight = np.array([w for _, w in pairs])
    share = m.water_fill(demand, weight, capacity)
    assert np.all(share <= demand + 1e-6) and np.all(share >= -1e-9)
    assert share.sum() == pytest.approx(min(capacity, demand.sum()), rel=1e-9, abs=1e-6)
    # unsatisfied tenants get equal service per unit weight, at least that of satisfied ones
    short = share < demand - 1e-6
    if short.sum() >= 2:
        level = share[short] / weight[short]
        assert level.max() - level.min() <= 1e-6 * max(1.0, level.max())


# ---------------------------------------------------------------- latency and SLOs


def records(rows: list[dict]) -> pd.DataFrame:
    base = {"endpoint": "chat", "status": "ok", "t_sent_ns": None, "slo_class": "interactive"}
    return pd.DataFrame([{**base, **r} for r in rows])


def test_latency_metrics_by_hand() -> None:
    df = records(
        [
            # intended 0, sent 1 ms, first token 100 ms, last 190 ms, 10 tokens, done 200 ms
            {
                "t_intended_ns": 0,
                "t_sent_ns": 1_000_000,
                "t_first_token_ns": 100_000_000,
                "t_last_token_ns": 190_000_000,
                "t_done_ns": 200_000_000,
                "output_tokens": 10,
                "itl_max_ns": 20_000_000,
            },
        ]
    )
    assert m.ttft_ns(df)[0] == 100_000_000
    assert m.ttft_sent_ns(df)[0] == 99_000_000
    assert m.tpot_ns(df)[0] == 10_000_000  # 90 ms over 9 gaps
    assert m.e2e_ns(df)[0] == 200_000_000


def test_slo_met_by_hand() -> None:
    df = records(
        [
            {
                "t_intended_ns": 0,
                "t_first_token_ns": 250_000_000,
                "t_last_token_ns": 290_000_000,
                "t_done_ns": 300_000_000,
                "output_tokens": 5,
            },  # ttft 250 ms, tpot 10 ms: met
            {
                "t_intended_ns": 0,
                "t_first_token_ns": 350_000_000,
                "t_last_token_ns": 390_000_000,
                "t_done_ns": 400_000_000,
                "output_tokens": 5,
            },  # ttft 350 ms: missed
            {
                "t_intended_ns": 0,
                "t_first_token_ns": 100_000_000,
                "t_last_token_ns": 900_000_000,
                "t_done_ns": 900_000_000,
                "output_tokens": 5,
            },  # tpot 200 ms: missed
            {
                "t_intended_ns": 0,
                "t_first_token_ns": 10_000_000,
                "t_last_token_ns": 10_000_000,
                "t_done_ns": 10_000_000,
                "output_tokens": 1,
                "status": "error",
            },  # not ok: missed
        ]
    )
    met = m.slo_met(df, {"interactive": {"ttft": 0.3, "tpot": 0.05, "e2e": None}})
    assert list(met) == [True, False, False, False]


# ---------------------------------------------------------------- service difference


def test_service_difference_by_hand() -> None:
    """Two clients, one tick (T=120 s, warm-up 0, 1 tick at 60 s, window [30, 90])."""
    client = np.array(["a", "b"])
    arrival = np.array([40.0, 40.0])
    start = np.array([40.0, 40.0])
    end = np.array([100.0, 60.0])  # a: 600 over 60 s, 500 inside; b: 300 over 20 s, all inside
    cost = np.array([600.0, 300.0])
    sd = service_difference(
        client, arrival, start, end, cost, 120.0, warmup_s=0.0, window_s=60.0, n_ticks=1
    )
    # s = [500/60, 300/60]; r = [600/60, 300/60]; diff = min(0, 100/60) + min(200/60, 0) = 0
    assert sd.diff[0] == pytest.approx(0.0)
    cost_b = np.array([600.0, 900.0])  # b asked 900 but got 300 inside -> unfair to b
    sd = service_difference(
        client, arrival, start, end, cost_b, 120.0, warmup_s=0.0, window_s=60.0, n_ticks=1
    )
    # s = [500, 900]/60 (b all inside), r = [600, 900]/60: a: min(400/60, 100/60) = 100/60
    assert sd.diff[0] == pytest.approx(100 / 60)


@pytest.mark.parametrize(
    ("scheduler", "expected"),
    [
        ("VTC", (368.40, 251.66, 6549.16)),
        ("FCFS", (759.97, 433.53, 32112.00)),
        ("LCF", (750.49, 323.82, 29088.90)),
    ],
)
def test_reproduces_the_vtc_artifacts_real_trace_table(
    scheduler: str, expected: tuple[float, float, float]
) -> None:
    with lzma.open(VTC / f"{scheduler}_all_results_real.jsonl.xz", "rt", encoding="utf-8") as f:
        data = json.loads(f.readline())
    rows = [r for r in data["result"]["responses"] if r["first_token_latency"] != -1]
    arrival = np.array([r["req_time"] for r in rows])
    sd = service_difference(
        np.array([r["adapter_dir"] for r in rows]),
        arrival,
        arrival + np.array([r["first_token_latency"] for r in rows]),
        arrival + np.array([r["request_latency"] for r in rows]),
        np.array([r["prompt_len"] + 2 * r["output_len"] for r in rows], dtype=float),
        600.0,
    )
    assert (sd.max, sd.mean, sd.var) == pytest.approx(expected, abs=0.01)


def test_windowed_jain_sees_a_burst_the_whole_run_hides() -> None:
    # a serves alone in [0, 10), b alone in [10, 20): each window unfair, the run fair
    client = np.array(["a", "b"])
    start, end, cost = np.array([0.0, 10.0]), np.array([10.0, 20.0]), np.array([100.0, 100.0])
    _, per_window = windowed_jain(client, start, end, cost, {}, 0.0, 20.0, 10.0)
    assert list(per_window) == [1.0, 1.0]  # one active client per window is trivially fair
    assert m.jain(np.array([100.0, 100.0])) == 1.0
