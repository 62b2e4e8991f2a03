"""The windowed exact ranks equal the ranks from every binomial tail (issue 35).

Why: intervals._exact_ranks computes the binomial tails only near n·q; each tail value is the
same computed alone, so the ranks must be the same, bit for bit, as from all n + 2 of them.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from fairbench.analysis import intervals as iv


def _every_rank(n: int, q: float, tail: float) -> tuple[float, float]:
    """The computation on all n + 2 ranks (the code before the window)."""
    return iv._exact_ranks_on(n, q, tail, 0, n + 1) or (math.nan, math.nan)


@pytest.mark.parametrize("q", [0.001, 0.01, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999])
def test_window_gives_the_same_ranks(q: float) -> None:
    for n in [*range(1, 400), 1_000, 1_234, 5_000, 20_000, 96_097]:
        for tail in (0.005, 0.025, 0.05, 0.1587):
            assert iv._exact_ranks(n, q, tail) == _every_rank(n, q, tail), (n, q, tail)


def test_every_rank_is_the_binomial_rule() -> None:
    """The reference itself: the last rank with P(Bin ≥ l) ≥ 1 − tail, by hand at n = 100."""
    n, q, tail = 100, 0.5, 0.025
    ranks = np.arange(0, n + 2)
    g = sps.binom.sf(ranks - 1, n, q)
    l0 = int(np.flatnonzero((g >= 1 - tail) & (ranks >= 1))[-1])
    lower, _ = _every_rank(n, q, tail)
    assert l0 <= lower < l0 + 1
