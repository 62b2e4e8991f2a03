"""Production traces in their native formats, read into one columnar shape.

- Mooncake JSONL (FAST'25 release): `timestamp` (ms), `input_length`, `output_length`,
  `hash_ids` (one id per 512-token block, chained, so equal leading ids mean a shared prefix).
- Azure LLM inference CSV (Splitwise, 2023): `TIMESTAMP,ContextTokens,GeneratedTokens`, with
  7-digit fractional seconds; the 2024 week-long files add a UTC offset to the timestamp.
- BurstGPT CSV: columns matched by name (`Timestamp` in seconds, `Request tokens`,
  `Response tokens`), so the v2.0 release's extra `Session ID,Elapsed time` columns are
  harmless; with `sessions: true` they are read (`read_burstgpt_sessions`). Rows with
  0 response tokens are failed requests in the original service; they are not replayed (there
  is no output length to ask for), and the count is reported.
- Traces with conversation ids — our generic `conversation` format, Qwen-Bailian's
  `bailian`, and BurstGPT v2.0 — are read here too, each row with its conversation, turn and
  recorded latency; fairbench.workload.conversations documents them and replays them as
  sessions.

A malformed row is reported as `file:line: problem`; the whole file is rejected rather than
silently replayed without it. The row type and what the readers share are in
fairbench.workload.trace_rows (re-exported here).

pandas is imported by the CSV readers that use it, not at the top: every command imports this
module (for `TraceError`), and pandas is half a second of CPU that `--help` need not pay.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fairbench.workload.trace_rows import (
    TraceError,
    TraceRows,
    detect_tick,
    fail,
    in_time_order,
    json_objects,
    request_fields,
    spread_ties,
    take_ragged,
)

if TYPE_CHECKING:
    import pandas as pd


def read_mooncake(path: Path) -> TraceRows:
    times: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    lengths: list[int] = []
    values: list[int] = []
    for number, row in json_objects(path):
        ts, n_in, n_out, ids, _ = request_fields(path, number, row)
        times.append(ts / 1000.0)
        inputs.append(n_in)
        outputs.append(n_out)
        lengths.append(len(ids))
        values.extend(ids)
    if not times:
        raise TraceError(f"{path}: no rows")
    t = np.asarray(times)
    return in_time_order(t, inputs, outputs, lengths, values, np.argsort(t, kind="stable"))


def _read_csv(path: Path) -> pd.DataFrame:
    import pandas as pd

    try:
        frame = pd.read_csv(path, dtype=str, skipinitialspace=True, keep_default_na=False)
    except (pd.errors.ParserError, UnicodeDecodeError) as error:
        raise TraceError(f"{path}: not a readable CSV ({error})") from None
    except pd.errors.EmptyDataError:
        raise TraceError(f"{path}: empty file") from None
    frame.columns = [c.strip() for c in frame.columns]
    return frame


def _column(frame: pd.DataFrame, path: Path, names: tuple[str, ...]) -> str:
    lowered = {c.lower(): c for c in frame.columns}
    for name in names:
        if name.lower() in lowered:
            return lowered[name.lower()]
    raise TraceError(f"{path}: no column named {names[0]!r} (columns: {list(frame.columns)})")


def _integers(frame: pd.DataFrame, column: str, path: Path, low: int) -> np.ndarray:
    import pandas as pd

    values = pd.to_numeric(frame[column], errors="coerce")
    bad = values.isna() | (values < low) | (values != np.floor(values))
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise fail(
            path, i + 2, f"{column} must be an integer >= {low}, got {frame[column].iloc[i]!r}"
        )
    return values.to_numpy(dtype=np.int64)


def _finish(
    path: Path, t: np.ndarray, n_in: np.ndarray, n_out: np.ndarray, dropped: int
) -> TraceRows:
    if len(t) == 0:
        raise TraceError(f"{path}: no replayable rows")
    order = np.argsort(t, kind="stable")
    t = t[order]
    return TraceRows(t - t[0], n_in[order], n_out[order], dropped=dropped)


def read_azure(path: Path) -> TraceRows:
    import pandas as pd

    frame = _read_csv(path)
    ts_col = _column(frame, path, ("TIMESTAMP",))
    stamps = pd.to_datetime(frame[ts_col], format="ISO8601", errors="coerce", utc=True)
    bad = stamps.isna().to_numpy()
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise fail(path, i + 2, f"bad timestamp {frame[ts_col].iloc[i]!r}")
    ns = stamps.dt.as_unit("ns").astype("int64").to_numpy()
    n_in = _integers(frame, _column(frame, path, ("ContextTokens",)), path, 1)
    n_out = _integers(frame, _column(frame, path, ("GeneratedTokens",)), path, 0)
    return _finish(path, (ns - ns.min()) / 1e9, n_in, n_out, 0)


def _burstgpt_times(frame: pd.DataFrame, path: Path) -> pd.Series:
    """BurstGPT's `Timestamp` column (seconds), each a number >= 0, else `file:line` names it."""
    import pandas as pd

    ts_col = _column(frame, path, ("Timestamp",))
    t = pd.to_numeric(frame[ts_col], errors="coerce")
    bad = (t.isna() | (t < 0)).to_numpy()
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise fail(path, i + 2, f"bad timestamp {frame[ts_col].iloc[i]!r}")
    return t


def read_burstgpt(path: Path) -> TraceRows:

    frame = _read_csv(path)
    t = _burstgpt_times(frame, path)
    n_in = _integers(frame, _column(frame, path, ("Request tokens",)), path, 0)
    n_out = _integers(frame, _column(frame, path, ("Response tokens",)), path, 0)
    ok = (n_out > 0) & (n_in > 0)
    return _finish(path, t.to_numpy(dtype=np.float64)[ok], n_in[ok], n_out[ok], int((~ok).sum()))


