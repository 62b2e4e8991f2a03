"""Cache isolation between tenants: `tenants[i].cache_salt` (vLLM's field) and
`workloads.X.prefix.across_tenants`. Two tenants sending identical prompts share prefix-cache
hits when sharing is on, and get none of each other's when salted or when each has prefixes
of its own — in both simulated engines (the reference scheduler's, and `engine: vllm`), and on
the reference server over HTTP. The live client sends the salt to vLLM and to the reference
server, and nowhere that would not read it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any
from urllib.error import HTTPError
from urllib.request import Request, urlopen

import pytest

from fairbench.plan.materialize import materialize
from fairbench.targets.sim import run_sim
from fairbench.workload.scenario import ScenarioError, parse_scenario
from reference_scheduler.core.prefix_cache import salted


def two_tenants(
    salts: tuple[str | None, str | None] = (None, None),
    across: bool = True,
    engine: str = "reference",
    kind: str = "sim",
) -> Any:
    """Tenants a and b send the same workload: one 512-token shared prefix, then 32 tokens of
    their own. b starts after a's first request has finished."""
    tenants = []
    for i, (tid, salt) in enumerate(zip(("a", "b"), salts, strict=True)):
        tenant: dict[str, Any] = {
            "id": tid,
            "mix": "chat",
            "arrival": {"process": "constant", "rate": "1/s"},
            "phases": [{"start": "0s", "end": "5s", "multiplier": 1e-9}] if i else [],
        }
        if salt is not None:
            tenant["cache_salt"] = salt
        tenants.append(tenant)
    scheduler: dict[str, Any] = {"policy": "fifo", "prefix_cache": {"blocks": 65536}}
    if engine == "vllm":
        scheduler = {"engine": "vllm", "policy": "fcfs", "prefix_caching": True}
    return parse_scenario(
        {
            "name": "isolation",
            "workloads": {
                "chat": {
                    "prompt_tokens": 544,
                    "output_tokens": 8,
                    "prefix": {"groups": 1, "tokens": 512, "across_tenants": across},
                }
            },
            "tenants": tenants,
            "run": {"duration": "10s", "seed": 1},
            "target": {"kind": kind, **({"base_url": "http://x:1"} if kind != "sim" else {})},
            "scheduler": scheduler,
        }
    )


def cached_by_tenant(scn: Any) -> dict[str, list[int]]:
    rows, _ = run_sim(materialize(scn), scn)
    out: dict[str, list[int]] = {"a": [], "b": []}
    for row in sorted(rows, key=lambda r: r["t_intended_ns"]):
        assert row["status"] == "ok"
        out[row["tenant"]].append(int(row["cached_tokens"]))
    return out


@pytest.mark.parametrize("engine", ["reference", "vllm"])
def test_identical_prompts_share_hits_unless_salted(engine: str) -> None:
    shared = cached_by_tenant(two_tenants(engine=engine))
    assert len(shared["b"]) >= 3
    assert shared["a"][0] == 0  # nothing cached yet
    assert shared["b"][0] == 512  # b's very first request hits a's prefix
    salted_run = cached_by_tenant(two_tenants(("ta", "tb"), engine=engine))
    assert salted_run["b"][0] == 0  # a's blocks are not b's, though the text is the same
    assert salted_run["b"][1] == 512  # b still hits its own
    assert salted_run["a"][1:] == shared["a"][1:]  # a salt alone changes nothing for a
    same_salt = cached_by_tenant(two_tenants(("org", "org"), engine=engine))
    assert same_salt == shared  # one salt: shared exactly as unsalted
    own = cached_by_tenant(two_tenants(across=False, engine=engine))
    assert own["b"][0] == 0  # each tenant's prefix text is its own


def test_salted_hashes_follow_vllms_rule() -> None:
    chain = (11, 22, 33)
    assert salted(chain, None) == chain
    a, b = salted(chain, "a"), salted(chain, "b")
    assert not set(a) & set(b) and not set(a) & set(chain)
    assert salted(chain[:2], "a") == a[:2]  # a common prefix stays common under one salt


def test_across_tenants_false_gives_each_tenant_its_own_prefix_text() -> None:
    plan = materialize(two_tenants(across=False))
    groups = {
        t: set(plan.columns["prefix_group"][plan.columns["tenant"] == i].tolist())
        for i, t in enumerate(("a", "b"))
    }
    assert groups["a"].isdisjoint(groups["b"])
    first = {t: next(i for i in range(len(plan)) if plan.request(i).tenant == t) for t in "ab"}
    ids = {t: plan.request(i).prompt_ids()[:512] for t, i in first.items()}
    assert (ids["a"] != ids["b"]).any()
    shared = materialize(two_tenants())
    assert shared.digest != materialize(two_tenants(across=False)).digest


