"""Prompt calibration: a real engine's tokenizer must count exactly the planned prompt tokens.

The tokenizer here is a real byte-level BPE (HF tokenizers), trained in the test on the same
consonant-vowel words fairbench's prompts use (tests/engines/make_tiny_llama.py), so some
words are one token and others split — the case calibration exists for. The end-to-end test
runs `fairbench run` with a `vllm` target against a loopback server that speaks vLLM's
/v1/models, /version, /tokenize and chat API and counts prompts with that tokenizer plus a
chat template's markers, as vLLM does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from fairbench.pipeline import run_scenario
from fairbench.plan.materialize import materialize
from fairbench.run import RunOptions
from fairbench.targets.calibrate import (
    MIN_WORDS,
    Calibration,
    FileTokenizer,
    calibrate,
    single_token_words,
)
from fairbench.workload.loading import parse_scenario
from fairbench.workload.prompts import VOCAB
from tests.engines.make_tiny_llama import train_tokenizer
from tests.loopback import serve_in_thread

TEMPLATE_TOKENS = 5  # what the fake server's chat template adds, like the tiny Llama's


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_tokenizer(np.random.default_rng(7)).save(str(path))
    return str(path)


def scenario(url: str = "http://127.0.0.1:9", **target: Any) -> dict[str, Any]:
    return {
        "name": "cal",
        "workloads": {
            "chat": {
                "endpoint": "chat",
                "prompt_tokens": {"dist": "uniform", "low": 8, "high": 300},
                "output_tokens": 3,
                "prefix": {"groups": 2, "tokens": 32},
            },
            "doc": {
                "endpoint": "completions",
                "prompt_tokens": {"dist": "uniform", "low": 100, "high": 500},
                "output_tokens": 3,
            },
        },
        "tenants": [
            {"id": "a", "mix": "chat", "arrival": {"process": "poisson", "rate": 20}},
            {"id": "b", "mix": "doc", "arrival": {"process": "poisson", "rate": 10}},
        ],
        "run": {"duration": "1.5s", "seed": 3, "timeout": "10s", "grace": "5s"},
        "target": {"kind": "vllm", "base_url": url, **target},
    }


async def test_single_token_words_are_exactly_the_one_token_words() -> None:
    cost = {w: 1 + (i % 3 == 0) for i, w in enumerate(VOCAB)}  # every third word is 2 tokens

    async def count(text: str) -> int:  # plus a BOS, as some /tokenize endpoints insist
        return 1 + sum(cost[w] for w in text.split())

    kept = await single_token_words(count)
    expected = [w for w in VOCAB if cost[w] == 1]
    assert kept == expected[: len(kept)] and len(kept) >= 1024


async def test_file_tokenizer_counts_rendered_prompts_exactly(tokenizer_file: str) -> None:
    count = FileTokenizer(tokenizer_file)
    words = await single_token_words(count)
    assert len(words) >= MIN_WORDS
    cal = Calibration(words, {"chat": 0, "completions": 0}, "test")
    render = cal.renderer()
    plan = materialize(parse_scenario(scenario()))
    for i in range(len(plan)):
        req = plan.request(i)
        assert await count(render(req)) == req.prompt_tokens
    # requests of one prefix group share their first 32 tokens exactly
    same = [plan.request(i) for i in range(len(plan)) if plan.request(i).prefix_group == 0]
    heads = {" ".join(render(r).split()[:32]) for r in same if r.prompt_tokens >= 32}
    assert len(same) > 2 and len(heads) == 1


async def test_calibration_subtracts_the_servers_overhead(tokenizer_file: str) -> None:
    count = FileTokenizer(tokenizer_file)
    plan = materialize(parse_scenario(scenario()))
    overhead = {"chat": TEMPLATE_TOKENS, "completions": 1}

    async def probe(req: Any, text: str) -> int:
        return overhead[req.endpoint] + await count(text)

    cal = await calibrate(count, probe, plan, "test")
    assert cal is not None
    assert cal.overhead == overhead
    assert cal.exact and len(cal.checks) == 6
    again = Calibration.from_json(json.loads(json.dumps(cal.to_json())))
    req = plan.request(0)
    assert again.renderer()(req) == cal.renderer()(req)


class FakeVLLM:
    """vLLM's answers, with prompts counted by a real tokenizer (+ the template's tokens)."""

    def __init__(self, tokenizer_file: str) -> None:
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(tokenizer_file)
        self.prompts: list[tuple[str, int]] = []  # (endpoint, counted prompt tokens)

    def count(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=False).ids)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.32.0"})

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        assert body["model"] == "tiny" and body["add_special_tokens"] is False
        n = self.count(body["prompt"])
        return web.json_response({"count": n, "max_model_len": 2048, "tokens": list(range(n))})

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        assert body["model"] == "tiny"
        chat = "messages" in body
        text = body["messages"][0]["content"] if chat else body["prompt"]
        prompt = self.count(text) + (TEMPLATE_TOKENS if chat else 0)
        if body.get("max_tokens") != 1:  # probes are not records of the run
            self.prompts.append(("chat" if chat else "completions", prompt))
        n = body["max_tokens"]
        usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for k in range(n):
            choice = (
                {"index": 0, "delta": {"content": " ba"}, "finish_reason": None}
                if chat
                else {"index": 0, "text": " ba", "finish_reason": None}
            )
            if k == n - 1:
                choice["finish_reason"] = "length"
            await resp.write(b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n")
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def metrics(self, request: web.Request) -> web.Response:
        text = "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0.0\n"
        return web.Response(text=text)


@pytest.fixture
def fake_vllm(tokenizer_file: str) -> Iterator[tuple[str, FakeVLLM]]:
    """Served from its own thread and loop: run_scenario needs the main thread (signals)."""
    fake = FakeVLLM(tokenizer_file)
    app = web.Application()
    app.router.add_get("/v1/models", fake.models)
    app.router.add_get("/version", fake.version)
    app.router.add_get("/metrics", fake.metrics)
    app.router.add_post("/tokenize", fake.tokenize)
    app.router.add_post("/v1/chat/completions", fake.generate)
    app.router.add_post("/v1/completions", fake.generate)
    with serve_in_thread(app) as url:
        yield url, fake


def test_run_against_a_vllm_counts_exactly_the_plan(
    fake_vllm: tuple[str, FakeVLLM], tmp_path: Path
) -> None:
    url, fake = fake_vllm
    scn = parse_scenario(scenario(url))
    outcome = run_scenario(scn, RunOptions(out=tmp_path / "run", workers=1))
    header = json.loads((tmp_path / "run" / "run.json").read_text())
    target = header["target"]
    assert target["model"] == "tiny" and target["server_version"] == "0.32.0"
    cal = target["calibration"]
    assert cal["exact"] and cal["overhead"] == {"chat": TEMPLATE_TOKENS, "completions": 0}
    assert "words" not in cal  # derived data stays out of run.json
    plan = materialize(scn)
    assert sorted(p for _, p in fake.prompts) == sorted(
        int(x) for x in plan.columns["prompt_tokens"]
    )
    assert outcome.summary["warnings"] == []


def test_uncalibratable_run_says_so(fake_vllm: tuple[str, FakeVLLM], tmp_path: Path) -> None:
    url, _ = fake_vllm
    scn = parse_scenario(scenario(url, calibrate=False))
    outcome = run_scenario(scn, RunOptions(out=tmp_path / "run", workers=1))
    assert outcome.summary["warnings"] == [
        "prompt lengths: not calibrated (target.calibrate: false)"
    ]
