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
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from fairbench.plan.model import Plan
from fairbench.run.executor import ExecOptions, LiveCounters
from fairbench.run.live import Progress
from fairbench.run.ray_clock import PINGS, ClockOffset, drift, estimate_offset, to_driver_timeline
from fairbench.run.scrape import ScraperProcess
from fairbench.targets.factory import metrics_url
from fairbench.workload.scenario import Scenario

NO_RAY = (
    "--ray needs the ray package: pip install 'fairbench-llm[ray]' (or pip install 'ray>=2.40')"
)
PLACE_TIMEOUT_S = 120.0  # an actor the cluster cannot place (no such resource) fails the run
READY_TIMEOUT_S = 120.0  # plan loaded, connections warm
POLL_S = 0.2
CALL_TIMEOUT_S = 30.0  # one poll; past it the actor counts as dead
RAY_LEAD_S = 0.5  # on top of the executor's lead: the start calls must reach every actor first
BATCH_BYTES = 8 << 20
CHILD_KILL_AFTER_S = 10.0  # past the grace, an orphaned generator is killed


class RaySetupError(RuntimeError):
    """A Ray run that cannot start as asked (no ray package, resources the cluster lacks): one
    line naming the flag and the fix."""


def _now() -> int:
    return time.perf_counter_ns()


def import_ray() -> Any:
    """The ray module, or one line saying how to install it."""
    try:
        import ray
    except ImportError:
        raise RaySetupError(NO_RAY) from None
    return ray


# --------------------------------------------------------------------------- on the actor's node


class GeneratorActor:
    """One generator on one node: a child process running shard `k` of `n`, its journal tailed.

    Every method returns quickly, so a plain (one call at a time) actor answers pings and polls
    while its child runs the schedule.
    """

    def __init__(self, k: int, n: int) -> None:
        self.k, self.n = k, n
        self.dir = Path(tempfile.mkdtemp(prefix=f"fairbench-ray-{k}-"))
        self.journal = self.dir / f"journal-{k}.jsonl"
        self.state_path = self.dir / "state.bin"
        self.state = np.memmap(self.state_path, dtype=np.int64, mode="w+", shape=(5 * n + 1,))
        self.proc: subprocess.Popen[bytes] | None = None
        self.pos = 0

    def node(self) -> dict[str, Any]:
        import ray

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "journal": str(self.journal),
        }

    def clock(self) -> int:
        return _now()

    def prepare(self, plan_bytes: bytes, sha256: str, args: dict[str, Any]) -> int:
        """Write the plan (checked against the driver's hash) and start the child (its pid)."""
        if hashlib.sha256(plan_bytes).hexdigest() != sha256:
            raise RuntimeError(f"actor {self.k}: the plan arrived corrupted (sha256 differs)")
        plan_path = self.dir / "plan.parquet"
        plan_path.write_bytes(plan_bytes)
        args = dict(args, plan=str(plan_path), journal=str(self.journal))
        args["lags"] = str(self.dir / "loop-lag.npy")
        args_path = self.dir / "args.json"
        args_path.write_text(json.dumps(args), encoding="utf-8")
        err = (self.dir / "child.stderr").open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fairbench.run.ray_shards",
                str(args_path),
                str(self.state_path),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        err.close()
        return self.proc.pid

    def ready(self) -> bool:
        """Loaded and warm; raises if the child died first (with the end of its stderr)."""
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"actor {self.k}: the generator exited early: {self._stderr()}")
        return bool(self.state[4 * self.n + self.k])

    def start(self, t0_ns: int) -> None:
        self.state[5 * self.n] = t0_ns
        self.state.flush()

    def poll(self) -> tuple[bytes, list[int], bool]:
        """Journal lines since the last poll (complete lines only), counters, child running."""
        running = self.proc is not None and self.proc.poll() is None
        data = b""
        if self.journal.exists():
            with self.journal.open("rb") as handle:
                handle.seek(self.pos)
                chunk = handle.read(BATCH_BYTES)
            end = chunk.rfind(b"\n") + 1
            data = chunk[:end]
            self.pos += end
            if end < len(chunk):
                running = True  # more to read: ask again before calling it finished
        k = self.k
        return data, [int(v) for v in self.state[4 * k : 4 * k + 4]], running

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def finish(self, keep: bool = False) -> tuple[bytes, int | None, str]:
        """The loop-lag samples (as .npy bytes), the child's exit code and stderr tail; the
        node's files are removed unless `keep`."""
        code = self.proc.wait(timeout=60) if self.proc is not None else None
        lags_path = self.dir / "loop-lag.npy"
        lags = lags_path.read_bytes() if lags_path.exists() else b""
        tail = self._stderr() if code else ""
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)
        return lags, code, tail

    def _stderr(self) -> str:
        path = self.dir / "child.stderr"
        text = path.read_text(errors="replace") if path.exists() else ""
        lines = [line for line in text.strip().splitlines() if line.strip()]
        return lines[-1][:300] if lines else "(no output)"


