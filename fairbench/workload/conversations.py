"""Traces with conversation ids, replayed as sessions: the readers and the replay rule.

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
  independent downstream projects report them from the published file.

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

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fairbench.workload.traces import (
    TraceError,
    TraceRows,
    _column,
    _fail,
    _read_csv,
    detect_tick,
    spread_ties,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "SessionReplay",
    "read_bailian",
    "read_burstgpt_sessions",
    "read_conversations",
    "replay",
]

ID = "conversation_id"
REQUIRED = ("timestamp", ID, "input_tokens", "output_tokens")
OPTIONAL = ("turn", "latency_s")
_JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")


# ------------------------------------------------------------------ reading


def _lines_error(path: Path, lines: np.ndarray, bad: np.ndarray, message: str) -> TraceError:
    i = int(np.flatnonzero(bad)[0])
    return _fail(path, int(lines[i]), message.format(i=i))


def _seconds(values: pd.Series, path: Path, lines: np.ndarray, name: str) -> np.ndarray:
    """Timestamps in seconds: numbers as they are, or ISO 8601 date-times (one kind a file)."""
    import pandas as pd

    numbers = pd.to_numeric(values, errors="coerce")
    if numbers.notna().any():
        bad = (numbers.isna() | ~np.isfinite(numbers.fillna(0))).to_numpy()
        out = numbers.to_numpy(dtype=np.float64)
    else:
        stamps = pd.to_datetime(values, format="ISO8601", errors="coerce", utc=True)
        bad = stamps.isna().to_numpy()
        out = stamps.dt.as_unit("ns").astype("int64").to_numpy() / 1e9 if not bad.all() else None
    if bad.any() or out is None:
        i = int(np.flatnonzero(bad)[0]) if bad.any() else 0
        raise _fail(
            path,
            int(lines[i]),
            f"{name} must be seconds (a number) or an ISO 8601 date-time, got {values.iloc[i]!r}",
        )
    return out


def _whole(
    values: pd.Series, path: Path, lines: np.ndarray, name: str, low: int, blank_ok: bool = False
) -> np.ndarray:
    """Integers >= `low` (-1 where blank and `blank_ok`)."""
    import pandas as pd

    numbers = pd.to_numeric(values.replace("", None), errors="coerce")
    missing = numbers.isna().to_numpy()
    filled = numbers.fillna(low).to_numpy(dtype=np.float64)
    bad = (missing & (not blank_ok)) | (filled < low) | (filled != np.floor(filled))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise _fail(
            path, int(lines[i]), f"{name} must be an integer >= {low}, got {values.iloc[i]!r}"
        )
    out = filled.astype(np.int64)
    out[missing] = -1
    return out


def _latency(values: pd.Series, path: Path, lines: np.ndarray, name: str) -> np.ndarray:
    """Seconds >= 0, NaN where blank."""
    import pandas as pd

    blank = values.isna() | (values.astype(str).str.strip() == "")
    numbers = pd.to_numeric(values.where(~blank, None), errors="coerce")
    bad = ((numbers.isna() & ~blank) | (numbers < 0)).to_numpy()
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise _fail(path, int(lines[i]), f"{name} must be seconds >= 0, got {values.iloc[i]!r}")
    return numbers.to_numpy(dtype=np.float64)


def _ids(values: pd.Series, path: Path, lines: np.ndarray, name: str, blank_ok: bool) -> np.ndarray:
    """Conversation codes 0, 1, … in order of first appearance (-1: blank, where allowed)."""
    import pandas as pd

    if pd.api.types.infer_dtype(values, skipna=False) == "string":
        text = values.str.strip()  # a CSV's column: text already, vectorised
    else:
        text = values.map(_id_text)
    bad = text.isna().to_numpy()
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise _fail(
            path,
            int(lines[i]),
            f"{name} must be a non-empty string or an integer, got {values.iloc[i]!r}",
        )
    blank = (text == "").to_numpy()
    if blank.any() and not blank_ok:
        i = int(np.flatnonzero(blank)[0])
        raise _fail(path, int(lines[i]), f"{name} is empty; every row needs its conversation's id")
    codes, _ = pd.factorize(text.where(~blank, None), use_na_sentinel=True)
    return np.asarray(codes, dtype=np.int64)


def _id_text(value: Any) -> str | None:
    """A conversation id as text ('' for blank); None for a value that cannot be one."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return ""
    if isinstance(value, (bool, list, dict, float)):
        return None
    return str(value).strip()


