"""The simulated twin of a live run's scenario (`fairbench run --simulate PROFILE`): the same
plan as `target: sim` on a cost profile, in the simulated engine mode that matches the live
target's engine, with the classes' priorities as the live engine received them.

It exists so that what `--simulate` computes — which engine mode, which of the live
`scheduler:` block carries over, each SLO class's priority, the check that the twin plans the
same requests, the line that says how it was chosen — is a library call, tested without typer;
cli/simulate.py applies `--simulate-set`, gives the plan digests (this package plans nothing)
and prints. Each refusal is one TwinRefused line naming the flag. It is scenario to scenario,
so it lives with the scenario model and imports only it and, lazily,
`reference_scheduler.core.costmodel` (the profile loader): a refused `--simulate` loads no
plan, pyarrow or target. report/twin.py runs the twin after the live run.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fairbench.workload.models import Scenario


class TwinRefused(ValueError):
    """A live scenario (or a --simulate value) that has no simulated twin: one line naming the
    flag or field and the way out (the command exits 2)."""


# The simulated engine mode each live target's engine gets. The simulator has two: the
# reference scheduler (what the reference server runs) and vLLM V1's own scheduling. SGLang,
# TGI and an unknown OpenAI server are continuous-batching engines with a per-step token budget
# and KV allocated as tokens are produced, which the vLLM mode models; no mode of their own
# exists, so they get the vLLM one and the headline says so.
SIM_ENGINE = {"reference": "reference", "vllm": "vllm", "sglang": "vllm", "tgi": "vllm"}
# Keys of a live scenario's `scheduler:` block that describe a vLLM-like engine's limits and
# that the vLLM mode takes; the rest of the block (a reference policy's options) is not carried.
VLLM_LIMITS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "chunked_prefill",
    "kv_cache_tokens",
    "block_size",
    "max_model_len",
)


@dataclass(frozen=True)
class Simulation:
    """The simulated twin of a live run's scenario, and how it was chosen (one line)."""

    scn: Scenario
    profile: str
    line: str


def profile_spec(text: str) -> str:
    """`--simulate`'s value as `scheduler.profile` takes it (an absolute path, or a shipped
    profile's name), checked by loading it: a missing or bad file is one line, exit 2."""

    from reference_scheduler.core.costmodel import ProfileError, load_profile, shipped_profiles

    path = Path(text)
    if path.is_dir():
        raise TwinRefused(f"--simulate {text}: a directory; give the profile YAML file")
    if path.is_file():
        spec = str(path.resolve())
    elif text in shipped_profiles():
        spec = text
    else:
        raise TwinRefused(
            f"--simulate {text}: no such profile file; give the YAML `fairbench profile` wrote "
            f"(or a shipped profile: {', '.join(shipped_profiles())})"
        )
    try:
        load_profile(spec, where="profile")
    except ProfileError as error:
        raise TwinRefused(f"--simulate {text}: {' '.join(str(error).split())}") from None
    except yaml.YAMLError as error:
        why = " ".join(str(error).split())[:160]
        raise TwinRefused(f"--simulate {text}: not a profile YAML ({why})") from None
    except (OSError, UnicodeDecodeError) as error:
        raise TwinRefused(f"--simulate {text}: cannot read ({error})") from None
    return spec


def class_priorities(scn: Scenario) -> dict[str, int]:
    """Each SLO class's priority as the live engine received it, for every class: the
    simulated vLLM ranks a request by its class's `priority`, so the number the live target
    sent (`target.priority`) goes to each class, and 0 — the engines' default when a request
    carries none — to a class that was sent nothing. The plan does not change: it names
    classes, not their fields.

    SGLang runs *higher* values first (unless started with
    `--schedule-low-priority-values-first`), the simulated vLLM lower first, so SGLang's values
    are negated; `--simulate-set slo_classes.NAME.priority=N` says otherwise. A `priority` sent
    through `extra_body` / `class_extra_body` is not modelled and is refused."""
    target = scn.target
    for where, body in [("target.extra_body", target.extra_body)] + [
        (f"target.class_extra_body.{name}", b) for name, b in target.class_extra_body.items()
    ]:
        if "priority" in body:
            raise TwinRefused(
                f"--simulate: {where} sends a priority the simulation cannot read; use "
                "target.priority (by slo_class or tenant) instead, or give --simulate-set "
                "slo_classes.NAME.priority=N for each class"
            )
    sign = -1 if target.kind == "sglang" else 1
    spec = target.priority
    out = dict.fromkeys(scn.slo_classes, 0)
    if spec is None:
        return out
    if spec.by == "slo_class":
        for name in scn.slo_classes:
            value = spec.values.get(name, spec.default)
            out[name] = 0 if value is None else sign * value
        return out
    sent: dict[str, dict[int, str]] = {}
    for tenant in scn.tenants:
        value = spec.values.get(tenant.id, spec.default)
        value = 0 if value is None else value
        for workload in scn.mix_of(tenant):
            sent.setdefault(scn.slo_class_of(tenant, workload), {})[value] = tenant.id
    for name, values in sent.items():
        if len(values) > 1:
            who = ", ".join(f"{t} {v}" for v, t in sorted(values.items()))
            raise TwinRefused(
                f"--simulate: target.priority is by tenant and class {name!r} was sent "
                f"different priorities ({who}); the simulated vLLM ranks by SLO class: give "
                f"--simulate-set slo_classes.{name}.priority=N (or one class per tenant)"
            )
        out[name] = sign * next(iter(values))
    return out


