"""The profile experiment's values: observations, the engine's description, the design,
streams, results.

Plain data shared by every step of `fairbench profile`; imports only the reference
scheduler's Profile.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

COEFFICIENTS = ("a", "b", "c", "floor", "d", "e", "f", "overhead")
REQUEST_TIMEOUT_S = 120.0
# The arrival phase: a request sent every ARRIVAL_SPACING decode steps of a full batch, and the
# ARRIVAL_WINDOW gaps from the one it was sent in are where its front end lands (the gap it
# arrived in, where the server parses it beside the step; the next, which an engine that charges
# an arrival to its next step lengthens; and one more, as the server may read it a step late).
ARRIVAL_SPACING = 6
ARRIVAL_WINDOW = 3


class ProbeError(Exception):
    """The engine refused or failed the probe; the message is one line."""


@dataclass(frozen=True)
class Observation:
    """One measured step (or TTFT): its kind, the step's terms, and the milliseconds."""

    # prefill | decode | mixed | arrival (n prompt tokens arriving while `batch` decode with
    # no slot free; ms: what it added to their steps, which may be below 0) | load (n prompt
    # tokens, `batch` requests of `context` output tokens each, sent `gap_ms` apart; ms: their
    # makespan) | idle (n prompt tokens after `gap_ms` of quiet; ms: its time to first token
    # less that of the same length at once, which may be below 0)
    kind: str
    n: int  # prefill tokens in the step
    batch: int  # decode sequences in the step
    context: int  # their context tokens
    ms: float
    key: str = ""  # the design point: the fit takes the median over rounds of each
    gap_ms: float = 0.0  # load: the requests were sent this far apart (ms)
    prompts: tuple[int, ...] = ()  # load: each request's prompt tokens, in send order


ENGINES = ("vllm", "sglang", "tgi", "openai")
# The largest decode batch probed when the engine (not a flag) gave max_num_seqs: SGLang's
# computed max_running_requests runs to thousands, and the linear decode term extrapolates.
PROBE_BATCH_FROM_ENGINE = 32


@dataclass
class EngineInfo:
    """What the engine says about itself (None: it did not say), and where each came from."""

    model: str
    kind: str = "openai"  # vllm | sglang | tgi | openai
    detected_by: str = ""  # the endpoint that told the engine apart, or "--engine"
    version: str | None = None
    max_model_len: int | None = None
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    kv_tokens: int | None = None  # SGLang/TGI say the KV pool in tokens
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    chunked_prefill: bool | None = None
    max_prompt_tokens: int | None = None
    max_concurrent: int | None = None
    source: dict[str, str] = field(default_factory=dict)

    @property
    def kv_cache_tokens(self) -> int | None:
        if self.block_size and self.num_gpu_blocks:
            return self.block_size * self.num_gpu_blocks
        return self.kv_tokens


@dataclass
class ProbeDesign:
    """The experiment. Every list is capped by the engine's limits before it runs."""

    max_model_len: int = 2048
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 2048
    kv_cache_tokens: int | None = None
    prefill_points: int = 8
    prefill_reps: int = 2
    decode_tokens: int = 24
    mixed_batch: int = 4
    mixed_prompts: tuple[int, ...] = (256, 512, 1024)
    load_requests: int | None = None  # the load phase's burst (None: `burst()`; 0: no phase)
    load_prompt: int = 256  # prompt tokens of each of its requests (a workload's typical one)
    load_prompt_to: int | None = None  # prompts spread evenly from load_prompt to this
    load_output: int = 16  # output tokens of each
    idle_reps: int = 4  # the idle phase's pairs per round (0: no phase)
    idle_gap_ms: float = 250.0  # the quiet before each pair's first request
    idle_prompt: int = 64  # the prompt tokens of both
    budget_s: float = 240.0
    max_rounds: int = 8
    seed: int = 0
    max_prompt_tokens: int | None = None  # the engine's own cap on a prompt (SGLang, TGI)
    probe_batch: int | None = None  # the largest decode batch probed (default max_num_seqs)
    chunked_prefill: bool = True

    def longest_prompt(self) -> int:
        """95% of what one step and the context hold: prompts are sized in words, and the
        engine's tokenizer may count a few more tokens than the words suggested."""
        caps = [self.max_model_len - 8, self.max_num_batched_tokens - 8]
        if self.max_prompt_tokens:
            caps.append(self.max_prompt_tokens - 8)
        return max(16, int(0.95 * min(caps)))

    def prefill_lengths(self) -> list[int]:
        top = self.longest_prompt()
        points = np.geomspace(16, top, self.prefill_points)
        return sorted({round(p) for p in points})

    def batches(self) -> list[int]:
        top = max(1, min(self.probe_batch or self.max_num_seqs, self.max_num_seqs))
        out, b = [], 1
        while b < top:
            out.append(b)
            b *= 2
        return [*out, top]

    def decode_prompts(self) -> list[int]:
        return sorted({32, max(32, min(self.longest_prompt() // 2, 1024))})

    def burst(self) -> int:
        """The load phase's request count: `load_requests`, or twice the batch (at least 16,
        so the makespan is many requests long), at most 64."""
        if self.load_requests is not None:
            return self.load_requests
        return min(64, max(16, 2 * self.max_num_seqs))

    def load_shape(self) -> tuple[int, int, int]:
        """The load phase's (shortest prompt, longest prompt, output) tokens: each prompt capped
        so that it is one step and, with its output, fits the context (`--load-prompt` is a
        wish, not a limit test)."""
        room = self.max_model_len - self.load_output - 16

        def cap(n: int) -> int:
            return max(16, min(n, self.longest_prompt(), room))

        low = cap(self.load_prompt)
        high = cap(self.load_prompt_to) if self.load_prompt_to is not None else low
        return min(low, high), max(low, high), self.load_output

    def load_prompts(self, rng: np.random.Generator) -> list[int]:
        """The burst's prompt lengths in send order: evenly spread over `load_shape`'s range
        (one length if it is one), shuffled so that long and short ones alternate at random
        as a workload's do."""
        low, high, _ = self.load_shape()
        lengths = np.linspace(low, high, max(1, self.burst())).round().astype(int)
        return [int(n) for n in rng.permutation(lengths)]

    def arrival_tokens(self, arrivals: int) -> int:
        """The arrival phase's decode length: `decode_tokens`, or enough for `arrivals`
        requests ARRIVAL_SPACING steps apart after the first 3 tokens, and the last one's
        window of ARRIVAL_WINDOW gaps with as many after it."""
        return max(self.decode_tokens, 3 + ARRIVAL_SPACING * arrivals + 2 * ARRIVAL_WINDOW)

    def fits_kv(self, batch: int, prompt: int, output: int) -> bool:
        kv = self.kv_cache_tokens
        return kv is None or batch * (prompt + output + 16) <= 0.9 * kv


@dataclass
class Stream:
    """One streamed request as the client saw it."""

    sent_ns: int
    token_ns: list[int] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


@dataclass
class ProbeResult:
    engine: EngineInfo
    design: ProbeDesign
    observations: list[Observation]
    seconds: float
    rounds: int
    truncated: bool  # the budget stopped the rounds before max_rounds


Progress = Callable[[str, int, int], None]  # (phase, done, total)