def _frame_of_jsonl(path: Path) -> tuple[pd.DataFrame, np.ndarray]:
    import pandas as pd

    rows: list[dict[str, Any]] = []
    lines: list[int] = []
    with path.open("r", encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise _fail(path, number, f"not valid JSON ({error.msg})") from None
            if not isinstance(row, dict):
                raise _fail(path, number, "each line must be a JSON object")
            for name in REQUIRED:
                if name not in row:
                    raise _fail(path, number, f"missing field {name!r}")
            rows.append(row)
            lines.append(number)
    if not rows:
        raise TraceError(f"{path}: no rows")
    frame = pd.DataFrame.from_records(rows, columns=[*REQUIRED, *OPTIONAL]).astype(object)
    for name in OPTIONAL:
        if all(name not in row for row in rows):
            frame = frame.drop(columns=name)
    return frame, np.asarray(lines, dtype=np.int64)


def _sorted(
    path: Path,
    t: np.ndarray,
    n_in: np.ndarray,
    n_out: np.ndarray,
    conversation: np.ndarray,
    turn: np.ndarray,
    latency: np.ndarray,
) -> TraceRows:
    """Rows with a response, sorted by time, times from the first; failed rows (0 output
    tokens) are dropped and counted, as the BurstGPT reader does."""
    ok = n_out > 0
    if not ok.any():
        raise TraceError(f"{path}: no replayable rows")
    index = np.flatnonzero(ok)
    index = index[np.argsort(t[index], kind="stable")]
    times = t[index]
    return TraceRows(
        times - times[0],
        n_in[index],
        n_out[index],
        dropped=int((~ok).sum()),
        conversation=conversation[index],
        turn=turn[index],
        latency=latency[index],
    )


def read_conversations(path: Path) -> TraceRows:
    """The generic conversation trace (module docstring): JSONL for a `.jsonl`, `.ndjson` or
    `.json` file, else CSV with a header; columns by name."""
    if path.suffix.lower() in _JSONL_SUFFIXES:
        frame, lines = _frame_of_jsonl(path)
        names = {name: name for name in frame.columns}
    else:
        frame = _read_csv(path)
        lines = np.arange(2, len(frame) + 2, dtype=np.int64)
        names = {name: _column(frame, path, (name,)) for name in REQUIRED}
        lowered = {c.lower(): c for c in frame.columns}
        names.update({name: lowered[name] for name in OPTIONAL if name in lowered})
        if not len(frame):
            raise TraceError(f"{path}: no rows")
    n = len(frame)
    t = _seconds(frame[names["timestamp"]], path, lines, "timestamp")
    conversation = _ids(frame[names[ID]], path, lines, ID, blank_ok=False)
    n_in = _whole(frame[names["input_tokens"]], path, lines, "input_tokens", 1)
    n_out = _whole(frame[names["output_tokens"]], path, lines, "output_tokens", 0)
    turn = np.zeros(n, dtype=np.int64)
    if "turn" in names:
        turn = _whole(frame[names["turn"]], path, lines, "turn", 0, blank_ok=True)
        _no_repeated_turns(path, lines, conversation, turn, frame[names[ID]])
    latency = np.full(n, np.nan)
    if "latency_s" in names:
        latency = _latency(frame[names["latency_s"]], path, lines, "latency_s")
    return _sorted(path, t, n_in, n_out, conversation, turn, latency)


def _no_repeated_turns(
    path: Path, lines: np.ndarray, conversation: np.ndarray, turn: np.ndarray, ids: pd.Series
) -> None:
    given = np.flatnonzero(turn >= 0)
    order = given[np.lexsort((given, turn[given], conversation[given]))]
    same = (conversation[order[1:]] == conversation[order[:-1]]) & (
        turn[order[1:]] == turn[order[:-1]]
    )
    if same.any():
        i = int(order[1:][np.flatnonzero(same)[0]])
        raise _fail(
            path,
            int(lines[i]),
            f"turn {int(turn[i])} of conversation {ids.iloc[i]!r} appears twice",
        )


def read_burstgpt_sessions(path: Path) -> TraceRows:
    """BurstGPT v2.0 (module docstring) with its `Session ID` and `Elapsed time` columns; rows
    with 0 response tokens (failed in the original service) are dropped and counted."""
    import pandas as pd

    frame = _read_csv(path)
    lines = np.arange(2, len(frame) + 2, dtype=np.int64)
    try:
        sid_col = _column(frame, path, ("Session ID",))
    except TraceError as error:
        raise TraceError(
            f"{error}; conversation ids are in BurstGPT v2.0's BurstGPT_3.csv, or replay "
            "without sessions (sessions: false)"
        ) from None
    ts_col = _column(frame, path, ("Timestamp",))
    t = pd.to_numeric(frame[ts_col], errors="coerce")
    bad = (t.isna() | (t < 0)).to_numpy()
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise _fail(path, i + 2, f"bad timestamp {frame[ts_col].iloc[i]!r}")
    n_in = _whole(
        frame[_column(frame, path, ("Request tokens",))], path, lines, "Request tokens", 0
    )
    n_out = _whole(
        frame[_column(frame, path, ("Response tokens",))], path, lines, "Response tokens", 0
    )
    conversation = _ids(frame[sid_col], path, lines, "Session ID", blank_ok=True)
    latency = np.full(len(frame), np.nan)
    lowered = {c.lower(): c for c in frame.columns}
    if "elapsed time" in lowered:
        latency = _latency(frame[lowered["elapsed time"]], path, lines, "Elapsed time")
    n_out = np.where(n_in > 0, n_out, 0)  # a request of no tokens is not replayable either
    turn = np.zeros(len(frame), dtype=np.int64)
    return _sorted(path, t.to_numpy(np.float64), n_in, n_out, conversation, turn, latency)


def read_bailian(path: Path) -> TraceRows:
    """The Qwen-Bailian JSONL (module docstring): rows with their block ids and, from the
    `parent_chat_id` chains, their conversations and turns."""
    times: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    chats: list[int] = []
    parents: list[int] = []
    turns: list[int] = []
    lengths: list[int] = []
    values: list[int] = []
    lines: list[int] = []
    with path.open("r", encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise _fail(path, number, f"not valid JSON ({error.msg})") from None
            if not isinstance(row, dict):
                raise _fail(path, number, "each line must be a JSON object")
            try:
                chat, parent = row["chat_id"], row.get("parent_chat_id", -1)
                if isinstance(chat, bool) or not isinstance(chat, int):
                    raise TypeError(f"chat_id must be an integer, got {chat!r}")
                if isinstance(parent, bool) or not isinstance(parent, int):
                    raise TypeError(f"parent_chat_id must be an integer, got {parent!r}")
                ts = float(row["timestamp"])
                n_in, n_out = int(row["input_length"]), int(row["output_length"])
                turn = int(row.get("turn", 0))
                ids = row.get("hash_ids", [])
                if not isinstance(ids, list):
                    raise TypeError("hash_ids must be a list")
                ids = [int(x) for x in ids]
            except KeyError as error:
                raise _fail(path, number, f"missing field {error.args[0]!r}") from None
            except (TypeError, ValueError) as error:
                raise _fail(path, number, f"bad field value ({error})") from None
            if not np.isfinite(ts) or ts < 0 or n_in < 1 or n_out < 0:
                raise _fail(
                    path, number, "timestamp must be >= 0, input_length >= 1, output_length >= 0"
                )
            times.append(ts)
            inputs.append(n_in)
            outputs.append(n_out)
            chats.append(chat)
            parents.append(parent)
            turns.append(turn)
            lengths.append(len(ids))
            values.extend(ids)
            lines.append(number)
    if not times:
        raise TraceError(f"{path}: no rows")
    t = np.asarray(times)
    order = np.argsort(t, kind="stable")  # a parent arrives before its child
    root: dict[int, int] = {}
    conversation = np.empty(len(t), dtype=np.int64)
    for i in order.tolist():
        chat = chats[i]
        if chat in root:
            raise _fail(path, lines[i], f"chat_id {chat} appears twice")
        root[chat] = root.get(parents[i], chat) if parents[i] != -1 else chat
        conversation[i] = root[chat]
    codes = np.unique(conversation, return_inverse=True)[1].astype(np.int64)
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    rows = TraceRows(
        t,
        np.asarray(inputs, dtype=np.int64),
        np.asarray(outputs, dtype=np.int64),
        offsets,
        np.asarray(values, dtype=np.int64),
        conversation=codes,
        turn=np.asarray(turns, dtype=np.int64),
        latency=np.full(len(t), np.nan),
    ).take(order)
    return TraceRows(
        rows.t - rows.t[0],
        rows.input_tokens,
        rows.output_tokens,
        rows.hash_offsets,
        rows.hash_values,
        conversation=rows.conversation,
        turn=rows.turn,
        latency=rows.latency,
    )


# ------------------------------------------------------------------ replaying


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