def _watch_parent(parent: int, grace_s: float) -> None:
    """Stop this generator once its actor is gone: gracefully (in-flight requests get the grace,
    the rest are recorded cancelled, the journal is closed), then for good."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace_s + CHILD_KILL_AFTER_S)
    os.kill(os.getpid(), signal.SIGKILL)


def salvage(journal: str, pid: int, wait_s: float) -> bytes:
    """On a dead actor's node: wait for its generator to end, then hand back its journal.

    Ray kills an actor's children with it (where it does not, the child stops itself
    gracefully), so the journal holds what was on disk at the end: everything but the last
    second's records, including those the driver had not pulled yet.
    """
    deadline = time.monotonic() + wait_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    path = Path(journal)
    data = path.read_bytes() if path.exists() else b""
    if not _alive(pid):  # still running: leave its files alone
        shutil.rmtree(path.parent, ignore_errors=True)  # the node keeps no copy of the run
    return data[: data.rfind(b"\n") + 1]


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper has finished writing)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # gone, or the pid is another user's now
        return False
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    return True


def child_main(args_path: str, state_path: str) -> None:
    """The generator process an actor starts: shard k of n, exactly as `run_sharded` runs it."""
    from fairbench.run.shards import worker_main

    args = json.loads(Path(args_path).read_text(encoding="utf-8"))
    n = int(args["workers"])
    state = np.memmap(state_path, dtype=np.int64, mode="r+", shape=(5 * n + 1,))
    grace_s = float(args["exec"].get("grace_s", 30.0))
    threading.Thread(target=_watch_parent, args=(os.getppid(), grace_s), daemon=True).start()
    worker_main(args, state)


# --------------------------------------------------------------------------- on the driver


@dataclass
class ActorRun:
    """The driver's view of one actor."""

    k: int
    handle: Any
    node: dict[str, Any] = field(default_factory=dict)
    before: ClockOffset | None = None
    after: ClockOffset | None = None
    counters: list[int] = field(default_factory=lambda: [0, 0, 0, 0])
    running: bool = True
    dead: str | None = None  # why, when it died
    last_heard_ns: int = 0
    received: int = 0
    salvaged: int = 0
    child_pid: int | None = None
    filled: dict[str, int] = field(default_factory=dict)
    exit_code: int | None = None
    lags: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))


@dataclass
class RayResult:
    stopped: bool
    t0: int
    actors: list[dict[str, Any]]
    loop_lags: dict[int, np.ndarray]
    invalid_reasons: list[str]
    incomplete_reason: str | None
    info: dict[str, Any]


def _ping(ray: Any, handle: Any, pings: int = PINGS) -> ClockOffset:
    samples = []
    for _ in range(pings):
        send = _now()
        actor_t = ray.get(handle.clock.remote(), timeout=CALL_TIMEOUT_S)
        samples.append((send, int(actor_t), _now()))
    return estimate_offset(samples)


def _actor_options(k: int, name: str, resources: tuple[str, ...], cpus: float) -> dict[str, Any]:
    options: dict[str, Any] = {"name": name, "num_cpus": cpus, "max_restarts": 0}
    if resources:
        options["resources"] = {resources[k % len(resources)]: 1}
    else:
        options["scheduling_strategy"] = "SPREAD"
    return options


