"""Scraped engine metrics: the parser on each engine's exposition, rates, and quantiles."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fairbench.analysis import server_metrics as sm
from fairbench.run.scrape import parse_prometheus
from fairbench.targets.engines import ENGINES

FIXTURES = Path(__file__).parent / "fixtures" / "engines"


def scrapes(*texts: str, step_s: float = 1.0) -> pd.DataFrame:
    rows = []
    for k, text in enumerate(texts):
        rows += parse_prometheus(text, int(k * step_s * 1e9))
    return pd.DataFrame(rows)


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    bounds = np.array([0.1, 1.0, 10.0, math.inf])
    cumulative = np.array([300.0, 450.0, 500.0, 500.0])
    assert sm.histogram_quantile(bounds, cumulative, 0.5) == pytest.approx(0.1 * 250 / 300)
    assert sm.histogram_quantile(bounds, cumulative, 0.99) == pytest.approx(1 + 9 * 45 / 50)
    # everything in +Inf: the answer is the largest finite bound, a floor
    assert sm.histogram_quantile(bounds, np.array([0, 0, 0, 10.0]), 0.5) == 10.0
    assert math.isnan(sm.histogram_quantile(bounds, np.zeros(4), 0.5))


def test_counter_resets_count_as_increase() -> None:
    assert sm.increases(np.array([5.0, 10.0, 2.0, 6.0])).tolist() == [5.0, 2.0, 4.0]


def test_every_engine_exposition_parses_with_types() -> None:
    for engine, families in {
        "tgi": {"tgi_queue_size": "gauge", "tgi_request_count": "counter"},
        "sglang": {"sglang:num_queue_reqs": "gauge", "sglang:queue_time_seconds": "histogram"},
        "vllm": {
            "vllm:num_requests_waiting": "gauge",
            "vllm:num_preemptions": "counter",
            "vllm:request_queue_time_seconds": "histogram",
        },
    }.items():
        df = scrapes((FIXTURES / f"{engine}_metrics.prom").read_text())
        types = sm.family_types(df)
        for family, kind in families.items():
            assert types[family] == kind, (engine, family)
        assert not df["metric"].str.endswith("_created").any()


def test_overview_of_a_tgi_run() -> None:
    before = (FIXTURES / "tgi_metrics.prom").read_text()
    after = (
        before.replace("tgi_request_count 120", "tgi_request_count 180")
        .replace('{err="overloaded"} 9', '{err="overloaded"} 19')
        .replace("tgi_queue_size 7", "tgi_queue_size 3")
        .replace('le="1"} 105', 'le="1"} 130')
        .replace('le="10"} 110', 'le="10"} 140')
        .replace('le="+Inf"} 110', 'le="+Inf"} 140')
        .replace("duration_sum 21.5", "duration_sum 36.5")
        .replace("duration_count 110", "duration_count 140")
    )
    df = scrapes(before, after, step_s=2.0)
    rows = {r["metric"]: r for r in sm.overview(df, ENGINES["tgi"].headline_metrics)}
    assert rows["tgi_queue_size"] == {
        "metric": "tgi_queue_size",
        "type": "gauge",
        "mean": 5.0,
        "max": 7.0,
        "last": 3.0,
    }
    failures = rows["tgi_request_failure_total"]
    assert failures["increase"] == 10.0 and failures["rate_mean"] == 5.0
    queue = rows["tgi_request_queue_duration"]
    # the run observed 30 requests, 25 in (0.1, 1] and 5 in (1, 10]
    assert queue["count"] == 30.0 and queue["mean"] == pytest.approx(0.5)
    assert queue["p50"] == pytest.approx(0.1 + 0.9 * 15 / 25)
    assert queue["p99"] == pytest.approx(1 + 9 * (29.7 - 25) / 5)


def test_histogram_over_time_windows() -> None:
    base = (FIXTURES / "sglang_metrics.prom").read_text()
    texts = []
    for k in range(11):  # every second, 10 more requests each in (0.1, 1]
        n = 10 * k
        texts.append(
            base.replace('le="0.1",model_name="tiny"} 300.0', 'le="0.1",model_name="tiny"} 300.0')
            .replace('le="1.0",model_name="tiny"} 450.0', f'le="1.0",model_name="tiny"}} {450 + n}')
            .replace(
                'le="10.0",model_name="tiny"} 500.0', f'le="10.0",model_name="tiny"}} {500 + n}'
            )
            .replace(
                'le="+Inf",model_name="tiny"} 500.0', f'le="+Inf",model_name="tiny"}} {500 + n}'
            )
        )
    df = scrapes(*texts)
    h = sm.histogram_over_time(df, "sglang:queue_time_seconds", steps=5)
    assert h["t"] == [5.0, 10.0]
    assert h["p50"] == pytest.approx([0.55, 0.55])  # the middle of (0.1, 1]
