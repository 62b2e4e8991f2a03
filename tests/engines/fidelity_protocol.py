"""The live half of the simulator's proof on a real vLLM (issue #16 item 4), shared by
tests/test_vllm_fidelity.py and benchmarks/bench_fidelity.py so that the test and the bench
measure one protocol.

The protocol, and why each step:

- **Both engines up at once**, one started `--scheduling-policy fcfs`, one `priority`, on the
  same core (the policy is a start flag, so an A/B needs two engines), prefix caching off (a
  replayed plan would hit the prompts of the runs before it). The idle one took 1.7% of the
  core (0.34 s of CPU in 20 s, measured here).
- **The generator off the engine's core**: the engine runs niced, so a generator process the
  kernel placed on its core would take its time first (`generator_cores`).
- **Warm both engines** with a short run of the scenario, discarded: a freshly started engine
  is slower for its first requests. Before, the priority engine's first requests were its
  measured run (the FCFS engine had been warmed by the profile), and in CI every real
  priority run was slower than every FCFS run (TPOT p50 8.4 and 6.6 ms against 4.9 and 5.3):
  an engine difference the simulator was blamed for.
- **Profile the engine around each run**: `fairbench profile` (two rounds, about 7 s) right
  before each run, of the engine about to run, and once after the last; the probes on either
  side of a run, merged (`fairbench profile --merge`), are the profile of its simulated twin
  (the probe between two runs serves both: the engines share the core whose speed drifts).
  Why: measured here, one profile fitted before all the runs described them badly — the
  one-core engine's decode constant `d` took 5.36, 6.48, 4.42 and 3.51 ms in four tests within
  35 minutes, and its TPOT p50 moved 5.7 → 7.9 ms over one test's six runs. Bracketed, the
  drift is measured rather than suffered, and the probes show what no single profile can
  absorb: in one test `d` went 4.03 → 7.18 ms across one 30 s run. Every probe merged is the
  engine over the whole test: the simulated A/B (one profile for both policies, as a user
  would sweep) runs on it.
- **Interleave the measured runs**: FCFS 1, priority 1, FCFS 2, priority 2, FCFS 3,
  priority 3. The engine's own speed drifts on a shared machine; run back to back per policy,
  a drift lands between the policies, where it looks like the policy's effect; interleaved, it
  lands in the noise floor (runs 1 and 2 of one plan), where the fidelity test expects it.
  Three rounds, because `fairbench compare`'s verdict over k pairs takes a t interval with
  k − 1 degrees of freedom: with two pairs its half-width is 6.4 times their difference.
- **More rounds while the real A/B has no verdict** (`settled`), up to five: with three pairs
  the t quantile is 4.30, and one pair whose engine slowed mid-run leaves a real cut of chat's
  TTFT p99 "no significant change" (CI, 2026-12-02: pair mean −39%, the simulated −65%
  `better`), which says the real experiment was too small, not that the simulator was wrong.
  A fourth and fifth pair bring the quantile to 3.18 and 2.78 and the interval's width down
  with √k. The price of looking three times: under no effect the chance of a false `better`
  rises from 5% to about 10% (Armitage, McPherson & Rowe 1969); the proof's effect is a cut of
  a half or more, and the extra rounds cost time only in the runs that need them (about 100 s
  each).
- **Nearer the knee than past it, as a load and not a rate** (`operating_point_of`): the
  flood's rate is chosen from the fastest of the first three probes (`fastest` says why) so
  that the plan asks for 80% of the
  engine's time (`TARGET_LOAD`, by tests/engines/load.py's `engine_load`). A fixed rate is a
  different experiment on a different core (tests/engines/load.py): the old 7/s was a load of
  0.66 to 0.72 on the one-core VMs of earlier CI
  runs (where 10/s, 0.9 to 1.0, was past the knee: a few percent of engine speed decided
  whether the FCFS queue drained or grew for the whole run, and 6/s left the simulated queue
  empty), but on a VM whose engine stepped in 1.7 ms rather than 4 (2026-12-02) it was 0.30:
  no queue formed and priority changed nothing (five pairs, real +11%, simulated 0%), while
  the simulator's errors all sat inside the issue's tolerances (MAPE 3.7% FCFS, 5.5%
  priority). On that engine's profile the simulated cut of chat's TTFT p99 was −23% to −39%
  at loads 0.66 to 0.70 (too close to the 25% the test asks of both) and −55% to −77% from
  0.73 to 0.98; 0.8 is 21/s there and about 8/s on the slower VMs. That is near the knee: the
  simulated engine was busy 93% of each run, the real one's core about 98% (per-process CPU
  read from /proc), so the live-vs-simulated errors at this point are large (reported, not
  asserted) while the verdict, the proof's assertion, is wide of its threshold (two tests:
  real −65% and −68%, simulated −58% and −52%).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from fairbench.decide.compare import Verdict, compare_dirs
from reference_scheduler.core.costmodel import load_profile
from tests.engines.load import (
    BUDGET_TOKENS,
    MAX_NUM_SEQS,
    base_rates,
    engine_load,
    operating_point,
)
from tests.engines.load import probe as probe_engine
from tests.engines.vllm_server import VLLMServer

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "scenarios" / "vllm-priority.yaml"
POLICIES = ("fcfs", "priority")
# the operating point: the engine's load that the plan asks for (`operating_point` turns it
# into the flood's rate on the probed engine); the same override goes to the live runs and to
# the simulated twins, so both replay one plan (the fidelity command checks the digest)
TARGET_LOAD = 0.80
WARM_POINT = ("--set=tenants.flood.arrival.rate=7/s",)  # a warm-up only needs work to do
# The generator's own schedule is not what is measured here (tests/test_vllm_engine.py holds
# it): on a loaded two-core machine a send lag over 5 ms would make a run INVALID, and an
# INVALID run is not compared. The same relaxation goes into the simulated runs. The receive
# error bound (1 ms) stays: a late first-token stamp is an error in the very TTFT the
# simulator is judged against, so a run whose stamps cannot be trusted must not be compared.
HEALTH = {"max_send_lag_p99": "1s", "min_rate_ratio": 0.5}
RELAX = tuple(f"--set=health.{k}={v}" for k, v in HEALTH.items())
WARMUP = ("--set=run.duration=8s",)
# Every run of an engine replays one plan, so with vLLM's prefix cache on (the default; the
# tiny model's 1 GiB KV cache holds every prompt of a plan) a run's prefills are nearly free
# whenever an earlier run or the warm-up sent the same prompts: the second run of a plan would
# measure the cache, the first not. The workload shares no prefixes, so the cache is off.
NO_CACHE = ("--no-enable-prefix-caching",)
ROUNDS = 3  # interleaved rounds: the verdict needs k = 3 pairs (with 2, its t has 1 df)
MAX_ROUNDS = 5  # more while the real A/B has no verdict (`settled`)
VERDICT = "ttft_p99.tenant.chat"  # the decision the proof is about: priority and chat's tail

Cli = Callable[..., "subprocess.CompletedProcess[str]"]


def checked(cli: Cli, *args: str, ok: tuple[int, ...] = (0,), timeout: float = 600) -> str:
    """Run `fairbench ARGS` through `cli`; its stdout, or RuntimeError with its output."""
    proc = cli(*args, timeout=timeout)
    if proc.returncode not in ok:
        raise RuntimeError(
            f"fairbench {args[0]} exited {proc.returncode}: "
            f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    return str(proc.stdout)


@contextlib.contextmanager
def generator_cores() -> Iterator[None]:
    """Keep this process's children (the generator, the probe) off the engine's core: the
    engine runs niced there (VLLMServer.confine), so a generator process the kernel placed on
    it would take its time first, and the engine would run slower under a live run than under
    the probe that fitted its profile."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2 or VLLMServer.confine()[0] != "taskset":
        yield
        return
    os.sched_setaffinity(0, cores[1:])
    try:
        yield
    finally:
        os.sched_setaffinity(0, cores)


