"""A records frame's columns converted once while one summary is built (issue 35).

Why: the summary's blocks each read the same columns of the window's frame, and each read was
a fresh conversion: an Arrow float column to numpy (`censored._col` alone 135 times), the
client's last-seen time (6 columns, 12 times), and worst, the string columns (tenant, class,
status) to a Python str per request, then compared per group as objects. On a 10-minute fleet
run (1.9M requests) those conversions were about 6 of the summary's 23 CPU seconds.

Inside `converted_once(df)` (build_summary's body), what is derived from that very frame object
is kept and handed out again; any other frame, or any call outside, converts as before. Kept
arrays are read-only, so a caller that would edit one in place fails loudly instead of changing
what the next reader gets. The frame must not change while the block runs (the summary only
reads it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

T = TypeVar("T")

_state = threading.local()  # (frame, memo) of the block running on this thread


@contextmanager
def converted_once(df: pd.DataFrame) -> Iterator[None]:
    """Keep what is derived from `df` (and only `df`) until the block ends."""
    outer = getattr(_state, "current", None)
    _state.current = (df, {})
    try:
        yield
    finally:
        _state.current = outer


def memo(df: pd.DataFrame, key: Any, make: Callable[[], T]) -> T:
    """`make()`, kept under `key` while `converted_once(df)` runs (arrays made read-only)."""
    current = getattr(_state, "current", None)
    if current is None or current[0] is not df:
        return make()
    store = current[1]
    if key not in store:
        value = make()
        for array in value if isinstance(value, tuple) else (value,):
            if isinstance(array, np.ndarray):
                array.flags.writeable = False
        store[key] = value
    return store[key]  # type: ignore[no-any-return]


def floats(df: pd.DataFrame, name: str) -> np.ndarray:
    """The column as float64, NaN for a missing value."""
    return memo(df, ("floats", name), lambda: df[name].to_numpy(dtype=np.float64, na_value=np.nan))


def equals(df: pd.DataFrame, name: str, value: str) -> np.ndarray:
    """Rows whose string column `name` is `value` (a missing value is not)."""
    return memo(df, ("equals", name, value), lambda: _equals(df[name], value))


def _equals(values: pd.Series, value: str) -> np.ndarray:
    return np.asarray((values == value).fillna(False).to_numpy(), dtype=bool)


def codes(df: pd.DataFrame, name: str) -> tuple[np.ndarray, list[str]]:
    """The string column as (codes, names): `names` its distinct values, sorted, and each row's
    index into them (−1 for a missing value). Compares and group masks on int codes, where a
    str per row made Python objects of the whole column: `names[k]` for `codes == k` is exactly
    `sorted(set(column))` and `column == name`."""
    return memo(df, ("codes", name), lambda: sorted_codes(df[name]))


def arrow_strings(values: pd.Series) -> pa.Array | pa.ChunkedArray | None:
    """The column as an Arrow string array where it is Arrow strings underneath (a records
    frame's ArrowDtype, or pandas' pyarrow-backed str dtype, as read_parquet gives), else None:
    codes are then taken in Arrow, with no Python str per row."""
    dtype = values.dtype
    arrow_backed = (
        isinstance(dtype, pd.ArrowDtype)
        and (
            pa.types.is_string(dtype.pyarrow_dtype) or pa.types.is_large_string(dtype.pyarrow_dtype)
        )
    ) or (isinstance(dtype, pd.StringDtype) and dtype.storage == "pyarrow")
    if not arrow_backed:
        return None
    arrow = pa.array(values)
    return arrow if pa.types.is_string(arrow.type) or pa.types.is_large_string(arrow.type) else None


def codes_of(values: pd.Series, names: Sequence[str]) -> np.ndarray:
    """Integer codes of the names (−1 for a value not among them or missing), vectorised: in
    Arrow where the column is (no Python str per record: 0.4 s a column at 1.9M, issue 35),
    pandas' pyarrow-backed str dtype included (a run directory's records as pd.read_parquet
    reads them under pandas 3: `decide.runs`, the report)."""
    return _codes(_held(values), names)


def sorted_codes(values: pd.Series) -> tuple[np.ndarray, list[str]]:
    """`codes` of a series, without the memo: in Arrow where the column is Arrow strings."""
    held = _held(values)
    if isinstance(held, np.ndarray):
        names = sorted(str(v) for v in set(held.tolist()) if isinstance(v, str))
    else:  # Arrow (an array, or a chunked one)
        names = sorted(str(v) for v in pc.unique(held.drop_null()).to_pylist())
    return _codes(held, names), names


def _held(values: pd.Series) -> pa.Array | pa.ChunkedArray | np.ndarray:
    """The column's strings as Arrow holds them (`arrow_strings`), else as Python objects."""
    arrow = arrow_strings(values)
    return np.asarray(values, dtype=object) if arrow is None else arrow


def _codes(held: pa.Array | pa.ChunkedArray | np.ndarray, names: Sequence[str]) -> np.ndarray:
    """Each value's index in `names`, −1 where it is not there or missing."""
    if isinstance(held, np.ndarray):
        # an index lookup, not a Categorical: pandas 4 refuses values outside its categories
        return pd.Index(list(names), dtype=object).get_indexer(held).astype(np.int64)
    found = pc.index_in(held, value_set=pa.array(list(names), type=held.type))
    return found.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)


def name_codes(df: pd.DataFrame, name: str, names: Sequence[str]) -> np.ndarray:
    """Each row's index into `names` (−1 for a value not among them): a code per row in the
    caller's order of names, from the sorted `codes`."""
    found, present = codes(df, name)
    where = {n: k for k, n in enumerate(names)}
    table = np.array([where.get(n, -1) for n in present] + [-1], dtype=np.int64)
    return table[found]
