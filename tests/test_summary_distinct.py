"""The tenants present in a group are found by counting their codes (metrics.distinct), not by
np.unique's hash or sort of a million codes (issue 35): the same sorted values and dtype in
every case np.unique would see; and a group's mean slowdowns are computed once for the two
figures that read them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fairbench.analysis import definitions
from fairbench.analysis.columns import Cols
from fairbench.analysis.metrics import distinct


@pytest.mark.parametrize(
    "codes",
    [
        np.array([], dtype=np.int64),
        np.array([-1, 3, 3, 0, -1], dtype=np.int64),
        np.array([2, 2, 2], dtype=np.int32),
        np.array([5, 1, 9], dtype=np.uint8),
        np.array([-100, 100, 5], dtype=np.int8),  # the shift would wrap in int8
        np.array([-1, 127], dtype=np.int8),
        np.array([-7, 10**12, 4], dtype=np.int64),  # wider than the rows: np.unique's way
        np.random.default_rng(1).integers(-1, 4, size=10_000),
        np.array([True, False, True]),
        np.array([0.5, 0.5, 1.0]),
    ],
)
def test_distinct_is_np_unique(codes: np.ndarray) -> None:
    got, want = distinct(codes), np.unique(codes)
    assert got.dtype == want.dtype and np.array_equal(got, want)


def test_distinct_inverse_of_narrow_codes() -> None:
    from fairbench.analysis.metrics import distinct_inverse

    codes = np.array([-100, 100, 5, -100], dtype=np.int8)
    got, want = distinct_inverse(codes), np.unique(codes, return_inverse=True)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_slowdowns_once_per_group(monkeypatch: pytest.MonkeyPatch) -> None:
    n = 400
    rng = np.random.default_rng(2)
    c = Cols(
        e2e_x=np.ones(n, dtype=bool),
        e2e_t=rng.exponential(size=n),
        unloaded=np.full(n, 0.5),
        tenant=rng.integers(0, 3, size=n),
    )
    calls: list[Any] = []
    inner = definitions._tenant_slowdowns

    def counted(cols: Any, mask: Any) -> list[float]:
        calls.append(mask)
        return inner(cols, mask)

    monkeypatch.setattr(definitions, "_tenant_slowdowns", counted)
    mask = c.tenant != 2
    worst, jain = definitions._worst_slowdown(c, mask), definitions._jain_slowdown(c, mask)
    assert len(calls) == 1
    c.forget()
    assert definitions._worst_slowdown(c, mask) == worst
    assert definitions._jain_slowdown(c, None) is not None and len(calls) == 3
    assert jain == definitions._jain_slowdown(c, mask)
    per = inner(c, mask)
    assert len(per) == 2 and worst[0] == max(per) / min(per)
