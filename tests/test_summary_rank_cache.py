"""The binomial ranks of a percentile's interval are computed once per (n, q, tail) (issue 35):
a run's TTFT and E2E (and usually TPOT) have the same n in each group, and each computation is
thousands of binomial tails at fleet size. The cached ranks are the ones computed afresh."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fairbench.analysis import intervals as iv


def test_ranks_computed_once_per_n_q_tail(monkeypatch: pytest.MonkeyPatch) -> None:
    iv._exact_ranks.cache_clear()
    calls: list[tuple[int, float, float]] = []
    on = iv._exact_ranks_on

    def counted(n: int, q: float, tail: float, a: int, b: int) -> Any:
        calls.append((n, q, tail))
        return on(n, q, tail, a, b)

    monkeypatch.setattr(iv, "_exact_ranks_on", counted)
    x = np.sort(np.random.default_rng(3).exponential(size=5_003))
    y = np.sort(np.random.default_rng(4).exponential(size=5_003))
    first = [iv.percentile_interval(x, q) for q in (0.5, 0.9, 0.99)]
    made = len(calls)
    again = [iv.percentile_interval(y, q) for q in (0.5, 0.9, 0.99)]
    assert made == 3 and len(calls) == made  # the second latency of the same n: no new tails
    iv._exact_ranks.cache_clear()
    fresh = [iv.percentile_interval(y, q) for q in (0.5, 0.9, 0.99)]
    assert len(calls) == 2 * made
    assert again == fresh and first != again
