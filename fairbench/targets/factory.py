"""The one place that maps a scenario to a target.

Every run path (single process, each shard, engine set-up) asks this module for its target, so
a field of the scenario (a tenant's headers, an extra body, the priority mapping) reaches the
wire the same way however the run is executed. Adding a target kind means a class in
`fairbench/targets/` and one branch here.
"""

from __future__ import annotations

from typing import Any

from fairbench.targets.base import Target
from fairbench.workload.models import Scenario


def http_options(
    scn: Scenario, tenant_keys: dict[str, str] | None, setup: dict[str, Any]
) -> dict[str, Any]:
    """Keyword arguments of `OpenAITarget` that come from the scenario (all but the URL)."""
    from fairbench.targets.openai import Priority, plan_prompt

    spec = scn.target
    keys = {t.id: t.api_key for t in scn.tenants if t.api_key}
    keys.update(tenant_keys or {})
    reference = spec.kind == "reference"
    priority = None
    if spec.priority is not None:
        priority = Priority(spec.priority.by, spec.priority.values, spec.priority.default)
    renderer = plan_prompt
    calibration = setup.get("calibration")
    if calibration:
        from fairbench.targets.calibrate import Calibration

        renderer = Calibration.from_json(calibration).renderer()
    return {
        "model": spec.model or setup.get("model") or ("reference" if reference else "default"),
        "api_key": spec.api_key,
        "tenant_keys": keys,
        "headers": spec.headers,
        "extra_body": spec.extra_body,
        "class_extra_body": spec.class_extra_body,
        "ignore_eos": spec.ignore_eos,
        "kind": spec.kind,
        "class_header": "X-SLO-Class" if reference else None,
        "tenant_headers": {t.id: t.headers for t in scn.tenants if t.headers},
        "tenant_extra_body": {t.id: t.extra_body for t in scn.tenants if t.extra_body},
        "tenant_salts": {t.id: t.cache_salt for t in scn.tenants if t.cache_salt is not None},
        "api": spec.api,
        "priority": priority,
        "renderer": renderer,
        "ca_bundle": spec.ca_bundle,
    }


def make_target(
    scn: Scenario,
    base_url: str | None = None,
    tenant_keys: dict[str, str] | None = None,
    setup: dict[str, Any] | None = None,
) -> Target:
    """The scenario's target. With `base_url` for a reference target, the server was started by
    the parent process and `tenant_keys` are the keys it issued; `setup` is what
    fairbench.targets.engine_setup learned of a real engine (model, version, calibration)."""
    spec = scn.target
    setup = setup or {}
    if spec.kind == "reference" and base_url is None:
        from fairbench.targets.reference import ReferenceTarget

        return ReferenceTarget(scn, http_options(scn, tenant_keys, setup))
    from fairbench.targets.openai import OpenAITarget

    url = base_url or spec.base_url
    if not url:
        raise ValueError(f"target.base_url: a {spec.kind} target needs the server's URL")
    options = http_options(scn, tenant_keys, setup)
    target = OpenAITarget(url, **options)
    target.server_version = setup.get("server_version")
    calibration = setup.get("calibration")
    if calibration:
        target.calibration = {k: v for k, v in calibration.items() if k != "words"}
    elif "calibration_note" in setup:
        target.calibration = {"note": setup["calibration_note"]}
    return target


def metrics_url(scn: Scenario, base_url: str | None) -> str | None:
    """Where the server's Prometheus metrics are: the scenario's own `metrics_url`, else the
    server's `/metrics` (not guessed for a generic OpenAI-compatible server)."""
    if scn.target.metrics_url:
        return scn.target.metrics_url
    base = base_url or scn.target.base_url
    return f"{base.rstrip('/')}/metrics" if base and scn.target.kind != "openai" else None
