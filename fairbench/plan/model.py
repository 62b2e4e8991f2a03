"""The Plan: every request of a run, decided up front, as an immutable columnar value.

Columns are numpy arrays with explicit little-endian dtypes, so the content digest is the same
on every machine. Categorical columns (tenant, class, workload) are small integer codes into
name tables that the digest covers too. A and B of an A/B test replay the same Plan, and its
digest is part of every run's header.

Digest format history (`PLAN_FORMAT`):
  1 — sha256 over a JSON header (format, names, block_tokens) and each column's bytes in
      `COLUMNS` order, then the ragged prefix-block ids.
  A plan with sessions (multi-turn conversations, fairbench.workload.sessions) adds
  `"sessions": true` to the header and hashes `SESSION_COLUMNS` last; a plan without sessions
  has neither, so its digest is what it was.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from fairbench.plan.parquet import write_table
from fairbench.workload.prompts import render_tokens, text_of

PLAN_FORMAT = 1
ENDPOINTS: tuple[str, ...] = ("chat", "completions", "embeddings")

COLUMNS: dict[str, str] = {
    "offset_ns": "<i8",
    "tenant": "<i2",
    "slo_class": "<i2",
    "workload": "<i2",
    "endpoint": "<i1",
    "stream": "|b1",
    "prompt_tokens": "<i4",
    "max_tokens": "<i4",
    "prefix_group": "<i4",
    "prefix_tokens": "<i4",
    "prompt_seed": "<u8",
}
# Only in a plan with sessions. session_id: -1 for a request outside any session; turn: 1 for
# a session's first; think_ns: after the previous turn completed, before this one is due (its
# offset_ns is its *earliest* time: the session's arrival plus the think times before it);
# context_limit: the most prompt tokens sent (0: none). prompt_tokens is the turn's new user text.
SESSION_COLUMNS: dict[str, str] = {
    "session_id": "<i8",
    "turn": "<i4",
    "think_ns": "<i8",
    "context_limit": "<i4",
}


@dataclass(frozen=True)
class PlannedRequest:
    """One request as a target sees it (a row of the plan, names resolved)."""

    request_id: int
    offset_ns: int
    tenant: str
    slo_class: str
    workload: str
    endpoint: str
    stream: bool
    prompt_tokens: int
    max_tokens: int
    prefix_group: int
    prefix_tokens: int
    prompt_seed: int
    workload_index: int
    block_ids: np.ndarray | None = None
    block_tokens: int = 512
    session_id: int = -1
    turn: int = 0
    think_ns: int = 0
    context_limit: int = 0
    # a session turn as sent: the whole prompt (conversation so far + this turn's user text);
    # prompt_tokens is then its length (fairbench.plan.sessions.as_sent)
    conversation: np.ndarray | None = None

    def user_ids(self, length: int | None = None) -> np.ndarray:
        """The words this request itself adds (for a session turn, its new user text),
        `length` of them (default prompt_tokens)."""
        key = (self.workload_index, self.prefix_group) if self.prefix_group >= 0 else None
        return render_tokens(
            self.prompt_tokens if length is None else length,
            self.prompt_seed,
            prefix_key=key,
            prefix_tokens=self.prefix_tokens,
            block_ids=self.block_ids,
            block_tokens=self.block_tokens,
        )

    def prompt_ids(self, length: int | None = None) -> np.ndarray:
        """Vocabulary indices of the prompt's words, `length` of them (default prompt_tokens):
        a shorter prompt is the same prompt cut short, so prefix sharing survives. A session
        turn as sent renders its whole conversation."""
        if self.conversation is not None:
            return self.conversation if length is None else self.conversation[:length]
        return self.user_ids(length)

    def prompt(self) -> str:
        """The prompt text: exactly `prompt_tokens` reference tokens (workload.prompts)."""
        return text_of(self.prompt_ids())


@dataclass(frozen=True)
class Plan:
    """Requests sorted by (offset_ns, request_id); request_id is the row number."""

    columns: dict[str, np.ndarray]
    tenants: tuple[str, ...]
    slo_classes: tuple[str, ...]
    workloads: tuple[str, ...]
    block_offsets: np.ndarray | None = None  # CSR over rows: Mooncake-style prefix block ids
    block_values: np.ndarray | None = None
    block_tokens: int = 512
    seed: int = 0
    scenario: str = ""
    digest: str = field(default="", compare=False)
    sessions: dict[str, np.ndarray] | None = None  # SESSION_COLUMNS, in a plan with sessions

    def __post_init__(self) -> None:
        n = len(self.columns["offset_ns"])
        for name, dtype in SESSION_COLUMNS.items() if self.sessions is not None else ():
            col = self.sessions.get(name)  # type: ignore[union-attr]
            if col is None or col.dtype != np.dtype(dtype) or len(col) != n:
                raise ValueError(f"plan session column {name!r} must be {dtype} of length {n}")
        for name, dtype in COLUMNS.items():
            col = self.columns.get(name)
            if col is None or col.dtype != np.dtype(dtype) or len(col) != n:
                raise ValueError(f"plan column {name!r} must be {dtype} of length {n}")
        if n and np.any(np.diff(self.columns["offset_ns"]) < 0):
            raise ValueError("plan offsets must be sorted")
        if not self.digest:
            object.__setattr__(self, "digest", self.compute_digest())

    def __len__(self) -> int:
        return len(self.columns["offset_ns"])

    @property
    def duration_ns(self) -> int:
        return int(self.columns["offset_ns"][-1]) if len(self) else 0

    def compute_digest(self) -> str:
        h = hashlib.sha256()
        header = {
            "format": PLAN_FORMAT,
            "tenants": self.tenants,
            "slo_classes": self.slo_classes,
            "workloads": self.workloads,
            "block_tokens": self.block_tokens,
            "rows": len(self),
        }
        if self.sessions is not None:
            header["sessions"] = True
        h.update(json.dumps(header, sort_keys=True).encode())
        for name, dtype in COLUMNS.items():
            h.update(np.ascontiguousarray(self.columns[name], dtype=dtype).tobytes())
        if self.block_offsets is not None and self.block_values is not None:
            h.update(np.ascontiguousarray(self.block_offsets, dtype="<i8").tobytes())
            h.update(np.ascontiguousarray(self.block_values, dtype="<i8").tobytes())
        for name, dtype in SESSION_COLUMNS.items() if self.sessions is not None else ():
            h.update(np.ascontiguousarray(self.sessions[name], dtype=dtype).tobytes())  # type: ignore[index]
        return "sha256:" + h.hexdigest()

    def subset(self, rows: np.ndarray) -> Plan:
        """The plan of only these rows (in order; request ids are renumbered), with its own
        digest: e.g. one tenant's requests alone, for the solo arm of an isolation figure."""
        rows = np.asarray(rows, dtype=np.int64)
        columns = {k: v[rows] for k, v in self.columns.items()}
        offsets = values = None
        if self.block_offsets is not None and self.block_values is not None:
            starts, ends = self.block_offsets[rows], self.block_offsets[rows + 1]
            offsets = np.concatenate([[0], np.cumsum(ends - starts)]).astype(np.int64)
            parts = [self.block_values[s:e] for s, e in zip(starts, ends, strict=True)]
            values = np.concatenate(parts) if parts else self.block_values[:0]
        return Plan(
            columns,
            self.tenants,
            self.slo_classes,
            self.workloads,
            offsets,
            values,
            self.block_tokens,
            self.seed,
            self.scenario,
            sessions=None
            if self.sessions is None
            else {k: v[rows] for k, v in self.sessions.items()},
        )

    def request(self, i: int) -> PlannedRequest:
        c = self.columns
        blocks = None
        if self.block_offsets is not None and self.block_values is not None:
            lo, hi = self.block_offsets[i], self.block_offsets[i + 1]
            blocks = self.block_values[lo:hi] if hi > lo else None
        w = int(c["workload"][i])
        s = self.sessions
        session = (
            {}
            if s is None
            else {
                "session_id": int(s["session_id"][i]),
                "turn": int(s["turn"][i]),
                "think_ns": int(s["think_ns"][i]),
                "context_limit": int(s["context_limit"][i]),
            }
        )
        return PlannedRequest(
            request_id=i,
            offset_ns=int(c["offset_ns"][i]),
            tenant=self.tenants[c["tenant"][i]],
            slo_class=self.slo_classes[c["slo_class"][i]],
            workload=self.workloads[w],
            endpoint=ENDPOINTS[c["endpoint"][i]],
            stream=bool(c["stream"][i]),
            prompt_tokens=int(c["prompt_tokens"][i]),
            max_tokens=int(c["max_tokens"][i]),
            prefix_group=int(c["prefix_group"][i]),
            prefix_tokens=int(c["prefix_tokens"][i]),
            prompt_seed=int(c["prompt_seed"][i]),
            workload_index=w,
            block_ids=blocks,
            block_tokens=self.block_tokens,
            **session,
        )

    def names(self, column: str) -> np.ndarray:
        """A categorical column as its names (object array)."""
        table = {
            "tenant": self.tenants,
            "slo_class": self.slo_classes,
            "workload": self.workloads,
            "endpoint": ENDPOINTS,
        }[column]
        return np.asarray(table, dtype=object)[self.columns[column]]

    # ------------------------------------------------------------------ parquet

    def to_arrow(self) -> pa.Table:
        n = len(self)
        arrays: dict[str, pa.Array] = {"request_id": pa.array(np.arange(n, dtype=np.int64))}
        for name in COLUMNS:
            col = self.columns[name]
            if name in ("tenant", "slo_class", "workload", "endpoint"):
                table = {
                    "tenant": self.tenants,
                    "slo_class": self.slo_classes,
                    "workload": self.workloads,
                    "endpoint": ENDPOINTS,
                }[name]
                arrays[name] = pa.DictionaryArray.from_arrays(
                    pa.array(col.astype(np.int32)), pa.array(list(table), type=pa.string())
                )
            else:
                arrays[name] = pa.array(col)
        if self.block_offsets is not None and self.block_values is not None:
            arrays["block_ids"] = pa.ListArray.from_arrays(
                pa.array(self.block_offsets.astype(np.int32)), pa.array(self.block_values)
            )
        for name in SESSION_COLUMNS if self.sessions is not None else ():
            arrays[name] = pa.array(self.sessions[name])  # type: ignore[index]
        meta = {
            "fairbench.plan_format": str(PLAN_FORMAT),
            "fairbench.plan_digest": self.digest,
            "fairbench.seed": str(self.seed),
            "fairbench.scenario": self.scenario,
            "fairbench.block_tokens": str(self.block_tokens),
            "fairbench.names": json.dumps(
                {"tenant": self.tenants, "slo_class": self.slo_classes, "workload": self.workloads}
            ),
        }
        return pa.table(arrays).replace_schema_metadata(meta)

    def save(self, path: str | Path) -> None:
        write_table(self.to_arrow(), path)

    def summary_rows(self) -> list[dict[str, Any]]:
        """Per-tenant figures a person checks before running: count, rate, CV, lengths."""
        rows = []
        t = self.columns["offset_ns"]
        for code, name in enumerate(self.tenants):
            mask = self.columns["tenant"] == code
            offsets = t[mask] / 1e9
            prompt = self.columns["prompt_tokens"][mask]
            output = self.columns["max_tokens"][mask]
            gaps = np.diff(offsets)
            span = offsets[-1] - offsets[0] if len(offsets) > 1 else 0.0
            row: dict[str, Any] = {
                "tenant": name,
                "requests": int(mask.sum()),
                "rate_per_s": (len(offsets) - 1) / span if span > 0 else float("nan"),
                "interarrival_cv": float(gaps.std() / gaps.mean())
                if len(gaps) > 1 and gaps.mean() > 0
                else float("nan"),
            }
            for label, values in (("prompt", prompt), ("output", output)):
                for q in (50, 90, 99):
                    row[f"{label}_p{q}"] = float(np.percentile(values, q)) if len(values) else 0.0
            rows.append(row)
        return rows


