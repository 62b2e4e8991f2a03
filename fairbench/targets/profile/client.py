"""The HTTP client of `fairbench profile`: streamed completions with per-token client stamps.

Imports aiohttp and the profile's values (model.py) only.
"""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp
import numpy as np

from fairbench.targets.http.sse import SSEParser
from fairbench.targets.profile.model import (
    REQUEST_TIMEOUT_S,
    ProbeError,
    Stream,
)
from reference_scheduler.core.tokenizer import VOCAB

# ---------------------------------------------------------------- talking to the engine


class Client:
    """Streams completions and stamps each chunk's arrival on the monotonic clock."""

    def __init__(
        self, base: str, model: str, headers: dict[str, str], seed: int, kind: str = "openai"
    ) -> None:
        self.base, self.model, self.headers = base.rstrip("/"), model, headers
        self.kind = kind
        self.rng = np.random.default_rng(seed)
        self.words_per_token = 1.0  # learnt from the first reply's usage
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Client:
        self.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
            connector=aiohttp.TCPConnector(limit=0),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.session is not None:
            await self.session.close()

    def prompt(self, tokens: int) -> str:
        words = max(1, round(tokens * self.words_per_token))
        picks = self.rng.integers(0, len(VOCAB), words)
        return " ".join(VOCAB[int(i)] for i in picks)

    async def stream(self, tokens: int, max_tokens: int, out: Stream | None = None) -> Stream:
        """Send one streamed request; `out` (if given) fills as tokens arrive."""
        assert self.session is not None
        body = self.body(tokens, max_tokens)
        out = out or Stream(0)
        out.sent_ns = time.perf_counter_ns()
        url = f"{self.base}/v1/completions"
        async with self.session.post(url, json=body, headers=self.headers) as resp:
            if resp.status != 200:
                text = (await resp.text())[:200].replace("\n", " ")
                raise ProbeError(
                    f"{url}: the engine refused the probe (HTTP {resp.status}: {text})"
                )
            parser = SSEParser()  # fairbench's one SSE reader (targets/http/sse.py)
            async for raw in resp.content.iter_any():
                if self._read_events(parser.feed(raw), out, url):
                    break
        if not out.token_ns:
            raise ProbeError(f"{url}: the engine streamed no token for a probe request")
        return out

    @staticmethod
    def _read_events(events: list[bytes], out: Stream, url: str) -> bool:
        """Stamp the tokens of one read's events into `out`; True at the stream's [DONE]."""
        for payload in events:
            data = payload.strip()
            if data == b"[DONE]":
                return True
            now = time.perf_counter_ns()
            try:
                chunk = json.loads(data)
            except ValueError:
                raise ProbeError(f"{url}: not an OpenAI stream ({data[:80]!r})") from None
            choices = chunk.get("choices") or []
            # a token whose text is still held back (a partial character) streams ""; the
            # last one comes with finish_reason either way
            if choices and (choices[0].get("text") or choices[0].get("finish_reason")):
                out.token_ns.append(now)
            usage = chunk.get("usage")
            if isinstance(usage, dict):
                out.prompt_tokens = usage.get("prompt_tokens")
                out.completion_tokens = usage.get("completion_tokens")
        return False

    def body(self, tokens: int, max_tokens: int) -> dict[str, Any]:
        """The completion request: vLLM's fields (SGLang takes the same); TGI reads only
        model, prompt, max_tokens, temperature and stream, and takes a `model` other than
        `tgi` as a LoRA adapter id."""
        if self.kind == "tgi":
            return {
                "model": "tgi",
                "prompt": self.prompt(tokens),
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": True,
            }
        return {
            "model": self.model,
            "prompt": self.prompt(tokens),
            "max_tokens": max_tokens,
            "min_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    async def calibrate(self) -> None:
        """How many words make a token on this engine's tokenizer (usage of one probe)."""
        asked = 64
        s = await self.stream(asked, 1)
        if s.prompt_tokens:
            self.words_per_token = asked / max(1, s.prompt_tokens)


async def _get(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> Any:
    try:
        async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(10)) as r:
            if r.status != 200:
                return None
            text = await r.text()
    except (aiohttp.ClientError, TimeoutError):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text
