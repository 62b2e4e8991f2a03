"""The `reference` target, the embedded default: the bundled scheduler's HTTP server, started in
a subprocess on a free 127.0.0.1 port for the run and stopped after it.

With `target.upstreams` the subprocess is the same scheduler as a gateway (`python -m
reference_scheduler gateway`, docs/gateway.md) in front of those engines instead of on its
simulated GPU: the same tenants, keys, classes and `scheduler:` block, so an A/B of a policy on
real engines is the sim's A/B with one block added. The upstreams' own keys go into the same
private file (or stay in the environment, `api_key_env`).

Each tenant gets an API key (the scenario's, or a fresh random one for this run) so the server
authenticates tenancy exactly as it would in production; the keys live in a private temporary
config file, never in the run directory. Requests carry their SLO class in `X-SLO-Class`, which
the server accepts only for classes the tenant's traffic uses.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from fairbench.targets.openai import OpenAITarget
from fairbench.workload.errors import ScenarioError
from fairbench.workload.models import Scenario, Tenant

START_TIMEOUT_S = 60.0
SERVER_NICENESS = 5  # relative to the generator: see ReferenceServer.start
PORT_0 = ("--port", "0")  # a free port, printed on the server's first line


def _tenant_classes(scn: Scenario, tenant: Tenant) -> list[str]:
    classes = [tenant.slo_class]
    for workload in scn.mix_of(tenant):
        cls = scn.workloads[workload].slo_class
        if cls and cls not in classes:
            classes.append(cls)
    return classes


def _drain(stream: Any) -> None:
    """Read and discard the server's later stdout, so its pipe can never fill."""
    for _ in stream:
        pass


def config_lines(stderr: str, path: str) -> list[str]:
    """The lines of a refused configuration (the server prints `PATH: field: problem`) as the
    scenario's fields: `upstreams[0].url: ...` is `target.upstreams[0].url: ...` there."""
    lines = []
    for raw in stderr.splitlines():
        line = raw.strip().removeprefix(f"{path}: ")
        if line.startswith(("upstreams", "dispatch")):
            line = "target." + line
        if line:
            lines.append(line)
    return lines or ["target: the reference scheduler refused its configuration"]


class ReferenceServer:
    """The server process: start() returns its URL; stop() ends it."""

    def __init__(self, scn: Scenario) -> None:
        self.scn = scn
        self.keys = {t.id: t.api_key or f"fb-{secrets.token_hex(16)}" for t in scn.tenants}
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def gateway(self) -> bool:
        """Whether this is the gateway in front of real engines (`target.upstreams`)."""
        return self.scn.target.upstreams is not None

    def config(self) -> dict[str, Any]:
        scn = self.scn
        out: dict[str, Any] = {
            "model": scn.target.model or "reference",
            "host": "127.0.0.1",
            "port": 0,
            "scheduler": scn.scheduler,
            "tenants": [
                {
                    "id": t.id,
                    "api_key": self.keys[t.id],
                    "weight": t.weight,
                    "classes": _tenant_classes(scn, t),
                }
                for t in scn.tenants
            ],
            "slo_classes": {name: c.priority for name, c in scn.slo_classes.items()},
            "timing_extension": True,
            "faults": scn.target.faults,
        }
        spec = scn.target
        if spec.upstreams is not None:
            del out["faults"]  # refused with upstreams by the scenario's validation
            out["upstreams"] = [up.model_dump(exclude_none=True) for up in spec.upstreams]
            if spec.dispatch is not None:
                out["dispatch"] = spec.dispatch.model_dump()
        return out

    def start(self) -> str:
        self._dir = tempfile.TemporaryDirectory(prefix="fairbench-ref-")
        path = Path(self._dir.name) / "server.yaml"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            yaml.safe_dump(self.config(), handle)
        # stderr goes to a file, not a pipe: a pipe nobody reads fills at 64 KiB and would
        # freeze the server mid-run the first time it logs a burst of warnings.
        err_path = Path(self._dir.name) / "server.stderr"
        with open(err_path, "wb") as err_file:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "reference_scheduler", self.command, str(path), *PORT_0],
                stdout=subprocess.PIPE,
                stderr=err_file,
                text=True,
            )
        # The generator is the instrument; when it and the embedded server want the same CPU
        # (a busy 2-core laptop), the instrument goes first, so its stamps stay on time. The
        # server's own slowness is then what the run measures, accurately.
        with contextlib.suppress(OSError, AttributeError):  # no setpriority off Unix
            os.setpriority(os.PRIO_PROCESS, self.proc.pid, SERVER_NICENESS)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line.startswith("listening on "):
            threading.Thread(target=_drain, args=(self.proc.stdout,), daemon=True).start()
        else:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
            err = err_path.read_text(errors="replace")[-4000:]
            code = self.proc.poll()
            self.stop()
            if code == 2:  # its configuration was refused: one line per problem, as fields
                raise ScenarioError(config_lines(err, str(path)))
            raise RuntimeError(f"the reference {self.command} did not start: {line} {err}".strip())
        self.url = line.removeprefix("listening on ")
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return self.url
            except OSError:
                time.sleep(0.05)
        self.stop()
        why = (
            " (is any upstream healthy? it answers /health 503 until one is)"
            if self.gateway
            else ""
        )
        raise RuntimeError(f"the reference {self.command} never became healthy{why}")

    def stop(self, metrics_path: Path | None = None) -> None:
        if self.proc is not None and self.proc.poll() is None:
            if metrics_path is not None and self.url:
                try:
                    with urllib.request.urlopen(self.url + "/metrics", timeout=5) as resp:
                        metrics_path.write_bytes(resp.read())
                except OSError:
                    pass
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    @property
    def command(self) -> str:
        return "gateway" if self.gateway else "serve"

    def info(self) -> dict[str, Any]:
        from reference_scheduler.scheduler.config import parse_scheduler_config

        sched = self.scn.scheduler
        out: dict[str, Any] = {
            "kind": "reference",
            "base_url": self.url,
            "policy": str(sched.get("policy", "dwrr")),
        }
        upstreams = self.scn.target.upstreams
        if upstreams is None:  # the simulated GPU: which one, how many
            out["profile"] = str(sched.get("profile", "h100-llama3-8b"))
            out["replicas"] = str(sched.get("replicas", 1))
        else:  # real engines: where (no key: those stay in the private config)
            out["mode"] = "gateway"
            out["upstreams"] = [
                f"{up.name or f'u{i}'} {up.url} ({up.engine}, max_inflight {up.max_inflight})"
                for i, up in enumerate(upstreams)
            ]
        # the server runs this much nicer than the generator (see ReferenceServer.start)
        out["niceness"] = SERVER_NICENESS
        warnings = parse_scheduler_config(sched).warnings  # validated with the scenario
        if warnings:
            out["warnings"] = list(warnings)
        return out


class ReferenceTarget(OpenAITarget):
    """An `OpenAITarget` whose server this target starts on open and stops on close.

    `options` are the scenario's HTTP options (fairbench.targets.factory.http_options), so a
    single-process run sends exactly what a sharded run against the same server sends; only
    the tenant keys are the server's own.
    """

    def __init__(self, scn: Scenario, options: Mapping[str, Any]) -> None:
        self.server = ReferenceServer(scn)
        super().__init__("http://127.0.0.1:0", **{**options, "tenant_keys": self.server.keys})

    async def open(self) -> None:
        self.base_url = self.server.start()
        await super().open()

    async def close(self) -> None:
        await super().close()
        self.server.stop()

    def info(self) -> Mapping[str, Any]:
        return self.server.info()