def load_plan(path: str | Path) -> Plan:
    """Read a plan written by `Plan.save` and check its digest."""
    table = pq.read_table(str(path))
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    names = json.loads(meta["fairbench.names"])
    columns: dict[str, np.ndarray] = {}
    for name, dtype in COLUMNS.items():
        col = table.column(name).combine_chunks()
        if isinstance(col, pa.DictionaryArray):
            columns[name] = col.indices.to_numpy(zero_copy_only=False).astype(dtype)
        else:
            columns[name] = col.to_numpy(zero_copy_only=False).astype(dtype)
    offsets = values = None
    if "block_ids" in table.column_names:
        lists = table.column("block_ids").combine_chunks()
        offsets = lists.offsets.to_numpy().astype(np.int64)
        values = lists.values.to_numpy().astype(np.int64)
    sessions = None
    if "session_id" in table.column_names:
        sessions = {
            name: table.column(name).to_numpy().astype(dtype)
            for name, dtype in SESSION_COLUMNS.items()
        }
    plan = Plan(
        columns=columns,
        tenants=tuple(names["tenant"]),
        slo_classes=tuple(names["slo_class"]),
        workloads=tuple(names["workload"]),
        block_offsets=offsets,
        block_values=values,
        block_tokens=int(meta.get("fairbench.block_tokens", 512)),
        seed=int(meta.get("fairbench.seed", 0)),
        scenario=meta.get("fairbench.scenario", ""),
        sessions=sessions,
    )
    if plan.digest != meta["fairbench.plan_digest"]:
        raise ValueError(f"{path}: plan digest mismatch (file altered or written by a bug)")
    return plan
