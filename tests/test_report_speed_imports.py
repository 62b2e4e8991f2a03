"""A simulated run does not import the live path (issue 35).

The executor, asyncio, the Prometheus scraper, the shard pool and the HTTP client are for live
runs; a simulated `fairbench run` and its report loaded them at import anyway (about 70 ms of
CPU of every run). They now load where the live path starts (fairbench.run.measure) or where a
live run's server metrics are drawn (fairbench.report.run).
"""

from __future__ import annotations

import json
import subprocess
import sys

LIVE_ONLY = (
    "asyncio",
    "fairbench.run.executor",
    "fairbench.run.live",
    "fairbench.run.scrape",
    "fairbench.run.shards",
    "fairbench.run.pacer",
    "fairbench.targets.http",
    "prometheus_client",
    "aiohttp",
)


def _loaded(code: str) -> list[str]:
    """The LIVE_ONLY modules a fresh interpreter holds after running `code`."""
    held = f"[m for m in {LIVE_ONLY!r} if m in sys.modules]"
    probe = f"{code}\nimport sys, json\nprint(json.dumps({held}))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_simulated_run_stack_does_not_import_the_live_path() -> None:
    stack = (
        "import fairbench.pipeline, fairbench.analysis.summary, fairbench.targets.sim\n"
        "import fairbench.report.run, fairbench.cli.main\n"
        "from fairbench.report import write_run_report\n"
        "from fairbench.run import RunOptions, measure, Measurement, ExecOptions, LiveCounters"
    )
    assert _loaded(stack) == []


def test_the_live_names_still_load_on_first_use() -> None:
    import importlib

    from fairbench import run

    executor = importlib.import_module("fairbench.run.executor")
    measure = importlib.import_module("fairbench.run.measure")  # `run.measure` is the function
    assert run.Executor is executor.Executor
    assert run.ExecOptions is executor.ExecOptions and run.LiveCounters is executor.LiveCounters
    assert issubclass(measure.SimCounters, executor.LiveCounters)
    assert "fairbench.run.executor" in _loaded("from fairbench.run import Executor")
