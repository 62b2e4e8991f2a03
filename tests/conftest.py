"""Shared helpers: small plans built in code, and scripted targets; and the machine shared
between pytest-xdist's workers.

The suite runs on two workers (pyproject's addopts: `-n 2`), most of it CPU or wall-clock
bound on its own; but a test that measures the machine — a real engine's speed against the
simulator (`engine`), a fitted step floor (`quiet`) — needs it to itself, as it had before the
suite ran in parallel. Such a test takes the machine exclusively: the other worker finishes the
test it is running and waits until it is done (a readers-writer lock over two files, with a
turnstile so that a waiting exclusive test is not starved by the other worker's next tests).
What the lock covers is each test's setup, call and teardown: a module fixture the other worker
keeps between its tests (a Ray cluster of tests/test_ray.py) stays up, idle, beside it."""

from __future__ import annotations

import fcntl
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
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
    """The real vLLM's python and the tiny random-weight Llama it serves, made once per worker
    that runs an engine test (tests/engines/make_tiny_llama.py, in its first engine test's
    setup, so with the machine to itself); skips with the reason where there is no
    engine (see `engine_python`)."""
    from tests.engines.vllm_server import engine_python

    python = engine_python()
    model = tmp_path_factory.mktemp("vllm") / "tiny-llama"
    maker = Path(__file__).parent / "engines" / "make_tiny_llama.py"
    subprocess.run([python, str(maker), str(model)], check=True, timeout=300)
    return python, model


def _exclusive(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(name) for name in ("engine", "quiet"))


@contextmanager
def _machine_share(item: pytest.Item) -> Iterator[None]:
    """Shared for most tests, exclusive for those that measure the machine (module docstring).
    Outside pytest-xdist (one process) there is nobody to share with: no lock."""
    workerinput = getattr(item.config, "workerinput", None)
    if workerinput is None:
        yield
        return
    # the session's temporary root, which every worker's own lies in (and pytest rotates)
    basetemp = item.config.option.basetemp
    if basetemp:
        locks = Path(basetemp).parent
    else:
        locks = Path(tempfile.gettempdir()) / f"fairbench-tests-{workerinput['testrunuid']}"
    locks.mkdir(parents=True, exist_ok=True)
    with (
        open(locks / "turnstile.lock", "a") as turnstile,
        open(locks / "machine.lock", "a") as machine,
    ):
        if _exclusive(item):
            fcntl.flock(turnstile, fcntl.LOCK_EX)  # no new test starts beside it ...
            fcntl.flock(machine, fcntl.LOCK_EX)  # ... and the running one ends first
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        else:
            fcntl.flock(turnstile, fcntl.LOCK_SH)
            fcntl.flock(turnstile, fcntl.LOCK_UN)
            fcntl.flock(machine, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(machine, fcntl.LOCK_UN)


def pytest_configure(config: pytest.Config) -> None:
    """Compile the simulator's loop once, before the workers start (in the controller, or
    in the one process of `-n 0`): numba compiles it on first use and caches it beside its
    source (about 30 s on this machine). Left to the tests, both workers, and any `fairbench`
    subprocess a test starts with a timeout of its own, would compile it at once, each paying
    the 30 s, slower for the other's load."""
    if hasattr(config, "workerinput"):  # an xdist worker: the controller has done it
        return
    try:
        from reference_scheduler.drivers.compiled import warm_up
    except ImportError:  # numba missing: the compiled simulator is not used
        return
    warm_up()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Setup, call and teardown of each test under `_machine_share`: an exclusive test's
    fixtures (an engine's server) start and stop with the machine to itself too."""
    with _machine_share(item):
        yield
