"""A run past one machine: the plan's shards on Ray actors, one clock, nothing lost (issue #18).

The driver materializes the plan once (measure does) and ships its bytes to `n` actors, one per
generator, placed by custom resources (one unit each) or spread over the nodes. Each actor runs
the existing shard worker (`fairbench.run.shards.worker_main`, hence `live` and the executor,
unchanged) in a child process of its own, because the executor wants a main thread for its
signal handlers and Ray runs actor methods on a thread of its own. Actor and child share the
node's CLOCK_MONOTONIC and a small memory-mapped state file (the same layout as `run_sharded`'s
shared array: counters, ready flag, t0).

One clock: the driver estimates every actor's clock offset by ping-pong (`ray_clock`) before
the run and again after it, and starts each actor at the driver's t0 expressed in the actor's
clock, so every shard aims at one timeline. Offsets, bounds and drift go to run.json; a bound
past the send-lag budget makes the run INVALID.

Nothing lost: each child journals on its node, and the driver pulls complete journal lines from
every actor as the run goes (a batch every 0.2 s), writing them to `journal-<k>.jsonl` in the
run directory, merged by request id. An actor that dies leaves its shard's unrecorded requests
recorded by the driver: those it had sent as `error` (kind `client`, outcome unknown) and the
rest as `cancelled`, and the run is marked incomplete. Ctrl-C on the driver stops every actor
(its child gets SIGTERM: the executor's graceful stop); a child whose actor dies stops itself.

The jobs live apart: `ray_cluster` (reaching the cluster), `ray_actor` (the actor and its child
on a node), `ray_sync` (the clock), `ray_merge` (the journals), `ray_fill` (a dead actor's
shard); this module starts the actors and runs them in order. What the shards share (the
plan, the worker's arguments, the scraper) is `run.shards.Shards`, as for local processes.
Imports those and `run.shards`.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from fairbench.run.ray_actor import CALL_TIMEOUT_S, ActorRun, GeneratorActor, now
from fairbench.run.ray_cluster import RaySetupError, check_resources, connect, import_ray, why
from fairbench.run.ray_fill import fill, salvage_dead
from fairbench.run.ray_merge import bytes_file, convert, stream
from fairbench.run.ray_sync import clock_json, clock_reasons, ping
from fairbench.run.shards import Shards

PLACE_TIMEOUT_S = 120.0  # an actor the cluster cannot place (no such resource) fails the run
READY_TIMEOUT_S = 120.0  # plan loaded, connections warm
RAY_LEAD_S = 0.5  # on top of the executor's lead: the start calls must reach every actor first


@dataclass
class RayResult:
    stopped: bool
    t0: int
    actors: list[dict[str, Any]]
    loop_lags: dict[int, np.ndarray]
    invalid_reasons: list[str]
    incomplete_reason: str | None
    info: dict[str, Any]


def actor_options(k: int, name: str, resources: tuple[str, ...], cpus: float) -> dict[str, Any]:
    options: dict[str, Any] = {"name": name, "num_cpus": cpus, "max_restarts": 0}
    if resources:
        options["resources"] = {resources[k % len(resources)]: 1}
    else:
        options["scheduling_strategy"] = "SPREAD"
    return options


def run_ray(
    address: str, shards: Shards, resources: tuple[str, ...] = (), cpus: float = 1.0
) -> RayResult:
    """Run the plan's n shards on Ray actors; the records land in run_dir's journals."""
    n, run_dir, plan, scn = shards.n, shards.run_dir, shards.plan, shards.scn
    import_ray()  # the import is not Ray's start-up cost
    started = time.perf_counter()
    ray, connected_here = connect(address)
    actors: list[ActorRun] = []
    scraper = None
    t0 = 0
    stopped = False
    try:
        check_resources(ray, resources, n)
        remote = ray.remote(GeneratorActor)
        for k in range(n):
            opts = actor_options(k, f"fairbench-{run_dir.name}-{k}", resources, cpus)
            actors.append(ActorRun(k, remote.options(**opts).remote(k, n)))
        try:
            nodes = ray.get([a.handle.node.remote() for a in actors], timeout=PLACE_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            want = ", ".join(resources) or f"{cpus:g} CPU each, spread"
            raise RaySetupError(
                f"--ray: the cluster could not place {n} generator actors ({want}) within "
                f"{PLACE_TIMEOUT_S:g}s; check --workers and --ray-resource against `ray status`"
            ) from None
        for actor, node in zip(actors, nodes, strict=True):
            actor.node = node
        startup_s = time.perf_counter() - started
        for actor in actors:
            actor.before = ping(ray, actor.handle)
        plan_bytes = shards.plan_path.read_bytes()
        sha = hashlib.sha256(plan_bytes).hexdigest()
        plan_ref = ray.put(plan_bytes)
        pids = ray.get(
            [a.handle.prepare.remote(plan_ref, sha, shards.worker_args(a.k)) for a in actors],
            timeout=READY_TIMEOUT_S,
        )
        for actor, pid in zip(actors, pids, strict=True):
            actor.child_pid = int(pid)
        scraper = shards.scraper()
        deadline = time.monotonic() + READY_TIMEOUT_S
        waiting = list(actors)
        while waiting and time.monotonic() < deadline:
            for actor in list(waiting):
                try:
                    if ray.get(actor.handle.ready.remote(), timeout=CALL_TIMEOUT_S):
                        waiting.remove(actor)
                except Exception as error:  # it died before t0: its shard is filled below
                    actor.dead = why(error)
                    waiting.remove(actor)
            time.sleep(0.05)
        for actor in waiting:
            actor.dead = f"not ready within {READY_TIMEOUT_S:g}s"
            with contextlib.suppress(Exception):
                ray.kill(actor.handle, no_restart=True)
        if scraper is not None:
            scraper.wait_ready()  # its baseline scrape must come before t0
        t0 = now() + int((shards.exec_options.lead_s + RAY_LEAD_S) * 1e9)
        for actor in actors:
            if actor.dead is None and actor.before is not None:
                actor.handle.start.remote(t0 + actor.before.offset_ns)
        if scraper is not None:
            scraper.start(t0)
        stopped = stream(ray, actors, run_dir, len(plan), shards.progress)
        for actor in actors:
            if actor.dead is None:
                try:
                    actor.after = ping(ray, actor.handle)
                    lags, actor.exit_code, tail = ray.get(actor.handle.finish.remote(), timeout=90)
                    if lags:
                        actor.lags = np.load(bytes_file(lags))
                    if actor.exit_code:
                        actor.dead = f"its generator exited with code {actor.exit_code}: {tail}"
                except Exception as error:
                    actor.dead = why(error)
        salvage_dead(ray, actors, run_dir, len(plan), shards.exec_options.grace_s)
        convert(actors, run_dir, plan)
        fill(actors, run_dir, plan, n, t0)
        reasons = clock_reasons(actors, scn)
        dead = [a for a in actors if a.dead]
        incomplete = None
        if dead:
            incomplete = "incomplete run: " + "; ".join(
                f"ray actor {a.k} ({a.node.get('hostname', '?')}) died ({a.dead}): "
                f"{a.salvaged} records recovered from its node's journal, "
                f"{a.filled.get('error', 0)} in-flight requests recorded as error (outcome "
                f"unknown), {a.filled.get('cancelled', 0)} unsent recorded as cancelled"
                for a in dead
            )
        info = {
            "address": address,
            "ray_version": ray.__version__,
            "actors": n,
            "startup_s": round(startup_s, 3),
            "placement": {"resources": list(resources)} if resources else {"strategy": "SPREAD"},
        }
        return RayResult(
            stopped,
            t0,
            [actor_json(a) for a in actors],
            {a.k: a.lags for a in actors},
            reasons,
            incomplete,
            info,
        )
    finally:
        if scraper is not None:
            scraper.stop_sync(t0)
        for actor in actors:
            with contextlib.suppress(Exception):
                ray.kill(actor.handle, no_restart=True)
        if connected_here:
            ray.shutdown()


def actor_json(a: ActorRun) -> dict[str, Any]:
    clock = clock_json(a)
    node = dict(a.node)
    if a.dead is None or "salvage" not in node:
        node.pop("journal", None)  # removed from the node (kept, and named, if salvage failed)
    return {
        "worker": a.k,
        **node,
        "status": "died" if a.dead else "finished",
        "died": a.dead,
        "records_streamed": a.received,
        "records_salvaged": a.salvaged,
        "records_filled": a.filled,
        "clock": clock,
    }
