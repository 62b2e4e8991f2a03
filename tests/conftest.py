"""Shared helpers: small plans built in code, and scripted targets."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from fairbench.plan.materialize import materialize
from fairbench.plan.model import Plan
from fairbench.workload.loading import parse_scenario
from fairbench.workload.models import Scenario


def make_scenario(
    rate: float = 50.0,
    duration: str = "2s",
    process: str = "constant",
    output: int = 5,
    endpoint: str = "chat",
    stream: bool | None = None,
    **run: Any,
) -> Scenario:
    return parse_scenario(
        {
            "name": "t",
            "workloads": {
                "w": {
                    "endpoint": endpoint,
                    "prompt_tokens": 10,
                    **({"output_tokens": output} if endpoint != "embeddings" else {}),
                    **({"stream": stream} if stream is not None else {}),
                }
            },
            "tenants": [{"id": "a", "mix": "w", "arrival": {"process": process, "rate": rate}}],
            "run": {"duration": duration, **run},
        }
    )


def live_doc(kind: str = "vllm", **target: Any) -> dict[str, Any]:
    """A live scenario of two tenants in two classes, against an engine of `kind`."""
    return {
        "name": "live",
        "workloads": {"w": {"endpoint": "completions", "prompt_tokens": 100, "output_tokens": 10}},
        "slo_classes": {"interactive": {"ttft": "500ms"}, "batch": {}},
        "tenants": [
            {"id": "chat", "slo_class": "interactive", "mix": "w",
             "arrival": {"process": "poisson", "rate": "2/s"}},
            {"id": "flood", "slo_class": "batch", "mix": "w",
             "arrival": {"process": "poisson", "rate": "2/s"}},
        ],
        "run": {"duration": "3s", "seed": 1},
        "target": {"kind": kind, "base_url": "http://127.0.0.1:9", **target},
    }  # fmt: skip


def make_plan(**kwargs: Any) -> Plan:
    return materialize(make_scenario(**kwargs))


@pytest.fixture
def plan_factory():  # type: ignore[no-untyped-def]
    return make_plan


@pytest.fixture(scope="session")
def vllm_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """The real vLLM's python and the tiny random-weight Llama it serves, made once for every
    engine test (tests/engines/make_tiny_llama.py); skips with the reason where there is no
    engine (see `engine_python`)."""
    from tests.engines.vllm_server import engine_python

    python = engine_python()
    model = tmp_path_factory.mktemp("vllm") / "tiny-llama"
    maker = Path(__file__).parent / "engines" / "make_tiny_llama.py"
    subprocess.run([python, str(maker), str(model)], check=True, timeout=300)
    return python, model
