"""The profile document the `sim` target reads, and the whole run of `fairbench profile`.

Orchestration: probe, fit, then the document; imports every step before it.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Any

import aiohttp

from fairbench.targets.profile.client import (
    Client,
)
from fairbench.targets.profile.detect import (
    apply_engine,
    engine_info,
)
from fairbench.targets.profile.fit import (
    Fit,
    Limits,
)
from fairbench.targets.profile.load import fit
from fairbench.targets.profile.model import (
    ProbeDesign,
    ProbeError,
    ProbeResult,
    Progress,
)
from fairbench.targets.profile.probe import (
    probe,
)


def profile_document(result: ProbeResult, the_fit: Fit, name: str) -> dict[str, Any]:
    """The profile YAML: the coefficients the simulator loads, the engine's limits (as the
    design resolved them: flags, then the engine's self-description, then defaults), and a
    `fit:` block (the loader ignores it) with the residuals, the raw probe data and the
    engine's description."""
    info, design = result.engine, result.design
    kv = design.kv_cache_tokens
    doc: dict[str, Any] = {"name": name, **the_fit.profile_fields()}
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
