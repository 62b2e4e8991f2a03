"""A Ray run's journals on the driver: pulling every actor's new journal lines as the run goes,
merged by request id (a record already held is not written twice), and rewriting a journal
whose actor's clock drifted measurably onto the driver's timeline.

It exists so that the merge rule — one record per request, whichever way it arrived — lives
in one module. Imports `run.executor` (the live counters), `run.live`, `run.ray_actor`,
`run.ray_clock`, `run.ray_cluster` and `plan`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import orjson

from fairbench.plan.model import Plan
from fairbench.run.executor import LiveCounters
from fairbench.run.live import Progress
from fairbench.run.ray_actor import CALL_TIMEOUT_S, ActorRun, now
from fairbench.run.ray_clock import drift, to_driver_timeline
from fairbench.run.ray_cluster import why

POLL_S = 0.2


def bytes_file(data: bytes) -> Any:
    import io

    return io.BytesIO(data)


def stream(
    ray: Any, actors: list[ActorRun], run_dir: Path, planned: int, progress: Progress | None
) -> bool:
    """Pull every actor's new journal lines into the run directory until all are done."""
    stopped = False
    seen = bytearray(planned)
    journals = {a.k: (run_dir / f"journal-{a.k}.jsonl").open("ab") for a in actors}
    counters = LiveCounters(planned=planned)
    try:
        while any(a.dead is None and a.running for a in actors):
            try:
                time.sleep(POLL_S)
                live = [a for a in actors if a.dead is None and a.running]
                refs = [a.handle.poll.remote() for a in live]
                for actor, ref in zip(live, refs, strict=True):
                    try:
                        data, actor.counters, actor.running = ray.get(ref, timeout=CALL_TIMEOUT_S)
                    except (ray.exceptions.RayError, TimeoutError) as error:
                        actor.dead = why(error)
                        continue
                    actor.last_heard_ns = now()
                    if data:
                        append(journals[actor.k], data, seen, actor)
                values = [a.counters for a in actors]
                counters.sent = sum(v[0] for v in values)
                counters.done = sum(v[1] for v in values)
                counters.errors = sum(v[2] for v in values)
                counters.last_lag_ns = max(v[3] for v in values)
                if progress is not None:
                    progress(counters)
            except KeyboardInterrupt:
                stopped = True  # every actor's generator stops gracefully (SIGTERM)
                for actor in actors:
                    if actor.dead is None:
                        actor.handle.stop.remote()
    finally:
        for handle in journals.values():
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
    return stopped


def append(journal: Any, data: bytes, seen: bytearray, actor: ActorRun) -> None:
    """Write a batch, merged by request id: a record already held is not written twice."""
    out = []
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        rid = int(orjson.loads(line)["request_id"])
        if seen[rid]:
            continue
        seen[rid] = 1
        out.append(line)
    actor.received += len(out)
    if out:
        journal.write(b"\n".join(out) + b"\n")
        journal.flush()


def read_journal(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().split(b"\n") if line.strip()]


def convert(actors: list[ActorRun], run_dir: Path, plan: Plan) -> None:
    """Rewrite a journal whose actor's clock drifted measurably onto the driver's timeline."""
    for actor in actors:
        if actor.before is None or actor.after is None:
            continue
        d = drift(actor.before, actor.after)
        if not d.significant:
            continue
        path = run_dir / f"journal-{actor.k}.jsonl"
        rows = [to_driver_timeline(r, d, plan.duration_ns) for r in read_journal(path)]
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
        tmp.replace(path)
