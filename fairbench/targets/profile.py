"""`fairbench profile`: fit the simulator's cost profile from a live engine.

A simulated sweep predicts a deployment only if its profile is that engine's. This module runs
a designed, bounded experiment against any OpenAI-compatible server (`/v1/completions`,
streamed) and fits the cost model's existing coefficient form
(reference_scheduler.core.costmodel):

    prefill_ms(n)       = max(floor, a + b·n + c·n²)
    decode_step_ms(B,C) = max(d + e·B, a + b·B) + f·C
    mixed step          = max(d + e·B, max(floor, a + b·(n + B) + c·n²)) + f·C

The experiment, one phase at a time (nothing else should load the engine meanwhile):

1. **Prefill sweep.** One request at a time, `max_tokens=1`, prompt lengths spaced
   geometrically up to the model's context (and the per-step token budget, so a prompt is one
   step). Observed: the time to the first token, which is `overhead + prefill_ms(n)`;
   `overhead` (HTTP, tokenisation, the API server) is fitted as its own term — it is not a step
   cost — and written as the profile's `request_overhead_ms`, by which the `sim` target delays
   each request's arrival at the simulated engine (so a simulated TTFT contains it as a
   measured one does).
2. **Decode sweep.** B concurrent streams (B = 1, 2, 4, … up to `max_num_seqs`) at a short and
   a long prompt, `ignore_eos` so each produces its tokens. Once all B decode, each step emits
   one token per stream: the median gap between a stream's tokens there is
   `decode_step_ms(B, C)`, C the batch's context at the middle of that stretch. Gaps are
   measured between tokens on the client, so no request overhead is in them.
3. **Mixed steps.** While B streams decode, one long prompt arrives (`max_tokens=1`). The
   decode streams' gap that ends with its first token is the mixed step: its prefill chunk and
   the B decode tokens in one pass. This is what separates `a` from the request overhead.

4. **Load.** A burst of `load_requests` streamed requests shaped like a workload's
   (`load_prompt` prompt tokens, or spread evenly from `load_prompt` to `load_prompt_to` in a
   shuffled order, and `load_output` output tokens each: give your workload's typical request
   and the range of its prompts), sent one after another 0.6 of a request's cost apart
   (`load_gap_ms`), so a queue builds and the engine runs full batches while requests keep
   arriving between its steps, as a live run's do. Observed: the burst's makespan, from the
   first send to the last token. Each request's HTTP parsing, tokenisation and streaming take
   core time; where the API server shares the engine's cores (a CPU engine) that time is taken
   from the steps, and it grows with the prompt and the streamed tokens, which is why this
   phase uses the workload's shape: small one-token requests beside a decoding batch (this
   phase's first form) measured 0.0–0.9 ms on the CPU vLLM, while under a live workload its
   API server took 0.22 of the core against 0.14 during the probe (docs/simulator.md); why
   arrivals are spread over the steps, not sent at once (a burst sent at once ran faster than
   the fitted steps predict); and why the prompts span the workload's range (the same engine,
   four bursts of each: 0.6–0.8 ms per request with every prompt at 512 tokens, 2.0–2.4 ms
   with prompts of 300–800, whose mixed steps cost more than the fit says at the short end).
   After the fit, the same burst (each request's prompt as the engine counted it) is
   simulated with vLLM's scheduling on the fitted steps, and the front-end charge per request
   that makes the simulated makespan the measured one is one estimate; their median (at
   least 0) is the profile's `front_end_core_ms`, which the simulated engines charge to the
   steps of a busy engine per arriving request (costmodel says how). Where the API server has
   cores of its own (a GPU engine's host) it comes out near 0.
5. **Idle.** `idle_reps` times: quiet for `idle_gap_ms` (250 ms), a short prompt
   (`max_tokens=1`), then the same length again at once. Observed: the first one's time to
   its first token less the second's. Every other phase sends back to back, but a live run's
   lone request (a chat between two bursts) finds the engine idle, and an engine that idled
   may take longer to start: the CPU vLLM on one core took about 3 ms more after 100 ms of
   quiet than after 30 ms or less (why is not established: reference_scheduler's costmodel).
   The median difference (at least 0) is the profile's `idle_wake_ms`, which the simulated
   engines charge to the step that starts a request finding them idle for `idle_after_ms`
   (costmodel says how).

The five phases are one round; rounds repeat while the budget lasts (a round starts only if
one as long as the longest so far still fits; `max_rounds` at most), and the fit takes the
median of each design point over the rounds, so one slow round (a neighbour's burst, a late
wake) does not move it. Prompts are distinct random words (an engine's prefix cache must not
make a prefill free); their token counts are what the server reports in `usage`, not what was
asked. The fit is
`scipy.optimize.least_squares` on relative residuals with a soft-L1 loss (an outlier that
survives the median is not a trend), coefficients ≥ 0, started from the linear fits of
each phase; each coefficient's standard error comes from the Jacobian at the solution.

**Which engine, and what it says about itself.** `--engine auto` (the default) asks the server:
SGLang answers `GET /get_server_info`, TGI `GET /info`, vLLM `GET /version` (tried in that
order, all at once; a server that answers none is `openai`, and nothing but `/v1/models` and
`/metrics` is read from it). What each self-description gives, field names checked in the
engines' source:

- vLLM: `/metrics` `vllm:cache_config_info` (block size × GPU blocks → `kv_cache_tokens`),
  `/v1/models` (`max_model_len`), `/version`.
- SGLang (sgl-project/sglang `python/sglang/srt/entrypoints/http_server.py`,
  `get_server_info`: the `ServerArgs` dataclass of `srt/server_args.py`, the scheduler's
  `get_init_info` of `srt/managers/scheduler.py`, and `version`): `max_total_num_tokens` (the
  KV pool, in tokens) → `kv_cache_tokens`; `max_running_requests` → `max_num_seqs`;
  `chunked_prefill_size` (−1 or null: chunking off) → `max_num_batched_tokens`, else
  `max_prefill_tokens`; `context_length`, else `/v1/models` `max_model_len` (SGLang's
  `available_models` reports the model's context there) → `max_model_len`;
  `max_req_input_len` → the longest prompt; `version`. A server started with
  `--stream-interval` above 1 streams several tokens per chunk, so its gaps are not steps: the
  probe refuses it.
- TGI (huggingface/text-generation-inference `router/src/lib.rs` `struct Info`, served by
  `router/src/server.rs` `get_model_info`): `max_total_tokens` (prompt + output per request) →
  `max_model_len`; `max_input_tokens` (`max_input_length` before v2.1) → the longest prompt;
  `max_batch_total_tokens` (in `/info` up to v2.2; removed with the v3 router) →
  `kv_cache_tokens`; `max_batch_size` (same versions) → `max_num_seqs`;
  `max_concurrent_requests` (the router's limit on requests in flight) caps the decode batches
  probed; `model_id`; `version`.

The probe's requests go to the engine's OpenAI-compatible `/v1/completions`, streamed: SGLang's
(`srt/entrypoints/openai/serving_completions.py`) takes `ignore_eos`, `min_tokens` and
`stream_options.include_usage` as vLLM's does. TGI's (`router/src/server.rs` `completions`,
`CompletionRequest` of `lib.rs`) reads `model`, `prompt`, `max_tokens`, `temperature`, `stream`
and nothing else (serde ignores the rest; `model` other than `tgi` is taken as a LoRA adapter
id, so the probe sends `tgi`): there is no `ignore_eos`, so a stream may end early at EOS (a
decode stream with fewer than 3 tokens is left out of its step). Its stream is one event per
token, `finish_reason` "" until the last, and the last event carries `usage` (prompt and
completion tokens from the generation's details) whatever `stream_options` says; a token is
counted per event, as its chunks say.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import numpy as np

from reference_scheduler.core.costmodel import Profile
from reference_scheduler.core.tokenizer import VOCAB

COEFFICIENTS = ("a", "b", "c", "d", "e", "f", "overhead")
REQUEST_TIMEOUT_S = 120.0


class ProbeError(Exception):
    """The engine refused or failed the probe; the message is one line."""


@dataclass(frozen=True)
class Observation:
    """One measured step (or TTFT): its kind, the step's terms, and the milliseconds."""

    # prefill | decode | mixed | load (n prompt tokens, `batch` requests of `context` output
    # tokens each, sent `gap_ms` apart; ms: their makespan) | idle (n prompt tokens after
    # `gap_ms` of quiet; ms: its time to first token less that of the same length at once,
    # which may be below 0)
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
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
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
        if not out.token_ns:
            raise ProbeError(f"{url}: the engine streamed no token for a probe request")
        return out

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