def test_live_client_sends_the_salt_to_vllm_only() -> None:
    from fairbench.targets.factory import make_target

    scn = two_tenants(("ta", None), kind="vllm")
    target = make_target(scn)
    plan = materialize(scn)
    bodies = {}
    for i in range(len(plan)):
        req = plan.request(i)
        bodies.setdefault(req.tenant, target.body(req, "hello"))  # type: ignore[attr-defined]
    assert bodies["a"]["cache_salt"] == "ta"
    assert "cache_salt" not in bodies["b"]


@pytest.mark.parametrize("kind", ["sglang", "tgi"])
def test_a_salt_for_a_target_that_ignores_it_is_refused(kind: str) -> None:
    with pytest.raises(ScenarioError, match=r"tenants\[0\]\.cache_salt: target kind"):
        two_tenants(("ta", None), kind=kind)


def test_the_reference_target_takes_the_salt_but_not_through_a_gateway() -> None:
    from fairbench.targets.factory import make_target

    scn = two_tenants(("ta", None), kind="reference")
    target = make_target(scn, base_url="http://127.0.0.1:1")
    plan = materialize(scn)
    bodies = {}
    for i in range(len(plan)):
        req = plan.request(i)
        bodies.setdefault(req.tenant, target.body(req, "hello"))  # type: ignore[attr-defined]
    assert bodies["a"]["cache_salt"] == "ta"
    assert "cache_salt" not in bodies["b"]
    raw = scn.model_dump(mode="json", exclude_none=True)
    raw["target"] = {"kind": "reference", "upstreams": [{"url": "http://127.0.0.1:8000"}]}
    with pytest.raises(ScenarioError, match=r"tenants\[0\]\.cache_salt: with target.upstreams"):
        parse_scenario(raw)


# ------------------------------------------------------------------ the reference server

SERVER = {
    "model": "ref",
    "scheduler": {
        "policy": "fifo",
        "profile": {"constant_step_ms": 1.0, "kv_cache_tokens": 20000, "max_num_seqs": 8},
        "prefix_cache": {"blocks": 4096},
    },
    "timing_extension": True,
    "max_tokens_limit": 64,
}


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    from reference_scheduler.server.app import serve
    from reference_scheduler.server.config import parse_server_config

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ready = threading.Event()
    loop = asyncio.new_event_loop()

    def run() -> None:
        asyncio.set_event_loop(loop)
        task = loop.create_task(
            serve(parse_server_config(SERVER), "127.0.0.1", port, lambda _: ready.set())
        )
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(task)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10)
    yield f"http://127.0.0.1:{port}"
    for task in asyncio.all_tasks(loop):
        loop.call_soon_threadsafe(task.cancel)
    thread.join(5)


def _ask(url: str, text: str, salt: object = None) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON body) of one chat request."""
    body: dict[str, Any] = {"messages": [{"role": "user", "content": text}], "max_tokens": 2}
    if salt is not None:
        body["cache_salt"] = salt
    request = Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urlopen(request, timeout=20) as response:
            return response.status, json.loads(response.read())
    except HTTPError as error:
        return error.code, json.loads(error.read())


def test_the_reference_server_honours_cache_salt(server: str) -> None:
    """vLLM's rule over HTTP: an unsalted repeat hits; a different salt hits nothing of the same
    text; a repeat under one salt hits what an unsalted repeat does."""
    from reference_scheduler.core.tokenizer import VOCAB

    def cached(text: str, salt: str | None = None) -> int:
        status, body = _ask(server, text, salt)
        assert status == 200, body
        return int(body["fairbench"]["cached_tokens"])

    prompts = [" ".join(VOCAB[(k * 131 + i) % len(VOCAB)] for i in range(200)) for k in range(4)]
    assert cached(prompts[0]) == 0
    unsalted = cached(prompts[0])
    assert unsalted >= 192  # 12 full blocks of 16
    assert cached(prompts[0], "tenant-a") == 0  # the same text, salted: no block shared
    assert cached(prompts[0], "tenant-b") == 0
    assert cached(prompts[0], "tenant-a") == unsalted
    # a salt isolates from the start: salted, then unsalted, of fresh text
    assert cached(prompts[1], "tenant-a") == 0
    assert cached(prompts[1]) == 0


@pytest.mark.parametrize("salt", [5, "", ["a"], True])
def test_a_bad_cache_salt_is_an_openai_400(server: str, salt: object) -> None:
    status, body = _ask(server, "ka ke ki", salt)
    assert status == 400
    error = body["error"]
    assert error["param"] == "cache_salt" and error["type"] == "invalid_request_error"
    assert _ask(server, "ka ke ki")[0] == 200  # and the server is still up


def test_salt_in_extra_body_is_pointed_to_the_field() -> None:
    scn = two_tenants()
    raw = scn.model_dump(mode="json", exclude_none=True)
    raw["tenants"][0]["extra_body"] = {"cache_salt": "x"}
    with pytest.raises(ScenarioError, match=r"tenants\[0\]\.extra_body\.cache_salt"):
        parse_scenario(raw)
