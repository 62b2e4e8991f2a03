"""The waiting queue's length through a run, per window, and its variance ratio between runs.

Why: in the field's incident the only server-side signal that moved was the variance of the
scheduler's waiting-queue length (×1.8) while its mean stayed flat. The queue length is rebuilt
from the records, exactly for the simulator (every arrival and admission is stamped): a request
waits from its send until its admission (queue_time_ns) and, disaggregated, again from its KV's
arrival at the decode pool until a decode replica admits it (decode_wait_ns). Sampled every
`step_s` (1 s) on the run clock; windows of `window_s` (30 s) give a mean and a variance each.

The variance ratio (candidate over baseline, over the whole run) gets a 95% interval from a
moving-block bootstrap of each run's sampled series on its own (blocks of `block_s`, 10 s, since
neighbouring samples are correlated; 1,000 resamples; percentile interval of the ratio), the runs
taken as independent. Declined (None, with the reason) with fewer than 3 blocks in a run.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

METHOD = "moving-block bootstrap of each run's 1 s queue-length series (10 s blocks, 1,000)"


def _col(df: pd.DataFrame, name: str) -> np.ndarray:
    if name not in df:
        return np.full(len(df), np.nan)
    return df[name].to_numpy(dtype=float, na_value=np.nan)


def queue_series(df: pd.DataFrame, step_s: float = 1.0) -> np.ndarray:
    """Waiting requests at each `step_s` from the first send to the last (both pools)."""
    sent = _col(df, "t_intended_ns") / 1e9
    queue = _col(df, "queue_time_ns") / 1e9
    has = np.isfinite(queue)
    if not has.any():
        return np.empty(0)
    starts = [sent[has]]
    ends = [sent[has] + queue[has]]
    wait = _col(df, "decode_wait_ns") / 1e9
    at_decode = sent + queue + _col(df, "prefill_ns") / 1e9 + _col(df, "kv_transfer_ns") / 1e9
    more = has & np.isfinite(wait) & (wait > 0) & np.isfinite(at_decode)
    starts.append(at_decode[more])
    ends.append(at_decode[more] + wait[more])
    a, b = np.sort(np.concatenate(starts)), np.sort(np.concatenate(ends))
    grid = np.arange(float(sent.min()), float(sent.max()) + 1e-9, step_s)
    return (np.searchsorted(a, grid, side="right") - np.searchsorted(b, grid, side="right")).astype(
        float
    )


def windows(series: np.ndarray, window_s: float = 30.0, step_s: float = 1.0) -> list[dict]:
    per = max(round(window_s / step_s), 1)
    out = []
    for k in range(0, len(series) - per + 1, per):
        w = series[k : k + per]
        out.append({"start_s": k * step_s, "mean": float(w.mean()), "variance": float(w.var())})
    return out


def _block_vars(series: np.ndarray, block: int, rng: np.random.Generator, n: int) -> np.ndarray:
    starts = len(series) - block + 1
    count = -(-len(series) // block)
    out = np.empty(n)
    for i in range(n):
        picks = rng.integers(0, starts, count)
        sample = np.concatenate([series[p : p + block] for p in picks])[: len(series)]
        out[i] = sample.var()
    return out


def queue_length(
    base: pd.DataFrame, cand: pd.DataFrame, block_s: float = 10.0, seed: int = 0
) -> dict[str, Any]:
    """Each run's queue-length mean, variance and windows; the variance ratio with its interval."""
    a, b = queue_series(base), queue_series(cand)
    out: dict[str, Any] = {
        "sampling": "every 1 s on the run clock, from the records (prefill queue + decode wait)",
        "baseline": {"mean": _mean(a), "variance": _var(a), "windows": windows(a)},
        "candidate": {"mean": _mean(b), "variance": _var(b), "windows": windows(b)},
    }
    va, vb = _var(a), _var(b)
    block = max(int(block_s), 1)
    ratio = vb / va if va and vb is not None and va > 0 else None
    out["variance_ratio"] = ratio
    out["ci_method"] = METHOD
    if ratio is None or len(a) < 3 * block or len(b) < 3 * block:
        out.update(ci_low=None, ci_high=None, ci_reason="fewer than 3 blocks or no queue")
        return out
    rng = np.random.default_rng(seed)
    draws = _block_vars(b, block, rng, 1000) / np.maximum(_block_vars(a, block, rng, 1000), 1e-12)
    lo, hi = np.quantile(draws, [0.025, 0.975])
    out.update(ci_low=float(lo), ci_high=float(hi), ci_confidence=0.95)
    return out


def _mean(x: np.ndarray) -> float | None:
    return float(x.mean()) if len(x) else None


def _var(x: np.ndarray) -> float | None:
    return float(x.var()) if len(x) else None