def run_ray(
    address: str,
    tenant_keys: dict[str, str] | None,
    plan_path: Path,
    plan: Plan,
    scn: Scenario,
    run_dir: Path,
    n: int,
    exec_options: ExecOptions,
    base_url: str | None,
    progress: Progress | None,
    setup: dict[str, Any] | None = None,
    resources: tuple[str, ...] = (),
    cpus: float = 1.0,
) -> RayResult:
    """Run the plan's n shards on Ray actors; the records land in run_dir's journals."""
    import_ray()  # the import is not Ray's start-up cost
    started = time.perf_counter()
    ray, connected_here = connect(address)
    actors: list[ActorRun] = []
    scraper = None
    t0 = 0
    stopped = False
    try:
        _check_resources(ray, resources, n)
        remote = ray.remote(GeneratorActor)
        for k in range(n):
            opts = _actor_options(k, f"fairbench-{run_dir.name}-{k}", resources, cpus)
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
            actor.before = _ping(ray, actor.handle)
        plan_bytes = plan_path.read_bytes()
        sha = hashlib.sha256(plan_bytes).hexdigest()
        plan_ref = ray.put(plan_bytes)
        exec_dict = dict(exec_options.__dict__)
        common = {
            "scenario": scn.model_dump(mode="json"),
            "workers": n,
            "exec": exec_dict,
            "base_url": base_url,
            "tenant_keys": tenant_keys,
            "setup": setup,
        }
        pids = ray.get(
            [a.handle.prepare.remote(plan_ref, sha, dict(common, worker=a.k)) for a in actors],
            timeout=READY_TIMEOUT_S,
        )
        for actor, pid in zip(actors, pids, strict=True):
            actor.child_pid = int(pid)
        url = metrics_url(scn, base_url)
        scraper = (
            ScraperProcess(url, run_dir / "server_metrics.parquet", scn.target.scrape_interval)
            if url
            else None
        )
        deadline = time.monotonic() + READY_TIMEOUT_S
        waiting = list(actors)
        while waiting and time.monotonic() < deadline:
            for actor in list(waiting):
                try:
                    if ray.get(actor.handle.ready.remote(), timeout=CALL_TIMEOUT_S):
                        waiting.remove(actor)
                except Exception as error:  # it died before t0: its shard is filled below
                    actor.dead = _why(error)
                    waiting.remove(actor)
            time.sleep(0.05)
        for actor in waiting:
            actor.dead = f"not ready within {READY_TIMEOUT_S:g}s"
            with contextlib.suppress(Exception):
                ray.kill(actor.handle, no_restart=True)
        if scraper is not None:
            scraper.wait_ready()  # its baseline scrape must come before t0
        t0 = _now() + int((exec_options.lead_s + RAY_LEAD_S) * 1e9)
        for actor in actors:
            if actor.dead is None and actor.before is not None:
                actor.handle.start.remote(t0 + actor.before.offset_ns)
        if scraper is not None:
            scraper.start(t0)
        stopped = _stream(ray, actors, run_dir, len(plan), progress)
        for actor in actors:
            if actor.dead is None:
                try:
                    actor.after = _ping(ray, actor.handle)
                    lags, actor.exit_code, tail = ray.get(actor.handle.finish.remote(), timeout=90)
                    if lags:
                        actor.lags = np.load(_bytes_file(lags))
                    if actor.exit_code:
                        actor.dead = f"its generator exited with code {actor.exit_code}: {tail}"
                except Exception as error:
                    actor.dead = _why(error)
        _salvage(ray, actors, run_dir, len(plan), exec_options.grace_s)
        _convert(actors, run_dir, plan)
        _fill(actors, run_dir, plan, n, t0)
        reasons = _clock_reasons(actors, scn)
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
            [_actor_json(a) for a in actors],
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


def connect(address: str) -> tuple[Any, bool]:
    """The ray module, connected to the cluster `address` names (`auto`, `local` or HOST:PORT),
    and whether this call connected (then the caller disconnects with `ray.shutdown()`).

    A HOST:PORT where nothing listens is refused at once: Ray itself would wait minutes for it.
    """
    ray = import_ray()
    if ray.is_initialized():
        return ray, False
    if address not in ("auto", "local") and "://" not in address:
        _probe(address)
    quiet = {"log_to_driver": False, "logging_level": logging.WARNING}  # the command's own output
    try:
        if address == "local":  # a Ray instance on this machine, for this command only
            ray.init(**quiet, include_dashboard=False)
        else:
            ray.init(address=address, **quiet)
    except (ConnectionError, ValueError, RuntimeError) as error:
        raise RaySetupError(
            f"--ray {address}: cannot connect ({_why(error)}); {CONNECT_FIX}"
        ) from None
    return ray, True


CONNECT_FIX = "start a cluster with `ray start --head`, pass its HOST:PORT, or use --ray local"
PROBE_TIMEOUT_S = 5.0


