"""Records: one per planned request, the single source of truth of a run.

Times are integer nanoseconds on the run's monotonic clock, relative to t0 (the instant offset
0 of the plan is due); None where a stage was never reached. Every metric is recomputable from
these columns alone.

The journal is append-only JSON lines. A record is on disk (flushed and fsynced) within one
second of being written: the writer flushes when its oldest unflushed record is 0.8 s old, and the
executor's background task checks every 0.2 s even when nothing completes. So `kill -9` loses at
most the last second; `read_journal`
reads a journal back — a truncated last line from a crash included — and `consolidate` turns it
into `records.parquet`.

Status is one of `ok | error | timeout | rejected | cancelled`, and for every run
`planned == ok + error + timeout + rejected + cancelled` (checked by `check_accounting`).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import dataclass, fields
from pathlib import Path
from typing import IO, Any

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from fairbench.plan.parquet import write_table

RECORD_SCHEMA_VERSION = 6  # 2: t_end_ns; 3: rx_delay_ns, rx_delay_max_ns, rx_error_ns,
# server_received_ns, t_written_ns; 4: passed_over_ns, backlog_ns; 5: prefill_ns,
# kv_transfer_ns, decode_wait_ns; 6: session_id, turn
STATUSES = ("ok", "error", "timeout", "rejected", "cancelled")
ERROR_KINDS = (
    "connect",  # could not connect / connection refused
    "http_4xx",
    "http_5xx",
    "dropped",  # the connection broke mid-stream
    "stream_incomplete",  # the stream ended without a terminal event ([DONE] / finish / usage)
    "no_token",  # a terminal event, but zero output tokens where tokens were asked for
    "bad_stream",  # malformed SSE or JSON
    "client",  # a bug or limit on our side (reported, never hidden)
)


@dataclass(slots=True)
class Record:
    request_id: int
    tenant: str
    slo_class: str
    workload: str
    endpoint: str
    t_intended_ns: int
    prompt_tokens: int
    max_tokens: int
    status: str = "cancelled"
    t_sent_ns: int | None = None
    t_first_byte_ns: int | None = None
    t_first_token_ns: int | None = None
    t_last_token_ns: int | None = None
    t_done_ns: int | None = None
    output_tokens: int = 0
    n_chunks: int = 0
    itl_max_ns: int | None = None
    error_kind: str | None = None
    error_detail: str | None = None
    http_status: int | None = None
    retry_after_s: float | None = None
    queue_time_ns: int | None = None  # what the target reports, where it does
    preemptions: int | None = None
    cached_tokens: int | None = None
    # when the client stopped waiting, whatever the outcome: the time a request that never
    # finished was last seen (its latency is right-censored there; fairbench.analysis.censored)
    t_end_ns: int | None = None
    # the generator's own receive delay: how long the bytes that gave the first token (or, with
    # no token, the response's end) sat in the socket before the event loop read them (kernel
    # receive stamp to user-space read); None where the platform has no kernel stamps
    rx_delay_ns: int | None = None
    rx_delay_max_ns: int | None = None  # the longest such wait of any read of this response
    # how far that lateness can have moved the first-token stamp: 0 when the token's bytes were
    # the newest of their read (kernel-stamped on arrival); else the span since the previous read
    rx_error_ns: int | None = None
    # when the server says it read the request, on the server's own clock (the reference server
    # reports it): only differences mean anything — the rate the server saw
    server_received_ns: int | None = None
    # when the request's last byte reached the kernel: t_sent plus the write, and on a new
    # connection its connect and TLS handshake
    t_written_ns: int | None = None
    # contention, as the scheduler saw it (the reference scheduler reports it; None elsewhere):
    # how long after the send the scheduler first passed the request over — an admission pass
    # ended while it waited, or it was preempted — None if it never was; and how long it waited
    # for the scheduler after that, summed over its waits (0: never passed over). The live
    # reference server counts from its own receipt of the request, a loopback hop after the send
    passed_over_ns: int | None = None
    backlog_ns: int | None = None
    # TTFT decomposed, where the target knows it (the simulated reference scheduler): after
    # queue_time_ns, the prefill (admission to the prompt's last chunk; colocated, that step
    # yields the first token), the KV transfer to the decode pool and the wait there for a decode
    # slot (0 when colocated). With the profile's front end and, disaggregated, the decode pool's
    # first step, they sum to TTFT (fairbench.analysis.explain)
    prefill_ns: int | None = None
    kv_transfer_ns: int | None = None
    decode_wait_ns: int | None = None
    # a multi-turn session's id and this request's turn in it (1 for the first); None outside
    # any session (fairbench.plan.sessions). A turn's t_intended_ns is when it became due: the
    # previous turn's completion plus its think time
    session_id: int | None = None
    turn: int | None = None
    worker: int = 0


COLUMNS = [f.name for f in fields(Record)]

_ARROW_TYPES = {
    "request_id": pa.int64(),
    "tenant": pa.string(),
    "slo_class": pa.string(),
    "workload": pa.string(),
    "endpoint": pa.string(),
    "status": pa.string(),
    "error_kind": pa.string(),
    "error_detail": pa.string(),
    "retry_after_s": pa.float64(),
    "http_status": pa.int64(),
    "worker": pa.int64(),
}
ARROW_SCHEMA = pa.schema([(name, _ARROW_TYPES.get(name, pa.int64())) for name in COLUMNS])


class JournalWriter:
    """Append-only JSON-lines journal; `maybe_flush` is cheap and flushes once a second."""

    def __init__(self, path: Path, flush_after_s: float = 0.8) -> None:
        self.path = path
        self._handle: IO[str] = path.open("a", encoding="utf-8", buffering=1 << 16)
        self._after_ns = int(flush_after_s * 1e9)
        self._oldest: int | None = None  # when the oldest unflushed record was written
        self.written = 0

    def write(self, record: Record) -> None:
        """Buffer one record; the executor's flusher puts it on disk (see `due`)."""
        self._handle.write(orjson.dumps(record).decode() + "\n")
        self.written += 1
        if self._oldest is None:
            self._oldest = time.monotonic_ns()

    def due(self) -> bool:
        return self._oldest is not None and time.monotonic_ns() - self._oldest >= self._after_ns

    def push(self) -> int | None:
        """Hand buffered records to the OS (fast); returns the fd to fsync, or None if clean."""
        if self._oldest is None:
            return None
        self._handle.flush()
        self._oldest = None
        return self._handle.fileno()

    def maybe_flush(self) -> None:
        if self.due():
            self.flush()

    def flush(self) -> None:
        fd = self.push()
        if fd is not None:
            os.fsync(fd)

    def close(self) -> None:
        if not self._handle.closed:
            self.flush()
            self._handle.close()


