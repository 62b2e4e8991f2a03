"""Token-length sampling for prompts and outputs: one vectorized draw per (tenant, workload)."""

from __future__ import annotations

import numpy as np

from fairbench.workload.models import (
    ConstantDist,
    EmpiricalDist,
    ExponentialDist,
    LengthDist,
    LogNormalDist,
    NormalDist,
    UniformDist,
)

# Φ⁻¹(0.99): a lognormal with median m and 99th percentile p has σ = ln(p/m) / Z99.
Z99 = 2.3263478740408408


def lognormal_sigma(median: float, p99: float) -> float:
    return float(np.log(p99 / median) / Z99)


def sample_lengths(dist: LengthDist, rng: np.random.Generator, n: int) -> np.ndarray:
    """`n` integer token counts from `dist`, rounded and clipped to [dist.min, dist.max]."""
    if isinstance(dist, ConstantDist):
        raw = np.full(n, float(dist.value))
    elif isinstance(dist, UniformDist):
        raw = rng.integers(dist.low, dist.high + 1, size=n).astype(np.float64)
    elif isinstance(dist, NormalDist):
        raw = rng.normal(dist.mean, dist.std, size=n)
    elif isinstance(dist, LogNormalDist):
        raw = rng.lognormal(np.log(dist.median), lognormal_sigma(dist.median, dist.p99), size=n)
    elif isinstance(dist, ExponentialDist):
        raw = rng.exponential(dist.mean, size=n)
    elif isinstance(dist, EmpiricalDist):
        values = np.asarray(dist.values, dtype=np.float64)
        if dist.weights is None:
            raw = values[rng.integers(0, len(values), size=n)]
        else:
            p = np.asarray(dist.weights, dtype=np.float64)
            raw = values[rng.choice(len(values), size=n, p=p / p.sum())]
    else:  # pragma: no cover - the scenario schema admits no other kind
        raise TypeError(f"unknown length distribution {dist!r}")
    return np.clip(np.rint(raw), dist.min, dist.max).astype(np.int64)
