"""The summary at fleet size (issue 35): the same summary.json, each figure's work done once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from fairbench.analysis import censored
from fairbench.pipeline import run_scenario
from fairbench.run.rundir import RunOptions
from fairbench.workload.loading import parse_scenario


def small_sim(**run: Any) -> Any:
    """Two tenants in two classes on the simulated reference scheduler, near its capacity."""
    return parse_scenario(
        {
            "name": "small",
            "workloads": {
                "chat": {"endpoint": "chat", "prompt_tokens": 200, "output_tokens": 40},
                "long": {"endpoint": "completions", "prompt_tokens": 2000, "output_tokens": 80},
            },
            "tenants": [
                {
                    "id": "a",
                    "mix": "chat",
                    "slo_class": "interactive",
                    "arrival": {"process": "poisson", "rate": "30/s"},
                },
                {
                    "id": "b",
                    "mix": "long",
                    "slo_class": "batch",
                    "arrival": {"process": "poisson", "rate": "6/s"},
                },
            ],
            "run": {"duration": "20s", "warmup": "2s", "cooldown": "2s", "seed": 3, **run},
            "target": {"kind": "sim"},
            "scheduler": {"policy": "vtc", "profile": "h100-llama3-8b"},
        }
    )


def test_each_percentile_interval_is_computed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """latency_ci_ms and the `metrics` block ask for the same group's same percentile: it is
    estimated once (its dependence costs two FFTs of the group) and both read it."""
    seen: Counter[tuple[int, float, float]] = Counter()
    estimate = censored.quantile_estimate

    def counted(obs: censored.Observations, q: float, confidence: float = 0.95) -> Any:
        seen[(len(obs), float(obs.time.sum()), q)] += 1
        return estimate(obs, q, confidence)

    monkeypatch.setattr(censored, "quantile_estimate", counted)
    outcome = run_scenario(small_sim(), RunOptions(out=tmp_path / "run"))
    # p50 and p90 are asked for by those two alone (p99 also by the drift's and isolation's own
    # windows and arms, on other observations of the same size)
    twice = [k for k, n in seen.items() if n > 1 and k[2] in (0.5, 0.9)]
    assert seen and not twice, twice
    metrics = outcome.summary["metrics"]
    for tenant, block in outcome.summary["tenants"].items():  # the two read the same estimate
        ci = block["latency_ci_ms"]["ttft"]["p99"]
        entry = metrics["tenant"][tenant]["ttft_p99"]
        assert (entry["value"], entry["ci_low"], entry["ci_high"]) == (
            ci["value"],
            ci["ci_low"],
            ci["ci_high"],
        )
