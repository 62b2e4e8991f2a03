"""`materialize(scenario, seed) -> Plan`: every request decided up front, in one process.

Randomness comes from one seed through a tree of named streams, `SeedSequence(seed,
spawn_key=(owner, purpose))`: tenant i's arrivals, workload choices, lengths, prefixes and prompt
seeds each have their own stream. The streams are independent and fixed by (seed, owner,
purpose) alone, so adding a tenant or lengthening the run never reshuffles another tenant's
draws, and no worker process ever draws on its own (see STYLE.md's guidellm pitfall).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairbench.plan.model import COLUMNS, ENDPOINTS, SESSION_COLUMNS, Plan
from fairbench.plan.sessions import expand_sessions, number_sessions
from fairbench.workload.arrivals import arrival_times, rate_function
from fairbench.workload.conversations import SessionReplay, replay
from fairbench.workload.errors import ScenarioError
from fairbench.workload.lengths import sample_lengths
from fairbench.workload.models import ConstantDist, Scenario, Tenant, TraceArrival, TraceSpec
from fairbench.workload.sessions import trace_sessions, whole_prompts
from fairbench.workload.traces import TraceRows, detect_tick, read_trace, spread_ties, take_ragged

_ARRIVALS, _MIX, _PROMPT, _OUTPUT, _PREFIX, _SEEDS, _SPLIT = range(7)
_TRACE_OWNER = 1 << 20
_DEFAULT_OUTPUT = ConstantDist(dist="constant", value=128)


def _stream(seed: int, owner: int, purpose: int, extra: int = 0) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(owner, purpose, extra)))


@dataclass
class _Part:
    """One tenant's requests before the global merge (times in seconds, unsorted globally)."""

    t: np.ndarray
    prompt: np.ndarray | None = None  # from a trace
    output: np.ndarray | None = None
    block_offsets: np.ndarray | None = None
    block_values: np.ndarray | None = None
    # from a trace whose conversations replay as sessions (fairbench.workload.conversations)
    replay: SessionReplay | None = None


def _replay_part(replay: SessionReplay) -> _Part:
    return _Part(replay.t, replay.input_tokens, replay.output_tokens, replay=replay)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _trace_parts(scn: Scenario, seed: int) -> dict[int, _Part]:
    """Each trace is read, windowed, spread and scaled once, then split among its tenants."""
    parts: dict[int, _Part] = {}
    for trace_index, (name, spec) in enumerate(scn.traces.items()):
        users = [
            i
            for i, t in enumerate(scn.tenants)
            if isinstance(t.arrival, TraceArrival) and t.arrival.trace == name
        ]
        if not users:
            continue
        if trace_sessions(spec):
            parts.update(_session_trace_parts(scn, seed, trace_index, spec, users))
            continue
        rows = read_trace(spec.format, spec.path)
        end = spec.end if spec.end is not None else np.inf
        keep = np.flatnonzero((rows.t >= spec.start) & (rows.t < end))
        rows = rows.take(keep)
        t = rows.t - spec.start
        if spec.spread == "auto":
            t = spread_ties(t, detect_tick(t))
        elif isinstance(spec.spread, float):
            t = spread_ties(t, spec.spread)
        t = t * spec.time_scale
        rows = TraceRows(
            t, rows.input_tokens, rows.output_tokens, rows.hash_offsets, rows.hash_values
        )
        shares = np.array([scn.tenants[i].arrival.share or 1.0 for i in users])  # type: ignore[union-attr]
        edges = np.cumsum(shares / shares.sum())
        edges[-1] = 1.0
        if spec.split == "hash":
            key = rows.prefix_key(spec.split_depth)
            if key is None:
                key = np.arange(len(rows), dtype=np.int64)
            u = (_splitmix64(key) >> np.uint64(11)).astype(np.float64) / float(1 << 53)
        else:
            u = _stream(seed, _TRACE_OWNER + trace_index, _SPLIT).random(len(rows))
        owner = np.searchsorted(edges, u, side="right")
        for k, tenant_index in enumerate(users):
            mine = rows.take(np.flatnonzero(owner == k))
            parts[tenant_index] = _Part(
                mine.t,
                mine.input_tokens,
                mine.output_tokens,
                mine.hash_offsets,
                mine.hash_values,
            )
    return parts


