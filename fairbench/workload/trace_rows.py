"""A trace's rows in one columnar shape, and what every trace reader shares: the row type
(`TraceRows`, with each row's prefix block ids as a ragged array), the one-line error
(`TraceError`, `file:line: problem`), the JSONL line loop, the Mooncake-shaped request fields,
time ordering, and spreading a coarse clock's ties. The readers of each format are in
fairbench.workload.traces; fairbench.workload.conversations replays a trace's conversations."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


class TraceError(Exception):
    """A trace file that cannot be replayed; the message names the file and line."""


@dataclass(frozen=True)
class TraceRows:
    """One row per request, times in seconds from the first row, sorted by time."""

    t: np.ndarray  # float64 seconds
    input_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    hash_offsets: np.ndarray | None = None  # int64, len n+1 (CSR) — Mooncake only
    hash_values: np.ndarray | None = None  # int64
    dropped: int = 0  # rows not replayable (e.g. failed requests in BurstGPT)
    # read only where a trace's conversation ids are replayed as sessions
    # (fairbench.workload.conversations): each row's conversation (a code, -1: none), its turn
    # index as the trace gives it (0 where it gives none: then the timestamps order the turns),
    # and the latency the trace recorded for it (seconds, NaN where unknown)
    conversation: np.ndarray | None = None  # int64
    turn: np.ndarray | None = None  # int64
    latency: np.ndarray | None = None  # float64

    def __len__(self) -> int:
        return len(self.t)

    def take(self, index: np.ndarray) -> TraceRows:
        """The rows at `index`, keeping their prefix ids."""
        offsets, values = None, None
        if self.hash_offsets is not None and self.hash_values is not None:
            offsets, values = take_ragged(self.hash_offsets, self.hash_values, index)
        return TraceRows(
            self.t[index],
            self.input_tokens[index],
            self.output_tokens[index],
            offsets,
            values,
            conversation=None if self.conversation is None else self.conversation[index],
            turn=None if self.turn is None else self.turn[index],
            latency=None if self.latency is None else self.latency[index],
        )

    def prefix_key(self, depth: int) -> np.ndarray | None:
        """The block id at position `depth`-1 (or the last, for shorter rows), -1 for none.

        Ids are chained, so this one id stands for the row's whole leading `depth` blocks."""
        if self.hash_offsets is None or self.hash_values is None:
            return None
        lengths = np.diff(self.hash_offsets)
        key = np.full(len(self), -1, dtype=np.int64)
        has = lengths > 0
        pos = self.hash_offsets[:-1][has] + np.minimum(lengths[has], depth) - 1
        key[has] = self.hash_values[pos]
        return key


def take_ragged(
    offsets: np.ndarray, values: np.ndarray, index: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Rows `index` of a CSR ragged array (offsets of length n+1 into values)."""
    lengths = np.diff(offsets)[index]
    new_offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    starts = offsets[:-1][index]
    pos = np.repeat(starts - new_offsets[:-1], lengths) + np.arange(new_offsets[-1])
    return new_offsets, values[pos]


def fail(path: Path, line: int, problem: str) -> TraceError:
    return TraceError(f"{path}:{line}: {problem}")


def json_objects(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) per non-blank line of a JSONL file; a line that is not a JSON
    object is a one-line error naming it."""
    with path.open("r", encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise fail(path, number, f"not valid JSON ({error.msg})") from None
            if not isinstance(row, dict):
                raise fail(path, number, "each line must be a JSON object")
            yield number, row


def request_fields(
    path: Path, number: int, row: dict[str, Any], read: Callable[[dict[str, Any]], Any] = dict
) -> tuple[float, int, int, list[int], Any]:
    """A Mooncake-shaped row's `timestamp`, `input_length`, `output_length` and `hash_ids`
    (Mooncake's and Qwen-Bailian's JSONL share them), checked, and `read(row)`: what else the
    format takes from the row, under the same errors."""
    try:
        extra = read(row)
        ts = float(row["timestamp"])
        n_in, n_out = int(row["input_length"]), int(row["output_length"])
        ids = row.get("hash_ids", [])
        if not isinstance(ids, list):
            raise TypeError("hash_ids must be a list")
        ids = [int(x) for x in ids]
    except KeyError as error:
        raise fail(path, number, f"missing field {error.args[0]!r}") from None
    except (TypeError, ValueError) as error:
        raise fail(path, number, f"bad field value ({error})") from None
    if not np.isfinite(ts) or ts < 0 or n_in < 1 or n_out < 0:
        raise fail(path, number, "timestamp must be >= 0, input_length >= 1, output_length >= 0")
    return ts, n_in, n_out, ids, extra


def in_time_order(
    t: np.ndarray,
    inputs: list[int],
    outputs: list[int],
    lengths: list[int],
    values: list[int],
    order: np.ndarray,
    **sessions: np.ndarray,
) -> TraceRows:
    """Rows with their block ids (`lengths` ids each, in `values`), taken in `order` and timed
    from the first; `sessions`: the conversation, turn and latency columns, if any."""
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    rows = TraceRows(
        t,
        np.asarray(inputs, dtype=np.int64),
        np.asarray(outputs, dtype=np.int64),
        offsets,
        np.asarray(values, dtype=np.int64),
        **sessions,
    ).take(order)
    return dataclasses.replace(rows, t=rows.t - rows.t[0])


def detect_tick(t: np.ndarray) -> float:
    """The clock tick of a coarse trace: the most common positive gap between distinct stamps.

    Mooncake rounds timestamps to ~3 s; replayed literally, every tick fires a burst."""
    distinct = np.unique(t)
    if len(distinct) < 2:
        return 0.0
    gaps = np.round(np.diff(distinct), 6)
    values, counts = np.unique(gaps, return_counts=True)
    return float(values[np.argmax(counts)])


def spread_ties(t: np.ndarray, tick: float) -> np.ndarray:
    """Spread the m rows that share a timestamp evenly over [t, t + tick): k-th at t + k·tick/m."""
    if tick <= 0 or len(t) == 0:
        return t
    starts = np.flatnonzero(np.concatenate(([True], t[1:] != t[:-1])))
    sizes = np.diff(np.concatenate((starts, [len(t)])))
    group = np.repeat(np.arange(len(starts)), sizes)
    rank = np.arange(len(t)) - starts[group]
    return t + rank * (tick / sizes[group])
