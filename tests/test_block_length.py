"""The vectorized Politis–White block length equals arch's `optimal_block_length`.

Why: intervals.block_length moved from arch's loop to fairbench.analysis.block_length for speed
(issue 35); every interval's batch length rests on it, so it must give arch's numbers on every
kind of series the summary meets: i.i.d., AR(1) at φ = 0.5 and 0.9, heavy-tailed (Cauchy,
Pareto 1.1), ties (discrete latencies), short (down to the shortest arch can take) and constant.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from arch.bootstrap import optimal_block_length
from scipy import stats as sps

from fairbench.analysis import intervals as iv
from fairbench.analysis.block_length import circular_block_length, optimal_blocks


def _ar1(rng: np.random.Generator, n: int, phi: float) -> np.ndarray:
    e = rng.standard_normal(n)
    x = np.empty(n)
    x[0] = e[0]
    for i in range(1, n):
        x[i] = phi * x[i - 1] + e[i]
    return x


def _series(rng: np.random.Generator, kind: str, n: int) -> np.ndarray:
    if kind == "iid":
        return rng.standard_normal(n)
    if kind == "ar05":
        return _ar1(rng, n, 0.5)
    if kind == "ar09":
        return _ar1(rng, n, 0.9)
    if kind == "cauchy":
        return rng.standard_cauchy(n)
    if kind == "pareto":
        return rng.pareto(1.1, n)
    if kind == "ties":
        return rng.integers(0, 4, n).astype(float)
    if kind == "trend":
        return np.arange(n, dtype=float) + rng.standard_normal(n)
    raise AssertionError(kind)


def _arch(x: np.ndarray) -> tuple[float, float]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        row = optimal_block_length(x).iloc[0]
    return float(row["stationary"]), float(row["circular"])


KINDS = ("iid", "ar05", "ar09", "cauchy", "pareto", "ties", "trend")
LENGTHS = (11, 12, 13, 17, 30, 31, 64, 100, 333, 1_000, 4_097, 20_000)


@pytest.mark.parametrize("kind", KINDS)
def test_equals_arch(kind: str) -> None:
    rng = np.random.default_rng(sum(map(ord, kind)))
    for n in LENGTHS:
        for _ in range(3 if n <= 1_000 else 1):
            x = _series(rng, kind, n)
            want = _arch(x)
            got = optimal_blocks(x)
            for w, g in zip(want, got, strict=True):
                assert g == pytest.approx(w, rel=1e-9, abs=0.0), (kind, n, want, got)


def test_normal_scores_as_intervals_uses_them() -> None:
    """What intervals.block_length hands it (normal scores of the first 20,000 values) gives
    arch's circular length, and the wrapper keeps its floor of 1."""
    rng = np.random.default_rng(7)
    for x in (_ar1(rng, 25_000, 0.7), rng.exponential(size=5_000), _ar1(rng, 40, 0.2)):
        head = x[: iv.MAX_BLOCK_SAMPLE]
        scores = sps.norm.ppf(sps.rankdata(head, method="average") / (len(head) + 1))
        want = _arch(scores)[1]
        assert circular_block_length(scores) == pytest.approx(want, rel=1e-9, abs=0.0)
        assert iv.block_length(x) == pytest.approx(max(want, 1.0), rel=1e-9, abs=0.0)


def test_constant_and_short() -> None:
    """A constant series is NaN in both (the wrapper says 1); a series too short for arch's lags
    is refused here, and the wrapper gives 1 below MIN_DEPENDENCE_N without asking."""
    x = np.full(100, 3.0)
    want = _arch(x)
    got = optimal_blocks(x)
    assert all(np.isnan(want)) and all(np.isnan(got))
    assert iv.block_length(x) == 1.0
    with pytest.raises(ValueError, match="too short"):
        optimal_blocks(np.arange(10.0))
    assert iv.block_length(np.arange(float(iv.MIN_DEPENDENCE_N - 1))) == 1.0


def test_cap_and_dependence_order() -> None:
    """A strongly dependent series hits arch's cap ⌈min(3√n, n/3)⌉; a stronger AR(1) never gets
    a shorter block than a weaker one on the same shocks (the estimate follows dependence)."""
    rng = np.random.default_rng(3)
    trend = np.cumsum(rng.standard_normal(400))
    assert optimal_blocks(trend)[1] == pytest.approx(_arch(trend)[1], rel=1e-9)
    e = rng.standard_normal(5_000)
    blocks = []
    for phi in (0.0, 0.5, 0.9):
        x = np.empty_like(e)
        x[0] = e[0]
        for i in range(1, len(e)):
            x[i] = phi * x[i - 1] + e[i]
        blocks.append(circular_block_length(x))
    assert blocks[0] < blocks[1] < blocks[2]
