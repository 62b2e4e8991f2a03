"""Prompts that a real engine's tokenizer counts exactly as planned.

A plan's prompt of L tokens is L words of the reference vocabulary; a real tokenizer splits
some of those words into several tokens and adds its own around the prompt (BOS, the chat
template). Calibration makes the server see exactly L prompt tokens:

1. **Single-token words.** Ask the tokenizer (the server's `/tokenize`, or a local
   tokenizer.json) for each vocabulary word in the two forms a prompt uses: at the start
   (`w`) and after a space (`A w` minus `A`). Words that are one token in both are kept. BPE
   and SentencePiece tokenizers never merge across a space, so a text of k kept words is k
   tokens. Prompts are rendered from the kept words (word i of the plan's recipe becomes kept
   word i mod n), so requests of one prefix group still share their leading tokens exactly.
2. **Overhead.** One probe request per endpoint (`max_tokens: 1`) reports, in its usage, how
   many prompt tokens the server counted for k words; the difference is the overhead that
   rendering subtracts (a chat template's markers, a BOS token).
3. **Check.** The shortest, median and longest prompt of each endpoint in the plan are sent as
   probes; the server's counts are recorded next to the planned ones in run.json, and a
   mismatch is reported, not hidden.

Probes run before t0 and are not records of the run. A server without a tokenizer endpoint
(and no tokenizer file given) is not calibrated; run.json says so.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

from fairbench.plan.model import ENDPOINTS, Plan, PlannedRequest
from fairbench.workload.prompts import VOCAB

MIN_WORDS = 64  # fewer kept words than this and prompts would be too repetitive to trust
ENOUGH_WORDS = 1024  # stop asking once this many are kept
BATCH = 256
ANCHOR = VOCAB[0]

Count = Callable[[str], Awaitable[int]]


@dataclass
class Calibration:
    words: list[str]
    overhead: dict[str, int]
    source: str
    checks: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def exact(self) -> bool:
        return bool(self.checks) and all(c.get("server") == c["planned"] for c in self.checks)

    def summary(self) -> dict[str, Any]:
        """What run.json records (not the word list: it is derived, and long)."""
        return {
            "source": self.source,
            "single_token_words": len(self.words),
            "overhead": self.overhead,
            "checks": self.checks,
            "exact": self.exact,
            "seconds": round(self.seconds, 2),
        }

    def to_json(self) -> dict[str, Any]:
        return {**self.summary(), "words": self.words}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Calibration:
        return cls(
            list(data["words"]),
            {k: int(v) for k, v in data["overhead"].items()},
            str(data["source"]),
            list(data.get("checks", [])),
            float(data.get("seconds", 0.0)),
        )

    def renderer(self) -> Callable[[PlannedRequest], str]:
        words = np.array(self.words, dtype=object)
        overhead = dict(self.overhead)

        def render(req: PlannedRequest) -> str:
            ids = req.prompt_ids(max(1, req.prompt_tokens - overhead.get(req.endpoint, 0)))
            return " ".join(words[ids % len(words)])

        return render


async def single_token_words(count: Count, vocab: Sequence[str] = VOCAB) -> list[str]:
    """Vocabulary words that are one token at the start of a text and after a space."""
    anchor = await count(ANCHOR)
    kept: list[str] = []
    special: int | None = None
    for lo in range(0, len(vocab), BATCH):
        batch = list(vocab[lo : lo + BATCH])
        alone = await asyncio.gather(*(count(w) for w in batch))
        after = await asyncio.gather(*(count(f"{ANCHOR} {w}") for w in batch))
        if special is None:
            # Tokens the endpoint adds to any text (a BOS some /tokenize endpoints insist on):
            # at least one word of a batch is a single token in any real vocabulary.
            special = max(0, min(alone) - 1)
        kept += [
            w
            for w, a, b in zip(batch, alone, after, strict=True)
            if a - special == 1 and b - anchor == 1
        ]
        if len(kept) >= ENOUGH_WORDS:
            break
    return kept


class HTTPTokenizer:
    """Counts with the server's own tokenizer endpoint, 32 questions in flight."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        body: Callable[[str, str], dict[str, Any]],
        parse: Callable[[Any], int],
        model: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.session, self.url, self.body, self.parse = session, url, body, parse
        self.model, self.headers = model, headers or {}
        self.gate = asyncio.Semaphore(32)

    async def __call__(self, text: str) -> int:
        async with (
            self.gate,
            self.session.post(
                self.url, json=self.body(self.model, text), headers=self.headers
            ) as resp,
        ):
            if resp.status != 200:
                detail = (await resp.text())[:200]
                raise CalibrationError(f"{self.url} answered {resp.status}: {detail}")
            return self.parse(await resp.json(content_type=None))


class FileTokenizer:
    """Counts with a local tokenizer.json (HF `tokenizers`), without special tokens."""

    def __init__(self, path: str) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(path)

    async def __call__(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)


class CalibrationError(Exception):
    pass


Probe = Callable[[PlannedRequest, str], Awaitable[int | None]]


def probe_request(endpoint: str, template: PlannedRequest, k: int) -> PlannedRequest:
    """A request shaped like the plan's (tenant, class, endpoint) with a k-word prompt."""
    from dataclasses import replace

    return replace(template, request_id=-1, endpoint=endpoint, prompt_tokens=k, max_tokens=1)


async def calibrate(count: Count, probe: Probe, plan: Plan, source: str) -> Calibration | None:
    """Calibrate prompts for `plan`; None when too few words are single tokens."""
    started = time.perf_counter()
    words = await single_token_words(count)
    if len(words) < MIN_WORDS:
        return None
    cal = Calibration(words, {}, source)
    endpoints = plan.columns["endpoint"]
    for code in sorted(int(e) for e in np.unique(endpoints)):
        endpoint = ENDPOINTS[code]
        if endpoint == "embeddings":
            continue
        rows = np.flatnonzero(endpoints == code)
        template = plan.request(int(rows[0]))
        k = 32
        counted = await probe(probe_request(endpoint, template, k), " ".join(words[:k]))
        if counted is None:
            raise CalibrationError(f"the server reported no prompt token count for {endpoint}")
        cal.overhead[endpoint] = counted - k
        render = cal.renderer()
        lengths = plan.columns["prompt_tokens"][rows]
        order = rows[np.argsort(lengths, kind="stable")]
        for i in sorted({int(order[0]), int(order[len(order) // 2]), int(order[-1])}):
            req = plan.request(i)
            server = await probe(probe_request(endpoint, req, req.prompt_tokens), render(req))
            cal.checks.append(
                {
                    "endpoint": endpoint,
                    "request_id": req.request_id,
                    "planned": req.prompt_tokens,
                    "server": server,
                }
            )
    cal.seconds = time.perf_counter() - started
    return cal