def fastest(profiles: list[Path]) -> Path:
    """The probe that found the engine fastest (the least engine time for the scenario's own
    rates). Interference — a neighbour, a stall, an engine not yet warm — only slows a probe,
    so the fastest of several is the nearest to the engine's own speed. One probe is not
    enough: in a CI run of 2026-12-02 the first probe found `d` 2.04 ms where the later ones
    found 1.64-1.97, the flood was sized at 14/s instead of about 21, no queue formed after
    the first run, and the simulated A/B cut chat's TTFT p99 by only 17%."""
    doc = yaml.safe_load(SCENARIO.read_text(encoding="utf-8"))
    rates = base_rates(doc)
    return min(profiles, key=lambda path: engine_load(load_profile(str(path)), doc, rates))


def operating_point_of(profile_path: Path, target: float = TARGET_LOAD) -> tuple[str, ...]:
    """The override that sets the flood's rate so the plan asks for `target` of the probed
    engine's time (tests/engines/load.py), chat's rate unchanged."""
    return (f"--set={operating_point(profile_path, SCENARIO, 'flood', target)}",)


@dataclass
class LiveRuns:
    """What the live half produced: per policy, the runs in order and, for each, the profile
    merged from the probes right before and right after it; every probe merged; the probes'
    and merges' output."""

    runs: dict[str, list[Path]]
    around: dict[str, list[Path]]
    whole: Path
    log: str
    point: tuple[str, ...]  # the flood's rate, from the fastest first probe (`fastest`)


