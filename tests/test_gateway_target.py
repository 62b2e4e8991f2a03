"""The gateway reachable from a scenario: `target: {kind: reference, upstreams: [...]}`.

fairbench then starts `python -m reference_scheduler gateway` instead of `serve`, with the same
tenants, keys and `scheduler:` block. The upstream here is the repository's own reference
server (`serve`, its simulated GPU in real time) started by the test on 127.0.0.1 and asking
for its own key, so a run that ends ok also shows the upstream key reached it. Bad upstreams
are one line naming the field (exit 2), and a dead one is found before t0. Nothing asserts a
duration.
"""

from __future__ import annotations

import copy
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from aiohttp import web

from fairbench.run.rundir import REDACTED, redacted
from fairbench.targets.precheck import TargetUnreachable, precheck
from fairbench.targets.reference import ReferenceServer, config_lines
from fairbench.workload.scenario import (
    GatewayDispatch,
    GatewayUpstream,
    ScenarioError,
    parse_scenario,
)
from reference_scheduler.gateway.config import DispatchSpec, UpstreamSpec, parse_gateway_config
from tests.cli import run_cli
from tests.loopback import free_port, reference_process, serve
from tests.promtext import samples

UPSTREAM_KEY = "sk-upstream-SECRET-4242"
TENANT_KEY = "sk-tenant-SECRET-0042"

BASE: dict[str, Any] = {
    "name": "gw-target",
    "workloads": {
        "chat": {"endpoint": "chat", "prompt_tokens": 40, "output_tokens": 6},
        "doc": {"endpoint": "completions", "prompt_tokens": 200, "output_tokens": 12},
    },
    "tenants": [
        {
            "id": "polite",
            "api_key": TENANT_KEY,
            "mix": "chat",
            "arrival": {"process": "poisson", "rate": "5/s"},
        },
        {
            "id": "flood",
            "slo_class": "batch",
            "mix": "doc",
            "arrival": {"process": "poisson", "rate": "15/s"},
        },
    ],
    "run": {"duration": "3s", "seed": 5, "grace": "20s", "timeout": "30s"},
    # this judges the gateway path, not this machine's load (tests/test_health.py does that)
    "health": {"max_send_lag_p99": "10s", "max_receive_error_p99": "10s", "min_rate_ratio": 0.5},
    "scheduler": {"policy": "vtc", "admission": {"max_queue_per_tenant": 500}},
    "target": {"kind": "reference", "upstreams": [{"url": "http://127.0.0.1:8000"}]},
}


