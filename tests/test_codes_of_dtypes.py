"""`frame_memo.codes_of` and `frame_memo.sorted_codes` give the same codes whatever holds the
strings: a run directory's records read by pd.read_parquet (pandas 3's pyarrow-backed `str`),
the pipeline's ArrowDtype frame (string or large_string), or Python objects. The Arrow path is
the fast one (issue 35); what would break is a dtype taking it with other codes than the
object path gives (a missing value, or one not among the names, must read −1)."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pytest

from fairbench.analysis.frame_memo import arrow_strings, codes_of, sorted_codes

VALUES = ["b", None, "a", "zz", "b", "a"]
DTYPES = [
    object,
    "str",
    pd.ArrowDtype(pa.string()),
    pd.ArrowDtype(pa.large_string()),
    pd.StringDtype("python"),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_codes_are_the_object_paths_for_every_string_dtype(dtype: object) -> None:
    series = pd.Series(VALUES, dtype=dtype)
    plain = pd.Series(VALUES, dtype=object)
    assert codes_of(series, ["a", "b", "c"]).tolist() == [1, -1, 0, -1, 1, 0]
    assert codes_of(series, ["a", "b", "c"]).tolist() == codes_of(plain, ["a", "b", "c"]).tolist()
    codes, names = sorted_codes(series)
    assert names == ["a", "b", "zz"] and codes.tolist() == [1, -1, 0, 2, 1, 0]


def test_the_arrow_path_is_taken_where_arrow_holds_the_strings() -> None:
    assert arrow_strings(pd.Series(VALUES, dtype="str")) is not None
    assert arrow_strings(pd.Series(VALUES, dtype=pd.ArrowDtype(pa.large_string()))) is not None
    assert arrow_strings(pd.Series(VALUES, dtype=object)) is None
    assert arrow_strings(pd.Series([1, 2], dtype=pd.ArrowDtype(pa.int64()))) is None


def test_a_chunked_column_takes_the_arrow_path_too() -> None:
    """A column read from a file of several row groups is a chunked Arrow array: the codes
    are the one-chunk column's (a report of the quarterly pages once failed on it)."""
    chunked = pa.chunked_array([["b", None], ["a", "zz", "b", "a"]])
    series = pd.Series(pd.arrays.ArrowExtensionArray(chunked))
    assert isinstance(arrow_strings(series), pa.ChunkedArray)
    assert codes_of(series, ["a", "b", "c"]).tolist() == [1, -1, 0, -1, 1, 0]
    codes, names = sorted_codes(series)
    assert names == ["a", "b", "zz"] and codes.tolist() == [1, -1, 0, 2, 1, 0]