def read_journal(path: Path) -> list[dict[str, Any]]:
    """Records from a journal; a torn last line (a crash mid-write) is dropped, not fatal."""
    rows = []
    with path.open("r", encoding="utf-8") as handle:
        lines = handle.read().split("\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if number >= len(lines) - 1:
                break  # torn final line
            raise ValueError(f"{path}:{number}: corrupt journal line") from None
    return rows


# A run's records: one dict per record (a live run's journal), or one Arrow table with
# ARROW_SCHEMA (a simulated run's, from columns: no Python object per record, issue 35)
Records = list[dict[str, Any]] | pa.Table


def records_table(columns: dict[str, tuple[Any, np.ndarray | None]], n: int) -> pa.Table:
    """The Arrow table of `n` records given as columns, name -> (values, null mask or None)
    (fairbench.targets.sim.record_columns); a column not given is all null. The same table,
    value for value and type for type, as `pa.Table.from_pylist` makes of the records as
    dicts, so records.parquet is the same byte for byte whichever way the records came."""
    arrays = []
    nulls_of: dict[pa.DataType, pa.Array] = {}  # one all-null array per type, shared
    for item in ARROW_SCHEMA:
        if item.name not in columns:
            # a simulated run has seven columns that are all null (the live client's stamps);
            # each pa.nulls is a zeroed buffer of n values: 15 MB each at fleet size, issue 35
            if item.type not in nulls_of:
                nulls_of[item.type] = pa.nulls(n, item.type)
            arrays.append(nulls_of[item.type])
            continue
        values, nulls = columns[item.name]
        if isinstance(values, pa.Array):  # built in Arrow already (a string column from codes)
            arrays.append(values if values.type == item.type else values.cast(item.type))
            continue
        if nulls is not None and not nulls.any():
            nulls = None
        arrays.append(pa.array(values, type=item.type, mask=nulls))
    return pa.Table.from_arrays(arrays, schema=ARROW_SCHEMA)


def sorted_table(records: Records) -> pa.Table:
    """The records as an Arrow table in request_id order (stable, as `sorted` was); a table
    already in that order is returned as it is."""
    if not isinstance(records, pa.Table):
        return pa.Table.from_pylist(
            sorted(records, key=lambda r: r["request_id"]), schema=ARROW_SCHEMA
        )
    ids = records.column("request_id").to_numpy()
    if len(ids) > 1 and not (ids[1:] >= ids[:-1]).all():
        records = records.take(pa.array(np.argsort(ids, kind="stable")))
    return records


def records_frame(records: Records) -> pd.DataFrame:
    table = sorted_table(records)
    return (
        table.to_pandas(types_mapper=pd.ArrowDtype).sort_values("request_id").reset_index(drop=True)
    )


def write_records(records: Records, path: Path) -> None:
    """records.parquet: the records in request_id order (plan.parquet.write_table's encodings)."""
    table = sorted_table(records).replace_schema_metadata(
        {"fairbench.record_schema": str(RECORD_SCHEMA_VERSION)}
    )
    write_table(table, path)
    del table
    release_arrow_memory()


def release_arrow_memory() -> None:
    """Give back to the OS what Arrow's allocator (mimalloc) keeps of buffers already freed:
    it would otherwise hold them, counted in the process's RSS, while the next stage (the
    simulation, the summary) allocates its own through Python's. A fleet run of 192k requests
    kept 76 MB after writing plan.parquet (issue 35). Changes no data."""
    pa.default_memory_pool().release_unused()


def read_records(path: Path) -> pd.DataFrame:
    return pq.read_table(str(path)).to_pandas().sort_values("request_id").reset_index(drop=True)


@dataclass(frozen=True)
class Accounting:
    planned: int
    counts: dict[str, int]
    duplicates: int
    missing: int

    @property
    def holds(self) -> bool:
        return (
            self.duplicates == 0 and self.missing == 0 and sum(self.counts.values()) == self.planned
        )

    def line(self) -> str:
        parts = " + ".join(f"{self.counts.get(s, 0)} {s}" for s in STATUSES)
        verdict = (
            "holds"
            if self.holds
            else (f"BROKEN ({self.missing} missing, {self.duplicates} duplicated)")
        )
        return f"planned {self.planned} = {parts}: {verdict}"


def check_accounting(planned: int, rows: Records) -> Accounting:
    if isinstance(rows, pa.Table):  # by column: no per-record objects (issue 35)
        id_array = rows.column("request_id").to_numpy()
        if len(id_array) < 2 or bool((id_array[1:] > id_array[:-1]).all()):
            unique = id_array  # in order and distinct (a simulated run's): np.unique's answer,
            # without its hash table over 1.9M ids (1.8 s of a fleet run, issue 35)
        else:
            unique = np.unique(id_array)
        duplicates = len(id_array) - len(unique)
        missing = planned - int(np.count_nonzero((unique >= 0) & (unique < planned)))
        counted = pc.value_counts(rows.column("status")).to_pylist()  # not one str per row
        counts = Counter({c["values"]: c["counts"] for c in counted})
        return Accounting(planned, {s: counts.get(s, 0) for s in STATUSES}, duplicates, missing)
    ids = Counter(r["request_id"] for r in rows)
    duplicates = sum(c - 1 for c in ids.values() if c > 1)
    missing = sum(1 for i in range(planned) if i not in ids)
    counts = Counter(r["status"] for r in rows)
    return Accounting(planned, {s: counts.get(s, 0) for s in STATUSES}, duplicates, missing)
