"""The queue-depth block skips sorting arrivals that already come in plan order (issue 35);
its figures are those of sorting them, in order or not."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from fairbench.analysis.blocks import queue_depth_block


def _frame(order: np.ndarray | None = None) -> pd.DataFrame:
    rng = np.random.default_rng(8)
    n = 5_000
    t = np.sort(rng.uniform(0, 60e9, n)).astype(np.int64)
    queue = rng.exponential(2e9, n).astype(np.int64)
    queue_col = pa.array(queue, mask=rng.random(n) < 0.1)  # some requests report none
    df = pd.DataFrame(
        {
            "t_intended_ns": pd.array(t, dtype=pd.ArrowDtype(pa.int64())),
            "queue_time_ns": pd.Series(queue_col, dtype=pd.ArrowDtype(pa.int64())),
        }
    )
    return df if order is None else df.iloc[order].reset_index(drop=True)


def _reference(df: pd.DataFrame, step_s: float = 1.0) -> dict[str, float]:
    queued = df["queue_time_ns"].notna().to_numpy()
    arrive = df["t_intended_ns"].to_numpy(dtype=float)[queued] / 1e9
    admit = arrive + df["queue_time_ns"].to_numpy(dtype=float, na_value=np.nan)[queued] / 1e9
    grid = np.arange(arrive.min(), arrive.max(), step_s)
    depth = np.searchsorted(np.sort(arrive), grid, side="right") - np.searchsorted(
        np.sort(admit), grid, side="right"
    )
    half = len(depth) // 2
    return {
        "mean_first_half": float(depth[:half].mean()),
        "variance_second_half": float(np.var(depth[half:])),
    }


def test_in_order_and_shuffled_equal_sorting() -> None:
    ordered = _frame()
    shuffled = _frame(np.random.default_rng(9).permutation(5_000))
    a, b = queue_depth_block(ordered), queue_depth_block(shuffled)
    assert a == b
    want = _reference(ordered)
    assert {k: a[k] for k in want} == want
