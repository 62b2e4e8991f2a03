"""The `sim` target on the compiled simulator (reference_scheduler/drivers/compiled.py): the
plan's columns in, what `sim.fields_from` reads of a run out, with no Job object per request.

Why (issue 35): at fleet size the Python engine's steps were 14 CPU s of a 39 s run, and making
the 1.9M Job objects and reading their fields back 6 more. The records are the same, value for
value (tests/test_sim_compiled.py; the golden outputs run through here too).

`FAIRBENCH_SIM_ENGINE` picks the simulator: `auto` (the default: compiled where it covers the
configuration, the Python engine elsewhere), `python`, or `compiled` (an error where it does
not cover the configuration). It changes the speed, never the records."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fairbench.plan.model import Plan
from fairbench.workload.errors import ScenarioError
from fairbench.workload.models import Scenario
from reference_scheduler.core.job import Job
from reference_scheduler.drivers import compiled
from reference_scheduler.drivers.virtual import SimResult
from reference_scheduler.scheduler.config import SchedulerConfig

ENGINE_VARIABLE = "FAIRBENCH_SIM_ENGINE"
_CHOICES = ("auto", "python", "compiled")


class SimEngineError(ScenarioError):
    """FAIRBENCH_SIM_ENGINE names no simulator, or `compiled` where it does not apply: one
    line, printed by the CLI without a traceback (exit 2)."""

    def __init__(self, line: str) -> None:
        super().__init__([line])


def use_compiled(config: SchedulerConfig) -> bool:
    """Whether this run simulates on the compiled driver (see the module's docstring)."""
    choice = os.environ.get(ENGINE_VARIABLE, "auto").strip().lower() or "auto"
    if choice not in _CHOICES:
        raise SimEngineError(
            f"{ENGINE_VARIABLE}={choice!r}: not a simulator; use one of {', '.join(_CHOICES)}"
        )
    if choice == "python":
        return False
    why = compiled.supported(config)
    if why is not None and choice == "compiled":
        raise SimEngineError(
            f"{ENGINE_VARIABLE}=compiled: this scenario's scheduler needs the Python engine "
            f"({why}); unset it or use auto"
        )
    return why is None


@dataclass(frozen=True)
class JobColumns:
    """A simulated run as `sim.fields_from` reads it, from either simulator: `raw` the jobs'
    `sim._INT_FIELDS`, their statuses (Job.status strings), `retry_after_s`, whether each has
    a decode segment (Job.segments), job i on demand for the few read one by one, and the
    decode-step end times (`view`)."""

    view: SimResult
    job_at: Callable[[int], Job]
    raw: dict[str, np.ndarray]
    status_of: np.ndarray
    retry: np.ndarray
    preempted: np.ndarray
    steps: int


def simulate_plan(
    plan: Plan,
    scn: Scenario,
    config: SchedulerConfig,
    timeout_ns: int | None,
    stop_ns: int | None,
    delay_ns: int,
    progress: Callable[[int, int], None] | None = None,
) -> JobColumns:
    """The plan simulated on the compiled driver. The engine's clock is the plan's shifted by
    `delay_ns` (the profile's request overhead), and a job times out `timeout_ns - delay_ns`
    after its arrival there, as `sim.run_sim` does with the Python engine."""
    c = plan.columns
    weights = {t.id: t.weight for t in scn.tenants}
    ranks = {name: cls.priority for name, cls in scn.slo_classes.items()}  # sim.plan_jobs's
    arrival = np.asarray(c["offset_ns"], dtype=np.int64) + delay_ns
    result = compiled.simulate_columns(
        c["prompt_tokens"],
        c["max_tokens"],
        arrival,
        c["tenant"],
        np.array([weights[name] for name in plan.tenants], dtype=np.float64),
        list(plan.tenants),
        c["slo_class"],
        list(plan.slo_classes),
        config,
        timeout_ns=None if timeout_ns is None else max(0, timeout_ns - delay_ns),
        stop_ns=stop_ns,
        progress=progress,
        class_rank=[ranks[name] for name in plan.slo_classes],
        workload=c["workload"],
        workload_names=list(plan.workloads),
    )
    n = len(arrival)
    unset = np.full(n, -1, dtype=np.int64)
    raw = {
        "id": np.arange(n, dtype=np.int64),
        "prompt_tokens": np.array(c["prompt_tokens"], dtype=np.int64),
        "backlog_ns": result.backlog_ns,
        "wait_since_ns": result.wait_since_ns,
        "passed_over_ns": result.passed_over_ns,
        "reject_code": result.reject_code,
        "first_token_ns": result.first_token_ns,
        "max_tokens": np.array(c["max_tokens"], dtype=np.int64),
        "done_ns": result.done_ns,
        "admit_ns": result.admit_ns,
        "arrival_ns": arrival,
        "preemptions": np.zeros(n, dtype=np.int64),
        "cached_tokens": np.zeros(n, dtype=np.int64),
        "prefill_done_ns": unset,
        "kv_arrived_ns": unset.copy(),
        "decode_admit_ns": unset.copy(),
        "replica": result.replica,
        "first_step": result.first_step,
    }
    return JobColumns(
        view=SimResult([], result.decode_ends, result.end_ns, result.steps, None),
        job_at=lambda i: _job(result, plan, i),
        raw=raw,
        status_of=np.array(compiled.STATUS_NAMES, dtype=object)[result.status],
        retry=np.zeros(n, dtype=np.float64),  # retry_after_s: no admission limits here
        preempted=result.seg_replica >= 0,  # cancelled while decoding: one segment
        steps=result.steps,
    )


def _job(result: compiled.CompiledResult, plan: Plan, i: int) -> Job:
    """Job i as the Python engine leaves it, in the fields `SimResult.token_times` and
    sim.py's per-job readers use: for the few jobs read one by one."""
    c = plan.columns
    job = Job(
        i,
        plan.tenants[int(c["tenant"][i])],
        plan.slo_classes[int(c["slo_class"][i])],
        int(c["prompt_tokens"][i]),
        int(c["max_tokens"][i]),
        -1,
    )
    job.status = compiled.STATUS_NAMES[int(result.status[i])]
    job.replica = int(result.replica[i])
    job.first_token_ns = int(result.first_token_ns[i])
    job.done_ns = int(result.done_ns[i])
    job.first_step = int(result.first_step[i])
    if result.seg_replica[i] >= 0:
        job.segments = [
            (
                int(result.seg_replica[i]),
                int(result.seg_lead_ns[i]),
                int(result.seg_first[i]),
                int(result.seg_count[i]),
            )
        ]
    return job
