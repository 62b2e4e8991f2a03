"""Sessions in the plan: one arrival becomes a conversation's turns, and a turn becomes the
request as sent.

Why here: the plan decides everything it can up front (how many turns, think times, each
turn's new user text and output length) and records each turn's *earliest* time — the session's
arrival plus the think times before it, as if every turn completed instantly — so the plan stays
sorted and digestible. What it cannot decide (when a turn completes, how many tokens it returned)
the executor and the simulator supply at run time through `Conversation`, one rule for both.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from fairbench.plan.model import Plan, PlannedRequest
from fairbench.workload.lengths import sample_lengths
from fairbench.workload.models import Workload
from fairbench.workload.sessions import conversation_ids, output_ids, sample_seconds

__all__ = ["Conversation", "expand_sessions", "number_sessions", "successors"]

# random-stream purposes (fairbench.plan.materialize numbers 0..6)
_TURNS, _THINK, _PROMPT, _OUTPUT, _SEEDS = range(7, 12)
_DEFAULT_OUTPUT = 128


def expand_sessions(
    out: dict[str, np.ndarray],
    workloads: list[tuple[int, Workload]],
    stream: object,
    tenant_index: int,
) -> dict[str, np.ndarray]:
    """One tenant's rows with every session row expanded into its turns.

    `out` is the tenant's rows as `materialize` fills them (one per arrival); `workloads` the
    (code, workload) pairs of the scenario; `stream(purpose, workload_code)` the tenant's named
    random stream. Rows of a sessionless workload stay as they are (turn 0, session -1). Adds the
    columns session_key (tenant, row), turn, think_ns, context_limit."""
    n = len(out["t"])
    turns = np.zeros(n, dtype=np.int64)
    limit = np.zeros(n, dtype=np.int32)
    extra: dict[int, dict[str, np.ndarray]] = {}
    for code, wl in workloads:
        if wl.session is None:
            continue
        rows = np.flatnonzero(out["workload"] == code)
        if not len(rows):
            continue
        count = np.maximum(sample_lengths(wl.session.turns, stream(_TURNS, code), len(rows)), 1)  # type: ignore[operator]
        turns[rows] = count
        limit[rows] = wl.session.context_limit or 0
        k = int((count - 1).sum())  # the later turns of these sessions
        prompt = np.maximum(sample_lengths(wl.prompt_tokens, stream(_PROMPT, code), k), 1)  # type: ignore[operator]
        if wl.output_tokens is None:
            output = np.full(k, _DEFAULT_OUTPUT, dtype=np.int64)
        else:
            output = sample_lengths(wl.output_tokens, stream(_OUTPUT, code), k)  # type: ignore[operator]
        extra[code] = {
            "think": sample_seconds(wl.session.think_time, stream(_THINK, code), k),  # type: ignore[operator]
            "prompt": prompt,
            "output": output,
            "seed": stream(_SEEDS, code).integers(  # type: ignore[operator]
                0, np.iinfo(np.uint64).max, size=k, dtype=np.uint64, endpoint=True
            ),
        }
    reps = np.maximum(turns, 1)
    base = np.repeat(np.arange(n), reps)  # each new row's session (its turn-1 row)
    first = np.concatenate([[0], np.cumsum(reps)[:-1]]).astype(np.int64)
    turn = np.arange(len(base)) - np.repeat(first, reps) + 1
    grown = {key: value[base] for key, value in out.items()}
    grown["turn"] = np.where(np.repeat(turns, reps) > 0, turn, 0).astype(np.int32)
    grown["session_key"] = np.where(
        grown["turn"] > 0, (np.int64(tenant_index) << 40) | base.astype(np.int64), -1
    )
    grown["context_limit"] = limit[base]
    think = np.zeros(len(base), dtype=np.float64)
    for code, draws in extra.items():
        later = np.flatnonzero((grown["workload"] == code) & (grown["turn"] > 1))
        think[later] = draws["think"]
        grown["prompt_tokens"][later] = draws["prompt"]
        grown["max_tokens"][later] = draws["output"]
        grown["prompt_seed"][later] = draws["seed"]
        grown["prefix_group"][later] = -1  # the shared prefix opens a conversation only
        grown["prefix_tokens"][later] = 0
    think_ns = np.rint(think * 1e9).astype(np.int64)
    # earliest time: the session's arrival plus every think time before this turn
    since = np.cumsum(think_ns) - np.repeat(np.cumsum(think_ns)[first], reps)
    grown["think_ns"] = think_ns
    grown["t"] = grown["t"] + since / 1e9
    return grown


def number_sessions(keys: np.ndarray) -> np.ndarray:
    """Session ids 0, 1, … in order of each session's first row (-1 stays -1)."""
    ids = np.full(len(keys), -1, dtype=np.int64)
    has = keys >= 0
    if has.any():
        unique, first, inverse = np.unique(keys[has], return_index=True, return_inverse=True)
        rank = np.empty(len(unique), dtype=np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(len(unique))
        ids[has] = rank[inverse]
    return ids


def successors(plan: Plan) -> np.ndarray:
    """Row of each row's next turn in its session (-1: none)."""
    nxt = np.full(len(plan), -1, dtype=np.int64)
    if plan.sessions is None:
        return nxt
    sid = plan.sessions["session_id"]
    rows = np.flatnonzero(sid >= 0)
    order = rows[np.lexsort((plan.sessions["turn"][rows], sid[rows]))]
    same = sid[order[1:]] == sid[order[:-1]]
    nxt[order[:-1][same]] = order[1:][same]
    return nxt


class Conversation:
    """One session's conversation so far: what turn k's prompt is, given turns 1..k−1.

    `as_sent(turn)` is the request as it goes out (its whole prompt rendered, prompt_tokens its
    length); `completed(turn, output_tokens)` appends the turn's user text and its output, the
    token count the target actually returned."""

    def __init__(self) -> None:
        self.history: list[np.ndarray] = []

    def as_sent(self, req: PlannedRequest) -> PlannedRequest:
        ids = conversation_ids(self.history, req.user_ids(), req.context_limit)
        return replace(req, prompt_tokens=len(ids), conversation=ids)

    def completed(self, req: PlannedRequest, output_tokens: int) -> None:
        """`req` as planned (its prompt_tokens the new user text)."""
        self.history.append(req.user_ids())
        self.history.append(output_ids(req.prompt_seed, output_tokens))
