"""A live target is checked before t0, and a target without a URL is a one-line error.

A dead port used to give a full-duration run of errors that still said VALID and exit 0; a
`kind: openai` scenario without `base_url` passed `validate` and then crashed in `run`. Now
both fail in seconds with one line naming the URL (or the field) and what failed, exit 2, and
no run directory is left behind. Servers here are loopback ones the tests start themselves.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from fairbench.targets.precheck import TargetUnreachable, check_reachable, precheck, probe_url
from fairbench.workload.checks import target_url
from fairbench.workload.errors import ScenarioError
from fairbench.workload.loading import parse_scenario
from tests.cli import run_cli
from tests.loopback import free_port, serve

BASE: dict[str, Any] = {
    "workloads": {"chat": {"prompt_tokens": 20, "output_tokens": 4}},
    "tenants": [{"id": "a", "mix": "chat", "arrival": {"process": "poisson", "rate": "5/s"}}],
    "run": {"duration": "2s"},
}


def scenario_data(**target: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    data["target"] = target
    return data


def models_app(status: int, seen: list[dict[str, str]] | None = None) -> web.Application:
    async def models(request: web.Request) -> web.Response:
        if seen is not None:
            seen.append(dict(request.headers))
        if status == 200:
            return web.json_response({"object": "list", "data": [{"id": "m"}]})
        return web.json_response({"error": "no"}, status=status)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    return app


def one_line(error: pytest.ExceptionInfo[ScenarioError]) -> str:
    assert len(error.value.lines) == 1
    line = error.value.lines[0]
    assert "\n" not in line
    return line


# ---------------------------------------------------------------- the check itself


async def test_a_dead_port_is_connection_refused() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(TargetUnreachable) as error:
        await check_reachable(url)
    line = one_line(error)
    assert line.startswith(f"target.base_url {url}: connection refused")


@pytest.mark.parametrize("status", [404, 500, 401])
async def test_an_http_error_on_v1_models_names_the_status(status: int) -> None:
    async with serve(models_app(status)) as url:
        with pytest.raises(TargetUnreachable) as error:
            await check_reachable(url + "/v1", label="--target-url")
    line = one_line(error)
    assert line.startswith(f"--target-url {url}/v1: GET /v1/models answered HTTP {status}")


async def test_a_server_without_v1_models_is_a_404() -> None:
    async with serve(web.Application()) as url:
        with pytest.raises(TargetUnreachable) as error:
            await check_reachable(url)
    assert "HTTP 404" in one_line(error)


async def test_a_listener_that_never_answers_is_a_timeout() -> None:
    """It accepts the connection and then says nothing, so only the timeout can end the wait."""
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(TargetUnreachable) as error:
            await check_reachable(f"http://127.0.0.1:{port}", timeout_s=0.5)
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()
    line = one_line(error)
    assert "timeout" in line and "GET /v1/models" in line


async def test_a_server_that_answers_passes_and_gets_the_runs_credentials() -> None:
    seen: list[dict[str, str]] = []
    async with serve(models_app(200, seen)) as url:
        scn = parse_scenario(
            scenario_data(kind="vllm", base_url=url, api_key="k1", headers={"X-Org": "o"})
        )
        await precheck(scn)
    assert len(seen) == 1
    assert seen[0]["Authorization"] == "Bearer k1" and seen[0]["X-Org"] == "o"


def test_the_probe_path_follows_the_targets_url_rules() -> None:
    assert probe_url("http://h:8000") == "http://h:8000/v1/models"
    assert probe_url("http://h:8000/v1/") == "http://h:8000/v1/models"
    assert probe_url("http://h/proxy") == "http://h/proxy/v1/models"


async def test_sim_and_a_started_reference_server_are_not_probed() -> None:
    """`sim` has no server; `reference` without --target-url starts its own (and waits for
    its /health), so neither may be sent anything now."""
    for kind in ("sim", "reference"):
        await precheck(parse_scenario(scenario_data(kind=kind)))


async def test_a_reference_target_at_a_given_url_is_probed() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(TargetUnreachable) as error:
        await precheck(parse_scenario(scenario_data(kind="reference")), url)
    assert one_line(error).startswith(f"--target-url {url}: connection refused")


# ---------------------------------------------------------------- which URL, and its form


@pytest.mark.parametrize("kind", ["openai", "vllm", "sglang", "tgi"])
def test_a_live_target_without_a_url_names_the_field_and_the_fix(kind: str) -> None:
    scn = parse_scenario(scenario_data(kind=kind))  # valid: --target-url may give the URL
    with pytest.raises(ScenarioError) as error:
        target_url(scn)
    line = one_line(error)
    assert line.startswith(f"target.base_url: a target of kind {kind!r} needs the server's URL")
    assert "--target-url" in line
    assert target_url(scn, "http://127.0.0.1:8000") == "http://127.0.0.1:8000"


def test_the_override_wins_and_is_checked() -> None:
    scn = parse_scenario(scenario_data(kind="vllm", base_url="http://a:1"))
    assert target_url(scn) == "http://a:1"
    assert target_url(scn, "http://b:2") == "http://b:2"
    with pytest.raises(ScenarioError) as error:
        target_url(scn, "b:2")
    assert one_line(error).startswith("--target-url: must be an http:// or https:// URL")
    assert target_url(parse_scenario(scenario_data(kind="sim")), "http://b:2") is None


def test_a_metrics_url_may_have_a_query_but_not_a_bad_scheme() -> None:
    target = {"kind": "vllm", "base_url": "http://h:8000"}
    parse_scenario(scenario_data(**target, metrics_url="http://h:8000/metrics?x=1"))
    with pytest.raises(ScenarioError) as error:
        parse_scenario(scenario_data(**target, metrics_url="h:8000/metrics"))
    assert one_line(error).startswith("target.metrics_url: must be an http:// or https:// URL")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("localhost:8000", "must be an http:// or https:// URL with a host"),
        ("http://", "must be an http:// or https:// URL with a host"),
        ("http://h:99999", "not a URL with a valid port"),
        ("http://h:8000/?x=1", "must be the server's base URL, without ?query"),
    ],
)
def test_a_malformed_base_url_is_a_scenario_error(url: str, says: str) -> None:
    with pytest.raises(ScenarioError) as error:
        parse_scenario(scenario_data(kind="vllm", base_url=url))
    assert one_line(error).startswith(f"target.base_url: {says}")


# ---------------------------------------------------------------- as a user runs it


def write(tmp_path: Path, **target: Any) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario_data(**target)), encoding="utf-8")
    return path


def test_run_against_a_dead_port_fails_before_t0(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    out = tmp_path / "run"
    path = write(tmp_path, kind="vllm", base_url=url)
    result = run_cli("run", str(path), "--out", str(out), "--quiet")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"target.base_url {url}: connection refused")
    assert not out.exists()


def test_run_without_any_url_is_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, kind="openai")
    assert run_cli("validate", str(path)).returncode == 0
    out = tmp_path / "run"
    result = run_cli("run", str(path), "--out", str(out), "--quiet")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("target.base_url: a target of kind 'openai'")
    assert not out.exists()


def test_target_url_still_overrides_a_scenario_without_base_url(tmp_path: Path) -> None:
    """The URL on the command line is the one checked (here: a dead one)."""
    url = f"http://127.0.0.1:{free_port()}"
    path = write(tmp_path, kind="openai")
    out = tmp_path / "run"
    result = run_cli("run", str(path), "--target-url", url, "--out", str(out), "--quiet")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"--target-url {url}: connection refused")
    assert not out.exists()