_CACHE_INFO = re.compile(r"^vllm:cache_config_info\{([^}]*)\}", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def cache_config(metrics_text: str) -> dict[str, str]:
    """The labels of vLLM's `cache_config_info` gauge (empty for another engine)."""
    found = _CACHE_INFO.search(metrics_text or "")
    return dict(_LABEL.findall(found.group(1))) if found else {}


def _int(value: Any) -> int | None:
    """A positive integer the engine said, or None (null, -1, a string, a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value) if value > 0 and float(value).is_integer() else None


def detect(server_info: Any, info: Any, version: Any) -> tuple[str, str]:
    """(engine, the endpoint that said so) from the three self-descriptions' answers."""
    if isinstance(server_info, dict) and (
        "max_total_num_tokens" in server_info or "model_path" in server_info
    ):
        return "sglang", "/get_server_info"
    if isinstance(info, dict) and "model_id" in info and "max_total_tokens" in info:
        return "tgi", "/info"
    if isinstance(version, dict) and version.get("version") is not None:
        return "vllm", "/version"
    return "openai", "no /get_server_info, /info or /version"


def read_sglang(info: EngineInfo, doc: dict[str, Any]) -> None:
    """SGLang's `/get_server_info`: its ServerArgs, the scheduler's init info, `version`."""
    where = "/get_server_info"
    interval = _int(doc.get("stream_interval"))
    if interval is not None and interval > 1:
        raise ProbeError(
            f"{where}: stream_interval is {interval}: SGLang streams {interval} tokens per "
            "chunk, so the gaps between chunks are not steps; profile a server started with "
            "--stream-interval 1"
        )
    fields = {
        "kv_tokens": "max_total_num_tokens",
        "max_num_seqs": "max_running_requests",
        "max_model_len": "context_length",
        "max_prompt_tokens": "max_req_input_len",
    }
    for attr, key in fields.items():
        value = _int(doc.get(key))
        if value is not None:
            setattr(info, attr, value)
            info.source[attr] = f"{where} {key}"
    chunk = doc.get("chunked_prefill_size")
    if _int(chunk) is not None:
        info.max_num_batched_tokens, info.chunked_prefill = _int(chunk), True
        info.source["max_num_batched_tokens"] = f"{where} chunked_prefill_size"
    elif chunk is None or (isinstance(chunk, int) and chunk <= 0):
        if "chunked_prefill_size" in doc:
            info.chunked_prefill = False
            info.source["chunked_prefill"] = f"{where} chunked_prefill_size {chunk}"
        if _int(doc.get("max_prefill_tokens")) is not None:
            info.max_num_batched_tokens = _int(doc.get("max_prefill_tokens"))
            info.source["max_num_batched_tokens"] = f"{where} max_prefill_tokens"
    if doc.get("version") is not None:
        info.version, info.source["version"] = str(doc["version"]), f"{where} version"


def read_tgi(info: EngineInfo, doc: dict[str, Any]) -> None:
    """TGI's `/info` (router/src/lib.rs `struct Info`), old and new field names."""
    where = "/info"
    fields = {
        "max_model_len": ("max_total_tokens",),
        "max_prompt_tokens": ("max_input_tokens", "max_input_length"),
        "kv_tokens": ("max_batch_total_tokens",),
        "max_num_seqs": ("max_batch_size",),
        "max_concurrent": ("max_concurrent_requests",),
    }
    for attr, keys in fields.items():
        for key in keys:
            value = _int(doc.get(key))
            if value is not None:
                setattr(info, attr, value)
                info.source[attr] = f"{where} {key}"
                break
    if doc.get("version") is not None:
        info.version, info.source["version"] = str(doc["version"]), f"{where} version"


async def engine_info(
    base: str, model: str | None, headers: dict[str, str], engine: str = "auto"
) -> EngineInfo:
    """The engine's self-description: `engine` (vllm | sglang | tgi | openai) or, with
    `auto`, whichever of SGLang's /get_server_info, TGI's /info and vLLM's /version answers."""
    base = base.rstrip("/")
    paths = {"models": "/v1/models", "metrics": "/metrics"}
    if engine in ("auto", "sglang"):
        paths["sglang"] = "/get_server_info"
    if engine in ("auto", "tgi"):
        paths["tgi"] = "/info"
    if engine in ("auto", "vllm"):
        paths["vllm"] = "/version"
    async with aiohttp.ClientSession() as session:
        got = await asyncio.gather(*(_get(session, base + p, headers) for p in paths.values()))
    answers = dict(zip(paths, got, strict=True))
    if engine == "auto":
        kind, by = detect(answers.get("sglang"), answers.get("tgi"), answers.get("vllm"))
    else:
        kind, by = engine, "--engine"
    models = answers["models"]
    listed = models.get("data") if isinstance(models, dict) else None
    entry = next(
        (
            m
            for m in listed or []
            if isinstance(m, dict) and (model is None or m.get("id") == model)
        ),
        None,
    )
    described = answers.get(kind)
    if model is None:
        if entry is not None:
            model = str(entry["id"])
        elif kind == "tgi" and isinstance(described, dict) and described.get("model_id"):
            model = str(described["model_id"])
        else:
            raise ProbeError(f"{base}/v1/models lists no model; name one with --model")
    info = EngineInfo(model, kind=kind, detected_by=by)
    if entry is not None and _int(entry.get("max_model_len")) is not None:
        info.max_model_len = _int(entry["max_model_len"])
        info.source["max_model_len"] = "/v1/models"
    if kind == "sglang" and isinstance(described, dict):
        read_sglang(info, described)
    elif kind == "tgi" and isinstance(described, dict):
        read_tgi(info, described)
    elif isinstance(described, dict) and described.get("version") is not None:
        info.version, info.source["version"] = str(described["version"]), "/version"
    metrics = answers["metrics"]
    labels = cache_config(metrics if isinstance(metrics, str) else "")
    for key in ("block_size", "num_gpu_blocks"):
        value = labels.get(key)
        if value and value.isdigit():
            setattr(info, key, int(value))
            info.source[key] = "/metrics cache_config_info"
    return info


def apply_engine(design: ProbeDesign, info: EngineInfo, given: Collection[str] = ()) -> None:
    """The engine's limits into the design, where no flag (`given`, by field name) set them:
    the context length and the prompt cap always (a flag cannot make the engine take more);
    max_num_seqs, the step budget and the KV cache unless a flag said. The decode batches
    probed stop at PROBE_BATCH_FROM_ENGINE when only the engine gave max_num_seqs, and below
    TGI's max_concurrent_requests (the mixed step adds one request)."""
    if info.max_model_len:
        design.max_model_len = info.max_model_len
    if info.max_prompt_tokens:
        design.max_prompt_tokens = info.max_prompt_tokens
    if info.kv_cache_tokens and "kv_cache_tokens" not in given:
        design.kv_cache_tokens = info.kv_cache_tokens
    if info.max_num_batched_tokens and "max_num_batched_tokens" not in given:
        design.max_num_batched_tokens = info.max_num_batched_tokens
    if info.chunked_prefill is not None:
        design.chunked_prefill = info.chunked_prefill
    if info.max_num_seqs and "max_num_seqs" not in given:
        design.max_num_seqs = info.max_num_seqs
        design.probe_batch = min(info.max_num_seqs, PROBE_BATCH_FROM_ENGINE)
    elif info.max_concurrent and "max_num_seqs" not in given:
        # TGI without max_batch_size (null on 2.2, gone from the v3 router) batches by tokens
        # up to the router's limit on requests in flight: that, not the flag's default of 8, is
        # the concurrency the simulated engine may reach
        design.max_num_seqs = info.max_concurrent
        design.probe_batch = min(info.max_concurrent, PROBE_BATCH_FROM_ENGINE)
        info.source["max_num_seqs"] = "/info max_concurrent_requests (no max_batch_size)"
    if info.max_concurrent:
        design.probe_batch = max(1, min(design.probe_batch or design.max_num_seqs,
                                        info.max_concurrent - 1))  # fmt: skip


# ---------------------------------------------------------------- the experiment


def steady_gap(streams: Sequence[Stream]) -> tuple[float, float] | None:
    """(median gap in ms, mean tokens generated) over the stretch where every stream decodes:
    after the last first token, up to the first last token."""
    if any(len(s.token_ns) < 3 for s in streams):
        return None
    start = max(s.token_ns[0] for s in streams)
    end = min(s.token_ns[-1] for s in streams)
    gaps, made = [], []
    for s in streams:
        t = np.array(s.token_ns, dtype=np.int64)
        inside = np.flatnonzero((t > start) & (t <= end))
        inside = inside[inside >= 1]
        if len(inside):
            gaps.extend((t[inside] - t[inside - 1]).tolist())
            made.append(float(np.median(inside)))
    if len(gaps) < 2:
        return None
    return float(np.median(gaps)) / 1e6, float(np.mean(made))


def gap_at(streams: Sequence[Stream], at_ns: int) -> float | None:
    """The step that delivered the event at `at_ns`, in ms: per decode stream, the token
    delivered with it (the nearest arrival) is token k, and the step is t_k − t_(k−2) less the
    stream's median decode gap before it; the median over streams. Two gaps, not one: a token
    stamped late (the client or server busy with the arriving request) would shorten one gap
    and lengthen the next, and over the two the lateness cancels."""
    steps = []
    for s in streams:
        t = np.array(s.token_ns, dtype=np.int64)
        if len(t) < 5:
            continue
        k = int(np.argmin(np.abs(t - at_ns)))
        if k < 4:
            continue
        before = float(np.median(np.diff(t[: k - 1])))
        steps.append(float(t[k] - t[k - 2]) - before)
    return float(np.median(steps)) / 1e6 if steps else None


def load_gap_ms(obs: Sequence[Observation], prompt: int, output: int, batch: int) -> float:
    """How far apart the load phase sends its requests: 0.6 of what one request costs the
    engine by this round's observations (the prefill of the nearest length, then its decode
    steps shared by a full batch). The engine is asked for about 1.7 of its capacity, so a
    queue builds from the start and the makespan is the burst's work, not its last send."""
    prefills = [o for o in obs if o.kind == "prefill"]
    decodes = [o for o in obs if o.kind == "decode"]
    if not prefills or not decodes:
        return 0.0
    ttft = min(prefills, key=lambda o: abs(o.n - prompt)).ms
    full = max(o.batch for o in decodes)
    step = float(np.median([o.ms for o in decodes if o.batch == full]))
    return 0.6 * (ttft + (output - 1) * step / max(1, min(batch, full)))


def context_at(streams: Sequence[Stream], at_ns: int) -> int:
    """The decode batch's context tokens at `at_ns`: each 32-token stream's prompt (as the
    server counted it) plus the tokens it had made by then, summed."""
    made = np.mean([sum(1 for t in s.token_ns if t <= at_ns) for s in streams])
    prompt = int(np.mean([s.prompt_tokens or 32 for s in streams]))
    return round(len(streams) * (prompt + made))


async def one_round(
    client: Client, design: ProbeDesign, key: int, say: Progress
) -> list[Observation]:
    """The four phases once: every prefill length (`prefill_reps` times), every decode
    configuration, every mixed step, the load."""
    obs: list[Observation] = []
    lengths = design.prefill_lengths()
    configs = [
        (b, p)
        for p in design.decode_prompts()
        for b in design.batches()
        if design.fits_kv(b, p, design.decode_tokens)
    ]
    batch = max(1, min(design.mixed_batch, max(design.batches()) - 1))
    tokens = 3 * design.decode_tokens
    mixed = [
        min(n, design.longest_prompt())
        for n in design.mixed_prompts
        if n + batch <= design.max_num_batched_tokens
        and design.fits_kv(batch + 1, max(n, 32), tokens)
    ]
    _, load_prompt, load_output = design.load_shape()  # the longest prompt, for the checks
    burst = design.burst()
    running = min(burst, design.max_num_seqs)  # at most this many hold KV at once
    load = burst > 0 and design.fits_kv(running, load_prompt, load_output)
    idle_prompt = min(design.idle_prompt, design.longest_prompt())
    total = (
        len(lengths) * design.prefill_reps + len(configs) + len(mixed) + int(load)
        + design.idle_reps
    )  # fmt: skip
    done = 0

    def step(phase: str) -> None:
        nonlocal done
        done += 1
        say(f"round {key + 1}: {phase}", done, total)

    for _ in range(design.prefill_reps):
        for n in lengths:
            s = await client.stream(n, 1)
            prompt = int(s.prompt_tokens or n)
            ttft = (s.token_ns[0] - s.sent_ns) / 1e6
            obs.append(Observation("prefill", prompt, 0, 0, ttft, f"prefill {n}"))
            step("prefill")
    for batch_, prompt in configs:
        streams = await asyncio.gather(
            *(client.stream(prompt, design.decode_tokens) for _ in range(batch_))
        )
        found = steady_gap(streams)
        if found is not None:
            gap, made = found
            real_prompt = int(np.mean([s.prompt_tokens or prompt for s in streams]))
            context = round(batch_ * (real_prompt + made))
            obs.append(Observation("decode", 0, batch_, context, gap, f"decode {batch_}x{prompt}"))
        step("decode")
    for n in mixed:
        live = [Stream(0) for _ in range(batch)]
        decoders = [asyncio.create_task(client.stream(32, tokens, s)) for s in live]
        # the long prompt arrives once they all decode, a third of the way through their output
        await _until(live, tokens // 3, decoders)
        long = await client.stream(n, 1)
        streams = await asyncio.gather(*decoders)
        gap = gap_at(streams, long.token_ns[0])
        if gap is not None:
            at = long.token_ns[0]
            context = context_at(streams, at)
            n_real = int(long.prompt_tokens or n)
            obs.append(Observation("mixed", n_real, batch, context, gap, f"mixed {n}+{batch}"))
        step("mixed")
    # the load's requests are sent one after another, a little faster than this round's steps
    # say the engine serves them: a queue builds, so every request after the first arrives at
    # a busy engine, spread over its steps as a live run's arrivals are
    prompts = design.load_prompts(client.rng) if load else []
    typical = int(np.median(prompts)) if prompts else 0
    spacing = load_gap_ms(obs, typical, load_output, design.max_num_seqs) if load else 0.0
    if load and spacing <= 0:  # no step observed this round: a burst sent at once measures
        step("load")  # another thing
    elif load:
        t0 = time.perf_counter_ns()

        async def send(i: int) -> Stream:
            await asyncio.sleep(max(0.0, t0 + i * spacing * 1e6 - time.perf_counter_ns()) / 1e9)
            return await client.stream(prompts[i], load_output)

        streams = await asyncio.gather(*(send(i) for i in range(burst)))
        sent = np.array([s.sent_ns for s in streams], dtype=np.int64)
        gap_ms = float(np.diff(sent).mean()) / 1e6 if burst > 1 else 0.0
        makespan = (max(s.token_ns[-1] for s in streams) - int(sent[0])) / 1e6
        # the prompts as the engine counted them (its tokenizer, not the words asked for)
        real = tuple(int(s.prompt_tokens or n) for s, n in zip(streams, prompts, strict=True))
        # what the engine made, not what was asked (TGI takes no ignore_eos: an EOS ends early)
        made = round(float(np.median([s.completion_tokens or len(s.token_ns) for s in streams])))
        low, high, _ = design.load_shape()
        shape = f"{low}" if low == high else f"{low}-{high}"
        point = f"load {burst}x{shape}+{load_output}"
        n_real = round(float(np.median(real)))
        obs.append(Observation("load", n_real, burst, max(1, made), makespan, point, gap_ms, real))
        step("load")
    for _ in range(design.idle_reps):
        # the quiet, then the request that finds the engine idle, then its twin at once
        await asyncio.sleep(design.idle_gap_ms / 1000)
        woken = await client.stream(idle_prompt, 1)
        warm = await client.stream(idle_prompt, 1)
        extra = (woken.token_ns[0] - woken.sent_ns - (warm.token_ns[0] - warm.sent_ns)) / 1e6
        n_real = int(woken.prompt_tokens or idle_prompt)
        obs.append(
            Observation("idle", n_real, 0, 0, extra, f"idle {idle_prompt}", design.idle_gap_ms)
        )
        step("idle")
    return obs


async def probe(
    client: Client, design: ProbeDesign, progress: Progress | None = None
) -> tuple[list[Observation], int, bool]:
    """Rounds of the experiment while the budget lasts: a round is started only if another
    as long as the longest so far still fits (at least one round runs), up to `max_rounds`.
    Returns the observations, the rounds run, and whether the budget stopped them."""
    t0 = time.monotonic()
    say = progress or (lambda phase, done, total: None)
    await client.calibrate()
    obs: list[Observation] = []
    longest = 0.0
    rounds = 0
    while rounds < design.max_rounds:
        elapsed = time.monotonic() - t0
        if rounds and elapsed + longest > design.budget_s:
            return obs, rounds, True
        started = time.monotonic()
        obs += await one_round(client, design, rounds, say)
        longest = max(longest, time.monotonic() - started)
        rounds += 1
    return obs, rounds, False


async def _until(live: list[Stream], tokens: int, tasks: list[asyncio.Task[Stream]]) -> None:
    """Poll every 2 ms until each of `live` has `tokens` tokens (or a task ended: it raised,
    or the engine was fast)."""
    while not all(len(s.token_ns) >= tokens for s in live) and not any(t.done() for t in tasks):
        await asyncio.sleep(0.002)


# ---------------------------------------------------------------- the fit


def predict(obs: Sequence[Observation], x: np.ndarray, form: str = "max") -> np.ndarray:
    """Milliseconds the coefficient vector `x` (COEFFICIENTS order) predicts per observation,
    with the mixed step's `form` (costmodel's `mixed_step`: max or sum)."""
    a, b, c, d, e, f, overhead = (float(v) for v in x)
    prof = Profile("fit", a=a, b=b, c=c, d=d, e=e, f=f, kv_cache_tokens=1, mixed_step=form)
    out = np.empty(len(obs))
    for i, o in enumerate(obs):
        ms = prof.step_ms(o.n, o.batch, o.context)
        out[i] = ms + (overhead if o.kind == "prefill" else 0.0)
    return out


def _start(obs: Sequence[Observation]) -> np.ndarray:
    """Linear fits of each phase: prefill ms on n (a + overhead, b), decode ms on B and C."""
    pre = [o for o in obs if o.kind == "prefill"]
    dec = [o for o in obs if o.kind == "decode"]
    b, a0 = 0.01, 1.0
    if len(pre) >= 2:
        slope, icpt = np.polyfit([o.n for o in pre], [o.ms for o in pre], 1)
        b, a0 = max(float(slope), 1e-6), max(float(icpt), 0.0)
    d, e, f = 1.0, 0.01, 1e-5
    if len(dec) >= 3:
        A = np.array([[1.0, o.batch, o.context] for o in dec])
        sol, *_ = np.linalg.lstsq(A, np.array([o.ms for o in dec]), rcond=None)
        d, e, f = (max(float(v), 1e-6) for v in sol)
    return np.array([a0 / 2, b, 1e-9, d, e, f, a0 / 2])


@dataclass
class Fit:
    coefficients: dict[str, float]
    stderr: dict[str, float]
    residuals: list[dict[str, Any]]  # per design point: its median, the fit, the residual
    rms_relative: float
    form: str  # the mixed step's form the residuals chose (max | sum)
    rms_by_form: dict[str, float]
    n: int  # design points
    raw: list[dict[str, Any]]  # every observation of every round
    # the front end's core time per request, from the load phase (None: not probed)
    front_end: dict[str, Any] | None = None
    # what an idle engine takes to start, from the idle phase (None: not probed)
    idle: dict[str, Any] | None = None

    def summary(self) -> dict[str, Any]:
        """What the profile's `fit:` block says of this fit (a probe's or a merge's)."""
        return {
            "overhead_ms": self.coefficients["overhead"],
            **({"front_end": self.front_end} if self.front_end is not None else {}),
            **({"idle": self.idle} if self.idle is not None else {}),
            "stderr": self.stderr,
            "rms_relative_residual": round(self.rms_relative, 4),
            "mixed_step": f"{self.form}: the smaller RMS relative residual of the two forms "
            f"({self.rms_by_form})",
            "design_points": self.n,
            "observations": len(self.raw),
        }

    def profile_fields(self) -> dict[str, float]:
        """The profile's fields: the step coefficients, and the request overhead as
        `request_overhead_ms` (the sim target adds it to each request's way in)."""
        fields = {k: v for k, v in self.coefficients.items() if k != "overhead"}
        fields["request_overhead_ms"] = self.coefficients["overhead"]
        if self.front_end is not None:
            fields["front_end_core_ms"] = self.front_end["core_ms"]
        if self.idle is not None:
            fields["idle_wake_ms"] = self.idle["wake_ms"]
        return fields


def row(o: Observation) -> dict[str, Any]:
    """An observation as the profile's `fit.data` keeps it (`gap_ms` on load and idle rows
    only, `prompts` on load rows only)."""
    out = {**asdict(o), "ms": round(o.ms, 3)}
    if o.kind in ("load", "idle"):
        out["gap_ms"] = round(o.gap_ms, 3)
    else:
        del out["gap_ms"]
    if o.kind == "load" and o.prompts:
        out["prompts"] = list(o.prompts)
    else:
        del out["prompts"]
    return out


def medians(obs: Sequence[Observation]) -> list[Observation]:
    """One observation per design point: the median over its repetitions (a late wake or a
    neighbour's burst in one round does not move it)."""
    groups: dict[str, list[Observation]] = {}
    for o in obs:
        groups.setdefault(o.key or f"{o.kind} {o.n} {o.batch} {o.context}", []).append(o)
    out = []
    for key, rows in groups.items():
        med = lambda f, rows=rows: float(np.median([getattr(r, f) for r in rows]))  # noqa: E731
        out.append(
            Observation(
                rows[0].kind,
                round(med("n")),
                rows[0].batch,
                round(med("context")),
                med("ms"),
                key,
            )
        )
    return out


@dataclass(frozen=True)
class Limits:
    """The engine's limits the load phase's burst is simulated under."""

    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool = True


def fit(raw: Sequence[Observation], limits: Limits | None = None) -> Fit:
    """Both forms of the mixed step fitted; the one with the smaller residuals is kept (a GPU
    hides a prefill chunk in the decode step, a CPU adds it: the data say which). Then the
    front end's core time, from the load phase's observations (`front_end_core`; `limits`
    are the engine's, for simulating its bursts), and what an idle engine takes to start, from
    the idle phase's (`idle_wake`). Observations of the front-end phase's first form (kind
    `frontend`, in profiles written before the load phase) are not used."""
    steps = [o for o in raw if o.kind not in ("frontend", "load", "idle")]
    fits = {form: fit_form(steps, form) for form in ("max", "sum")}
    best = min(fits.values(), key=lambda f: f.rms_relative)
    best.rms_by_form = {form: round(f.rms_relative, 4) for form, f in fits.items()}
    load = [o for o in raw if o.kind == "load"]
    if load and limits is not None:
        best.front_end = front_end_core(load, best, limits)
        best.raw += [row(o) for o in load]
    idle = [o for o in raw if o.kind == "idle"]
    if idle:
        best.idle = idle_wake(idle)
        best.raw += [row(o) for o in idle]
    return best


def _median_of(name: str, values: Sequence[float]) -> dict[str, Any]:
    """A charge estimated per burst or pair: `name` the median at least 0 (a charge cannot be
    negative; below-0 estimates are kept so the median is not biased up), with the median,
    the median absolute deviation and the count."""
    array = np.array(values, dtype=float)
    middle = float(np.median(array))
    return {
        name: float(f"{max(0.0, middle):.4g}"),
        "median_ms": round(middle, 4),
        "mad_ms": round(float(np.median(np.abs(array - middle))), 4),
        "observations": len(array),
    }


def idle_wake(idle: Sequence[Observation]) -> dict[str, Any]:
    """What an engine that idled takes to start: per idle observation, the time to first token
    of a request after the quiet less that of the same request at once (no model in it: the
    two cost the same prefill); the median, at least 0, with the median absolute deviation."""
    return {
        **_median_of("wake_ms", [o.ms for o in idle]),
        "after_quiet_ms": float(np.median([o.gap_ms for o in idle])),
        "method": "per pair, the time to first token of a request after the quiet less that "
        "of the same length sent at once; median over pairs, at least 0",
    }


def burst_makespan_ms(
    the_fit: Fit, limits: Limits, o: Observation, front_end_ms: float
) -> float | None:
    """The simulated makespan of a load observation's burst: `o.batch` requests of `o.prompts`
    (or, in profiles written before them, `o.n` each) prompt and `o.context` output tokens,
    sent `o.gap_ms` apart from 0, each reaching the engine after
    the fitted request overhead, through vLLM's FCFS scheduling on the fitted steps, with
    `front_end_ms` charged per request that arrives while the engine runs others; None if the
    simulated engine could not serve the burst (a prompt past its step budget, unchunked)."""
    from reference_scheduler.core.job import Job
    from reference_scheduler.drivers.virtual import simulate
    from reference_scheduler.scheduler.config import parse_scheduler_config

    c = the_fit.coefficients
    profile = {
        "name": "burst",
        **{k: c[k] for k in "abcdef"},
        "mixed_step": the_fit.form,
        "front_end_core_ms": front_end_ms,
        "kv_cache_tokens": 1 << 40,  # vLLM allocates as it goes; the burst is sized to fit
        "max_num_seqs": limits.max_num_seqs,
        "max_num_batched_tokens": limits.max_num_batched_tokens,
        "chunked_prefill": limits.chunked_prefill,
    }
    config = parse_scheduler_config({"engine": "vllm", "policy": "fcfs", "profile": profile})
    arrive, gap = c["overhead"] * 1e6, o.gap_ms * 1e6
    prompts = o.prompts or (o.n,) * o.batch
    jobs = [
        Job(i, "load", "load", n, o.context, round(arrive + i * gap)) for i, n in enumerate(prompts)
    ]
    result = simulate(jobs, config)
    if any(job.status != "finished" for job in result.jobs):
        return None
    return max(job.done_ns for job in result.jobs) / 1e6


# Bounds of one burst's estimate (ms): below 0 it is noise (a burst faster than the fitted steps
# alone), kept so that the median is not biased up but floored so one odd burst cannot outweigh
# the others; at MOST_MS the search stops.
LEAST_MS, MOST_MS = -4.0, 256.0


def _charge_for(makespan: Callable[[float], float | None], measured: float) -> float | None:
    """The charge (ms) at which `makespan(charge)` reaches `measured`, within [LEAST_MS,
    MOST_MS]; None if the simulated burst cannot be served or no charge moves it (the
    simulated engine never queued)."""
    base, at4 = makespan(0.0), makespan(4.0)
    if base is None or at4 is None or at4 <= base:
        return None
    if measured <= base:
        return max(LEAST_MS, (measured - base) / ((at4 - base) / 4.0))
    lo, hi, m = 0.0, 4.0, at4
    while m is not None and m < measured:
        lo, hi = hi, 2 * hi
        if hi > MOST_MS:
            return MOST_MS
        m = makespan(hi)
    for _ in range(14):
        mid = (lo + hi) / 2
        m = makespan(mid)
        lo, hi = (mid, hi) if m is not None and m < measured else (lo, mid)
    return (lo + hi) / 2


def front_end_core(load: Sequence[Observation], the_fit: Fit, limits: Limits) -> dict[str, Any]:
    """The core time one request's front end takes from a busy engine's steps: for each load
    observation, the charge per arriving request that makes the simulated burst's makespan the
    measured one, found by bisection (the makespan grows with the charge: every request after
    the first arrives while the engine runs). A burst faster than the fitted steps alone gives
    a negative estimate, by the slope between no charge and 4 ms (noise, kept so that the
    median is not biased up); the median over observations, at least 0, with the median
    absolute deviation beside it."""
    estimates = []
    for o in load:
        estimate = _charge_for(lambda ms, o=o: burst_makespan_ms(the_fit, limits, o, ms), o.ms)
        if estimate is not None:
            estimates.append(estimate)
    if not estimates:
        return {
            "core_ms": 0.0,
            "median_ms": 0.0,
            "mad_ms": 0.0,
            "observations": 0,
            "method": "no burst of the load phase kept the simulated engine busy",
        }
    return {
        **_median_of("core_ms", estimates),
        "method": "per request, what makes the load phase's burst, simulated with vLLM's "
        "scheduling on the fitted steps, as long as it was measured; median over bursts, "
        "at least 0",
    }


def fit_form(raw: Sequence[Observation], form: str) -> Fit:
    """Least squares over the cost model's coefficients (and the request overhead), on the
    median of each design point, with the mixed step's `form`."""
    from scipy.optimize import least_squares

    obs = medians(raw)
    kinds = {o.kind for o in obs}
    if not {"prefill", "decode"} <= kinds or len(obs) < len(COEFFICIENTS):
        raise ProbeError(
            f"too few observations to fit ({len(obs)}: {sorted(kinds)}); raise --budget"
        )
    y = np.array([o.ms for o in obs])
    scale = np.array([max(v, 1e-3) for v in y])
    x0 = _start(obs)
    typical = np.maximum(np.abs(x0), 1e-6)

    def residuals(u: np.ndarray) -> np.ndarray:
        return (predict(obs, u * typical, form) - y) / scale

    sol = least_squares(
        residuals,
        x0 / typical,
        bounds=(0.0, np.inf),
        loss="soft_l1",
        f_scale=0.25,
        diff_step=1e-3,
        max_nfev=4000,
    )
    x = sol.x * typical
    r = residuals(sol.x)
    dof = max(1, len(obs) - len(COEFFICIENTS))
    jac = sol.jac / typical  # d residual / d coefficient
    try:
        cov = np.linalg.pinv(jac.T @ jac) * float(r @ r) / dof
        se = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    except np.linalg.LinAlgError:
        se = np.full(len(x), math.nan)
    pred = predict(obs, x, form)
    rows = [
        {**row(o), "fit_ms": round(float(p), 3),
         "residual_pct": round(100 * (float(p) - o.ms) / o.ms, 2) if o.ms > 0 else None,
         "repeats": sum(1 for r in raw if r.key == o.key)}
        for o, p in zip(obs, pred, strict=True)
    ]  # fmt: skip
    return Fit(
        coefficients={k: float(f"{v:.4g}") for k, v in zip(COEFFICIENTS, x, strict=True)},
        stderr={k: float(f"{v:.3g}") for k, v in zip(COEFFICIENTS, se, strict=True)},
        residuals=rows,
        rms_relative=float(np.sqrt(np.mean(((pred - y) / scale) ** 2))),
        form=form,
        rms_by_form={},
        n=len(obs),
        raw=[row(o) for o in raw],
    )


def profile_document(result: ProbeResult, the_fit: Fit, name: str) -> dict[str, Any]:
    """The profile YAML: the coefficients the simulator loads, the engine's limits (as the
    design resolved them: flags, then the engine's self-description, then defaults), and a
    `fit:` block (the loader ignores it) with the residuals, the raw probe data and the
    engine's description."""
    info, design = result.engine, result.design
    kv = design.kv_cache_tokens
    doc: dict[str, Any] = {"name": name, **the_fit.profile_fields(), "floor": 0.0}
    doc.update(
        kv_cache_tokens=int(kv) if kv else 100_000,
        max_num_seqs=int(design.max_num_seqs),
        max_num_batched_tokens=int(design.max_num_batched_tokens),
        chunked_prefill=design.chunked_prefill,
        mixed_step=the_fit.form,
        source=f"fairbench profile of {info.model}"
        + (f" (engine {info.version})" if info.version else ""),
    )
    doc["fit"] = {
        "method": "scipy.optimize.least_squares, relative residuals, soft-L1 (f_scale 0.25), "
        "coefficients >= 0; overhead_ms is the request overhead in every TTFT (not a step cost)",
        **the_fit.summary(),
        "rounds": result.rounds,
        "probe_seconds": round(result.seconds, 1),
        "truncated_by_budget": result.truncated,
        "engine": {
            "kind": info.kind,
            "detected_by": info.detected_by,
            "model": info.model,
            "version": info.version,
            "max_model_len": info.max_model_len,
            "block_size": info.block_size,
            "num_gpu_blocks": info.num_gpu_blocks,
            "kv_cache_tokens": info.kv_cache_tokens,
            "max_num_seqs": info.max_num_seqs,
            "max_num_batched_tokens": info.max_num_batched_tokens,
            "chunked_prefill": info.chunked_prefill,
            "max_prompt_tokens": info.max_prompt_tokens,
            "max_concurrent_requests": info.max_concurrent,
            "read_from": dict(info.source),
        },
        "design": {
            "prefill_lengths": design.prefill_lengths(),
            "prefill_reps": design.prefill_reps,
            "decode_batches": design.batches(),
            "longest_prompt": design.longest_prompt(),
            "decode_prompts": design.decode_prompts(),
            "decode_tokens": design.decode_tokens,
            "mixed_batch": design.mixed_batch,
            "mixed_prompts": list(design.mixed_prompts),
            "load_requests": design.burst(),
            "load_prompt": design.load_shape()[0],
            "load_prompt_to": design.load_shape()[1],
            "load_output": design.load_output,
            "idle_reps": design.idle_reps,
            "idle_gap_ms": design.idle_gap_ms,
            "max_rounds": design.max_rounds,
            "seed": design.seed,
        },
        "points": the_fit.residuals,
        "data": the_fit.raw,
    }
    if the_fit.front_end is None and design.burst():
        doc["fit"]["front_end_note"] = (
            "the load phase did not run (its burst would not fit the KV cache, or no round "
            "observed the steps to pace it by): front_end_core_ms is left at 0"
        )
    if not design.kv_cache_tokens:
        doc["fit"]["kv_cache_tokens_note"] = (
            "the engine did not say (vLLM's cache_config_info, SGLang's max_total_num_tokens, "
            "TGI's max_batch_total_tokens); 100000 assumed: pass --kv-cache-tokens"
        )
    return doc


async def run_profile(
    base: str,
    model: str | None,
    design: ProbeDesign,
    headers: dict[str, str] | None = None,
    progress: Progress | None = None,
    engine: str = "auto",
    given: Collection[str] = (),
) -> tuple[ProbeResult, Fit]:
    """Read the engine's description (`engine`, or detected), fill the design's limits from it
    where no flag (`given`) set them, run the experiment, fit. Raises ProbeError (one line)."""
    headers = dict(headers or {})
    info = await engine_info(base, model, headers, engine)
    apply_engine(design, info, given)
    started = time.monotonic()
    try:
        async with Client(base, info.model, headers, design.seed, info.kind) as client:
            obs, rounds, cut = await probe(client, design, progress)
    except (aiohttp.ClientError, TimeoutError) as error:
        raise ProbeError(f"{base}: the probe failed ({type(error).__name__}: {error})") from None
    result = ProbeResult(info, design, obs, time.monotonic() - started, rounds, cut)
    limits = Limits(design.max_num_seqs, design.max_num_batched_tokens, design.chunked_prefill)
    return result, fit(obs, limits)


# ---------------------------------------------------------------- merging probes


class MergeError(Exception):
    """The profiles cannot be merged; the message is one line naming the file."""


# What must agree for two profiles to describe one engine: its limits (the simulator loads
# them) and the experiment's design points (a point's median pools its rounds across probes).
MERGE_LIMITS = ("kv_cache_tokens", "max_num_seqs", "max_num_batched_tokens", "chunked_prefill")
MERGE_ENGINE = ("kind", "model")
MERGE_DESIGN = (
    "prefill_lengths",
    "prefill_reps",
    "decode_batches",
    "decode_prompts",
    "decode_tokens",
    "mixed_batch",
    "mixed_prompts",
)


def _observation(row: Any) -> Observation:
    """One `fit.data` row back as an Observation (TypeError if it is not one)."""
    if not isinstance(row, dict):
        raise TypeError(f"not a mapping: {row!r}")
    return Observation(**{**row, "prompts": tuple(row.get("prompts") or ())})


def probe_data(doc: dict[str, Any], where: str) -> list[Observation]:
    """The raw observations a profile's `fit.data` holds (what `profile_document` wrote)."""
    block = doc.get("fit") if isinstance(doc, dict) else None
    rows = block.get("data") if isinstance(block, dict) else None
    if not isinstance(rows, list) or not rows:
        raise MergeError(
            f"{where}: no probe data (fit.data): only a profile `fairbench profile` fitted "
            "from an engine can be merged"
        )
    for key in ("engine", "design"):
        if not isinstance(block.get(key) or {}, dict):
            raise MergeError(f"{where}: fit.{key} is not a mapping")
    try:
        obs = [_observation(row) for row in rows]
    except TypeError:
        raise MergeError(f"{where}: fit.data is not `fairbench profile`'s probe data") from None
    for o in obs:  # a first-form front-end or an idle observation is a difference: any sign
        low = -math.inf if o.kind in ("frontend", "idle") else 0.0
        if not isinstance(o.ms, int | float) or not math.isfinite(o.ms) or o.ms <= low:
            raise MergeError(f"{where}: fit.data has a step of {o.ms!r} ms ({o.key})")
        if o.kind == "load" and not (
            all(isinstance(v, int) and v >= 1 for v in (o.n, o.batch, o.context))
            and isinstance(o.gap_ms, int | float)
            and math.isfinite(o.gap_ms)
            and o.gap_ms >= 0
            and (not o.prompts or len(o.prompts) == o.batch)
            and all(isinstance(v, int) and v >= 1 for v in o.prompts)
        ):
            raise MergeError(f"{where}: fit.data has a load burst it cannot replay ({o.key})")
    return obs


def merge_profiles(
    docs: Sequence[tuple[str, dict[str, Any]]], name: str
) -> tuple[dict[str, Any], Fit]:
    """One profile fitted from the probe data of several profiles of one engine: every round
    of every probe pooled, the median of each design point taken over all of them, fitted as
    one probe's rounds are (`fit`).

    Why: a profile describes the engine as it was while it was probed. Where the engine's
    speed drifts (a shared machine, a neighbour, clocks), the profile that predicts a run is
    the one measured around it: probe right before and right after the run, and merge. The
    merged document is the first's, with the fit, the pooled data and `fit.merged_from` (each
    source's name, rounds, probe seconds and step constants, so the drift between them shows).

    Refused (MergeError, one line naming the file) unless every profile describes one engine
    with one experiment: the same engine kind and model, the same limits (MERGE_LIMITS) and
    the same design points (MERGE_DESIGN)."""
    if not docs:
        raise MergeError("no profiles to merge")
    first_where, first = docs[0]
    raw: list[Observation] = []
    for where, doc in docs:
        raw += probe_data(doc, where)
        for key in MERGE_LIMITS:
            if doc.get(key) != first.get(key):
                raise MergeError(
                    f"{where}: {key} {doc.get(key)} but {first_where} has {first.get(key)}: "
                    "merge only profiles of one engine, started with the same limits"
                )
        for block, keys in (("engine", MERGE_ENGINE), ("design", MERGE_DESIGN)):
            mine, theirs = doc["fit"].get(block) or {}, first["fit"].get(block) or {}
            for key in keys:
                if mine.get(key) != theirs.get(key):
                    raise MergeError(
                        f"{where}: fit.{block}.{key} {mine.get(key)} but {first_where} has "
                        f"{theirs.get(key)}: merge only probes of one engine with one design"
                    )
    limits = Limits(
        int(first.get("max_num_seqs") or 8),
        int(first.get("max_num_batched_tokens") or 2048),
        bool(first.get("chunked_prefill", True)),
    )
    from reference_scheduler.scheduler.config import SchedulerConfigError

    try:
        the_fit = fit(raw, limits)
    except SchedulerConfigError as error:  # the first profile's limits cannot run a burst
        raise MergeError(
            f"{first_where}: its limits cannot simulate the load phase: {error}"
        ) from None
    out = {**first, "name": name, **the_fit.profile_fields(), "mixed_step": the_fit.form}
    if the_fit.front_end is None:  # no load phase in the pooled data: no front end to carry
        out["front_end_core_ms"] = 0.0
    if the_fit.idle is None:  # nor an idle phase: no wake to carry
        out["idle_wake_ms"] = 0.0
    sources = [
        {
            "profile": where,
            "name": doc.get("name"),
            "rounds": doc["fit"].get("rounds"),
            "probe_seconds": doc["fit"].get("probe_seconds"),
            "seed": (doc["fit"].get("design") or {}).get("seed"),
            **{k: doc.get(k) for k in ("a", "d")},
        }
        for where, doc in docs
    ]
    out["fit"] = {
        **first["fit"],
        **the_fit.summary(),
        "rounds": sum(s["rounds"] for s in sources if isinstance(s["rounds"], int)),
        "probe_seconds": round(
            sum(float(v) for s in sources if isinstance(v := s["probe_seconds"], int | float)), 1
        ),
        "truncated_by_budget": any(doc["fit"].get("truncated_by_budget") for _, doc in docs),
        "merged_from": sources,
        "points": the_fit.residuals,
        "data": the_fit.raw,
    }
    if the_fit.front_end is None:
        out["fit"].pop("front_end", None)
    if the_fit.idle is None:
        out["fit"].pop("idle", None)
    return out, the_fit
