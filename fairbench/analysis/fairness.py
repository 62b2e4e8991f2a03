"""Fairness over time: the VTC paper's service difference, and Jain's index per window.

Pure functions over arrays (one entry per request), so they serve fairbench's records and the
VTC artifact's published per-request results alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairbench.analysis.metrics import jain


@dataclass(frozen=True)
class ServiceDifference:
    """diff(tick) per tick, and the table the VTC paper reports: max, mean, population variance."""

    ticks_s: np.ndarray
    diff: np.ndarray

    @property
    def max(self) -> float:
        return float(self.diff.max())

    @property
    def mean(self) -> float:
        return float(self.diff.mean())

    @property
    def var(self) -> float:
        return float(self.diff.var())


def _service_in(
    start: np.ndarray, end: np.ndarray, cost: np.ndarray, lo: float, hi: float
) -> np.ndarray:
    """Cost spread uniformly over [start, end], the part inside [lo, hi]."""
    overlap = np.clip(np.minimum(end, hi) - np.maximum(start, lo), 0.0, None)
    return cost * overlap / (end - start)


def service_difference(
    client: np.ndarray,
    arrival_s: np.ndarray,
    start_s: np.ndarray,
    end_s: np.ndarray,
    cost: np.ndarray,
    duration_s: float,
    warmup_s: float = 30.0,
    window_s: float = 60.0,
    n_ticks: int = 19,
    min_end_s: float = 1.0,
    min_span_s: float = 1e-5,
) -> ServiceDifference:
    """The VTC paper's service difference (Sheng et al., OSDI 2024, §6.1, and its artifact).

    A request's cost (e.g. prompt + 2·output tokens) is spread uniformly over its service
    interval [start, end] (first token to done); requests ending before `min_end_s` or lasting
    under `min_span_s` contribute no service. At ticks x_i = (T − warmup)/(n_ticks + 1) · i,
    i = 1..n_ticks, the window is [x + warmup − w/2, x + warmup + w/2], and per client j:
        s_j = service inside the window / w,   r_j = cost of requests arriving in it / w
        diff = Σ_j min(max_k s_k − s_j, |r_j − s_j|)      (cost units per second)
    over every client seen. The min(...) term forgives a client that got less than the best
    served one only when it also asked for less: it measures unfairness, not low demand."""
    clients, code = np.unique(client, return_inverse=True)
    serves = (end_s >= min_end_s) & ((end_s - start_s) >= min_span_s)
    step = (duration_s - warmup_s) / (n_ticks + 1)
    ticks = step * np.arange(1, n_ticks + 1)
    diffs = np.empty(n_ticks)
    k = len(clients)
    for i, x in enumerate(ticks):
        lo, hi = x + warmup_s - window_s / 2, x + warmup_s + window_s / 2
        got = np.zeros(k)
        np.add.at(
            got, code[serves], _service_in(start_s[serves], end_s[serves], cost[serves], lo, hi)
        )
        asked = np.zeros(k)
        arrived = (arrival_s >= lo) & (arrival_s <= hi)
        np.add.at(asked, code[arrived], cost[arrived])
        s, r = got / window_s, asked / window_s
        diffs[i] = np.minimum(s.max() - s, np.abs(r - s)).sum()
    return ServiceDifference(ticks, diffs)


def windowed_jain(
    client: np.ndarray,
    start_s: np.ndarray,
    end_s: np.ndarray,
    cost: np.ndarray,
    weights: dict[str, float],
    t0: float,
    t1: float,
    window_s: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Jain's index of weighted service per window (start times, values), over clients active in
    the window. Bursty load can look fair in short windows and unfair over the run, or the
    reverse: report both this series and the whole-run index."""
    edges = np.arange(t0, t1, window_s)
    names, code = np.unique(np.asarray(client), return_inverse=True)  # once, not per window
    weight = np.array([weights.get(str(n), 1.0) for n in names])
    end = np.maximum(end_s, start_s + 1e-9)
    values = []
    for lo in edges:
        got = np.bincount(
            code, _service_in(start_s, end, cost, lo, lo + window_s), minlength=len(names)
        )
        active = got > 0
        values.append(jain(got[active] / weight[active]) if active.any() else np.nan)
    return edges, np.array(values)
