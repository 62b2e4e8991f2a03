"""Before t0: is the target there at all? A few seconds now instead of a wasted run.

Without this, a run against a dead port is a full-duration run of connection errors that still
passes generator health (the generator kept its schedule) and exits 0. So before anything is
planned or written, a live target gets a TCP connect and then `GET /v1/models` — the path
vLLM, SGLang, TGI, the reference server and OpenAI-compatible servers all answer (it is also
where fairbench.targets.engine_setup finds the served model) — each bounded by a short timeout.
Any failure is one line naming the URL and what failed, raised as `TargetUnreachable`, which
the CLI prints like any scenario error (exit 2). Not for `sim` (no server) nor a `reference`
target that fairbench starts itself (its start-up already waits for /health) — except the
engines behind one that runs as a gateway (`target.upstreams`): each gets the same check, with
its own key, plus its `/metrics` where the gateway reads saturation from it (an upstream whose
metrics never answer counts as saturated, so a run would send it nothing and time out).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from fairbench.targets.http.client import tls_context
from fairbench.workload.checks import target_url
from fairbench.workload.errors import ScenarioError
from fairbench.workload.models import Scenario

PRECHECK_TIMEOUT_S = 5.0  # per step; a server that cannot accept a connection in 5 s is not up
PROBE_PATH = "/v1/models"


class TargetUnreachable(ScenarioError):
    """The target did not answer the pre-run check; `lines` holds the one line to print."""

    def __init__(self, line: str) -> None:
        super().__init__([line])


def probe_url(base_url: str) -> str:
    """Where the check asks: the base URL (a trailing `/v1` dropped, as the targets do) plus
    /v1/models."""
    base = base_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    return base + PROBE_PATH


def _hint(status: int) -> str:
    if status in (401, 403):
        return "check target.api_key (or the tenants' api_key)"
    if status == 404:
        return f"is this an OpenAI-compatible server, and the URL its root? (no {PROBE_PATH})"
    if status >= 500:
        return "the server is up but failing (still loading the model?)"
    return f"expected 200 from {PROBE_PATH}"


async def check_reachable(
    base_url: str,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = PRECHECK_TIMEOUT_S,
    ca_bundle: str | None = None,
    label: str = "target.base_url",
) -> None:
    """Raise `TargetUnreachable` unless `base_url` accepts a TCP connection and answers
    `GET /v1/models` with a 2xx, each within `timeout_s`. `label` says where the URL came
    from (`target.base_url` or `--target-url`), so the line says what to fix."""
    parts = urlsplit(base_url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    where = f"{label} {base_url}"
    tls = None
    if parts.scheme == "https":
        if ca_bundle and not Path(ca_bundle).is_file():
            raise TargetUnreachable(
                f"target.ca_bundle: no such file {ca_bundle}; give the PEM file of the CA that "
                "signed the server's certificate. Checked before t0: nothing was run"
            )
        try:
            tls = tls_context(ca_bundle)
        except (ssl.SSLError, OSError) as error:
            raise TargetUnreachable(
                f"target.ca_bundle: {ca_bundle} is not a PEM file of CA certificates "
                f"({error}). Checked before t0: nothing was run"
            ) from None
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except ConnectionRefusedError:
        raise TargetUnreachable(
            f"{where}: connection refused (nothing listens on {host}:{port}); start the "
            "server or fix the URL. Checked before t0: nothing was run"
        ) from None
    except TimeoutError:
        raise TargetUnreachable(
            f"{where}: timeout: no TCP connection to {host}:{port} within {timeout_s:g} s. "
            "Checked before t0: nothing was run"
        ) from None
    except socket.gaierror as error:
        raise TargetUnreachable(
            f"{where}: cannot resolve host {host!r} ({error.strerror}). "
            "Checked before t0: nothing was run"
        ) from None
    except OSError as error:
        raise TargetUnreachable(
            f"{where}: cannot connect to {host}:{port} ({error.strerror or error}). "
            "Checked before t0: nothing was run"
        ) from None
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    url = probe_url(base_url)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(
                url, headers=dict(headers or {}), allow_redirects=False, ssl=tls or True
            ) as resp,
        ):
            status, reason = resp.status, resp.reason or ""
    except TimeoutError:
        raise TargetUnreachable(
            f"{where}: timeout: GET {PROBE_PATH} got no answer within {timeout_s:g} s. "
            "Checked before t0: nothing was run"
        ) from None
    except aiohttp.ClientConnectorCertificateError as error:
        reason = getattr(error.certificate_error, "verify_message", None) or "not trusted"
        raise TargetUnreachable(
            f"{where}: the server's TLS certificate failed verification ({reason}); if it is "
            "signed by a private CA, set target.ca_bundle to that CA's PEM file. "
            "Checked before t0: nothing was run"
        ) from None
    except aiohttp.ClientError as error:
        detail = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise TargetUnreachable(
            f"{where}: GET {PROBE_PATH} failed: {detail}. Checked before t0: nothing was run"
        ) from None
    if not 200 <= status < 300:
        raise TargetUnreachable(
            f"{where}: GET {PROBE_PATH} answered HTTP {status} {reason}".rstrip()
            + f"; {_hint(status)}. Checked before t0: nothing was run"
        )


def probe_headers(scn: Scenario) -> dict[str, str]:
    """The headers a request would carry that a server may require of the check too: the
    target's headers and key (else the first tenant's key)."""
    headers = dict(scn.target.headers)
    key = scn.target.api_key or next((t.api_key for t in scn.tenants if t.api_key), None)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return headers


async def check_metrics(
    base_url: str, headers: Mapping[str, str], label: str, timeout_s: float = PRECHECK_TIMEOUT_S
) -> None:
    """Raise `TargetUnreachable` unless `GET base_url/metrics` answers 2xx within `timeout_s`
    (the URL already passed `check_reachable`)."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(f"{base_url.rstrip('/')}/metrics", headers=dict(headers)) as resp,
        ):
            status = resp.status
    except (TimeoutError, aiohttp.ClientError) as error:
        status, detail = 0, str(error).splitlines()[0] if str(error) else type(error).__name__
    else:
        detail = f"HTTP {status}"
    if not 200 <= status < 300:
        raise TargetUnreachable(
            f"{label} {base_url}: GET /metrics failed ({detail}); the gateway reads saturation "
            "there and would count this engine saturated all run. Check its engine: (vllm, sglang, "
            "tgi) or set engine: none. Checked before t0: nothing was run"
        )


