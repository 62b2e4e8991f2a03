"""Per-session figures of a run with multi-turn sessions (fairbench.plan.sessions), beside the
per-request ones: a user waits for the conversation, not for one request.

Definitions (population: the sessions whose first turn's intended time lies in the measurement
window, with every turn of theirs, wherever it fell; a session's turns are its records with one
`session_id`):

- `session_e2e` (ms): from the first turn's intended send (`t_intended_ns`, the planned
  arrival) to the last turn's `t_done_ns`, for a session whose every turn ended `ok`. A session
  that did not complete is right-censored at the last time any of its turns was seen (as an
  unfinished request is, fairbench.analysis.censored), so p50/p99 are Kaplan–Meier estimates
  with the order-statistic interval of fairbench.analysis.intervals (method and confidence
  given with each; a lower bound where the quantile falls in censored mass).
- `turns_completed`: turns that ended `ok`, summed and per session (mean); `complete`:
  sessions whose every turn ended `ok`. Counts, exact, so no interval.
- `steps`, `steps_completed`: a step is the calls of one (session, turn) — one call for a chat
  turn or an agent's plain step, k for an agent's fan-out — and is completed when every call
  of it ended `ok`. Counts, exact. (`turns` counts calls, i.e. requests.)
- `ttft_by_turn` (ms): TTFT of turn k (for an agent, of every call of step k) measured
  from when it became due (its `t_intended_ns`: turn k−1's completion plus think time),
  over the admitted turns k, censored as for requests.

Pure: records in, a dict out.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from fairbench.analysis import censored

__all__ = ["session_block", "session_observations"]


def _col(df: pd.DataFrame, name: str) -> np.ndarray:
    return df[name].to_numpy(dtype=np.float64, na_value=np.nan)


def session_observations(df: pd.DataFrame, timeout_s: float | None = None) -> censored.Observations:
    """Each session's E2E (ns) or its censoring time, observed where every turn ended ok, in
    the order of the sessions' starts."""
    turns = df[df["session_id"].notna()]
    if not len(turns):
        return censored.Observations(np.zeros(0), np.zeros(0, dtype=bool), np.zeros(0))
    seen = censored.last_seen_ns(turns, timeout_s)
    frame = pd.DataFrame(
        {
            "session": turns["session_id"].to_numpy(dtype=np.int64),
            "turn": turns["turn"].to_numpy(dtype=np.int64),
            "start": _col(turns, "t_intended_ns"),
            "done": _col(turns, "t_done_ns"),
            "seen": seen,
            "ok": (turns["status"] == "ok").to_numpy(),
        }
    )
    grouped = frame.sort_values(["session", "turn"]).groupby("session", sort=True)
    start = grouped["start"].first().to_numpy()
    complete = grouped["ok"].all().to_numpy()
    end = np.where(complete, grouped["done"].max().to_numpy(), grouped["seen"].max().to_numpy())
    time = np.fmax(np.nan_to_num(end - start, nan=0.0), 0.0)
    return censored.Observations(time, complete, start)


def session_block(
    df: pd.DataFrame,
    timeout_s: float | None = None,
    window_s: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """The sessions block of a summary (see the module docstring); {} without sessions.
    `df`: all the run's records; `window_s`: the measurement window, in s from t0."""
    if "session_id" not in df or not df["session_id"].notna().any():
        return {}
    turns = df[df["session_id"].notna()]
    if window_s is not None:
        first = turns["turn"].to_numpy(dtype=np.int64) == 1
        t = _col(turns, "t_intended_ns") / 1e9
        start = first & (t >= window_s[0]) & (t <= window_s[1])
        keep = turns["session_id"].isin(set(turns["session_id"][start].tolist()))
        turns = turns[keep.to_numpy(dtype=bool)]
        df = turns
        if not len(turns):
            return {}
    obs = session_observations(df, timeout_s)
    ok = (turns["status"] == "ok").to_numpy()
    per_session = pd.Series(ok).groupby(turns["session_id"].to_numpy()).sum()
    per_step = pd.Series(ok).groupby(
        [turns["session_id"].to_numpy(), turns["turn"].to_numpy(dtype=np.int64)]
    )
    block: dict[str, Any] = {
        "sessions": len(obs),
        "complete": int(obs.observed.sum()),
        "turns": len(turns),
        "turns_completed": int(ok.sum()),
        "turns_completed_mean": round(float(per_session.mean()), 4),
        "steps": int(per_step.ngroups),
        "steps_completed": int(per_step.all().sum()),
        "session_e2e_ms": {
            f"p{q}": censored.quantile_estimate(obs, q / 100).as_dict(1e-6) for q in (50, 99)
        },
        "ttft_by_turn_ms": {},
    }
    rows = censored.ttft_rows(turns, timeout_s)
    turn = turns["turn"].to_numpy(dtype=np.int64)
    for k in sorted(set(turn.tolist())):
        sel = rows.select(turn == k)
        block["ttft_by_turn_ms"][str(k)] = {
            f"p{q}": censored.quantile_estimate(sel, q / 100).as_dict(1e-6) for q in (50, 99)
        }
    return block
