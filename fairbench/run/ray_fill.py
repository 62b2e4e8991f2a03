"""Nothing lost when a Ray actor dies: fetch what its node's journal holds that the stream
missed (a task pinned to that node), then record every request of its shard that still has no
record — in flight: cancelled and censored at the last time the actor was heard from; never
sent: cancelled with no send time.

It exists so that a dead actor's shard ends as exactly one record per planned request. Imports
`run.ray_actor`, `run.ray_cluster`, `run.ray_merge` and `plan`.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from fairbench.plan.model import Plan
from fairbench.run.ray_actor import CALL_TIMEOUT_S, CHILD_KILL_AFTER_S, ActorRun, salvage
from fairbench.run.ray_cluster import why
from fairbench.run.ray_merge import append, read_journal


def salvage_dead(
    ray: Any, actors: list[ActorRun], run_dir: Path, planned: int, grace_s: float
) -> None:
    """A dead actor's node still holds its generator's journal: fetch what the stream missed.

    A task pinned to that node waits for the orphaned generator to finish its graceful stop and
    returns the journal; records the driver already has are skipped (merge by request id). If
    the node itself is gone, this fails and the shard is filled instead (`fill`).
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    dead = [a for a in actors if a.dead and a.node.get("node_id") and a.child_pid]
    if not dead:
        return
    for actor in dead:  # one that only stopped answering must stop its generator too
        with contextlib.suppress(Exception):
            ray.kill(actor.handle, no_restart=True)
    wait_s = grace_s + CHILD_KILL_AFTER_S + 5.0
    task = ray.remote(salvage)
    refs = [
        task.options(
            num_cpus=0,
            max_retries=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(a.node["node_id"], soft=False),
        ).remote(a.node["journal"], a.child_pid, wait_s)
        for a in dead
    ]
    seen = bytearray(planned)
    for actor, ref in zip(dead, refs, strict=True):
        try:
            data = ray.get(ref, timeout=wait_s + CALL_TIMEOUT_S)
        except Exception as error:
            actor.node["salvage"] = f"failed: {why(error)}"
            continue
        path = run_dir / f"journal-{actor.k}.jsonl"
        for row in read_journal(path):
            seen[int(row["request_id"])] = 1
        before = actor.received
        with path.open("ab") as handle:
            append(handle, data, seen, actor)
            os.fsync(handle.fileno())
        actor.salvaged, actor.received = actor.received - before, before


def fill(actors: list[ActorRun], run_dir: Path, plan: Plan, n: int, t0: int) -> None:
    """Record every request of a dead actor's shard that has no record: nothing is lost. One
    that was in flight is `cancelled` and censored at the last time the driver heard from the
    actor (it waited at least that long; its latency stays in the population); one never sent
    is `cancelled` with no send time (not admitted)."""
    for actor in actors:
        if actor.dead is None:
            continue
        path = run_dir / f"journal-{actor.k}.jsonl"
        have = {int(r["request_id"]) for r in read_journal(path)}
        shard = np.arange(actor.k, len(plan), n)
        sent = int(actor.counters[0])  # the executor sends its shard in order
        offsets = plan.columns["offset_ns"]
        lines = []
        for position, rid in enumerate(shard):
            if int(rid) in have:
                continue
            req = plan.request(int(rid))
            row: dict[str, Any] = {
                "request_id": int(rid),
                "tenant": req.tenant,
                "slo_class": req.slo_class,
                "workload": req.workload,
                "endpoint": req.endpoint,
                "t_intended_ns": int(offsets[rid]),
                "prompt_tokens": req.prompt_tokens,
                "max_tokens": req.max_tokens,
                "worker": actor.k,
            }
            if position < sent:
                seen = max(int(actor.last_heard_ns) - t0, int(offsets[rid]))
                row.update(
                    status="cancelled",
                    t_sent_ns=int(offsets[rid]),  # sent in order, at its time at the earliest
                    t_end_ns=seen,
                    error_detail=f"ray actor {actor.k} died with the request in flight "
                    f"({actor.dead}); censored at the last time the actor was heard from",
                )
            else:
                row.update(
                    status="cancelled",
                    error_detail=f"not sent: ray actor {actor.k} died ({actor.dead})",
                )
            actor.filled[row["status"]] = actor.filled.get(row["status"], 0) + 1
            lines.append(orjson.dumps(row) + b"\n")
        with path.open("ab") as handle:
            handle.write(b"".join(lines))
            handle.flush()
            os.fsync(handle.fileno())