def real_verdict(runs: dict[str, list[Path]]) -> Verdict:
    """`fairbench compare`'s verdict on chat's TTFT p99, FCFS (A) → priority (B), over the
    interleaved pairs so far."""
    verdict = compare_dirs(runs["fcfs"], runs["priority"], block_s=2.0).get(VERDICT)
    if verdict is None:
        raise RuntimeError(f"fairbench compare has no row {VERDICT}")
    return verdict


def settled(runs: dict[str, list[Path]]) -> bool:
    """Whether the real A/B so far has a verdict (better or worse), not a want of power."""
    return real_verdict(runs).verdict in ("better", "worse")


def live_runs(
    python: str,
    model: Path,
    work: Path,
    cli: Cli,
    budget_s: int = 30,
    max_rounds: int = MAX_ROUNDS,
) -> LiveRuns:
    """Warm both engines, then run both policies interleaved, each run between two probes
    (`budget_s` each at most): ROUNDS rounds (fewer if `max_rounds` is lower), and more up to
    `max_rounds` while the real A/B is not `settled`."""
    runs: dict[str, list[Path]] = {p: [] for p in POLICIES}
    around: dict[str, list[Path]] = {p: [] for p in POLICIES}
    probes: list[Path] = []
    log: list[str] = []
    fcfs = VLLMServer(python, model, work / "vllm-fcfs.log", policy="fcfs", extra=NO_CACHE)
    priority = VLLMServer(
        python, model, work / "vllm-priority.log", policy="priority", extra=NO_CACHE
    )
    servers = {"fcfs": fcfs, "priority": priority}

    def probe(server: VLLMServer, out: Path) -> Path:
        # a probe between runs (a run's profile pools the probes before and after it), each
        # its own prompts (a prefix cache must never serve a probe's prefill)
        log.append(probe_engine(cli, server.url, out, seed=len(probes), budget_s=budget_s))
        probes.append(out)
        return out

    def merge(parts: list[Path], out: Path) -> Path:
        merged = [f"--merge={p}" for p in parts]
        log.append(checked(cli, "profile", *merged, "--out", str(out), timeout=300))
        return out

    with fcfs, priority, generator_cores():
        for policy, server in servers.items():  # exit 1 (INVALID) is fine for a warm-up
            checked(
                cli, "run", str(SCENARIO), "--target-url", server.url, "--quiet",
                "--out", str(work / f"warm-{policy}"), *WARM_POINT, *RELAX, *WARMUP, ok=(0, 1),
            )  # fmt: skip
        # one probe before each run, of the engine about to run, and one after the last: the
        # probe between two runs brackets both (the engines share the core whose speed drifts)
        # three probes before the first run (the last of the engine about to run): the flood
        # is sized on the fastest of them (`fastest`)
        for policy in (POLICIES[0], POLICIES[1], POLICIES[0]):
            edge = probe(servers[policy], work / f"probe-{len(probes)}.yaml")
        sizing = fastest(probes)
        point = operating_point_of(sizing)
        log.append(
            f"operating point {point[0]} (load {TARGET_LOAD:g} of {sizing.name}, the fastest "
            "of the first three probes)\n"
        )
        k = 0
        more = True
        while more:
            k += 1
            for j, policy in enumerate(POLICIES):  # an INVALID run exits 1: an error here
                out = work / f"{policy}-{k}"
                checked(
                    cli, "run", str(SCENARIO), "--target-url", servers[policy].url, "--out",
                    str(out), "--quiet", *point, *RELAX,
                )  # fmt: skip
                runs[policy].append(out)
                if j + 1 < len(POLICIES):
                    following = POLICIES[j + 1]
                else:  # the round is whole: is another one needed?
                    more = k < min(ROUNDS, max_rounds) or (k < max_rounds and not settled(runs))
                    following = POLICIES[0] if more else policy
                before, edge = edge, probe(servers[following], work / f"probe-{len(probes)}.yaml")
                around[policy].append(merge([before, edge], work / f"around-{policy}-{k}.yaml"))
    whole = merge(probes, work / "whole.yaml")
    return LiveRuns(runs, around, whole, "".join(log), point)