async def check_upstreams(scn: Scenario) -> None:
    """The engines behind a gateway target, in order: each key's variable is set, each engine
    answers /v1/models (and /metrics unless `engine: none`), as `TargetUnreachable` or
    `ScenarioError` naming `target.upstreams[i]`."""
    for i, up in enumerate(scn.target.upstreams or []):
        at = f"target.upstreams[{i}]"
        key = up.api_key
        if up.api_key_env is not None:
            key = os.environ.get(up.api_key_env) or None
            if key is None:
                raise ScenarioError(
                    [
                        f"{at}.api_key_env: the environment variable {up.api_key_env} is not "
                        "set (the engine's key is read from it); export it, or use api_key"
                    ]
                )
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        await check_reachable(up.url, headers, label=f"{at}.url")
        if up.engine != "none":
            await check_metrics(up.url, headers, f"{at}.url")


async def precheck(scn: Scenario, override: str | None = None) -> None:
    """The pre-run check of a scenario's target, with the run's URL override if any. Raises
    `ScenarioError` for a live target without a URL and `TargetUnreachable` for one that does
    not answer; returns at once for `sim` and for a `reference` target fairbench starts, after
    checking the engines behind it if it is a gateway."""
    url = target_url(scn, override)
    if url is None:
        if scn.target.kind == "reference" and override is None:
            await check_upstreams(scn)
        return
    label = "--target-url" if override is not None else "target.base_url"
    await check_reachable(url, probe_headers(scn), label=label, ca_bundle=scn.target.ca_bundle)