def twin_document(doc: dict[str, Any], scn: Scenario, profile: str) -> tuple[dict[str, Any], str]:
    """The live scenario `scn` (document `doc`) as a `target: sim` document on `profile`, in the
    engine mode that matches the live target's engine, and the profile as `scheduler.profile`
    takes it. Everything but the target, the `scheduler:` block and the classes' priorities
    stays as it is, so the plan is the same.

    The policy: the reference target simulates its own `scheduler:` block (policy and all)
    on the profile. A vLLM engine's policy is `fcfs` (vLLM's default `--scheduling-policy`)
    unless the scenario's `scheduler.policy` is `priority` (the block a live vLLM run does not
    otherwise read); `--simulate-set scheduler.policy=priority` says it on the command line."""
    if scn.target.kind == "sim":
        raise TwinRefused(
            "--simulate: the scenario's target is sim already; --simulate replays a live run's "
            "plan in simulation (compare two runs with `fairbench fidelity REAL SIM`)"
        )
    if scn.target.upstreams:
        raise TwinRefused(
            "--simulate: target.upstreams runs the gateway in front of real engines, which has "
            "no simulated counterpart; simulate the engines' scenario with --set target.kind=sim"
        )
    if scn.target.faults:
        raise TwinRefused(
            "--simulate: target.faults injects failures the simulation would not have; remove "
            "them to compare the live run with its simulation"
        )
    spec = profile_spec(profile)
    data = json.loads(json.dumps(doc))
    if SIM_ENGINE.get(scn.target.kind, "vllm") == "reference":
        block = {**scn.scheduler, "profile": spec}
    else:
        policy = "priority" if scn.scheduler.get("policy") == "priority" else "fcfs"
        block = {"engine": "vllm", "policy": policy, "profile": spec}
        block.update({k: scn.scheduler[k] for k in VLLM_LIMITS if k in scn.scheduler})
        ranks = class_priorities(scn)
        classes = data.get("slo_classes")
        if not isinstance(classes, dict):
            classes = {
                name: cls.model_dump(exclude_none=True) for name, cls in scn.slo_classes.items()
            }
            data["slo_classes"] = classes
        for name, value in ranks.items():
            if isinstance(classes.get(name), dict):
                classes[name]["priority"] = value
    data["target"] = {"kind": "sim"}
    data["scheduler"] = block
    return data, spec


def check_twin(scn: Scenario, sim: Scenario, what: str, digest: Callable[[Scenario], str]) -> None:
    """The twin `sim` must stay `target: sim` and plan exactly the live scenario's requests
    (`digest` gives a scenario's plan digest at the run's seed: the caller's materialize, as
    this package plans nothing); `what` is the flag that made it so, which a refusal names.
    Checked before the live run starts, so nothing is spent on it."""
    if sim.target.kind != "sim":
        raise TwinRefused(
            f"{what}: the simulated scenario's target must stay sim "
            "(the live run is the scenario's own target)"
        )
    live, twin = digest(scn), digest(sim)
    if live != twin:
        raise TwinRefused(
            f"{what}: changes the plan ({twin[:19]}… against the live {live[:19]}…); "
            "--simulate-set may change the engine (scheduler.*, slo_classes.*.priority), not "
            "the workload, tenants or run"
        )


def twin_line(scheduler: dict[str, Any], profile: str, kind: str) -> str:
    """How the twin was chosen, in one line: its `scheduler:` block (the profile as given on
    the command line) and, for an engine with no mode of its own, which mode stands in."""
    shown = {k: v for k, v in scheduler.items() if k != "profile"}
    shown = {**shown, "profile": profile}
    how = yaml.safe_dump(shown, default_flow_style=True, sort_keys=False, width=10**6).strip()
    note = "" if kind in ("reference", "vllm") else f" (no {kind} mode: vLLM's scheduling model)"
    return f"target sim, scheduler {how}{note}"
