"""Start and stop a real vLLM (CPU build) on loopback, for the engine integration test.

`VLLMServer` runs `python -m vllm.entrypoints.openai.api_server` from the engine's own venv
(the `vllm` console script is broken in the CPU distribution) in its own process group, with
the flags that make it start in ~30 s: --enforce-eager, bfloat16, a 2,048-token context, 1 GiB
of KV cache. It is confined to the first core and niced (see `confine`). Its output goes to a
log file (never a pipe that could fill); stop() ends the whole group: SIGTERM, then SIGKILL
after 20 s.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.request
import warnings
from pathlib import Path

from tests.loopback import free_port


def engine_python() -> str:
    """The engine venv's python from FAIRBENCH_VLLM_PYTHON, or skip the test saying why; where
    FAIRBENCH_REQUIRE_ENGINE=1 (CI sets it: .ci/run), fail instead, so a broken engine path can
    never land green."""
    import pytest

    python = os.environ.get("FAIRBENCH_VLLM_PYTHON", "")
    why = ""
    if not python:
        why = (
            "no real vLLM: FAIRBENCH_VLLM_PYTHON is not set "
            "(run tests/engines/setup_vllm_cpu.sh and export what it prints; .ci/run does)"
        )
    elif python.startswith("unavailable:"):
        why = f"no real vLLM: the engine could not be installed here ({python})"
    elif not Path(python).is_file():
        why = f"no real vLLM: FAIRBENCH_VLLM_PYTHON={python} does not exist"
    if why and os.environ.get("FAIRBENCH_REQUIRE_ENGINE") == "1":
        pytest.fail(f"{why}; FAIRBENCH_REQUIRE_ENGINE=1 says an engine test may not skip here")
    if why:
        pytest.skip(why)
    return python


def group_alive(pgid: int) -> bool:
    """Whether any process of group `pgid` is still running (a zombie is not)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


class VLLMServer:
    def __init__(
        self,
        python: str,
        model_dir: Path,
        log: Path,
        policy: str = "fcfs",
        max_num_seqs: int = 4,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.python, self.model_dir, self.log = python, model_dir, log
        self.policy, self.max_num_seqs, self.extra = policy, max_num_seqs, extra
        self.port = 0  # chosen at start(): a port picked long before the bind can be taken
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 240.0) -> str:
        self.port = free_port()
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1")
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(sorted(os.sched_getaffinity(0))[0])
        env.pop("CUDA_VISIBLE_DEVICES", None)
        cmd = [
            *self.confine(),
            self.python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            "tiny",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--enforce-eager",
            "--dtype",
            "bfloat16",
            "--max-model-len",
            "2048",
            "--max-num-seqs",
            str(self.max_num_seqs),
            "--scheduling-policy",
            self.policy,
            *self.extra,
        ]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()  # the API server died: its engine core may not have
                raise RuntimeError(f"vLLM exited with {self.proc.returncode}: {self.tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return self.url
            except OSError:
                pass
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"vLLM not healthy after {timeout_s:.0f} s: {self.tail()}")

    @staticmethod
    def confine() -> list[str]:
        """On a small box the engine shares cores with the load generator, whose timing (send
        lag) must not be what the engine's load degrades: the engine gets the first core
        (all its processes: API server, engine core, worker), the generator the rest."""
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) < 2 or len(cores) > 8:
            return ["nice", "-n", "10"]
        return ["taskset", "-c", str(cores[0]), "nice", "-n", "10"]

    def tail(self, n: int = 1500) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self) -> None:
        """End the whole process group, not only its leader (the API server): an engine core
        or worker left behind would keep its core busy under the next engine's measurement."""
        if self.proc is None:
            return
        group = self.proc.pid
        for sig, grace_s in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
            if not group_alive(group) and self.proc.poll() is not None:
                return
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, sig)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline:
                if self.proc.poll() is not None and not group_alive(group):
                    return
                time.sleep(0.2)
        warnings.warn(f"vLLM's process group {group} outlived SIGKILL", stacklevel=2)

    def __enter__(self) -> VLLMServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
