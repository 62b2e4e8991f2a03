"""Before t0, against a real engine: which model it serves, its version, calibrated prompts.

Runs once per run in the parent process (shards receive its result), so a sharded run asks the
server's tokenizer once. Nothing here is a record of the run: probes are sent before t0.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from fairbench.plan.model import Plan, PlannedRequest
from fairbench.targets.calibrate import (
    CalibrationError,
    FileTokenizer,
    HTTPTokenizer,
    calibrate,
)
from fairbench.targets.engines import engine
from fairbench.targets.http.client import tls_context
from fairbench.workload.models import Scenario

ENGINE_KINDS = ("vllm", "sglang", "tgi", "openai")
PROBE_TIMEOUT_S = 120.0  # one max_tokens=1 request; a server that cannot answer it is not ready


async def _get_json(session: aiohttp.ClientSession, url: str) -> Any:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as resp:
            if resp.status != 200:
                return None
            return await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


async def discover_model(session: aiohttp.ClientSession, base: str) -> str | None:
    """The first model the server lists at /v1/models (vLLM, SGLang and TGI all answer)."""
    data = await _get_json(session, f"{base}/v1/models")
    if isinstance(data, dict) and isinstance(data.get("data"), list) and data["data"]:
        first = data["data"][0]
        if isinstance(first, dict) and isinstance(first.get("id"), str):
            return str(first["id"])
    return None


async def server_version(session: aiohttp.ClientSession, base: str, kind: str) -> str | None:
    path = engine(kind).version_path
    if path is None:
        return None
    data = await _get_json(session, base + path)
    if isinstance(data, dict) and data.get("version") is not None:
        return str(data["version"])
    return None


async def engine_setup(scn: Scenario, plan: Plan, base_url: str | None) -> dict[str, Any]:
    """{"model", "server_version", "calibration" (Calibration JSON or None), "calibration_note"}."""
    from fairbench.targets.factory import make_target

    spec = scn.target
    if spec.kind not in ENGINE_KINDS:
        return {}
    base = (base_url or spec.base_url or "").rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    out: dict[str, Any] = {"calibration": None}
    headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
    tls = tls_context(spec.ca_bundle) if base.startswith("https:") else None
    connector = aiohttp.TCPConnector(ssl=tls) if tls else None
    async with aiohttp.ClientSession(headers=headers, connector=connector) as session:
        out["model"] = spec.model or await discover_model(session, base) or "default"
        out["server_version"] = await server_version(session, base, spec.kind)
        e = engine(spec.kind)
        if not spec.calibrate:
            out["calibration_note"] = "not calibrated (target.calibrate: false)"
            return out
        if spec.tokenizer:
            count: Any = FileTokenizer(spec.tokenizer)
            source = f"tokenizer file {spec.tokenizer.rsplit('/', 1)[-1]}"
        elif e.tokenize_path is not None:
            count = HTTPTokenizer(
                session, base + e.tokenize_path, e.tokenize_body, e.tokenize_count, out["model"]
            )
            source = f"server {e.tokenize_path}"
        else:
            out["calibration_note"] = (
                "not calibrated: prompts are counted in reference tokens "
                "(give target.tokenizer, or use a vllm/sglang/tgi target)"
            )
            return out
        target = make_target(scn, base_url, None, {"model": out["model"]})
        await target.open()

        async def probe(req: PlannedRequest, text: str) -> int | None:
            waiter, _ = target.start(target.prepare(req, text))  # type: ignore[attr-defined]
            try:
                outcome = await asyncio.wait_for(waiter, PROBE_TIMEOUT_S)
            except TimeoutError:
                target.abort(waiter)  # type: ignore[attr-defined]
                raise CalibrationError(
                    f"a probe request got no answer in {PROBE_TIMEOUT_S:g} s"
                ) from None
            if outcome.status != "ok":
                raise CalibrationError(
                    f"a probe request failed: {outcome.kind}: {outcome.detail or ''}"[:300]
                )
            return outcome.usage_prompt

        try:
            cal = await calibrate(count, probe, plan, source)
        except (CalibrationError, aiohttp.ClientError, TimeoutError) as error:
            out["calibration_note"] = f"calibration failed: {error}"
            return out
        finally:
            await target.close()
        if cal is None:
            out["calibration_note"] = (
                "not calibrated: fewer than 64 vocabulary words are single tokens for this "
                "tokenizer"
            )
        else:
            out["calibration"] = cal.to_json()
            if not cal.exact:
                bad = [c for c in cal.checks if c.get("server") != c["planned"]]
                out["calibration_note"] = (
                    f"calibration is not exact: {len(bad)} of {len(cal.checks)} checks differ "
                    f"(e.g. planned {bad[0]['planned']}, server {bad[0]['server']})"
                )
    return out
