"""Arrival processes by time-rescaling: one mechanism for every process, phase and ramp.

Every synthetic process here is a unit-rate renewal process in *operational time* u, mapped to
wall time through the inverse of the cumulative rate Λ(t) = ∫₀ᵗ λ(s) ds. λ is piecewise linear
(a ramp is linear, on/off and phases are piecewise constant), so Λ is piecewise quadratic and
inverts in closed form per segment. With exponential gaps this is an inhomogeneous Poisson
process; with equal gaps, "truly equal gaps" at a constant rate; with gamma gaps, a renewal
process of the asked CV whose rate follows λ(t).

The process is never rescaled so that the run ends "on time": the number of arrivals in a
window is random, as it is in production (rescaling conditions the process and, for bursty
processes, changes its burst statistics).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairbench.workload.models import (
    ConstantArrival,
    GammaArrival,
    OnOffArrival,
    Phase,
    PoissonArrival,
    RampArrival,
)

SyntheticArrival = ConstantArrival | PoissonArrival | GammaArrival | OnOffArrival | RampArrival

_CHUNK = 1 << 16  # gaps are drawn in fixed chunks so a longer horizon extends, never reshuffles


@dataclass(frozen=True)
class RateFunction:
    """λ(t) on [starts[k], ends[k]) rising linearly from lo[k] to hi[k]; Λ at each start."""

    starts: np.ndarray
    ends: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    cum: np.ndarray  # Λ(starts[k]); cum[-1] is Λ(horizon)

    @property
    def total(self) -> float:
        return float(self.cum[-1])

    def invert(self, u: np.ndarray) -> np.ndarray:
        """t such that Λ(t) = u, for u in [0, total)."""
        k = np.searchsorted(self.cum, u, side="right") - 1
        k = np.clip(k, 0, len(self.starts) - 1)
        du = u - self.cum[k]
        a = self.lo[k]
        slope = (self.hi[k] - a) / (self.ends[k] - self.starts[k])
        c = 0.5 * slope
        # c·s² + a·s − du = 0, in the form that stays exact when c → 0 or a → 0.
        disc = np.sqrt(np.maximum(a * a + 4.0 * c * du, 0.0))
        denom = a + disc
        with np.errstate(divide="ignore", invalid="ignore"):
            s = np.where(denom > 0, 2.0 * du / denom, 0.0)
        return self.starts[k] + s


def _base_segments(
    arrival: SyntheticArrival, horizon: float
) -> list[tuple[float, float, float, float]]:
    if isinstance(arrival, ConstantArrival | PoissonArrival | GammaArrival):
        return [(0.0, horizon, arrival.rate, arrival.rate)]
    if isinstance(arrival, RampArrival):
        segs = [(0.0, min(arrival.over, horizon), arrival.start_rate, 0.0)]
        end_rate_at = arrival.start_rate + (arrival.end_rate - arrival.start_rate) * (
            segs[0][1] / arrival.over
        )
        segs[0] = (0.0, segs[0][1], arrival.start_rate, end_rate_at)
        if horizon > arrival.over:
            segs.append((arrival.over, horizon, arrival.end_rate, arrival.end_rate))
        return segs
    if isinstance(arrival, OnOffArrival):
        period = arrival.on + arrival.off
        cycles = int(np.ceil(horizon / period))
        segs = []
        for i in range(cycles):
            t = i * period
            segs.append((t, min(t + arrival.on, horizon), arrival.rate, arrival.rate))
            if t + arrival.on < horizon:
                segs.append((t + arrival.on, min(t + period, horizon), 0.0, 0.0))
        return segs
    raise TypeError(f"not a synthetic arrival process: {arrival!r}")


def rate_function(arrival: SyntheticArrival, phases: list[Phase], horizon: float) -> RateFunction:
    """λ(t) on [0, horizon): the process's own rate times every phase multiplier active at t."""
    base = _base_segments(arrival, horizon)
    cuts = {0.0, horizon}
    for start, end, _, _ in base:
        cuts.update((start, end))
    for phase in phases:
        cuts.update(x for x in (phase.start, phase.end) if 0.0 < x < horizon)
    edges = np.array(sorted(c for c in cuts if 0.0 <= c <= horizon))
    starts, ends = edges[:-1], edges[1:]
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    base_starts = np.array([s for s, _, _, _ in base])
    base_ends = np.array([e for _, e, _, _ in base])
    base_lo = np.array([a for _, _, a, _ in base])
    base_hi = np.array([b for _, _, _, b in base])
    mids = 0.5 * (starts + ends)
    j = np.clip(np.searchsorted(base_starts, mids, side="right") - 1, 0, len(base) - 1)
    span = base_ends[j] - base_starts[j]
    slope = np.where(span > 0, (base_hi[j] - base_lo[j]) / np.where(span > 0, span, 1), 0.0)
    lo = base_lo[j] + slope * (starts - base_starts[j])
    hi = base_lo[j] + slope * (ends - base_starts[j])
    mult = np.ones_like(mids)
    for phase in phases:
        inside = (mids >= phase.start) & (mids < phase.end)
        mult = np.where(inside, mult * phase.multiplier, mult)
    lo, hi = lo * mult, hi * mult
    cum = np.concatenate(([0.0], np.cumsum(0.5 * (lo + hi) * (ends - starts))))
    return RateFunction(starts, ends, lo, hi, cum)


def _unit_gaps(arrival: SyntheticArrival, rng: np.random.Generator, n: int) -> np.ndarray:
    if isinstance(arrival, ConstantArrival) or (
        isinstance(arrival, OnOffArrival) and arrival.within == "constant"
    ):
        return np.ones(n)
    if isinstance(arrival, GammaArrival):
        shape = 1.0 / (arrival.cv * arrival.cv)
        return rng.gamma(shape, 1.0 / shape, size=n)
    return rng.standard_exponential(size=n)


def arrival_times(
    arrival: SyntheticArrival,
    phases: list[Phase],
    horizon: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Arrival times in seconds on [0, horizon), sorted.

    A constant process fires its first request at t = 0 (its equal gaps then start there); the
    random processes start fresh at t = 0 and fire their first request one gap later.
    """
    rate = rate_function(arrival, phases, horizon)
    total = rate.total
    if total <= 0:
        return np.empty(0)
    constant = isinstance(arrival, ConstantArrival) or (
        isinstance(arrival, OnOffArrival) and arrival.within == "constant"
    )
    if constant:
        u = np.arange(0.0, total, 1.0)
    else:
        chunks = []
        reached = 0.0
        while reached < total:
            gaps = _unit_gaps(arrival, rng, _CHUNK)
            points = reached + np.cumsum(gaps)
            chunks.append(points)
            reached = float(points[-1])
        u = np.concatenate(chunks)
        u = u[u < total]
    t = rate.invert(u)
    return t[t < horizon]
