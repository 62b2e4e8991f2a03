"""Generator health: a late generator's reason says what the machine was doing and what to try;
a run in which nothing succeeded is never VALID."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from aiohttp import web

from fairbench.analysis.health import MachineLoad, generator_health
from tests.cli import run_cli
from tests.conftest import make_scenario
from tests.loopback import serve_in_thread

SCN = make_scenario(rate=10, duration="1s")


def frame(lag_ms: float = 0.5, statuses: tuple[str, ...] = ("ok",) * 10) -> pd.DataFrame:
    """Records sent 100 ms apart, each `lag_ms` late, ending with the given statuses."""
    intended = [i * 100_000_000 for i in range(len(statuses))]
    return pd.DataFrame(
        {
            "tenant": ["a"] * len(statuses),
            "t_intended_ns": intended,
            "t_sent_ns": [t + int(lag_ms * 1e6) for t in intended],
            "status": list(statuses),
        }
    )


BUSY = MachineLoad(cpus=2, load_1m=3.1, wall_s=50.0, generator_cpu_s=5.0, children_cpu_s=6.4)
BOUND = MachineLoad(cpus=4, load_1m=1.2, wall_s=50.0, generator_cpu_s=45.0, children_cpu_s=1.0)


def lag_reason(health: dict) -> str:
    lines = [r for r in health["invalid_reasons"] if r.startswith("generator fell behind")]
    assert len(lines) == 1, health["invalid_reasons"]
    return lines[0]


def test_a_late_run_on_a_busy_machine_says_so_and_what_to_try() -> None:
    health = generator_health(frame(lag_ms=8.0), SCN, machine=BUSY)
    assert not health["valid"]
    reason = lag_reason(health)
    assert reason.startswith("generator fell behind: send lag p99 8.00 ms > 5 ms. ")
    assert "1-min load average 3.10 on 2 cores" in reason
    assert "this run's processes got 11.4 s of CPU in 50.0 s" in reason
    assert "generator 5.0 s = 10% of one core, its server/workers 6.4 s" in reason
    assert "more runnable work than cores" in reason and "stop other work" in reason
    assert "--workers" not in reason  # the generator was starved, not saturated
    assert "\n" not in reason  # one line, like every reason
    assert health["machine"] == {
        "cpus": 2,
        "load_1m": 3.1,
        "wall_s": 50.0,
        "generator_cpu_s": 5.0,
        "children_cpu_s": 6.4,
    }


def test_a_generator_using_a_whole_core_is_told_to_add_workers() -> None:
    reason = lag_reason(generator_health(frame(lag_ms=8.0), SCN, machine=BOUND))
    assert "1-min load average 1.20 on 4 cores" in reason
    assert "generator 45.0 s = 90% of one core" in reason
    assert "--workers N" in reason
    assert "more runnable work than cores" not in reason


def test_a_late_run_without_machine_figures_still_says_what_to_try() -> None:
    health = generator_health(frame(lag_ms=8.0), SCN)
    assert "no record of the machine's load" in lag_reason(health)
    assert health["machine"] is None


def test_a_busy_machine_alone_does_not_invalidate_a_punctual_run() -> None:
    health = generator_health(frame(lag_ms=0.5), SCN, machine=BUSY)
    assert health["valid"] and health["invalid_reasons"] == []
    assert health["machine"]["load_1m"] == 3.1  # recorded all the same


@pytest.mark.parametrize(
    ("statuses", "seen"),
    [
        (("error",) * 6 + ("timeout",) * 3 + ("rejected",), "6 error, 1 rejected, 3 timeout"),
        (("cancelled",) * 2, "2 cancelled"),
        ((), "no records"),
    ],
)
def test_a_run_where_nothing_succeeded_is_invalid(statuses: tuple[str, ...], seen: str) -> None:
    health = generator_health(frame(statuses=statuses), SCN, machine=BUSY)
    assert not health["valid"]
    reasons = [r for r in health["invalid_reasons"] if r.startswith("no request succeeded")]
    assert reasons == [
        f"no request succeeded ({seen}): the run measured failures, not the target's "
        "scheduling; check the target (its URL, API keys, model name) and the records' "
        "error_detail"
    ]


def test_one_success_is_enough_to_pass_that_rule() -> None:
    health = generator_health(frame(statuses=("error",) * 9 + ("ok",)), SCN)
    assert health["valid"], health["invalid_reasons"]


def _failing_server() -> web.Application:
    """A server that is there (so the check before t0 passes) and fails every request."""

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def fail(_: web.Request) -> web.Response:
        return web.Response(status=500, text="broken")

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", fail)
    return app


def test_a_run_in_which_nothing_succeeded_exits_1_invalid_and_records_the_machine(
    tmp_path: Path,
) -> None:
    with serve_in_thread(_failing_server()) as url:
        _run_against_a_failing_target(tmp_path, url)


def _run_against_a_failing_target(tmp_path: Path, url: str) -> None:
    scenario = {
        "name": "nobody",
        "workloads": {"c": {"endpoint": "chat", "prompt_tokens": 10, "output_tokens": 4}},
        "tenants": [{"id": "a", "mix": "c", "arrival": {"process": "constant", "rate": "10/s"}}],
        "run": {"duration": "1s", "timeout": "5s", "grace": "5s"},
        "target": {"kind": "openai", "base_url": f"{url}/v1", "model": "m"},
    }
    path = tmp_path / "nobody.yaml"
    path.write_text(yaml.safe_dump(scenario))
    out = tmp_path / "run"
    result = run_cli("run", str(path), "--out", str(out), "--quiet", "--workers", "1")
    assert result.returncode == 1, result.stderr + result.stdout
    assert "INVALID" in result.stdout and "no request succeeded (10 error)" in result.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert not summary["valid"]
    machine = summary["generator_health"]["machine"]
    assert machine["cpus"] >= 1 and machine["wall_s"] > 0 and machine["generator_cpu_s"] > 0
