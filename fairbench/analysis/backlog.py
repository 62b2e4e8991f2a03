"""When each request waited for the scheduler: the backlog the fairness figures count.

Why: a tenant is backlogged only while the scheduler has passed one of its requests over (an
admission pass ended while it waited, or it was preempted and waits); waiting for the next step
boundary, or for one's own prefill, is not contention. Counting from arrival to first token made
a high-rate tenant backlogged all the time and read demand as unfairness (issue 33).

Two sources, per request:
- `scheduler`: the target reported it (`passed_over_ns`, `backlog_ns`: the reference scheduler,
  simulated or live, and fairbench's gateway in front of any engine, its queue's record put in
  front of the engine's: run/executor.py `_behind_gateway`). The wait is
  [t_sent + passed_over, + backlog]: exact for a request that waited once; a preempted
  request's later waits are put right after its first.
- `proxy`: no report (an opaque engine, or a request that ended before the server said): the wait
  from arrival to first response (or to when it was last seen), the figure's earlier reading.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fairbench.analysis import censored, frame_memo


def wait_intervals(
    df: pd.DataFrame, timeout_s: float | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start ns, end ns, from the scheduler) per request; NaN where the request never waited
    for the scheduler (never passed over, or rejected). Kept while a summary is built: its
    timeline and its backlog basis both read it (frame_memo)."""
    return frame_memo.memo(df, ("wait_intervals", timeout_s), lambda: _waits(df, timeout_s))


def _waits(df: pd.DataFrame, timeout_s: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    col = lambda name: censored._col(df, name)  # noqa: E731
    seen = censored.last_seen_ns(df, timeout_s)
    first = censored.first_response_ns(df)
    admitted = censored.admitted(df)
    arrival = col("t_intended_ns")
    proxy_end = np.where(admitted, np.where(np.isnan(first), seen, first), np.nan)
    if "backlog_ns" in df.columns:
        backlog, passed = col("backlog_ns"), col("passed_over_ns")
    else:
        backlog = passed = np.full(len(df), np.nan)
    known = np.isfinite(backlog)
    sent = np.where(np.isnan(col("t_sent_ns")), arrival, col("t_sent_ns"))
    # a rejected request never waited: NaN at both ends (its start read its arrival)
    start = np.where(known, np.where(backlog > 0, sent + passed, np.nan), arrival)
    start[~known & ~admitted] = np.nan
    end = np.where(known, np.where(backlog > 0, sent + passed + backlog, np.nan), proxy_end)
    return start, end, known
