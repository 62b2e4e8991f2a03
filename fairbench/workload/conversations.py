"""Traces with conversation ids, replayed as sessions: the replay rule (the readers are in
fairbench.workload.traces, with the other formats).

Why a module of its own: a trace row is one request, but the rows of one conversation are not
independent — turn k+1 was sent after the user read turn k's answer, and its prompt resent the
conversation. Replaying them open loop at their timestamps would send turn k+1 before turn k
finished whenever the target is slower than the original service, and a prefix cache would see
no conversation. So the turns of a conversation become one session (fairbench.plan.sessions),
with the existing session rules, and what the trace knows decides the rest.

Three formats carry conversation ids:

- **conversation** (ours; docs/sessions.md): JSONL or CSV that a platform team can export from
  its own logs. Columns, by name: `timestamp` (seconds, from any origin, or an ISO 8601
  date-time), `conversation_id`, `input_tokens` (the turn's *new* text; or the whole prompt,
  with the trace's `turn_input: whole`), `output_tokens`, and optionally `turn` (orders the
  turns of a conversation; else the timestamps do) and `latency_s` (the turn's end-to-end
  time as recorded, request sent to last token).
- **burstgpt** with `sessions: true`: BurstGPT v2.0's `BurstGPT_3.csv` / `_without_fails_3.csv`
  (github.com/HPMLL/BurstGPT, release v2.0, CC-BY-4.0), header
  `Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type`.
  `Session ID` is a UUID on `Conversation log` rows and blank on `API log` rows (those replay as
  independent requests); `Elapsed time` is the request's response time in seconds. Neither is
  defined in the BurstGPT README we could read; the header and the two meanings are as two
  independent downstream projects report them from the published file. Whether `Request
  tokens` counts the conversation's history is not documented either: `turn_input` decides.
- **bailian**: the Qwen-Bailian anonymous traces (github.com/alibaba-edu/
  qwen-bailian-usagetraces-anon, Apache-2.0; Wang et al., "KVCache Cache in the Wild", ATC
  2025), JSONL `{"chat_id", "parent_chat_id" (-1 for a conversation's first request),
  "timestamp" (seconds), "input_length", "output_length", "type", "turn", "hash_ids" (16-token
  blocks)}`. A request's conversation is the root of its `parent_chat_id` chain (a parent not
  in the file makes its child a root). Its `input_length` is the whole prompt, earlier turns
  included (the repository's docs/qa-context-growth-pattern.md), so its `turn_input` default is
  `whole`. Without sessions its rows replay one by one with their block ids, as Mooncake's do.

The replay rule (`replay`): a conversation's first turn arrives open loop at its timestamp;
turn k+1 is due when turn k completed plus a think time, the trace's own gap between the two
turns' timestamps less turn k's recorded latency where the trace has one, clipped at 0. A
conversation belongs to a window if its first turn does, with all its turns. `spread` spreads
first turns (later ones are paced by the loop); `time_scale` scales first-turn times and think
times alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairbench.workload.trace_rows import TraceRows, detect_tick, spread_ties

__all__ = ["SessionReplay", "replay"]


@dataclass(frozen=True)
class SessionReplay:
    """A conversation trace's rows as a plan's session rows, sorted by earliest time.

    `t`: the row's earliest time (s): its conversation's opening plus the think times before
    it (for a row outside any conversation, its own time); `opened`: its conversation's first
    turn's time; `input_tokens`: the turn's new text; `session`: the conversation's code (-1:
    none); `turn`: 1, 2, … (0 outside); `think`: seconds after the previous turn completed
    before this one is due (0 for a first turn)."""

    t: np.ndarray
    opened: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    session: np.ndarray
    turn: np.ndarray
    think: np.ndarray

    def __len__(self) -> int:
        return len(self.t)

    def take(self, index: np.ndarray) -> SessionReplay:
        return SessionReplay(
            *(getattr(self, name)[index] for name in self.__dataclass_fields__)  # type: ignore[arg-type]
        )


def replay(
    rows: TraceRows,
    start: float = 0.0,
    end: float = np.inf,
    spread: str | float | None = None,
    time_scale: float = 1.0,
    whole_prompt: bool = False,
) -> SessionReplay:
    """The rows as sessions, by the rule in the module docstring. `whole_prompt`: the trace's
    input tokens are each turn's whole prompt, so the new text of turn k+1 is its input less
    turn k's input and output (at least 1)."""
    assert rows.conversation is not None and rows.turn is not None
    n = len(rows)
    conv = rows.conversation
    latency = np.zeros(n) if rows.latency is None else np.nan_to_num(rows.latency, nan=0.0)
    inside = np.flatnonzero(conv >= 0)
    # the conversation's turns in order: the trace's turn index, then time, then file order
    order = inside[np.lexsort((inside, rows.t[inside], rows.turn[inside], conv[inside]))]
    first = np.ones(len(order), dtype=bool)
    first[1:] = conv[order[1:]] != conv[order[:-1]]
    group = np.cumsum(first) - 1
    starts = np.flatnonzero(first)
    turn = np.zeros(n, dtype=np.int64)
    turn[order] = np.arange(len(order)) - starts[group] + 1
    think = np.zeros(n)
    opened = rows.t.astype(np.float64).copy()
    opened[order] = rows.t[order[starts]][group]
    new_text = rows.input_tokens.astype(np.int64).copy()
    later = np.flatnonzero(~first)
    if len(later):
        now, before = order[later], order[later - 1]
        think[now] = np.maximum(rows.t[now] - rows.t[before] - latency[before], 0.0)
        if whole_prompt:
            grown = rows.input_tokens[now] - rows.input_tokens[before] - rows.output_tokens[before]
            new_text[now] = np.maximum(grown, 1)
    keep = np.flatnonzero((opened >= start) & (opened < end))
    opened = opened[keep] - start
    conv, turn, think = conv[keep], turn[keep], think[keep]
    # spread and scale the openings (first turns and rows outside conversations)
    opens = np.flatnonzero(turn <= 1)
    opens = opens[np.argsort(opened[opens], kind="stable")]
    tick = detect_tick(opened[opens]) if spread == "auto" else spread
    if isinstance(tick, float):
        moved = spread_ties(opened[opens], tick)
        opened[opens] = moved
        codes = conv[opens]
        by_code = np.zeros(int(conv.max()) + 1 if len(conv) else 0)
        by_code[codes[codes >= 0]] = moved[codes >= 0]
        within = np.flatnonzero(turn > 1)
        opened[within] = by_code[conv[within]]
    opened = opened * time_scale
    think = think * time_scale
    # earliest times: the opening plus every think time before the turn
    chain = np.lexsort((turn, conv))
    cum = np.cumsum(think[chain])
    heads = np.concatenate(([True], conv[chain][1:] != conv[chain][:-1]))
    head_cum = cum[np.flatnonzero(heads)][np.cumsum(heads) - 1]
    since = np.zeros(len(keep))
    since[chain] = cum - head_cum  # a first turn's think is 0
    t = opened + np.where(conv >= 0, since, 0.0)
    final = np.lexsort((turn, conv, t))
    return SessionReplay(
        t[final],
        opened[final],
        new_text[keep][final],
        rows.output_tokens[keep][final].astype(np.int64),
        conv[final],
        turn[final].astype(np.int32),
        think[final],
    )
