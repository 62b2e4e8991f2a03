"""The load a real-engine test puts on its engine, as a share of the engine's time, not a rate.

Why: the same request rate is a different experiment on a different core. The CPU vLLM's tiny
model stepped in 4–6.5 ms on the one-core VMs of earlier CI runs and in 1.7 ms on a later one
(2026-12-02): there the fixed rates the engine tests were sized with (a flood of 7, 10 and
12/s) asked for 30–45% of the engine, no queue formed, and every A/B of a scheduling policy
decided nothing (tests/test_vllm_engine.py: "vLLM never queued"; tests/test_vllm_gateway.py:
"the gateway never queued"; tests/test_vllm_fidelity.py: priority +11%). So each test probes
its engine first (`probe`: two rounds of `fairbench profile`, about 7 s) and sets one tenant's
rate so the plan asks for a chosen share of the probed engine (`operating_point`).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from reference_scheduler.core.costmodel import Profile, load_profile

MAX_NUM_SEQS = 4  # what VLLMServer starts the engine with
BUDGET_TOKENS = 2048  # vLLM's max_num_batched_tokens at --max-model-len 2048
# Two rounds of `fairbench profile`'s experiment (about 8 s on the CPU vLLM); the load phase's
# requests shaped like the scenarios' flood (300-800 prompt tokens, 48 out), the most of their
# load: its prompts over the flood's range, not all at 512 (measured 2026-12-02, four bursts
# each on one engine: the charge per request came out 0.6-0.8 ms with every prompt at 512 and
# 2.0-2.4 ms spread over 300-800, which is what the live runs' bursts paid)
PROBE = ("--rounds", "2", "--max-num-seqs", str(MAX_NUM_SEQS),
         "--max-num-batched-tokens", str(BUDGET_TOKENS),
         "--load-prompt", "300", "--load-prompt-to", "800", "--load-output", "48")  # fmt: skip

Cli = Callable[..., "subprocess.CompletedProcess[str]"]


def probe(cli: Cli, url: str, out: Path, seed: int = 0, budget_s: int = 30) -> str:
    """`fairbench profile` of the engine at `url` into `out`; its stdout (RuntimeError with
    its output if it failed). Each probe of one engine takes its own `seed`, so a prefix cache
    never serves a probe's prefill."""
    proc = cli(
        "profile", "--target-url", url, "--out", str(out), *PROBE, "--budget", str(budget_s),
        "--seed", str(seed), timeout=budget_s + 300,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"fairbench profile exited {proc.returncode}: {proc.stderr[-2000:]}")
    return str(proc.stdout)


def _mean_tokens(dist: dict[str, Any]) -> float:
    if dist["dist"] == "constant":
        return float(dist["value"])
    if dist["dist"] == "uniform":
        return (float(dist["low"]) + float(dist["high"])) / 2
    raise ValueError(f"the mean of constant and uniform lengths is known here, not {dist}")


def engine_load(profile: Profile, doc: dict[str, Any], rates: dict[str, float]) -> float:
    """The share of the engine's time the scenario `doc`'s tenants ask for at `rates`
    (requests/s per tenant), by the profile: per request its prompt's prefill, its decode steps
    at a full batch (`MAX_NUM_SEQS` sequences share each step), and its request overhead (the
    CPU vLLM's API server and engine-core process run on the engine's core, so that CPU time is
    the core's too), at the workload's mean lengths. A lower bound of how busy the engine is: a
    batch is not always full, and a step of fewer sequences costs nearly as much (at 0.8 by
    this measure the fidelity test's simulated twins were busy 93% of the run, the real
    engine's core about 98%)."""
    batch = MAX_NUM_SEQS
    busy_ms = 0.0
    for tenant in doc["tenants"]:
        workload = doc["workloads"][tenant["mix"]]
        prompt = _mean_tokens(workload["prompt_tokens"])
        out = _mean_tokens(workload["output_tokens"])
        context = int(batch * (prompt + out / 2))
        decode = (out - 1) * profile.step_ms(0, batch, context) / batch
        cost = profile.step_ms(int(prompt), 0, 0) + decode + profile.request_overhead_ms
        busy_ms += rates[tenant["id"]] * cost
    return busy_ms / 1000


def base_rates(doc: dict[str, Any]) -> dict[str, float]:
    """Each tenant's rate in the scenario `doc` (requests/s), as written there."""
    return {t["id"]: float(str(t["arrival"]["rate"]).removesuffix("/s")) for t in doc["tenants"]}


def operating_point(profile_path: Path, scenario: Path, tenant: str, target: float) -> str:
    """The `--set` item that sets `tenant`'s rate (to 0.5/s) so the scenario asks for `target`
    of the probed engine's time by `engine_load`, the other tenants' rates unchanged."""
    profile = load_profile(str(profile_path))
    doc = yaml.safe_load(scenario.read_text(encoding="utf-8"))
    rates = base_rates(doc)
    others = engine_load(profile, doc, {**rates, tenant: 0.0})
    per_request = engine_load(profile, doc, {**rates, tenant: 1.0}) - others
    if not per_request > 0 or others >= target:
        raise ValueError(
            f"{profile_path}: {tenant}'s requests cost {per_request:.3g} of the engine each and "
            f"the other tenants ask for {others:.3g}: no rate of {tenant} makes a load of {target}"
        )
    rate = max(0.5, round(2 * (target - others) / per_request) / 2)
    return f"tenants.{tenant}.arrival.rate={rate:g}/s"


def burst_point(
    profile_path: Path, scenario: Path, tenant: str, work_s: float, on_s: float, off_s: float
) -> str:
    """The `--set` item that makes `tenant` arrive in bursts: Poisson for `on_s`, silent for
    `off_s`, at the rate (whole requests/s) that puts `work_s` of the probed engine's time
    (by `engine_load`) into each burst."""
    profile = load_profile(str(profile_path))
    doc = yaml.safe_load(scenario.read_text(encoding="utf-8"))
    alone = {t: 0.0 for t in base_rates(doc)}
    per_request = engine_load(profile, doc, {**alone, tenant: 1.0})  # engine seconds each
    if not per_request > 0:
        raise ValueError(f"{profile_path}: {tenant}'s requests cost nothing by this profile")
    rate = max(1, round(work_s / (on_s * per_request)))
    return (
        f"tenants.{tenant}.arrival={{process: onoff, rate: {rate}/s, on: {on_s:g}s,"
        f" off: {off_s:g}s}}"
    )
