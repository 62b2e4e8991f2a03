"""`Cols.memo`: a figure several others read is made once per group until `forget`."""

from __future__ import annotations

import numpy as np

from fairbench.analysis.columns import Cols


def test_memo_makes_once_per_group_until_forget() -> None:
    c = Cols(t=np.arange(6.0))
    made: list[str] = []

    def make(tag: str) -> str:
        made.append(tag)
        return tag

    a = np.array([1, 1, 0, 0, 1, 0], dtype=bool)
    b = ~a
    assert c.memo("x", a, lambda: make("a")) == "a"
    assert c.memo("x", a.copy(), lambda: make("again")) == "a"  # the same rows: kept
    assert c.memo("x", b, lambda: make("b")) == "b"  # other rows: their own
    assert c.memo("x", None, lambda: make("run")) == "run"
    assert c.memo("y", a, lambda: make("y")) == "y"  # another figure: its own
    assert made == ["a", "b", "run", "y"]
    c.forget()
    assert c.memo("x", a, lambda: make("after")) == "after"
