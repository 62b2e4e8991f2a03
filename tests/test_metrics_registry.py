"""One metric, one definition: the registry names every figure, the summary and compare compute
it with the same function, censored latencies are honest, and the docs are generated from it."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from fairbench.analysis import censored, registry
from fairbench.analysis.registry import MetricError, metric_value
from fairbench.analysis.summary import build_summary
from fairbench.decide.compare import RunData, compare_scenario_pairs
from fairbench.run.records import records_frame
from fairbench.workload.loading import parse_scenario

REPO = Path(__file__).resolve().parents[1]

SCN = parse_scenario(
    {
        "name": "censored",
        "workloads": {"w": {"endpoint": "chat", "prompt_tokens": 10, "output_tokens": 5}},
        "tenants": [
            {
                "id": "a",
                "mix": "w",
                "slo_class": "default",
                "arrival": {"process": "constant", "rate": 20},
            },
            {
                "id": "b",
                "mix": "w",
                "slo_class": "default",
                "arrival": {"process": "constant", "rate": 10},
            },
        ],
        "slo_classes": {"default": {"ttft": "300ms"}},
        "run": {"duration": "3s", "timeout": "3s"},
        "target": {"kind": "openai", "base_url": "http://127.0.0.1:1"},
    }
)


def records(n: int, ok: int, timed_out: int, rng: np.random.Generator) -> pd.DataFrame:
    """n requests: `ok` finished within 400 ms, `timed_out` hit the 3 s timeout, the rest were
    cancelled at the end of the run (each last seen when the run stopped)."""
    rows = []
    for i in range(n):
        t = int(i * 3e9 / n)
        row = {
            "request_id": i,
            "tenant": "a" if i % 3 else "b",
            "slo_class": "default",
            "workload": "w",
            "endpoint": "chat",
            "t_intended_ns": t,
            "t_sent_ns": t,
            "prompt_tokens": 10,
            "max_tokens": 5,
            "output_tokens": 0,
        }
        if i < ok:
            first = t + int(rng.uniform(50e6, 400e6))
            row.update(
                status="ok",
                t_first_token_ns=first,
                t_last_token_ns=first + 40_000_000,
                t_done_ns=first + 40_000_000,
                t_end_ns=first + 40_000_000,
                output_tokens=5,
            )
        elif i < ok + timed_out:
            row.update(status="timeout", t_end_ns=t + 3_000_000_000)
        else:
            row.update(status="cancelled", t_end_ns=6_000_000_000)
        rows.append(row)
    return records_frame(rows)


def summarise(df: pd.DataFrame) -> dict:
    health = {"valid": True, "invalid_reasons": []}
    acc = {"holds": True, "line": "ok"}
    return build_summary(df, SCN, "sha256:x", 0, 3.0, health, acc)


def test_the_tail_of_a_run_that_timed_out_is_a_lower_bound_not_the_survivors_p99() -> None:
    """The case a user found: 60 requests, 8 finished, 14 timed out, 38 cancelled. Over the
    8 survivors p99 was 402 ms; the honest figure is p99 ≥ 3,000 ms, 52 of 60 unfinished."""
    df = records(60, ok=8, timed_out=14, rng=np.random.default_rng(1))
    s = summarise(df)
    p99 = s["metrics"]["overall"]["ttft_p99"]
    assert p99["lower_bound"] and p99["value"] >= 3000.0, p99
    assert p99["unfinished"] == 52 and p99["n"] == 60
    assert p99["ci_high"] is None  # [bound, ∞)
    assert "p99" in s["overall"]["latency_ms"]["ttft"]["lower_bound"]
    assert s["completion"]["unfinished"] == 52 and not s["completion"]["ok"]
    assert registry.is_lower_bound(s, "ttft_p99")


def test_kaplan_meier_matches_scipy_and_is_the_order_statistic_without_censoring() -> None:
    rng = np.random.default_rng(3)
    x = rng.exponential(100.0, 500)
    c = rng.uniform(0, 400, 500)
    obs = censored.Observations(np.minimum(x, c), x <= c)
    ref = sps.ecdf(
        sps.CensoredData(uncensored=obs.time[obs.observed], right=obs.time[~obs.observed])
    )
    unfinished = int((~obs.observed).sum())
    assert 100 < unfinished < 150  # about a quarter
    for q in (0.25, 0.5, 0.7):
        value, bound = censored.quantile(obs, q)
        probs = ref.cdf.evaluate(ref.cdf.quantiles)
        expected = ref.cdf.quantiles[np.flatnonzero(probs >= q - 1e-12)[0]]
        assert not bound and value == pytest.approx(expected)
    # more unfinished than the 20% beyond p80: whatever they would have taken decides it, so
    # the figure is the bound that holds for any censoring, not Kaplan–Meier's value
    value, bound = censored.quantile(obs, 0.8)
    assert bound and value == np.sort(obs.time)[400 - 1]
    full = censored.Observations(x, np.ones(500, dtype=bool))
    assert censored.quantile(full, 0.99)[0] == np.sort(x)[math.ceil(0.99 * 500) - 1]


def test_every_interval_contains_its_estimate() -> None:
    df = records(300, ok=240, timed_out=30, rng=np.random.default_rng(2))
    s = summarise(df)
    for group in ("class", "tenant"):
        for entries in s["metrics"][group].values():
            for name, e in entries.items():
                if e.get("ci_low") is not None and e.get("value") is not None:
                    high = math.inf if e["ci_high"] is None else e["ci_high"]
                    assert e["ci_low"] <= e["value"] <= high, (name, e)


def test_summary_names_exactly_the_registry() -> None:
    s = summarise(records(90, ok=80, timed_out=5, rng=np.random.default_rng(4)))
    assert set(s["metrics"]["overall"]) == {
        m.name for m in registry.METRICS if "overall" in m.groups
    }
    assert set(s["metrics"]["tenant"]["a"]) <= {m.name for m in registry.METRICS}
    assert metric_value(s, "ttft_p99.tenant.a") == s["metrics"]["tenant"]["a"]["ttft_p99"]["value"]
    assert metric_value(s, "slo_attainment.default") == metric_value(
        s, "slo_attainment.class.default"
    )


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("gooput", "did you mean 'goodput'"),
        ("ttft_p98", "did you mean 'ttft_p99'"),
        ("isolation.class.x", "isolation exists for overall, tenant, not per class"),
    ],
)
def test_an_unknown_name_is_an_error_with_a_hint(name: str, hint: str) -> None:
    with pytest.raises(MetricError, match=hint):
        metric_value({}, name)


def test_compare_computes_the_summarys_figures() -> None:
    """The same function in both places: compare's A value is the summary's value."""
    df = records(120, ok=100, timed_out=10, rng=np.random.default_rng(5))
    s = summarise(df)
    run = RunData(Path("mem/a"), s, df)
    comparison = compare_scenario_pairs([(run, run)], SCN, resamples=50, deterministic=True)
    for name in ("ttft_p50", "slo_attainment", "starved_share", "ttft_p99.tenant.a"):
        v = comparison.get(name)
        assert v is not None and v.a == pytest.approx(metric_value(s, name), abs=1e-6), name


def test_docs_metrics_md_is_generated_from_the_registry() -> None:
    page = (REPO / "docs" / "metrics.md").read_text(encoding="utf-8")
    assert page == registry.reference_markdown() + "\n", (
        "docs/metrics.md is stale: fairbench metrics --markdown > docs/metrics.md"
    )
    for metric in registry.METRICS:
        assert f"## `{metric.name}`" in page
