"""The profile probe's design points as an exact engine of known coefficients gives them, for
the fit's tests (tests/test_profile_fit.py, tests/test_profile_probe.py): each prefill's TTFT
with the request overhead in it, the decode and mixed steps without. One builder, so the two
files' designs differ only in the engine's limits they name."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fairbench.targets.profile import Observation
from reference_scheduler.core.costmodel import load_profile


def exact_design(
    coefficients: Mapping[str, Any],
    *,
    floor: float,
    overhead: float,
    prefills: Iterable[int],
    decode_prompts: Iterable[int],
    decode_batches: Iterable[int],
    mixed: tuple[Iterable[int], int, int],
    mixed_label: str = "mixed {n}",
) -> list[Observation]:
    """`mixed` is (prefill lengths, decode batch, decode context) of the mixed steps."""
    truth = load_profile({"name": "t", **coefficients, "floor": floor, "kv_cache_tokens": 1})
    obs = [
        Observation("prefill", n, 0, 0, overhead + truth.step_ms(n, 0, 0), f"prefill {n}")
        for n in prefills
    ]
    for prompt in decode_prompts:
        for batch in decode_batches:
            context = batch * (prompt + 12)
            ms = truth.step_ms(0, batch, context)
            obs.append(Observation("decode", 0, batch, context, ms, f"decode {batch}x{prompt}"))
    lengths, batch, context = mixed
    for n in lengths:
        ms = truth.step_ms(n, batch, context)
        obs.append(Observation("mixed", n, batch, context, ms, mixed_label.format(n=n)))
    return obs
