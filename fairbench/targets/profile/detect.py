"""Which engine answers, and what it says of its own limits (vLLM, SGLang, TGI, plain OpenAI).

Reads the engine's own description endpoints and vLLM's cache_config_info gauge; imports
the client and the values.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any

import aiohttp

from fairbench.targets.profile.client import (
    _get,
)
from fairbench.targets.profile.model import (
    PROBE_BATCH_FROM_ENGINE,
    EngineInfo,
    ProbeDesign,
    ProbeError,
)

_CACHE_INFO = "vllm:cache_config_info"


def cache_config(metrics_text: str) -> dict[str, str]:
    """The labels of vLLM's `cache_config_info` gauge (empty for another engine).

    Read with prometheus_client's parser (the one reader of Prometheus text in fairbench), on
    that gauge's first sample line alone, so a line of another metric the parser rejects does
    not hide it."""
    from prometheus_client.parser import text_string_to_metric_families

    line = next(
        (x for x in (metrics_text or "").splitlines() if x.startswith(_CACHE_INFO + "{")), None
    )
    if line is None:
        return {}
    try:
        families = list(text_string_to_metric_families(line + "\n"))
    except ValueError:
        return {}
    samples = [s for family in families for s in family.samples]
    return dict(samples[0].labels) if samples else {}


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