def _session_trace_parts(
    scn: Scenario, seed: int, trace_index: int, spec: TraceSpec, users: list[int]
) -> dict[int, _Part]:
    """A trace's conversations as sessions (fairbench.workload.conversations.replay), each
    conversation whole with one tenant: a shares split draws once per conversation, a hash
    split hashes the conversation (rows outside any conversation: as without sessions)."""
    rows = read_trace(spec.format, spec.path, sessions=True)
    end = spec.end if spec.end is not None else np.inf
    rep = replay(rows, spec.start, end, spec.spread, spec.time_scale, whole_prompts(spec))
    shares = np.array([scn.tenants[i].arrival.share or 1.0 for i in users])  # type: ignore[union-attr]
    edges = np.cumsum(shares / shares.sum())
    edges[-1] = 1.0
    inside = rep.session >= 0
    if spec.split == "hash":
        key = np.where(inside, rep.session, (np.int64(1) << 40) + np.arange(len(rep)))
        u = (_splitmix64(key) >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    else:
        u = _stream(seed, _TRACE_OWNER + trace_index, _SPLIT).random(len(rep))
        if inside.any():  # every turn goes where its conversation's first row went
            _, first, back = np.unique(rep.session[inside], return_index=True, return_inverse=True)
            u[inside] = u[np.flatnonzero(inside)[first]][back]
    owner = np.searchsorted(edges, u, side="right")
    return {
        tenant_index: _replay_part(rep.take(np.flatnonzero(owner == k)))
        for k, tenant_index in enumerate(users)
    }


def _synthetic_part(tenant: Tenant, index: int, seed: int, horizon: float) -> _Part:
    rng = _stream(seed, index, _ARRIVALS)
    return _Part(arrival_times(tenant.arrival, tenant.phases, horizon, rng))  # type: ignore[arg-type]


def _fill(
    scn: Scenario, seed: int, index: int, tenant: Tenant, part: _Part
) -> dict[str, np.ndarray]:
    n = len(part.t)
    mix = scn.mix_of(tenant)
    names = list(mix)
    weights = np.array([mix[m] for m in names], dtype=np.float64)
    if len(names) == 1:
        pick = np.zeros(n, dtype=np.int64)
    else:
        pick = _stream(seed, index, _MIX).choice(len(names), size=n, p=weights / weights.sum())
    workload_codes = list(scn.workloads)
    class_codes = list(scn.slo_classes)
    out = {
        "t": part.t,
        "tenant": np.full(n, index, dtype=np.int16),
        "workload": np.empty(n, dtype=np.int16),
        "slo_class": np.empty(n, dtype=np.int16),
        "endpoint": np.empty(n, dtype=np.int8),
        "stream": np.empty(n, dtype=bool),
        "prompt_tokens": np.empty(n, dtype=np.int32),
        "max_tokens": np.empty(n, dtype=np.int32),
        "prefix_group": np.full(n, -1, dtype=np.int32),
        "prefix_tokens": np.zeros(n, dtype=np.int32),
        "prompt_seed": _stream(seed, index, _SEEDS).integers(
            0, np.iinfo(np.uint64).max, size=n, dtype=np.uint64, endpoint=True
        ),
    }
    for k, name in enumerate(names):
        rows = np.flatnonzero(pick == k)
        m = len(rows)
        wl = scn.workloads[name]
        w = workload_codes.index(name)
        out["workload"][rows] = w
        out["slo_class"][rows] = class_codes.index(wl.slo_class or tenant.slo_class)
        out["endpoint"][rows] = ENDPOINTS.index(wl.endpoint)
        embeddings = wl.endpoint == "embeddings"
        out["stream"][rows] = (not embeddings) if wl.stream is None else wl.stream
        if part.prompt is not None and part.output is not None:
            prompt = part.prompt[rows]
            output = part.output[rows]
        else:
            prompt = sample_lengths(wl.prompt_tokens, _stream(seed, index, _PROMPT, w), m)
            output = sample_lengths(
                wl.output_tokens or _DEFAULT_OUTPUT, _stream(seed, index, _OUTPUT, w), m
            )
        prompt = np.maximum(prompt, 1)
        out["prompt_tokens"][rows] = prompt
        out["max_tokens"][rows] = 0 if embeddings else output
        if wl.prefix is not None and part.block_offsets is None:
            rng = _stream(seed, index, _PREFIX, w)
            has = rng.random(m) < wl.prefix.share
            ranks = np.arange(1, wl.prefix.groups + 1, dtype=np.float64)
            p = ranks**-wl.prefix.zipf
            group = rng.choice(wl.prefix.groups, size=m, p=p / p.sum())
            if not wl.prefix.across_tenants:  # this tenant's own groups (own text, own blocks)
                group = group + index * wl.prefix.groups
            out["prefix_group"][rows] = np.where(has, group, -1)
            out["prefix_tokens"][rows] = np.where(has, np.minimum(wl.prefix.tokens, prompt), 0)
    if part.replay is not None:
        arrival = scn.tenants[index].arrival
        assert isinstance(arrival, TraceArrival)
        limit = scn.traces[arrival.trace].context_limit or 0
        return _trace_sessions(out, part.replay, index, limit)
    if _has_sessions(scn):
        # a trace without conversations is replayed row by row: only synthetic arrivals open
        # sessions of a workload's `session:`
        coded = [
            (workload_codes.index(name), scn.workloads[name])
            for name in names
            if part.prompt is None
        ]
        out = expand_sessions(
            out, coded, lambda purpose, w: _stream(seed, index, purpose, w), index
        )
    return out


def _trace_sessions(
    out: dict[str, np.ndarray], rep: SessionReplay, tenant_index: int, context_limit: int
) -> dict[str, np.ndarray]:
    """A tenant's rows from a trace's conversations, with the session columns: one workload a
    conversation (its first turn's pick), the shared prefix (if the workload has one) opening
    a conversation only, think times and turns as the replay gives them, and the trace's
    `context_limit` (0: none) on every row."""
    inside = rep.session >= 0
    if inside.any():
        codes, back = np.unique(rep.session[inside], return_inverse=True)
        opener = np.flatnonzero(inside & (rep.turn == 1))
        first_pick = np.empty(len(codes), dtype=np.int64)
        first_pick[np.searchsorted(codes, rep.session[opener])] = opener
        source = np.arange(len(rep))
        source[inside] = first_pick[back]
        for name in ("workload", "slo_class", "endpoint", "stream"):
            out[name] = out[name][source]  # the mix drew per row: the first turn's draw
    later = rep.turn > 1
    out["prefix_group"][later] = -1
    out["prefix_tokens"][later] = 0
    out["session_key"] = np.where(
        inside, (np.int64(tenant_index) << 40) | rep.session.astype(np.int64), -1
    )
    out["turn"] = rep.turn.astype(np.int32)
    out["think_ns"] = np.rint(rep.think * 1e9).astype(np.int64)
    out["context_limit"] = np.full(len(rep), context_limit, dtype=np.int32)
    return out


def _has_sessions(scn: Scenario) -> bool:
    used = {t.arrival.trace for t in scn.tenants if isinstance(t.arrival, TraceArrival)}
    return any(wl.session is not None for wl in scn.workloads.values()) or any(
        trace_sessions(spec) for name, spec in scn.traces.items() if name in used
    )


def _build(
    scn: Scenario, seed: int, horizon: float, traces: dict[int, _Part]
) -> tuple[dict[str, np.ndarray], list[_Part]]:
    parts: list[_Part] = []
    filled: list[dict[str, np.ndarray]] = []
    for i, tenant in enumerate(scn.tenants):
        part = traces[i] if i in traces else _synthetic_part(tenant, i, seed, horizon)
        if part.replay is not None:  # a conversation is in the run if its first turn is
            part = _replay_part(part.replay.take(np.flatnonzero(part.replay.opened < horizon)))
        elif i in traces:
            keep = np.flatnonzero(part.t < horizon)
            if len(keep) < len(part.t):
                rows = TraceRows(
                    part.t,
                    part.prompt,
                    part.output,
                    part.block_offsets,  # type: ignore[arg-type]
                    part.block_values,
                ).take(keep)
                part = _Part(
                    rows.t,
                    rows.input_tokens,
                    rows.output_tokens,
                    rows.hash_offsets,
                    rows.hash_values,
                )
        parts.append(part)
        filled.append(_fill(scn, seed, i, tenant, part))
    merged = {key: np.concatenate([f[key] for f in filled]) for key in filled[0]}
    return merged, parts


def _merge_blocks(parts: list[_Part], order: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    if all(p.block_offsets is None for p in parts):
        return None
    offsets = [np.zeros(1, dtype=np.int64)]
    values = []
    base = 0
    for p in parts:
        if p.block_offsets is None or p.block_values is None:
            offsets.append(np.full(len(p.t), base, dtype=np.int64))
            continue
        offsets.append(p.block_offsets[1:] + base)
        values.append(p.block_values)
        base += len(p.block_values)
    all_offsets = np.concatenate(offsets)
    all_values = np.concatenate(values) if values else np.empty(0, dtype=np.int64)
    return take_ragged(all_offsets, all_values, order)


MAX_REQUESTS = 50_000_000


def _check_size(scn: Scenario, horizon: float, max_requests: int) -> None:
    """Refuse, before drawing anything, a plan whose expected size is beyond `max_requests`."""
    for i, tenant in enumerate(scn.tenants):
        if isinstance(tenant.arrival, TraceArrival) or not np.isfinite(horizon):
            continue
        expected = rate_function(tenant.arrival, tenant.phases, horizon).total
        if expected > max_requests:
            raise ScenarioError(
                [
                    f"tenants[{i}].arrival: would plan about {expected:.3g} requests in "
                    f"{horizon:g}s (limit {max_requests:,}); lower the rate or run.duration"
                ]
            )


def materialize(scn: Scenario, seed: int | None = None, max_requests: int = MAX_REQUESTS) -> Plan:
    """The Plan of `scn` under `seed` (default: the scenario's run.seed; 0 is a real seed)."""
    seed = scn.run.seed if seed is None else seed
    if scn.run.requests is not None and scn.run.requests > max_requests:
        raise ScenarioError(
            [f"run.requests: {scn.run.requests:,} is over the limit of {max_requests:,}"]
        )
    traces = _trace_parts(scn, seed)
    limit = scn.run.requests
    if scn.run.duration is not None:
        horizon = scn.run.duration
    elif all(isinstance(t.arrival, TraceArrival) for t in scn.tenants):
        horizon = np.inf
    else:
        horizon = 60.0
    while True:
        _check_size(scn, horizon, max_requests)
        merged, parts = _build(scn, seed, horizon, traces)
        enough = limit is None or len(merged["t"]) >= limit
        if enough or scn.run.duration is not None or horizon == np.inf or horizon > 1e8:
            break
        horizon *= 2
    offset_ns = np.rint(merged["t"] * 1e9).astype(np.int64)
    order = np.argsort(offset_ns, kind="stable")
    if limit is not None:
        order = order[:limit]
    columns = {"offset_ns": offset_ns[order]}
    for name, dtype in COLUMNS.items():
        if name != "offset_ns":
            columns[name] = merged[name][order].astype(dtype)
    sessions = None
    if _has_sessions(scn):
        sessions = {"session_id": number_sessions(merged["session_key"][order])}
        for name, dtype in SESSION_COLUMNS.items():
            if name != "session_id":
                sessions[name] = merged[name][order].astype(dtype)
    blocks = _merge_blocks(parts, order)
    block_tokens = next(iter(scn.traces.values())).block_tokens if scn.traces else 512
    return Plan(
        columns=columns,
        tenants=tuple(t.id for t in scn.tenants),
        slo_classes=tuple(scn.slo_classes),
        workloads=tuple(scn.workloads),
        block_offsets=blocks[0] if blocks else None,
        block_values=blocks[1] if blocks else None,
        block_tokens=block_tokens,
        seed=seed,
        scenario=scn.name,
        sessions=sessions,
    )
