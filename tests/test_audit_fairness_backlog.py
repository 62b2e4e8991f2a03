"""Known-truth audit of the waits the backlogged figures count (fairbench.analysis.backlog) and
of the run's service that the timeline spreads (summary's timeline input), each row against an
oracle written from backlog.py's docstring: the scheduler's report where there is one
([t_sent + passed_over, + backlog], none when never passed over), else the proxy from arrival
to first response or last sight for an admitted request, none for a rejected one."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from fairbench.analysis.backlog import wait_intervals

STATUSES = ("ok", "timeout", "cancelled", "rejected", "error")


def random_frame(seed: int, n: int, reported: str) -> pd.DataFrame:
    """Requests with every status; `reported`: which rows carry the scheduler's backlog."""
    rng = np.random.default_rng(seed)
    status = rng.choice(STATUSES, n)
    intended = np.sort(rng.integers(0, 10_000, n)).astype(float)
    sent = np.where(status == "rejected", np.nan, intended + rng.integers(0, 50, n))
    sent = np.where((status == "rejected") & (rng.random(n) < 0.5), intended, sent)
    streams = rng.random(n) < 0.8
    got_first = (status == "ok") | ((status != "rejected") & (rng.random(n) < 0.5))
    first = np.where(streams & got_first, sent + rng.integers(1, 500, n), np.nan)
    done = np.where(status == "ok", np.fmax(first, sent) + rng.integers(1, 500, n), np.nan)
    end = np.where(rng.random(n) < 0.5, np.fmax(done, sent) + rng.integers(0, 9, n), np.nan)
    backlog = np.where(rng.random(n) < 0.5, 0.0, rng.integers(1, 300, n).astype(float))
    passed = np.where(backlog > 0, rng.integers(0, 100, n).astype(float), 0.0)
    if reported == "none":
        backlog = passed = np.full(n, np.nan)
    elif reported == "some":
        keep = (rng.random(n) < 0.5) & np.isfinite(sent)
        backlog, passed = np.where(keep, backlog, np.nan), np.where(keep, passed, np.nan)
    else:
        backlog = np.where(np.isfinite(sent), backlog, np.nan)
    return pd.DataFrame(
        {
            "status": status,
            "t_intended_ns": intended,
            "t_sent_ns": sent,
            "t_first_token_ns": first,
            "t_first_byte_ns": first,
            "t_last_token_ns": first,
            "t_done_ns": done,
            "t_end_ns": end,
            "backlog_ns": backlog,
            "passed_over_ns": passed,
        }
    )


def oracle_wait(row: pd.Series, timeout_s: float | None) -> tuple[float, float, bool]:
    if math.isfinite(row.backlog_ns):  # the scheduler reported it
        if row.backlog_ns > 0:
            lo = row.t_sent_ns + row.passed_over_ns
            return lo, lo + row.backlog_ns, True
        return math.nan, math.nan, True
    if row.status == "rejected" or not math.isfinite(row.t_sent_ns):
        return math.nan, math.nan, False
    first = row.t_first_token_ns
    if not math.isfinite(first) and row.status == "ok":
        first = row.t_done_ns  # a response that streams no token: the whole response
    if math.isfinite(first):
        return row.t_intended_ns, first, False
    seen = math.nan  # last sight: the end, else the latest stage reached
    for name in ("t_end_ns", "t_done_ns", "t_last_token_ns", "t_first_token_ns", "t_sent_ns"):
        if math.isfinite(row[name]):
            seen = row[name]
            break
    if timeout_s is not None and row.status == "timeout":
        seen = max(seen, row.t_intended_ns + timeout_s * 1e9)
    return row.t_intended_ns, seen, False


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 100_000),
    n=st.integers(1, 60),
    reported=st.sampled_from(["all", "some", "none"]),
    timeout_s=st.sampled_from([None, 1e-6, 3e-6]),
)
def test_waits_equal_their_definition(
    seed: int, n: int, reported: str, timeout_s: float | None
) -> None:
    df = random_frame(seed, n, reported)
    lo, hi, known = wait_intervals(df, timeout_s)
    for i, row in enumerate(df.itertuples(index=False)):
        want = oracle_wait(df.iloc[i], timeout_s)
        got = (lo[i], hi[i], bool(known[i]))
        assert np.allclose(got[:2], want[:2], equal_nan=True) and got[2] == want[2], (
            row,
            got,
            want,
        )
