"""The summary builds its largest transient, the timeline, before the run's columns (Cols) are
held (issue 35): at 1.9M requests the timeline adds ~270 MB, and built after the columns and
the overall block it set the run's peak RSS on top of them (1,980 -> 1,810 MB rebuilt alone).
Each of the window's columns is still converted once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from test_summary_speed import small_sim

from fairbench.analysis import columns, frame_memo, summary
from fairbench.pipeline import run_scenario
from fairbench.run.rundir import RunOptions


def test_timeline_before_the_columns_and_each_column_converted_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    order: list[str] = []
    timeline, cols_of = summary.backlogged_fairness, columns.Cols.of.__func__  # type: ignore[attr-defined]

    def first(*args: Any, **kwargs: Any) -> Any:
        order.append("timeline")
        return timeline(*args, **kwargs)

    def then(cls: type, *args: Any, **kwargs: Any) -> Any:
        order.append("columns")
        return cols_of(cls, *args, **kwargs)

    conversions: Counter[str] = Counter()  # inside the summary's converted_once block
    memo = frame_memo.memo

    def counted(df: Any, key: Any, make: Any) -> Any:
        def made() -> Any:
            current = getattr(frame_memo._state, "current", None)
            if current is not None and current[0] is df:
                conversions[repr(key)] += 1
            return make()

        return memo(df, key, made)

    monkeypatch.setattr(summary, "backlogged_fairness", first)
    monkeypatch.setattr(columns.Cols, "of", classmethod(then))
    monkeypatch.setattr(frame_memo, "memo", counted)
    run_scenario(small_sim(), RunOptions(out=tmp_path / "run", progress=False))
    assert order == ["timeline", "columns"]
    made_twice = {k: n for k, n in conversions.items() if n > 1 and "floats" in k}
    assert not made_twice, made_twice
