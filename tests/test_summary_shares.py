"""A share figure's population and indicator are made once for every group of the `metrics`
block, and a run already in time order is not sorted again per group (issue 35): the entries
are those of sorting each group's requests by time, whether or not the run came in order."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fairbench.analysis import metrics_block
from fairbench.analysis.columns import Cols
from fairbench.analysis.definitions import METRICS
from fairbench.analysis.intervals import share_interval

SHARES = [m for m in METRICS if m.share_of is not None and m.indicator is not None]


def _cols(t: np.ndarray) -> Cols:
    n = len(t)
    rng = np.random.default_rng(5)
    burst = (np.arange(n) // 50) % 3 == 0  # correlated in time: batch means see it
    return Cols(
        t=t,
        ok=np.ones(n, dtype=bool),
        met=burst | (rng.random(n) < 0.3),
        slack=np.where(burst, 0.5, 1.5) * rng.exponential(size=n),
        rejected=rng.random(n) < 0.05,
        unfinished=burst & (rng.random(n) < 0.5),
        ttft_o=rng.random(n) < 0.95,
        ttft_t=rng.exponential(size=n),
        ttft_x=np.ones(n, dtype=bool),
        slo_ttft=np.where(rng.random(n) < 0.5, 0.2, np.nan),
        tenant=rng.integers(0, 3, size=n),
    )


@pytest.mark.parametrize("in_order", [True, False])
def test_share_entries_equal_sorting_each_group(in_order: bool) -> None:
    n = 3_000
    t = np.sort(np.random.default_rng(6).uniform(0, 100, n))
    if not in_order:
        t = t[np.random.default_rng(7).permutation(n)]
    c = _cols(t)
    shares: metrics_block._Shares = {}
    assert SHARES
    for metric in SHARES:
        for mask in (None, c.tenant == 0, c.tenant != 1):
            got = metrics_block._entry(metric, c, mask, shares)
            pop = metric.share_of(c)  # type: ignore[misc]
            rows = pop if mask is None else pop & mask
            order = np.argsort(c.t[rows], kind="stable")
            score = None if metric.score is None else metric.score(c)[rows][order]
            want = share_interval(np.asarray(metric.indicator(c))[rows][order], scores=score)  # type: ignore[misc]
            assert {k: got[k] for k in want.fields()} == want.fields()
            assert got["n"] == int(rows.sum())
        assert shares[metric.name][2] is in_order


def test_indicator_made_once_per_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    c = _cols(np.linspace(0, 10, 500))
    made: list[str] = []
    inputs = metrics_block._share_inputs

    def counted(metric: Any, cols: Any, shares: Any) -> Any:
        if metric.name not in shares:
            made.append(metric.name)
        return inputs(metric, cols, shares)

    monkeypatch.setattr(metrics_block, "_share_inputs", counted)
    shares: metrics_block._Shares = {}
    for metric in SHARES:
        for k in range(3):
            metrics_block._entry(metric, c, c.tenant == k, shares)
    assert made == [m.name for m in SHARES]
