"""Prompt text with an exact token count, derived on demand from a recipe in the plan.

The reference tokenizer (shared with `reference_scheduler`, which defines it): a token is a
maximal run of non-whitespace characters, so `count = len(text.split())`. It is simple, fast,
documented and exact for the text we generate, which is words from a fixed 4,096-word
vocabulary joined by single spaces.

A plan stores each prompt as a *recipe*, not as text: its length, its prefix (a synthetic
prefix group, or Mooncake block ids) and a 64-bit seed for its own part. Text is rendered when
the request is sent. A 1,000,000-request plan of 4k-token prompts would be ~20 GB as text; as
recipes it is a few dozen bytes per request, and the digest covers the recipe, so equal digests
still mean equal text. Requests of one prefix group share their leading words exactly, so a
prefix cache (ours or a real engine's) sees real hits.

Real engines count tokens with their own tokenizer: for them fairbench.targets.calibrate renders
the same recipes from words the server's tokenizer counts as one token each (asked of its
/tokenize, or a local tokenizer.json), so the server, too, counts exactly the planned prompt
tokens.
"""

from __future__ import annotations

import numpy as np

from reference_scheduler.core.tokenizer import VOCAB, count_tokens

__all__ = ["VOCAB", "count_tokens", "render_prompt", "render_tokens", "text_of"]

_VOCAB_ARRAY = np.array(VOCAB, dtype=object)
_PREFIX_DOMAIN = 0x5EED_F1E1D
_BLOCK_DOMAIN = 0xB10C_1D5


def _words(key: tuple[int, ...], n: int) -> np.ndarray:
    rng = np.random.default_rng([int(k) & 0xFFFF_FFFF_FFFF_FFFF for k in key])
    return rng.integers(0, len(VOCAB), size=n)


def render_tokens(
    prompt_tokens: int,
    prompt_seed: int,
    prefix_key: tuple[int, int] | None = None,
    prefix_tokens: int = 0,
    block_ids: np.ndarray | None = None,
    block_tokens: int = 512,
) -> np.ndarray:
    """Vocabulary indices of a prompt: shared prefix first, then the request's own words."""
    parts: list[np.ndarray] = []
    used = 0
    if block_ids is not None and len(block_ids):
        for block in block_ids:
            take = min(block_tokens, prompt_tokens - used)
            if take <= 0:
                break
            parts.append(_words((_BLOCK_DOMAIN, int(block)), block_tokens)[:take])
            used += take
    elif prefix_key is not None and prefix_tokens > 0:
        take = min(prefix_tokens, prompt_tokens)
        parts.append(_words((_PREFIX_DOMAIN, *prefix_key), take))
        used = take
    if prompt_tokens > used:
        parts.append(_words((int(prompt_seed),), prompt_tokens - used))
    if not parts:
        return np.empty(0, dtype=np.int64)
    return np.concatenate(parts)


def text_of(ids: np.ndarray) -> str:
    """The words of these vocabulary indices, one space apart: one reference token each."""
    return " ".join(_VOCAB_ARRAY[ids])


def render_prompt(*args: object, **kwargs: object) -> str:
    """The prompt text of `render_tokens(...)`: exactly `prompt_tokens` reference tokens."""
    return text_of(render_tokens(*args, **kwargs))  # type: ignore[arg-type]
