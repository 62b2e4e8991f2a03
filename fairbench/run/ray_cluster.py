"""Reaching a Ray cluster for a run or a command's points: the ray package (one line saying
how to install it when it is missing), connecting to the cluster `--ray` names (refusing at once
an address where nothing answers), and checking the resources `--ray-resource` names.

It exists so that every way of failing to start on Ray is one `RaySetupError` line naming the
flag and the fix, raised before anything runs. Imports nothing of fairbench (only ray, lazily).
"""

from __future__ import annotations

import logging
import socket
from typing import Any

NO_RAY = (
    "--ray needs the ray package: pip install 'fairbench-llm[ray]' (or pip install 'ray>=2.40')"
)


class RaySetupError(RuntimeError):
    """A Ray run that cannot start as asked (no ray package, resources the cluster lacks): one
    line naming the flag and the fix."""


def import_ray() -> Any:
    """The ray module, or one line saying how to install it."""
    try:
        import ray
    except ImportError:
        raise RaySetupError(NO_RAY) from None
    return ray


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
            f"--ray {address}: cannot connect ({why(error)}); {CONNECT_FIX}"
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


def check_resources(ray: Any, resources: tuple[str, ...], n: int) -> None:
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


def why(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200] if text else ''}".rstrip(": ")
