"""What differs between vLLM, SGLang and TGI, in one place: paths, bodies, tokenizers, metrics.

Each engine is described, not subclassed: the transport and the executor are the same for all;
an `Engine` says which paths its native API uses, how a native body is built, how its tokenizer
endpoint is asked and answered, where its version is read, and which of its Prometheus series
the report puts first. Sources (read for this module): vLLM 0.32 `entrypoints/serve/tokenize`,
`v1/metrics/loggers.py`; SGLang `srt/entrypoints/http_server.py`, `srt/metrics/collector.py`;
TGI `router/src/server.rs`, `lib.rs`, `docs/source/reference/metrics.md`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fairbench.targets.http.wire import OPENAI, SGLANG, TGI, Dialect


def _count_openai_style(obj: Any) -> int:
    """vLLM's and SGLang's /tokenize answer {"count", "tokens", ...}."""
    if isinstance(obj, dict):
        if isinstance(obj.get("count"), int):
            return int(obj["count"])
        if isinstance(obj.get("tokens"), list):
            return len(obj["tokens"])
    raise ValueError(f"unexpected /tokenize answer: {str(obj)[:120]}")


def _count_tgi(obj: Any) -> int:
    """TGI's /tokenize answers a list of {id, text, start, stop}."""
    if isinstance(obj, list):
        return len(obj)
    raise ValueError(f"unexpected /tokenize answer: {str(obj)[:120]}")


def _tokenize_openai_style(model: str, text: str) -> dict[str, Any]:
    return {"model": model, "prompt": text, "add_special_tokens": False}


def _tokenize_tgi(model: str, text: str) -> dict[str, Any]:
    return {"inputs": text}


def sglang_body(prompt: str, max_tokens: int, stream: bool, ignore_eos: bool) -> dict[str, Any]:
    sampling: dict[str, Any] = {"max_new_tokens": max_tokens}
    if ignore_eos:
        sampling["ignore_eos"] = True
    # No `rid`: SGLang refuses a duplicate one, and a re-run (an A/B) reuses request ids.
    return {"text": prompt, "sampling_params": sampling, "stream": stream}


def tgi_body(prompt: str, max_tokens: int, stream: bool, ignore_eos: bool) -> dict[str, Any]:
    # TGI has no ignore_eos: a request may end early at EOS; `details` brings the server's
    # own counts (generated_tokens, input_length) on the last event.
    return {"inputs": prompt, "parameters": {"max_new_tokens": max_tokens, "details": True}}


@dataclass(frozen=True)
class Engine:
    kind: str
    priority_field: bool
    native_stream_path: str | None = None
    native_whole_path: str | None = None
    native_dialect: Dialect = OPENAI
    # Native APIs take raw text: no chat template is applied, so chat and completions
    # workloads send the same body there (calibration measures the overhead per endpoint).
    native_body: Callable[[str, int, bool, bool], dict[str, Any]] | None = None
    ignore_eos: bool = True
    tokenize_path: str | None = None
    tokenize_body: Callable[[str, str], dict[str, Any]] = _tokenize_openai_style
    tokenize_count: Callable[[Any], int] = _count_openai_style
    version_path: str | None = None
    headline_metrics: tuple[str, ...] = field(default_factory=tuple)
    # reads the request field `cache_salt` (vLLM: mixed into the first block's prefix hash)
    cache_salt: bool = False


ENGINES: dict[str, Engine] = {
    "vllm": Engine(
        "vllm",
        priority_field=True,
        cache_salt=True,
        tokenize_path="/tokenize",
        version_path="/version",
        headline_metrics=(
            "vllm:num_requests_waiting",
            "vllm:num_requests_running",
            "vllm:kv_cache_usage_perc",
            "vllm:num_preemptions_total",
            "vllm:generation_tokens_total",
            "vllm:request_queue_time_seconds",
            "vllm:time_to_first_token_seconds",
            "vllm:inter_token_latency_seconds",
            "vllm:e2e_request_latency_seconds",
        ),
    ),
    "sglang": Engine(
        "sglang",
        priority_field=True,
        native_stream_path="/generate",
        native_whole_path="/generate",
        native_dialect=SGLANG,
        native_body=sglang_body,
        tokenize_path="/tokenize",
        version_path="/get_server_info",
        headline_metrics=(
            "sglang:num_queue_reqs",
            "sglang:num_running_reqs",
            "sglang:token_usage",
            "sglang:cache_hit_rate",
            "sglang:num_retracted_reqs",
            "sglang:generation_tokens_total",
            "sglang:queue_time_seconds",
            "sglang:time_to_first_token_seconds",
            "sglang:inter_token_latency_seconds",
            "sglang:e2e_request_latency_seconds",
        ),
    ),
    "tgi": Engine(
        "tgi",
        priority_field=False,
        native_stream_path="/generate_stream",
        native_whole_path="/generate",
        native_dialect=TGI,
        native_body=tgi_body,
        ignore_eos=False,
        tokenize_path="/tokenize",
        tokenize_body=_tokenize_tgi,
        tokenize_count=_count_tgi,
        version_path="/info",
        headline_metrics=(
            "tgi_queue_size",
            "tgi_batch_current_size",
            "tgi_request_failure_total",  # the parser names counters *_total
            "tgi_request_success_total",
            "tgi_request_queue_duration",
            "tgi_request_mean_time_per_token_duration",
            "tgi_request_duration",
        ),
    ),
    "reference": Engine(
        "reference",
        priority_field=False,
        cache_salt=True,  # reference_scheduler/server/app.py: vLLM's rule
        headline_metrics=(
            "scheduler_queue_depth",
            "scheduler_running",
            "scheduler_throughput_tokens_total",
            "scheduler_admission_rejections_total",
            "scheduler_wait_time_seconds",
            "scheduler_step_duration_seconds",
        ),
    ),
    "openai": Engine("openai", priority_field=False),
}


def engine(kind: str) -> Engine:
    return ENGINES.get(kind, ENGINES["openai"])
