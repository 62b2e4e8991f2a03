"""A group's latencies are ordered from the whole run's order (Cols.sub_order, and the
summary's ITL max through summary._RunOrdered), not sorted again (issue 35): every figure must
be the one its own sort gives, ties included."""

from __future__ import annotations

import numpy as np

from fairbench.analysis import censored, summary
from fairbench.analysis.columns import Cols, sub_order


def _cols(n: int, seed: int) -> Cols:
    rng = np.random.default_rng(seed)
    time = np.round(rng.lognormal(3.0, 1.0, n), 1)  # rounded: many ties
    seen = rng.random(n) > 0.02  # a few unfinished: Kaplan–Meier and bounds too
    eligible = rng.random(n) > 0.05
    t = np.cumsum(rng.exponential(1e6, n))
    return Cols(ttft_t=time, ttft_o=seen, ttft_x=eligible, t=t)


def test_sub_order_sorts_the_group() -> None:
    rng = np.random.default_rng(1)
    values = rng.integers(0, 50, 5_000).astype(float)
    member = rng.random(5_000) < 0.3
    order = sub_order(np.argsort(values), member)
    assert np.array_equal(np.sort(order), np.arange(member.sum()))  # a permutation
    assert np.array_equal(values[member][order], np.sort(values[member]))


def test_group_figures_are_those_of_its_own_sort() -> None:
    cols = _cols(20_000, 7)
    whole = cols.obs("ttft", None)
    assert len(whole.sorted_time)  # the run's order, computed as every summary does
    cols.forget()  # the summary's order: the whole run's curves go, its order stays
    code = np.random.default_rng(3).integers(0, 4, 20_000)
    for k in range(4):
        mask = code == k
        got = cols.obs("ttft", mask)
        assert "_by_value" in got.__dict__  # read off the run's order, not sorted again
        own = censored.Observations(got.time, got.observed, got.t, ranked=True)
        assert np.array_equal(got.sorted_time, own.sorted_time)
        assert np.array_equal(got.score_acf, own.score_acf)
        for q in (0.5, 0.9, 0.99, 0.999):
            assert censored.quantile_estimate(got, q) == censored.quantile_estimate(own, q)


def _rows(n: int, seed: int, censored_share: float) -> censored.RowObservations:
    rng = np.random.default_rng(seed)
    time = np.round(rng.lognormal(3.0, 1.0, n), 0)  # rounded: most of them tied
    seen = rng.random(n) >= censored_share
    eligible = rng.random(n) > 0.05
    return censored.RowObservations(time, seen, eligible, np.cumsum(rng.exponential(1e6, n)))


def test_itl_max_groups_are_those_of_their_own_sort() -> None:
    for seed, share in ((1, 0.02), (2, 0.3), (3, 0.0)):
        rows = _rows(20_000, seed, share)
        ordered = summary._RunOrdered(rows)
        run = ordered.select()
        summary.latency_percentiles(run)  # the run's block: sorts only where some are censored
        code = np.random.default_rng(seed + 10).integers(0, 4, 20_000)
        for k in range(4):
            mask = code == k
            if k == 3:
                mask[:] = False
            got = ordered.select(mask)
            assert ("_by_value" in got.__dict__) == (share > 0)  # the run's order, if it sorted
            own = rows.select(mask)
            assert summary.latency_percentiles(got) == summary.latency_percentiles(own)
            if share > 0 and len(own):
                assert np.array_equal(got.sorted_time, own.sorted_time)
                for x, y in zip(got.km, own.km, strict=True):
                    assert x.tobytes() == y.tobytes()


def test_a_group_s_rows_by_index_are_its_mask_s() -> None:
    """Cols.obs and RowObservations.select take a group's rows by index (columns.rows_of):
    the arrays a boolean mask gives, element for element and dtype for dtype."""
    cols = _cols(20_000, 5)
    code = np.random.default_rng(4).integers(0, 3, 20_000)
    rows = censored.RowObservations(cols.ttft_t, cols.ttft_o, cols.ttft_x, cols.t)
    for k in range(3):
        mask = code == k
        keep = cols.ttft_x & mask
        for got in (cols.obs("ttft", mask), rows.select(mask)):
            assert got.t is not None
            for x, y in ((got.time, cols.ttft_t[keep]), (got.observed, cols.ttft_o[keep])):
                assert x.dtype == y.dtype and x.tobytes() == y.tobytes()
            assert got.t.tobytes() == cols.t[keep].tobytes()
