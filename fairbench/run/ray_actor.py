"""What runs on a generator's node: the Ray actor that starts shard k of n in a child process
and tails its journal, the child itself, the task that salvages a dead actor's journal, and
the driver's view of one actor (`ActorRun`).

The child is a process of its own because the executor wants a main thread for its signal
handlers and Ray runs actor methods on a thread of its own; actor and child share the node's
CLOCK_MONOTONIC and a small memory-mapped state file (counters, ready flag, t0). Imports
`run.shards` (the child runs its worker) and `run.ray_clock`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
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

from fairbench.run.ray_clock import ClockOffset

BATCH_BYTES = 8 << 20
CALL_TIMEOUT_S = 30.0  # one call to an actor; past it the actor counts as dead
CHILD_KILL_AFTER_S = 10.0  # past the grace, an orphaned generator is killed


def now() -> int:
    return time.perf_counter_ns()


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
        return now()

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
                "fairbench.run.ray_actor",
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


if __name__ == "__main__":  # the actor's child: python -m fairbench.run.ray_actor ARGS STATE
    child_main(sys.argv[1], sys.argv[2])
