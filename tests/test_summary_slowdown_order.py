"""The slowdown figures divide E2E by E2E alone once per run (fairness_ci.slowdowns, the
columns' memo) and skip the argsort by time where the group already is in time order (issue
35): the same intervals whether the requests come in time order or shuffled."""

from __future__ import annotations

import numpy as np

from fairbench.analysis import fairness_ci
from fairbench.analysis.columns import Cols
from fairbench.analysis.definitions import _jain_slowdown, _worst_slowdown


def _cols(perm: np.ndarray | None = None) -> Cols:
    rng = np.random.default_rng(14)
    n = 6_000
    t = np.sort(rng.uniform(0, 600e9, n))  # distinct send times
    ar = np.zeros(n)
    for i in range(1, n):  # backlog episodes: correlated slowdowns
        ar[i] = 0.5 * ar[i - 1] + rng.normal(0, 0.3)
    tenant = rng.integers(0, 3, n)
    unloaded = rng.uniform(0.5e9, 1.5e9, n)
    e2e = unloaded * np.exp(np.abs(ar)) * (1 + 0.5 * (tenant == 2))
    p = np.arange(n) if perm is None else perm
    return Cols(
        ok=np.ones(n, dtype=bool),
        t=t[p],
        tenant=tenant[p],
        unloaded=unloaded[p],
        e2e_t=e2e[p],
        e2e_x=np.ones(n, dtype=bool),
        ttft_t=0.2 * e2e[p],
        ttft_x=np.ones(n, dtype=bool),
        solo_ttft=np.full(3, np.nan),
        solo_ttft_se=np.full(3, np.nan),
    )


def test_in_order_and_shuffled_give_the_same_intervals() -> None:
    c = _cols()
    shuffled = _cols(np.random.default_rng(15).permutation(len(c)))
    for mask_of in (lambda x: None, lambda x: x.tenant != 1):
        a = fairness_ci.slowdown_intervals(c, mask_of(c))
        b = fairness_ci.slowdown_intervals(shuffled, mask_of(shuffled))
        assert a == b and not a[0].declined
    per = [float((c.e2e_t / c.unloaded)[c.tenant == k].mean()) for k in range(3)]
    assert _worst_slowdown(c, None) == (max(per) / min(per), False)
    assert _jain_slowdown(c, None)[0] > 0


def test_slowdowns_made_once_per_run() -> None:
    c = _cols()
    first = fairness_ci.slowdowns(c)
    assert fairness_ci.slowdowns(c) is first
    assert np.array_equal(first, c.e2e_t / c.unloaded)
