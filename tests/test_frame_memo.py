"""frame_memo: a summary's columns converted once, and the codes that replace str compares
(issue 35). The memo must give the same values as a fresh conversion, only for the frame of
the block, and fail loudly on an in-place edit."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from fairbench.analysis import censored, frame_memo
from fairbench.analysis.timeline import build_timeline


def _frame(arrow: bool | str) -> pd.DataFrame:
    rng = np.random.default_rng(3)
    n = 500
    tenants = rng.choice(["zeta", "alpha", "mid", "b"], n)
    status = rng.choice(["ok", "timeout", "rejected", "cancelled"], n, p=[0.7, 0.1, 0.1, 0.1])
    done = rng.uniform(0, 1e9, n)
    table = pa.table(
        {
            "tenant": pa.array(tenants.tolist()),
            "status": pa.array(status.tolist()),
            "t_done_ns": pa.array(np.where(status == "ok", done, np.nan), from_pandas=True),
        }
    )
    if arrow == "object":
        return table.to_pandas().astype({"tenant": object, "status": object})
    if arrow:
        return table.to_pandas(types_mapper=pd.ArrowDtype)
    return table.to_pandas()  # pandas' own str dtype (pyarrow-backed), as read_parquet gives


@pytest.mark.parametrize("arrow", [True, False, "object"])
def test_codes_are_sorted_set_and_compares(arrow: bool | str) -> None:
    df = _frame(arrow)
    codes, names = frame_memo.codes(df, "tenant")
    objects = np.asarray(df["tenant"], dtype=object)
    assert names == sorted(set(objects.tolist()))
    for k, name in enumerate(names):
        assert np.array_equal(codes == k, objects == name)
    order = ["mid", "nobody", "zeta"]
    mine = frame_memo.name_codes(df, "tenant", order)
    assert np.array_equal(mine == 0, objects == "mid")
    assert np.array_equal(mine == 2, objects == "zeta")
    assert np.array_equal(mine == -1, ~np.isin(objects, ["mid", "zeta"]))
    assert np.array_equal(
        frame_memo.equals(df, "status", "ok"), (df["status"] == "ok").to_numpy(dtype=bool)
    )


def test_memo_only_inside_the_block_and_only_for_its_frame() -> None:
    df, other = _frame(True), _frame(True)
    outside = censored.last_seen_ns(df)
    assert outside is not censored.last_seen_ns(df)  # no memo outside a block
    with frame_memo.converted_once(df):
        kept = censored.last_seen_ns(df)
        assert kept is censored.last_seen_ns(df)  # converted once
        assert np.array_equal(kept, outside, equal_nan=True)
        assert censored.last_seen_ns(other) is not censored.last_seen_ns(other)
        with pytest.raises(ValueError):  # a kept array is read-only: no silent edit
            kept[0] = 1.0
    assert censored.last_seen_ns(df) is not kept


def test_timeline_from_codes_equals_from_names() -> None:
    rng = np.random.default_rng(5)
    n = 300
    client = rng.choice(["b", "a", "c"], n)
    arrival = rng.uniform(0, 10, n)
    wait_end = arrival + rng.uniform(0, 1, n)
    start = wait_end + rng.uniform(0, 0.5, n)
    end = start + rng.uniform(0, 2, n)
    cost = rng.uniform(1, 100, n)
    weights = {"a": 1.0, "b": 2.0, "c": 0.5}
    by_name = build_timeline(client, weights, arrival, wait_end, start, end, cost)
    names = sorted(set(client.tolist()))
    codes = np.searchsorted(np.array(names), client)
    by_code = build_timeline(codes, weights, arrival, wait_end, start, end, cost, names=names)
    assert by_code.tenants == by_name.tenants
    for field in ("grid", "times", "key", "service", "rate", "offsets", "wait_lo", "wait_hi"):
        assert np.array_equal(getattr(by_code, field), getattr(by_name, field))


def test_report_window_is_the_masked_frame() -> None:
    from fairbench.report.run import _window

    rng = np.random.default_rng(7)
    ordered = pd.DataFrame({"t_intended_ns": np.sort(rng.integers(0, 10**10, 1000)), "x": 1})
    shuffled = ordered.sample(frac=1.0, random_state=1)
    for df in (ordered, shuffled, ordered.iloc[:0]):
        t = df["t_intended_ns"] / 1e9
        for lo, hi in ((2.0, 7.5), (0.0, 10.0), (11.0, 12.0), (t.iloc[3] if len(t) else 0, 5.0)):
            want = df[(t >= lo) & (t <= hi)]
            pd.testing.assert_frame_equal(_window(df, t, lo, hi), want)
