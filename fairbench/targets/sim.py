"""The `sim` target: the reference scheduler in virtual time, no HTTP and no sleeping.

The plan becomes jobs (tenant weight, class rank, workload as flow); the simulator's per-job
timings become records with the live executor's columns, so the analysis treats simulated and
live runs alike. The generator is exact here: t_sent = t_intended, send lag 0.
"""

from __future__ import annotations

from typing import Any

from fairbench.plan.model import Plan
from fairbench.workload.scenario import Scenario
from reference_scheduler.core.job import Job
from reference_scheduler.drivers.virtual import SimResult, simulate
from reference_scheduler.scheduler.config import parse_scheduler_config


def block_hashes(plan: Plan, i: int, block_size: int) -> tuple[int, ...]:
    """Ids of request i's full prompt blocks, equal exactly where prompt text is shared.

    Synthetic prefixes: block k of group g of workload w is the same everywhere. Trace blocks
    (Mooncake ids, chained, `plan.block_tokens` each) split into engine blocks. The rest of a
    prompt is the request's own (ids derived from its prompt seed)."""
    c = plan.columns
    n_full = int(c["prompt_tokens"][i]) // block_size
    ids: list[int] = []
    if plan.block_offsets is not None and plan.block_values is not None:
        per = max(plan.block_tokens // block_size, 1)
        for trace_block in plan.block_values[plan.block_offsets[i] : plan.block_offsets[i + 1]]:
            ids.extend(int(trace_block) * 4096 + sub for sub in range(per))
    elif c["prefix_group"][i] >= 0:
        key = (int(c["workload"][i]) << 32) | int(c["prefix_group"][i])
        shared = int(c["prefix_tokens"][i]) // block_size
        ids.extend(-((key << 20) | k) - 1 for k in range(shared))
    own = int(c["prompt_seed"][i]) << 16
    ids.extend(own | k for k in range(len(ids), n_full))
    return tuple(ids[:n_full])


def plan_jobs(plan: Plan, scn: Scenario, block_size: int | None = None) -> list[Job]:
    """Jobs for the simulator; with `block_size` (a prefix cache is on), their block hashes."""
    weights = {t.id: t.weight for t in scn.tenants}
    ranks = {name: c.priority for name, c in scn.slo_classes.items()}
    c = plan.columns
    tenants, classes, workloads = (
        plan.names("tenant"),
        plan.names("slo_class"),
        plan.names("workload"),
    )
    offsets, prompts, outputs = c["offset_ns"], c["prompt_tokens"], c["max_tokens"]
    jobs = [
        Job(
            i,
            tenants[i],
            classes[i],
            int(prompts[i]),
            int(outputs[i]),
            int(offsets[i]),
            weight=weights[tenants[i]],
            priority=ranks[classes[i]],
            flow=workloads[i],
        )
        for i in range(len(plan))
    ]
    if block_size is not None:
        for i, job in enumerate(jobs):
            job.block_hashes = block_hashes(plan, i, block_size)
    return jobs


def records_from(result: SimResult, plan: Plan) -> list[dict[str, Any]]:
    itl = result.itl_max_ns()
    workloads, endpoints = plan.names("workload"), plan.names("endpoint")
    rows = []
    for i, job in enumerate(result.jobs):
        row: dict[str, Any] = {
            "request_id": job.id,
            "tenant": job.tenant,
            "slo_class": job.slo_class,
            "workload": workloads[i],
            "endpoint": endpoints[i],
            "t_intended_ns": job.arrival_ns,
            "t_sent_ns": job.arrival_ns,
            "prompt_tokens": job.prompt_tokens,
            "max_tokens": job.max_tokens,
            "output_tokens": 0,
            "n_chunks": 0,
            "worker": 0,
        }
        if job.status == "finished":
            last = result.token_times(job)
            row.update(
                status="ok",
                http_status=200,
                t_first_byte_ns=job.first_token_ns,
                t_first_token_ns=job.first_token_ns if job.max_tokens else None,
                t_last_token_ns=int(last[-1]) if len(last) else None,
                t_done_ns=job.done_ns,
                output_tokens=job.max_tokens,
                n_chunks=job.max_tokens,
                itl_max_ns=int(itl[i]) if itl[i] >= 0 else None,
                queue_time_ns=job.admit_ns - job.arrival_ns,
                preemptions=job.preemptions,
                cached_tokens=job.cached_tokens,
            )
        elif job.status == "rejected":
            row.update(
                status="rejected" if job.reject_code in (429, 503) else "error",
                http_status=job.reject_code,
                retry_after_s=float(job.retry_after_s),
                error_kind=None if job.reject_code in (429, 503) else "http_4xx",
                error_detail="rejected by the scheduler",
            )
        else:
            row.update(status="cancelled", error_detail=f"left {job.status} by the simulation")
        rows.append(row)
    return rows


def run_sim(plan: Plan, scn: Scenario) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    config = parse_scheduler_config(scn.scheduler)
    block_size = config.spec.block_size if config.spec.prefix_cache else None
    result = simulate(plan_jobs(plan, scn, block_size), config)
    info = {
        "kind": "sim",
        "policy": str(config.spec.policy),
        "profile": config.profile.name,
        "replicas": str(config.replicas),
        "steps": str(result.steps),
    }
    return records_from(result, plan), info