def scenario(**target: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    data["target"] = {"kind": "reference", **target}
    return data


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The reference server as the engine behind the gateway: it accepts only UPSTREAM_KEY."""
    path = tmp_path_factory.mktemp("upstream") / "serve.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model": "reference",
                "tenants": [{"id": "gateway", "api_key": UPSTREAM_KEY}],
                "scheduler": {"policy": "fifo"},
            }
        )
    )
    with reference_process("serve", path) as url:
        yield url


def served(url: str) -> float:
    """Requests the upstream has finished (its scheduler_requests_total, all labels)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(samples(text, "scheduler_requests_total"))


# ---------------------------------------------------------------- a run through the gateway


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_run_through_the_gateway_accounts_for_every_request(
    upstream: str, tmp_path: Path, workers: str
) -> None:
    """The scenario's upstream is overridden on the command line (`--set`), as a user points
    a shipped scenario at a live engine; the run ends valid, every request ok, the gateway's
    /metrics scraped into it, and neither key anywhere in the run directory. With two
    generator processes the one gateway is started by the parent and shared."""
    data = scenario(
        upstreams=[
            {"url": "http://127.0.0.1:1", "engine": "none", "max_inflight": 3},
            {
                "url": "http://127.0.0.1:1",
                "name": "second",
                "engine": "vllm",  # /metrics answers (no vLLM series: never saturated)
                "max_inflight": 3,
                "api_key": UPSTREAM_KEY,
            },
        ],
        dispatch={"scrape_interval_s": 0.5},
    )
    data["target"]["upstreams"][0]["api_key"] = UPSTREAM_KEY
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "run"
    before = served(upstream)
    proc = run_cli(
        "run",
        str(path),
        "--out",
        str(out),
        "--quiet",
        "--workers",
        workers,
        "--set",
        f"target.upstreams.0.url={upstream}",
        "--set",
        f"target.upstreams.second.url={upstream}",
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["valid"], summary["invalid_reasons"]
    accounting = summary["accounting"]
    assert accounting["holds"] and accounting["missing"] == 0
    assert accounting["counts"]["ok"] == accounting["planned"] > 0
    assert served(upstream) - before == accounting["planned"]  # each reached the engine once
    target = json.loads((out / "run.json").read_text())["target"]
    assert target["mode"] == "gateway" and target["policy"] == "vtc"
    assert target["upstreams"] == [
        f"u0 {upstream} (none, max_inflight 3)",
        f"second {upstream} (vllm, max_inflight 3)",
    ]
    metrics = pd.read_parquet(out / "server_metrics.parquet")
    names = set(metrics["metric"])
    assert {"gateway_inflight", "gateway_upstream_healthy", "scheduler_queue_depth"} <= names
    assert "scheduler_wait_time_seconds_count" in names
    if workers == "2":  # the shared gateway's last /metrics, as for a shared `serve`
        assert b"gateway_inflight" in (out / "server_metrics.prom").read_bytes()
    run_scenario = yaml.safe_load((out / "scenario.yaml").read_text())
    assert [u["url"] for u in run_scenario["target"]["upstreams"]] == [upstream, upstream]
    for file in out.iterdir():
        if file.is_file():
            body = file.read_bytes()
            assert UPSTREAM_KEY.encode() not in body and TENANT_KEY.encode() not in body, file


def test_the_gateway_config_is_the_sim_references_plus_the_pool() -> None:
    """Same tenancy, keys, classes and scheduler block as `serve` gets; the upstreams (and
    dispatch) added; the gateway itself accepts the file."""
    data = scenario(
        upstreams=[{"url": "http://127.0.0.1:9", "engine": "none", "api_key": UPSTREAM_KEY}],
        dispatch={"stale_after_s": 2},
    )
    gateway = ReferenceServer(parse_scenario(data))
    sim = ReferenceServer(parse_scenario({**data, "target": {"kind": "reference"}}))
    gw, ref = gateway.config(), sim.config()
    assert gateway.command == "gateway" and sim.command == "serve"
    assert {k: v for k, v in gw.items() if k not in ("upstreams", "dispatch", "tenants")} == {
        k: v for k, v in ref.items() if k not in ("faults", "tenants")
    }
    strip = lambda ts: [{k: v for k, v in t.items() if k != "api_key"} for t in ts]  # noqa: E731
    assert strip(gw["tenants"]) == strip(ref["tenants"])
    assert gw["tenants"][0]["api_key"] == TENANT_KEY  # the scenario's key, as for serve
    assert gw["upstreams"] == [
        {
            **GatewayUpstream(url="http://127.0.0.1:9").model_dump(exclude_none=True),
            "engine": "none",
            "api_key": UPSTREAM_KEY,
        }
    ]
    config = parse_gateway_config(gw)
    assert config.upstreams[0].key() == UPSTREAM_KEY and config.dispatch.stale_after_s == 2
    assert config.server.scheduler.spec.policy == "vtc"


def test_scenario_upstream_fields_mirror_the_gateway_file() -> None:
    """A block moves between a scenario and a gateway file unchanged: same names, defaults."""

    def fields(model: Any) -> dict[str, Any]:
        return {name: info.default for name, info in model.model_fields.items()}

    assert fields(GatewayUpstream) == fields(UpstreamSpec)
    assert fields(GatewayDispatch) == fields(DispatchSpec)


def test_upstream_keys_are_redacted_from_the_run_directory() -> None:
    data = scenario(upstreams=[{"url": "http://127.0.0.1:9", "api_key": UPSTREAM_KEY}])
    written = redacted(parse_scenario(data))
    assert written["target"]["upstreams"][0]["api_key"] == REDACTED
    assert UPSTREAM_KEY not in json.dumps(written)
    parse_scenario(written)  # what a run directory holds still loads (compare reads it)


# ---------------------------------------------------------------- bad upstreams: one line


@pytest.mark.parametrize(
    ("target", "line"),
    [
        ({"upstreams": [{}]}, "target.upstreams[0].url: is required"),
        (
            {"upstreams": [{"url": "ftp://10.0.0.5:8000"}]},
            "target.upstreams[0].url: must be an http:// or https:// URL",
        ),
        (
            {"upstreams": [{"url": "http://ok:1"}, {"url": "10.0.0.5:8000"}]},
            "target.upstreams[1].url: must be an http:// or https:// URL",
        ),
        (
            {"upstreams": [{"url": "http://user:pw@10.0.0.5:8000"}]},
            "target.upstreams[0].url: no credentials in the URL",
        ),
        (
            {"upstreams": [{"url": "http://10.0.0.5:8000/v1"}]},
            "target.upstreams[0].url: the engine's root URL, without /v1",
        ),
        ({"upstreams": []}, "target.upstreams: list should have at least 1 item"),
        (
            {"upstreams": [{"url": "http://a:1", "max_inflight": 0}]},
            "target.upstreams[0].max_inflight: must be >= 1",
        ),
        (
            {"upstreams": [{"url": "http://a:1"}, {"url": "http://b:1", "name": "u0"}]},
            "target.upstreams[1].name: 'u0' is also upstreams[0]'s name",
        ),
        (
            {"upstreams": [{"url": "http://a:1", "api_key": "k", "api_key_env": "K"}]},
            "target.upstreams[0].api_key: give api_key or api_key_env, not both",
        ),
        (
            {"kind": "openai", "base_url": "http://a:1", "upstreams": [{"url": "http://a:1"}]},
            "target.upstreams: only kind reference runs the gateway",
        ),
        ({"dispatch": {"stale_after_s": 2}}, "target.dispatch: only with target.upstreams"),
        (
            {"upstreams": [{"url": "http://a:1"}], "faults": {"seed": 1}},
            "target.faults: the gateway injects no faults",
        ),
    ],
)
def test_a_bad_upstream_is_one_line_naming_the_field(target: dict[str, Any], line: str) -> None:
    data = copy.deepcopy(BASE)
    data["target"] = {"kind": "reference", **target}
    with pytest.raises(ScenarioError) as error:
        parse_scenario(data)
    assert len(error.value.lines) == 1 and error.value.lines[0].startswith(line), error.value.lines
    assert "pw@" not in error.value.lines[0]  # a credential is never echoed


def test_preemption_cannot_run_behind_the_gateway() -> None:
    data = scenario(upstreams=[{"url": "http://a:1"}])
    data["scheduler"]["preemption"] = {"mode": "swap"}
    with pytest.raises(ScenarioError) as error:
        parse_scenario(data)
    assert error.value.lines == [
        "scheduler.preemption.mode: the gateway cannot preempt a request running on an upstream "
        "(its work would be lost); use none, and the engine's own priority scheduling "
        "(upstreams' priority_field)"
    ]


def test_cli_bad_upstream_override_exits_2_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(BASE))
    proc = run_cli(
        "run", str(path), "--out", str(tmp_path / "r"), "--set", "target.upstreams.0.url=gpu0:8000"
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("--set target.upstreams.0.url=gpu0:8000: ")
    assert "target.upstreams[0].url: must be an http:// or https:// URL" in lines[0]
    assert not (tmp_path / "r").exists()


def test_refused_gateway_lines_name_the_scenarios_fields() -> None:
    err = "cfg/server.yaml: upstreams[0].api_key_env: environment variable is not set\n"
    assert config_lines(err, "cfg/server.yaml") == [
        "target.upstreams[0].api_key_env: environment variable is not set"
    ]


# ---------------------------------------------------------------- before t0


def test_a_dead_upstream_is_found_before_t0(tmp_path: Path) -> None:
    port = free_port()
    data = scenario(upstreams=[{"url": f"http://127.0.0.1:{port}", "engine": "none"}])
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(data))
    proc = run_cli("run", str(path), "--out", str(tmp_path / "r"), "--quiet")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"target.upstreams[0].url http://127.0.0.1:{port}: connection")
    assert not (tmp_path / "r").exists()  # checked before anything was written


