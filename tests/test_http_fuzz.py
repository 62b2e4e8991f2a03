"""HTTP requests generated from the server's OpenAPI document: never a 5xx, always an
OpenAI-shaped error for a 4xx, and well-behaved tenants keep being served meanwhile."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from reference_scheduler.server.app import build_app
from reference_scheduler.server.config import parse_server_config
from reference_scheduler.server.openapi import OPENAPI
from tests.loopback import serve_in_thread

SCHEMAS = OPENAPI["components"]["schemas"]
POSTS = {
    path: spec["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit(
        "/", 1
    )[-1]
    for path, spec in OPENAPI["paths"].items()
    if "post" in spec
}

junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)


def value_for(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    if "$ref" in schema:
        return body_for(schema["$ref"].rsplit("/", 1)[-1])
    kind = schema.get("type")
    if kind == "string":
        return st.text(alphabet="abcdefghij ", max_size=60)
    if kind == "integer":
        return st.integers(schema.get("minimum", -5), 200)
    if kind == "boolean":
        return st.booleans()
    if kind == "array":
        return st.lists(
            value_for(schema.get("items", {})), min_size=schema.get("minItems", 0), max_size=3
        )
    if kind == "object" and "properties" in schema:
        return st.fixed_dictionaries(
            {}, optional={k: value_for(v) for k, v in schema["properties"].items()}
        )
    return junk


def body_for(name: str) -> st.SearchStrategy[Any]:
    schema = SCHEMAS[name]
    props = schema.get("properties", {})
    required = {k: value_for(props[k]) for k in schema.get("required", [])}
    optional = {k: st.one_of(value_for(v), junk) for k, v in props.items() if k not in required}
    # The served model's name, or another: a body with any other model is a (correct) 404/400.
    model = {"model": st.sampled_from(["ref", "ref", "other"])} if "model" in props else {}
    valid = st.fixed_dictionaries(
        {**required, **model},
        optional={k: value_for(v) for k, v in props.items() if k not in required and k != "model"},
    )
    well_formed = st.fixed_dictionaries(required, optional=optional)
    corrupted = st.fixed_dictionaries(
        {k: st.one_of(v, junk) for k, v in required.items()}, optional=optional
    )
    return st.one_of(valid, well_formed, corrupted, junk)


def matched(path: str) -> st.SearchStrategy[tuple[str, str, str]]:
    """A body for this path (so accepted requests are common, not luck), any of the keys."""
    return st.tuples(
        st.just(path),
        body_for(POSTS[path]).map(json.dumps),
        st.sampled_from(["", "Bearer k1", "Bearer nope"]),
    )


request = st.one_of(
    st.sampled_from(sorted(POSTS)).flatmap(matched),
    st.tuples(
        st.sampled_from(sorted(POSTS)),
        st.sampled_from(sorted(POSTS)).flatmap(lambda p: body_for(POSTS[p])).map(json.dumps),
        st.sampled_from(["", "Bearer k1", "Bearer nope"]),
    ),
    st.tuples(
        st.sampled_from([*POSTS, "/v1/nothing", "/health"]),
        st.binary(max_size=80).map(lambda b: b.decode("latin-1")),
        st.sampled_from(["", "Bearer k1"]),
    ),
)


CONFIG = {
    "model": "ref",
    "scheduler": {
        "policy": "vtc",
        "profile": {"constant_step_ms": 1.0, "kv_cache_tokens": 50_000, "max_num_seqs": 16},
    },
    "tenants": [{"id": "t1", "api_key": "k1"}],
    "max_tokens_limit": 64,
}
SEEN: Counter[int] = Counter()  # statuses the fuzz produced: it must reach both sides


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """The reference server in its own thread's event loop, for the whole module."""
    with serve_in_thread(build_app(parse_server_config(CONFIG)), reference=True) as url:
        yield url


async def send(url: str, path: str, body: str, auth: str) -> tuple[int, str]:
    headers = {"Content-Type": "application/json"}
    if auth:
        headers["Authorization"] = auth
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + path, data=body.encode("utf-8", "replace"), headers=headers) as r,
    ):
        return r.status, await r.text()


# One well-formed request per endpoint, always run beside the generated ones: accepted requests
# are a few percent of what the strategies draw (a valid body, the right key, and every
# optional field in range), so 250 draws held no accepted one in about one run of twelve, and
# the fuzz then said nothing about the server serving while it is fuzzed.
ACCEPTED = (
    ("/v1/completions", {"model": "ref", "prompt": "a b", "max_tokens": 2}),
    ("/v1/chat/completions", {"model": "ref", "messages": [{"role": "user", "content": "a"}]}),
    ("/v1/embeddings", {"model": "ref", "input": "a b c"}),
)


def with_accepted(test: Any) -> Any:
    for path, body in ACCEPTED:
        test = example(req=(path, json.dumps(body), "Bearer k1"))(test)
    return test


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(req=request)
@with_accepted
def test_generated_requests_never_5xx(server: str, req: tuple[str, str, str]) -> None:
    path, body, auth = req
    status, text = asyncio.run(send(server, path, body, auth))
    SEEN[status] += 1
    assert status < 500, (status, path, body[:200], text[:200])
    if status >= 400:
        error = json.loads(text)["error"]
        assert {"message", "type", "param", "code"} <= set(error)


def test_the_server_still_serves_well_behaved_tenants(server: str) -> None:
    body = json.dumps({"model": "ref", "prompt": "a b c", "max_tokens": 3})
    status, text = asyncio.run(send(server, "/v1/completions", body, "Bearer k1"))
    assert status == 200 and json.loads(text)["usage"]["completion_tokens"] == 3
    if SEEN:  # after the fuzz (same module): it exercised accepted and refused requests alike
        assert {200, 400, 401} <= set(SEEN), SEEN
