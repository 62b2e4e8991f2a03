"""Sessions in the plan: one arrival becomes a conversation's turns, and a turn becomes the
request as sent.

Why here: the plan decides everything it can up front (how many turns, think times, each
turn's new user text and output length) and records each turn's *earliest* time — the session's
arrival plus the think times before it, as if every turn completed instantly — so the plan stays
sorted and digestible. What it cannot decide (when a turn completes, how many tokens it returned)
the executor and the simulator supply at run time through `Conversation`, one rule for both.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from fairbench.plan.model import Plan, PlannedRequest
from fairbench.workload.lengths import sample_lengths
from fairbench.workload.models import Workload
from fairbench.workload.sessions import conversation_ids, output_ids, sample_seconds

__all__ = [
    "Conversation",
    "Steps",
    "expand_sessions",
    "number_sessions",
    "session_steps",
    "successors",
]

# random-stream purposes (fairbench.plan.materialize numbers 0..6)
_TURNS, _THINK, _PROMPT, _OUTPUT, _SEEDS = range(7, 12)
_DEFAULT_OUTPUT = 128


def _calls_per_step(wl: Workload, step: np.ndarray) -> np.ndarray:
    """Model calls in each step: k where an agent fans out (step numbers divisible by
    `fan_out.every`, never the first), else 1."""
    calls = np.ones(len(step), dtype=np.int64)
    agent = wl.session.agent if wl.session is not None else None
    if agent is not None and agent.fan_out is not None:
        calls[(step % agent.fan_out.every) == 0] = agent.fan_out.k
    return calls


def expand_sessions(
    out: dict[str, np.ndarray],
    workloads: list[tuple[int, Workload]],
    stream: object,
    tenant_index: int,
) -> dict[str, np.ndarray]:
    """One tenant's rows with every session row expanded into its turns (a chat) or its steps'
    calls (an agent: a fan-out step is k rows of one `turn`, in branch order).

    `out` is the tenant's rows as `materialize` fills them (one per arrival); `workloads` the
    (code, workload) pairs of the scenario; `stream(purpose, workload_code)` the tenant's named
    random stream. Rows of a sessionless workload stay as they are (turn 0, session -1). Adds the
    columns session_key (tenant, row), turn, think_ns, context_limit. Think (tool) times are
    drawn per step, the new text, output length and seed per call, so a chat's plan is what it
    was before agents existed."""
    n = len(out["t"])
    steps = np.zeros(n, dtype=np.int64)
    limit = np.zeros(n, dtype=np.int32)
    by_code = dict(workloads)
    for code, wl in workloads:
        if wl.session is None:
            continue
        rows = np.flatnonzero(out["workload"] == code)
        if not len(rows):
            continue
        counts = wl.session.agent.steps if wl.session.agent is not None else wl.session.turns
        assert counts is not None  # fairbench.workload.sessions.session_problems
        steps[rows] = np.maximum(sample_lengths(counts, stream(_TURNS, code), len(rows)), 1)  # type: ignore[operator]
        limit[rows] = wl.session.context_limit or 0
    # the steps: one per session turn (a sessionless row is one step of turn 0)
    per = np.maximum(steps, 1)
    step_base = np.repeat(np.arange(n), per)  # each step's session (its first row)
    first_step = np.concatenate([[0], np.cumsum(per)[:-1]]).astype(np.int64)
    step_turn = np.arange(len(step_base)) - np.repeat(first_step, per) + 1
    step_turn = np.where(np.repeat(steps, per) > 0, step_turn, 0)
    step_wl = out["workload"][step_base]
    calls = np.ones(len(step_base), dtype=np.int64)
    step_think = np.zeros(len(step_base), dtype=np.float64)
    for code, wl in workloads:
        if wl.session is None:
            continue
        at = np.flatnonzero(step_wl == code)
        calls[at] = _calls_per_step(wl, step_turn[at])
        later = at[step_turn[at] > 1]
        if len(later):
            wait = wl.session.agent.tool_time if wl.session.agent else wl.session.think_time
            step_think[later] = sample_seconds(wait, stream(_THINK, code), len(later))  # type: ignore[operator]
    # earliest time of a step: the session's arrival plus every think time before it
    think_ns = np.rint(step_think * 1e9).astype(np.int64)
    cum = np.cumsum(think_ns)
    step_since = cum - np.repeat(cum[first_step], per)
    # the rows: one per call
    row_step = np.repeat(np.arange(len(step_base)), calls)
    base = step_base[row_step]
    grown = {key: value[base] for key, value in out.items()}
    grown["turn"] = step_turn[row_step].astype(np.int32)
    grown["session_key"] = np.where(
        grown["turn"] > 0, (np.int64(tenant_index) << 40) | base.astype(np.int64), -1
    )
    grown["context_limit"] = limit[base]
    # a session's rows after its very first: their own new text and output
    later_rows = np.ones(len(base), dtype=bool)
    later_rows[np.concatenate([[0], np.flatnonzero(np.diff(base)) + 1])] = False
    for code in sorted({c for c, wl in workloads if wl.session is not None}):
        wl = by_code[code]
        later = np.flatnonzero((grown["workload"] == code) & later_rows & (grown["turn"] > 0))
        k = len(later)
        if not k:
            continue
        grown["prompt_tokens"][later] = np.maximum(
            sample_lengths(wl.prompt_tokens, stream(_PROMPT, code), k),  # type: ignore[operator]
            1,
        )
        grown["max_tokens"][later] = (
            np.full(k, _DEFAULT_OUTPUT, dtype=np.int64)
            if wl.output_tokens is None
            else sample_lengths(wl.output_tokens, stream(_OUTPUT, code), k)  # type: ignore[operator]
        )
        grown["prompt_seed"][later] = stream(_SEEDS, code).integers(  # type: ignore[operator]
            0, np.iinfo(np.uint64).max, size=k, dtype=np.uint64, endpoint=True
        )
        grown["prefix_group"][later] = -1  # the shared prefix opens a conversation only
        grown["prefix_tokens"][later] = 0
    grown["think_ns"] = think_ns[row_step]
    grown["t"] = grown["t"] + step_since[row_step] / 1e9
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


@dataclass(frozen=True)
class Steps:
    """A plan's sessions as steps: a step is the calls of one (session, turn) — one for a chat
    turn, k for an agent's fan-out — and the next step is due when every call of this one
    completed, plus its think (tool) time. Rows of a step are in branch order (plan order)."""

    step_of: np.ndarray  # row -> its step (-1: outside any session)
    starts: np.ndarray  # step -> where its rows begin in `rows` (one more entry at the end)
    rows: np.ndarray  # every step's rows, step after step
    next: np.ndarray  # step -> the next step of its session (-1: the last)

    def calls(self, step: int) -> np.ndarray:
        return self.rows[self.starts[step] : self.starts[step + 1]]

    def chain(self, step: int) -> list[int]:
        """The rows of this step and of every later step of its session."""
        out: list[int] = []
        while step >= 0:
            out.extend(int(r) for r in self.calls(step))
            step = int(self.next[step])
        return out


def session_steps(plan: Plan) -> Steps:
    """The steps of a plan's sessions (see `Steps`); none in a plan without sessions."""
    n = len(plan)
    step_of = np.full(n, -1, dtype=np.int64)
    if plan.sessions is None:
        empty = np.zeros(0, dtype=np.int64)
        return Steps(step_of, np.zeros(1, dtype=np.int64), empty, empty)
    sid, turn = plan.sessions["session_id"], plan.sessions["turn"]
    rows = np.flatnonzero(sid >= 0)
    rows = rows[np.lexsort((rows, turn[rows], sid[rows]))]
    new = np.ones(len(rows), dtype=bool)
    if len(rows) > 1:
        new[1:] = (sid[rows[1:]] != sid[rows[:-1]]) | (turn[rows[1:]] != turn[rows[:-1]])
    starts = np.flatnonzero(new)
    step_of[rows] = np.cumsum(new) - 1
    first = rows[starts]
    nxt = np.full(len(starts), -1, dtype=np.int64)
    same = sid[first[1:]] == sid[first[:-1]]
    nxt[:-1][same] = np.flatnonzero(same) + 1
    return Steps(step_of, np.append(starts, len(rows)).astype(np.int64), rows, nxt)


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

    def joined(self, calls: list[tuple[PlannedRequest, int]]) -> None:
        """A step's calls all completed: each call's new text and output join the
        conversation in branch order (an agent merging its fan-out's results), so every call of
        the next step begins with all of them."""
        for req, output_tokens in calls:
            self.completed(req, output_tokens)