def _probe(address: str) -> None:
    """A head node's GCS port answers a TCP connect; refuse, in one line, an address where
    nothing does."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise RaySetupError(f"--ray {address}: use auto, local or HOST:PORT (e.g. 10.0.0.5:6379)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_TIMEOUT_S).close()
    except OSError as error:
        if isinstance(error, TimeoutError):
            reason = f"no answer within {PROBE_TIMEOUT_S:g} s"
        else:
            reason = (error.strerror or type(error).__name__).lower()
        raise RaySetupError(
            f"--ray {address}: nothing answers there ({reason}); {CONNECT_FIX}"
        ) from None


def _check_resources(ray: Any, resources: tuple[str, ...], n: int) -> None:
    """Fail at once, naming the flag, when the cluster lacks a resource the actors need."""
    if not resources:
        return
    have = ray.cluster_resources()
    for j, name in enumerate(resources):
        need = len(range(j, n, len(resources)))
        if need and have.get(name, 0) < need:
            raise RaySetupError(
                f"--ray-resource {name}: {n} actors need {need} unit(s), the cluster offers "
                f"{have.get(name, 0):g}; start nodes with --resources '{{\"{name}\": 1}}' or "
                "lower --workers"
            )


def check_task_resources(ray: Any, resources: tuple[str, ...]) -> None:
    """Tasks queue for a resource the cluster has (one unit each); one it lacks entirely would
    leave them queued for ever, so refuse it at once, naming the flag."""
    have = ray.cluster_resources()
    for name in resources:
        if have.get(name, 0) < 1:
            raise RaySetupError(
                f"--ray-resource {name}: the cluster offers none; start nodes with "
                f"--resources '{{\"{name}\": 1}}' or drop the flag (`ray status` lists them)"
            )


def _why(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200] if text else ''}".rstrip(": ")


def _bytes_file(data: bytes) -> Any:
    import io

    return io.BytesIO(data)


def _stream(
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
                        actor.dead = _why(error)
                        continue
                    actor.last_heard_ns = _now()
                    if data:
                        _append(journals[actor.k], data, seen, actor)
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


def _append(journal: Any, data: bytes, seen: bytearray, actor: ActorRun) -> None:
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


def _salvage(ray: Any, actors: list[ActorRun], run_dir: Path, planned: int, grace_s: float) -> None:
    """A dead actor's node still holds its generator's journal: fetch what the stream missed.

    A task pinned to that node waits for the orphaned generator to finish its graceful stop and
    returns the journal; records the driver already has are skipped (merge by request id). If
    the node itself is gone, this fails and the shard is filled instead (`_fill`).
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
            actor.node["salvage"] = f"failed: {_why(error)}"
            continue
        path = run_dir / f"journal-{actor.k}.jsonl"
        for row in _read(path):
            seen[int(row["request_id"])] = 1
        before = actor.received
        with path.open("ab") as handle:
            _append(handle, data, seen, actor)
            os.fsync(handle.fileno())
        actor.salvaged, actor.received = actor.received - before, before


def _read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().split(b"\n") if line.strip()]


def _convert(actors: list[ActorRun], run_dir: Path, plan: Plan) -> None:
    """Rewrite a journal whose actor's clock drifted measurably onto the driver's timeline."""
    for actor in actors:
        if actor.before is None or actor.after is None:
            continue
        d = drift(actor.before, actor.after)
        if not d.significant:
            continue
        path = run_dir / f"journal-{actor.k}.jsonl"
        rows = [to_driver_timeline(r, d, plan.duration_ns) for r in _read(path)]
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
        tmp.replace(path)


def _fill(actors: list[ActorRun], run_dir: Path, plan: Plan, n: int, t0: int) -> None:
    """Record every request of a dead actor's shard that has no record: nothing is lost. One
    that was in flight is `cancelled` and censored at the last time the driver heard from the
    actor (it waited at least that long; its latency stays in the population); one never sent
    is `cancelled` with no send time (not admitted)."""
    for actor in actors:
        if actor.dead is None:
            continue
        path = run_dir / f"journal-{actor.k}.jsonl"
        have = {int(r["request_id"]) for r in _read(path)}
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


def _clock_reasons(actors: list[ActorRun], scn: Scenario) -> list[str]:
    budget_ns = scn.health.max_send_lag_p99 * 1e9
    reasons = []
    for actor in actors:
        if actor.before is None:
            continue
        bound = drift(actor.before, actor.after).uncertainty_ns
        if bound > budget_ns:
            reasons.append(
                f"ray actor {actor.k} ({actor.node.get('hostname', '?')}): clock offset "
                f"uncertain by {bound / 1e6:.2f} ms > the {budget_ns / 1e6:g} ms send-lag budget"
            )
    return reasons


def _actor_json(a: ActorRun) -> dict[str, Any]:
    clock: dict[str, Any] = {"before": a.before.as_dict() if a.before else None}
    if a.before is not None:
        d = drift(a.before, a.after)
        clock.update(
            after=a.after.as_dict() if a.after else None,
            drift_ns=d.drift_ns,
            drift_corrected=d.significant,
            uncertainty_ns=d.uncertainty_ns,
        )
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


if __name__ == "__main__":  # the actor's child: python -m fairbench.run.ray_shards ARGS STATE
    child_main(sys.argv[1], sys.argv[2])
