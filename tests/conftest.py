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