def sim_scenario(work: Path, policy: str, profile: Path, name: str) -> Path:
    """The live scenario, simulated: the same workloads, tenants and run (so, with the same
    overrides, the same plan), target sim, vLLM's scheduler on the fitted profile."""
    doc = yaml.safe_load(SCENARIO.read_text(encoding="utf-8"))
    # the simulated vLLM ranks a request by its SLO class's priority; the live target sends
    # target.priority's values: the same numbers go to the classes (the plan does not change)
    ranks = doc["target"]["priority"]["values"]
    for cls_name, cls in doc["slo_classes"].items():
        cls["priority"] = ranks[cls_name]
    doc["target"] = {"kind": "sim"}
    doc["scheduler"] = {
        "engine": "vllm",
        "policy": policy,
        "profile": str(profile),
        "max_num_seqs": MAX_NUM_SEQS,
        "max_num_batched_tokens": BUDGET_TOKENS,
    }
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def sim_runs(work: Path, live: LiveRuns, cli: Cli) -> tuple[dict[str, list[Path]], dict[str, Path]]:
    """Each live run's simulated twin (its policy, on the profile probed around it), and the
    simulated A/B: each policy on the whole test's profile. All with the live runs' overrides
    (so the same plan)."""

    def simulate(policy: str, profile: Path, out: Path) -> Path:
        scenario = sim_scenario(work, policy, profile, out.name)
        checked(cli, "run", str(scenario), "--out", str(out), "--quiet", *live.point, *RELAX)
        return out

    twins = {
        policy: [
            simulate(policy, profile, work / f"sim-{policy}-{k}")
            for k, profile in enumerate(live.around[policy], 1)
        ]
        for policy in POLICIES
    }
    ab = {policy: simulate(policy, live.whole, work / f"sim-{policy}") for policy in POLICIES}
    return twins, ab