# ------------------------------------------------------------------ conversation ids
# The formats whose rows carry a conversation id (fairbench.workload.conversations explains
# them and the replay rule): our generic `conversation` format, Qwen-Bailian, BurstGPT v2.0.

ID = "conversation_id"
REQUIRED = ("timestamp", ID, "input_tokens", "output_tokens")
OPTIONAL = ("turn", "latency_s")
_JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")


# ------------------------------------------------------------------ reading


def _lines_error(path: Path, lines: np.ndarray, bad: np.ndarray, message: str) -> TraceError:
    i = int(np.flatnonzero(bad)[0])
    return fail(path, int(lines[i]), message.format(i=i))


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
        raise fail(
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
        raise fail(
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
        raise fail(path, int(lines[i]), f"{name} must be seconds >= 0, got {values.iloc[i]!r}")
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
        raise fail(
            path,
            int(lines[i]),
            f"{name} must be a non-empty string or an integer, got {values.iloc[i]!r}",
        )
    blank = (text == "").to_numpy()
    if blank.any() and not blank_ok:
        i = int(np.flatnonzero(blank)[0])
        raise fail(path, int(lines[i]), f"{name} is empty; every row needs its conversation's id")
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
    for number, row in json_objects(path):
        for name in REQUIRED:
            if name not in row:
                raise fail(path, number, f"missing field {name!r}")
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
    """The generic conversation trace (described in fairbench.workload.conversations): JSONL
    for a `.jsonl`, `.ndjson` or `.json` file, else CSV with a header; columns by name."""
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
        raise fail(
            path,
            int(lines[i]),
            f"turn {int(turn[i])} of conversation {ids.iloc[i]!r} appears twice",
        )


def read_burstgpt_sessions(path: Path) -> TraceRows:
    """BurstGPT v2.0 (described in fairbench.workload.conversations) with its `Session ID`
    and `Elapsed time` columns; rows with 0 response tokens (failed in the original service)
    are dropped and counted."""

    frame = _read_csv(path)
    lines = np.arange(2, len(frame) + 2, dtype=np.int64)
    try:
        sid_col = _column(frame, path, ("Session ID",))
    except TraceError as error:
        raise TraceError(
            f"{error}; conversation ids are in BurstGPT v2.0's BurstGPT_3.csv, or replay "
            "without sessions (sessions: false)"
        ) from None
    t = _burstgpt_times(frame, path)
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


def _bailian_ids(row: dict[str, Any]) -> tuple[int, int, int]:
    """A Qwen-Bailian row's chat_id, parent_chat_id (-1: none) and turn (0: not given)."""
    chat, parent = row["chat_id"], row.get("parent_chat_id", -1)
    if isinstance(chat, bool) or not isinstance(chat, int):
        raise TypeError(f"chat_id must be an integer, got {chat!r}")
    if isinstance(parent, bool) or not isinstance(parent, int):
        raise TypeError(f"parent_chat_id must be an integer, got {parent!r}")
    return chat, parent, int(row.get("turn", 0))


def read_bailian(path: Path) -> TraceRows:
    """The Qwen-Bailian JSONL (described in fairbench.workload.conversations): rows with their
    block ids and, from the `parent_chat_id` chains, their conversations and turns."""
    times: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    chats: list[int] = []
    parents: list[int] = []
    turns: list[int] = []
    lengths: list[int] = []
    values: list[int] = []
    lines: list[int] = []
    for number, row in json_objects(path):
        ts, n_in, n_out, ids, (chat, parent, turn) = request_fields(path, number, row, _bailian_ids)
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
            raise fail(path, lines[i], f"chat_id {chat} appears twice")
        root[chat] = root.get(parents[i], chat) if parents[i] != -1 else chat
        conversation[i] = root[chat]
    codes = np.unique(conversation, return_inverse=True)[1].astype(np.int64)
    return in_time_order(
        t,
        inputs,
        outputs,
        lengths,
        values,
        order,
        conversation=codes,
        turn=np.asarray(turns, dtype=np.int64),
        latency=np.full(len(t), np.nan),
    )


READERS = {"mooncake": read_mooncake, "azure": read_azure, "burstgpt": read_burstgpt}
# the formats whose conversation ids can be replayed as sessions (fairbench.workload.conversations)
SESSION_FORMATS = ("conversation", "bailian", "burstgpt")


def read_trace(fmt: str, path: str | Path, sessions: bool = False) -> TraceRows:
    """The trace's rows; with `sessions`, also each row's conversation, turn and latency."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: trace file not found")
    if fmt == "bailian":
        rows = read_bailian(path)
        if sessions:
            return rows
        return TraceRows(
            rows.t, rows.input_tokens, rows.output_tokens, rows.hash_offsets, rows.hash_values
        )
    if fmt == "conversation" or (sessions and fmt in SESSION_FORMATS):
        return read_conversations(path) if fmt == "conversation" else read_burstgpt_sessions(path)
    if sessions:
        raise TraceError(
            f"{path}: the {fmt} format has no conversation id; sessions come from the formats "
            f"{list(SESSION_FORMATS)}"
        )
    try:
        reader = READERS[fmt]
    except KeyError:
        known = sorted([*READERS, "bailian", "conversation"])
        raise TraceError(f"unknown trace format {fmt!r}; known: {known}") from None
    return reader(path)


__all__ = [
    "SESSION_FORMATS",
    "TraceError",
    "TraceRows",
    "detect_tick",
    "read_trace",
    "spread_ties",
    "take_ragged",
]
