"""Rules across fields of a scenario, each problem one line naming the field and the fix.

pydantic checks each field alone (fairbench.workload.models); what needs two fields (a tenant's
mix names a defined workload, a trace tenant a defined trace, a live target a valid URL, …) is
checked here, after that pass, so the message can name the exact field. Imports the models and
the reference scheduler's own validator of its `scheduler:` block.
"""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import urlsplit

from fairbench.workload.cache import cache_problems
from fairbench.workload.errors import ScenarioError
from fairbench.workload.models import ConstantDist, Scenario, TraceArrival
from fairbench.workload.sessions import session_problems

# Targets reached over HTTP at a URL the user gives: a `reference` target starts its own server
# (unless --target-url points at one) and `sim` has no server at all.
URL_KINDS = ("openai", "vllm", "sglang", "tgi")
_URL_EXAMPLE = "http://127.0.0.1:8000"


def url_problem(url: str, base: bool = True) -> str | None:
    """What is wrong with a server URL, or None: it must be http(s)://host[:port][/path], and
    a `base` URL (paths are appended to it) has no query or fragment."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number in range
    except ValueError:
        return f"not a URL with a valid port (like {_URL_EXAMPLE}), got {url!r}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"must be an http:// or https:// URL with a host, like {_URL_EXAMPLE}; got {url!r}"
    if base and (parts.query or parts.fragment):
        return f"must be the server's base URL, without ?query or #fragment; got {url!r}"
    return None


def target_url(scn: Scenario, override: str | None = None) -> str | None:
    """The URL a live run sends to: `override` (`fairbench run --target-url`), else
    `target.base_url`; None where fairbench provides the server (`reference` without an
    override) or there is none (`sim`). An openai/vllm/sglang/tgi target with neither is a
    scenario error, raised here rather than at load time because the URL may come from the
    command line."""
    if scn.target.kind == "sim":
        return None
    if override is not None:
        problem = url_problem(override)
        if problem is not None:
            raise ScenarioError([f"--target-url: {problem}"])
        return override
    if scn.target.kind in URL_KINDS and not scn.target.base_url:
        raise ScenarioError(
            [
                f"target.base_url: a target of kind {scn.target.kind!r} needs the server's "
                f"URL; set target.base_url (e.g. {_URL_EXAMPLE}) or pass fairbench run "
                "--target-url URL"
            ]
        )
    return scn.target.base_url if scn.target.kind in URL_KINDS else None


def _check_target(scn: Scenario) -> list[str]:
    t = scn.target
    problems: list[str] = []
    for name in ("base_url", "metrics_url"):
        url = getattr(t, name)
        problem = None if url is None else url_problem(url, base=name == "base_url")
        if problem is not None:
            problems.append(f"target.{name}: {problem}")
    if t.api == "native" and t.kind not in ("sglang", "tgi"):
        problems.append(
            f"target.api: 'native' is for sglang (/generate) and tgi (/generate_stream); "
            f"a {t.kind} target speaks 'openai'"
        )
    if t.priority is not None:
        if t.kind not in ("vllm", "sglang"):
            why = (
                "TGI has no per-request priority (it serves first come, first served)"
                if t.kind == "tgi"
                else f"a {t.kind} target has no engine priority field"
            )
            problems.append(f"target.priority: {why}; remove it, or use class_extra_body")
        else:
            known = (
                set(scn.slo_classes)
                if t.priority.by == "slo_class"
                else {x.id for x in scn.tenants}
            )
            for name in sorted(set(t.priority.values) - known):
                problems.append(
                    f"target.priority.values: unknown {t.priority.by} {name!r}; "
                    f"defined: {sorted(known)}"
                )
    if t.faults is not None and t.kind != "reference":
        problems.append("target.faults: faults are injected by the reference server only")
    return problems + _check_upstreams(scn)


def _check_upstreams(scn: Scenario) -> list[str]:
    """`target.upstreams`: what the gateway itself would refuse, said here with the scenario's
    field paths, so that `fairbench validate` catches it and a run never starts a gateway that
    exits. What depends on this machine (an `api_key_env` that is set, an engine that answers)
    is the pre-run check's (fairbench.targets.precheck): a run directory's scenario.yaml must
    load anywhere."""
    t = scn.target
    if t.upstreams is None:
        if t.dispatch is not None:
            return ["target.dispatch: only with target.upstreams (the gateway's settings)"]
        return []
    if t.kind != "reference":
        return [
            f"target.upstreams: only kind reference runs the gateway; kind {t.kind!r} sends to "
            "target.base_url (use kind: reference, or remove upstreams)"
        ]
    problems: list[str] = []
    if t.faults is not None:
        problems.append(
            "target.faults: the gateway injects no faults (the simulated engine does); remove "
            "faults, or inject them at the upstreams"
        )
    names: dict[str, int] = {}
    for i, up in enumerate(t.upstreams):
        at = f"target.upstreams[{i}]"
        problem = url_problem(up.url)
        if problem is None and "@" in urlsplit(up.url).netloc:
            problem = "no credentials in the URL (not echoed here); use api_key or api_key_env"
        if problem is None and urlsplit(up.url).path.rstrip("/").endswith("/v1"):
            problem = f"the engine's root URL, without /v1 (the gateway adds it); got {up.url!r}"
        if problem is not None:
            problems.append(f"{at}.url: {problem}")
        if up.api_key is not None and up.api_key_env is not None:
            problems.append(f"{at}.api_key: give api_key or api_key_env, not both")
        name = up.name or f"u{i}"
        if name in names:
            problems.append(f"{at}.name: {name!r} is also upstreams[{names[name]}]'s name")
        names.setdefault(name, i)
    preemption = scn.scheduler.get("preemption")
    mode = preemption.get("mode", "none") if isinstance(preemption, dict) else None
    if mode not in (None, "none"):
        problems.append(
            "scheduler.preemption.mode: the gateway cannot preempt a request running on an "
            "upstream (its work would be lost); use none, and the engine's own priority "
            "scheduling (upstreams' priority_field)"
        )
    return problems


def _cross_check(scn: Scenario) -> list[str]:
    problems: list[str] = _check_target(scn)
    seen: set[str] = set()
    trace_users: dict[str, list[int]] = {}
    for i, tenant in enumerate(scn.tenants):
        at = f"tenants[{i}]"
        if tenant.id in seen:
            problems.append(f"{at}.id: duplicate tenant id {tenant.id!r}; ids must be unique")
        seen.add(tenant.id)
        if tenant.slo_class not in scn.slo_classes:
            problems.append(
                f"{at}.slo_class: unknown class {tenant.slo_class!r}; "
                f"defined: {sorted(scn.slo_classes)}"
            )
        mix = scn.mix_of(tenant)
        for name in mix:
            if name not in scn.workloads:
                problems.append(
                    f"{at}.mix: unknown workload {name!r}; defined: {sorted(scn.workloads)}"
                )
        if not mix or sum(mix.values()) <= 0 or not all(math.isfinite(v) for v in mix.values()):
            problems.append(f"{at}.mix: needs at least one workload with a weight > 0")
        if isinstance(tenant.arrival, TraceArrival):
            if tenant.arrival.trace not in scn.traces:
                problems.append(
                    f"{at}.arrival.trace: unknown trace {tenant.arrival.trace!r}; "
                    f"defined under traces: {sorted(scn.traces)}"
                )
            else:
                trace_users.setdefault(tenant.arrival.trace, []).append(i)
            if tenant.phases:
                problems.append(
                    f"{at}.phases: a trace replay has no rate to change; remove phases "
                    "(use the trace's time_scale or window instead)"
                )
        for j, phase in enumerate(tenant.phases):
            if scn.run.duration is not None and phase.start >= scn.run.duration:
                problems.append(
                    f"{at}.phases[{j}].start: {phase.start}s is past run.duration "
                    f"({scn.run.duration}s)"
                )
    for name, users in trace_users.items():
        if len(users) > 1:
            for i in users:
                if scn.tenants[i].arrival.share is None:  # type: ignore[union-attr]
                    problems.append(
                        f"tenants[{i}].arrival.share: trace {name!r} is shared by "
                        f"{len(users)} tenants; give each a share"
                    )
    for name, wl in scn.workloads.items():
        at = f"workloads.{name}"
        if wl.slo_class is not None and wl.slo_class not in scn.slo_classes:
            problems.append(
                f"{at}.slo_class: unknown class {wl.slo_class!r}; "
                f"defined: {sorted(scn.slo_classes)}"
            )
        if wl.endpoint == "embeddings":
            if wl.stream:
                problems.append(f"{at}.stream: embeddings do not stream; remove it or set false")
            out = wl.output_tokens
            if out is not None and not (isinstance(out, ConstantDist) and out.value == 0):
                problems.append(
                    f"{at}.output_tokens: embeddings produce no output tokens; remove it"
                )
    problems += session_problems(scn)  # fairbench.workload.sessions
    problems += cache_problems(scn)  # fairbench.workload.cache
    all_trace = all(isinstance(t.arrival, TraceArrival) for t in scn.tenants)
    if scn.run.duration is None and scn.run.requests is None and not all_trace:
        problems.append(
            "run: needs duration (e.g. '60s') or requests (a count); only a pure trace replay "
            "can end on its own"
        )
    if scn.run.duration is not None and scn.run.warmup + scn.run.cooldown >= scn.run.duration:
        problems.append(
            f"run.warmup: warmup + cooldown ({scn.run.warmup + scn.run.cooldown}s) must be "
            f"shorter than run.duration ({scn.run.duration}s)"
        )
    return problems


def _check_scheduler_block(block: dict[str, Any]) -> list[str]:
    """The `scheduler:` block belongs to the reference scheduler, which validates it itself."""
    from reference_scheduler.scheduler.config import SchedulerConfigError, parse_scheduler_config

    try:
        parse_scheduler_config(block)
    except SchedulerConfigError as error:
        return [
            f"scheduler.{line}" if not line.startswith("scheduler") else line
            for line in error.lines
        ]
    return []
