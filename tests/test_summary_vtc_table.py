"""The VTC table (fairness.service_difference) reads a tick's arrivals as one slice where they
come in time order, and the clients' codes by counting where they are ints (issue 35): the
same table as masking every tick and np.unique, in order or not, int or str clients."""

from __future__ import annotations

import numpy as np
import pytest

from fairbench.analysis import fairness
from fairbench.analysis.metrics import distinct_inverse


def _reference(client, arrival, start, end, cost, duration):  # type: ignore[no-untyped-def]
    """The table as computed before: a mask per tick, np.unique's codes."""
    clients, code = np.unique(client, return_inverse=True)
    serves = (end >= 0.0) & ((end - start) >= 1e-5)
    ticks = (duration / 20) * np.arange(1, 20)
    out = np.empty(19)
    for i, x in enumerate(ticks):
        lo, hi = x - 2.5, x + 2.5
        got = np.zeros(len(clients))
        np.add.at(
            got,
            code[serves],
            fairness._service_in(start[serves], end[serves], cost[serves], lo, hi),
        )
        asked = np.zeros(len(clients))
        arrived = (arrival >= lo) & (arrival <= hi)
        np.add.at(asked, code[arrived], cost[arrived])
        s, r = got / 5.0, asked / 5.0
        out[i] = np.minimum(s.max() - s, np.abs(r - s)).sum()
    return out


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("names", [False, True])
def test_table_equals_masking_every_tick(shuffle: bool, names: bool) -> None:
    rng = np.random.default_rng(13)
    n = 20_000
    arrival = np.sort(rng.uniform(0, 100, n))
    start = arrival + rng.exponential(0.5, n)
    end = start + rng.exponential(2.0, n)
    cost = rng.integers(10, 500, n).astype(float)
    client = rng.integers(-1, 4, n)
    if names:
        client = np.array(["a", "b", "c", "d", "e"])[client + 1]
    if shuffle:
        p = rng.permutation(n)
        client, arrival, start, end, cost = client[p], arrival[p], start[p], end[p], cost[p]
    got = fairness.service_difference(
        client, arrival, start, end, cost, 100.0, warmup_s=0.0, window_s=5.0, min_end_s=0.0
    )
    want = _reference(client, arrival, start, end, cost, 100.0)
    assert got.diff.tobytes() == want.tobytes()


@pytest.mark.parametrize(
    "codes",
    [
        np.array([3, -1, 3, 0], dtype=np.int64),
        np.array([7], dtype=np.int32),
        np.array([], dtype=np.int64),
        np.array([5, 10**12, 5]),
        np.array(["b", "a", "b"]),
    ],
)
def test_distinct_inverse_is_np_unique(codes: np.ndarray) -> None:
    got, want = distinct_inverse(codes), np.unique(codes, return_inverse=True)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and np.array_equal(g, w)