def test_an_unset_key_variable_is_found_before_t0(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FB_TEST_NO_SUCH_KEY", raising=False)
    data = scenario(upstreams=[{"url": "http://127.0.0.1:9", "api_key_env": "FB_TEST_NO_SUCH_KEY"}])
    with pytest.raises(ScenarioError) as error:
        import asyncio

        asyncio.run(precheck(parse_scenario(data)))
    assert error.value.lines == [
        "target.upstreams[0].api_key_env: the environment variable FB_TEST_NO_SUCH_KEY is not "
        "set (the engine's key is read from it); export it, or use api_key"
    ]


def engine_app(metrics_status: int, seen: list[str]) -> web.Application:
    async def models(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.json_response({"object": "list", "data": [{"id": "m"}]})

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(status=metrics_status, text="vllm:num_requests_waiting 0\n")

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    return app


async def test_an_upstream_without_metrics_is_refused_unless_engine_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gateway would count an upstream whose /metrics fails as saturated all run (nothing
    sent, every request timing out), so the check says so; `engine: none` does not scrape."""
    monkeypatch.setenv("FB_TEST_UPSTREAM_KEY", UPSTREAM_KEY)
    seen: list[str] = []
    async with serve(engine_app(404, seen)) as url:
        up = {"url": url, "api_key_env": "FB_TEST_UPSTREAM_KEY"}
        with pytest.raises(TargetUnreachable) as error:
            await precheck(parse_scenario(scenario(upstreams=[up])))
        (line,) = error.value.lines
        assert line.startswith(f"target.upstreams[0].url {url}: GET /metrics failed (HTTP 404)")
        assert "engine: none" in line
        await precheck(parse_scenario(scenario(upstreams=[{**up, "engine": "none"}])))
    assert seen == [f"Bearer {UPSTREAM_KEY}"] * 2  # the check sends the upstream's own key
    async with serve(engine_app(200, [])) as url:
        await precheck(parse_scenario(scenario(upstreams=[{"url": url}])))


def test_behind_the_gateway_the_backlog_is_the_gateways_own_record(
    upstream: str, tmp_path: Path
) -> None:
    """Issue 33: the fairness figures count a request as backlogged only while the scheduler
    passed it over. Behind the gateway that scheduler is the gateway's queue: with one slot
    upstream the flood's documents queue there, each record carries the gateway's wait
    (`backlog_ns`, `passed_over_ns`), and the run's backlog comes from the scheduler, not from
    the arrival-to-first-token proxy an opaque engine would leave."""
    data = scenario(
        upstreams=[
            {"url": "http://127.0.0.1:1", "engine": "none", "max_inflight": 1},
        ],
    )
    data["target"]["upstreams"][0]["api_key"] = UPSTREAM_KEY
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "run"
    proc = run_cli(
        "run", str(path), "--out", str(out), "--quiet",
        "--set", f"target.upstreams.0.url={upstream}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = pd.read_parquet(out / "records.parquet")
    ok = records[records["status"] == "ok"]
    assert len(ok) > 20
    assert ok["backlog_ns"].notna().all()  # every answer carried the gateway's record
    waited = ok[ok["backlog_ns"] > 0]
    assert len(waited) > 0 and waited["passed_over_ns"].notna().all()
    assert (ok.loc[ok["backlog_ns"] == 0, "passed_over_ns"].isna()).all()
    # a request's wait for the scheduler is part of its time to first token
    ttft = ok["t_first_token_ns"] - ok["t_sent_ns"]
    assert (waited["backlog_ns"] <= ttft[waited.index]).all()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["fairness"]["service_difference"]["backlog_basis"] == "scheduler"
