"""How often do `gate`, `compare` and `ab` call a difference where there is none (A/A)?

Why: a verdict is only worth its false-positive rate. Issue #32 measured the gate failing 26 and
64 of 132 ordered pairs of 12 runs of one configuration, because a relative rule judged the two
runs' own intervals. This script measures, on the simulator (virtual time, seeded):

- **gate, A/A**: 12 runs of one configuration (seeds 301–312) on a light scenario (the
  calibration queue at 4/s per tenant) and a loaded one (`scenarios/gate-dogfood.yaml`), gated
  with relative rules (TTFT p99, E2E p99 and a tenant's TTFT p99: no significant increase > 5%):
  *before* — the rule of the gate before #32 (fail when the candidate's interval lies above the
  baseline's and the change exceeds the allowance) on every ordered pair; *after* — one baseline
  run (every ordered pair: `cannot evaluate`), and replicated baselines of 3 and 5 other seeds
  (every subset of the other 11) with the candidate judged against their noise band;
- **gate, detection**: the same with a real regression as the candidate — FIFO instead of DWRR
  on the loaded scenario (the support bot's TTFT p99), and a slower engine (max_num_seqs 16 → 4)
  on the light one;
- **compare / ab, A/A**: the incident scenario (30 s) with seeded engine step noise (5% CV),
  arms identical, only the noise seeds differ: at `ab`'s default of 3 interleaved pairs and at
  one pair (`compare`'s default), the share of rows called better/worse.

Goal: every A/A rate ≤ 5% and every regression detected in most gates. Prints the tables; exits 1
if a goal is missed.

    python benchmarks/bench_aa.py            # ~5 min on 2 cores
    python benchmarks/bench_aa.py --quick    # 8 seeds, 8 A/B repetitions
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import console, finish, show, verdict

from fairbench.decide.gate import evaluate, parse_rules
from fairbench.workload import parse_scenario, read_yaml

REPO = Path(__file__).resolve().parents[1]
GOAL = 0.05


def _light(data: dict[str, Any]) -> dict[str, Any]:
    for tenant in data["tenants"]:
        tenant["arrival"]["rate"] = "4/s"
    data["run"]["duration"] = "60s"
    return data


SCENARIOS: dict[str, tuple[Path, Callable[[dict[str, Any]], dict[str, Any]], str, list[str]]] = {
    # name: (file, change, regression, rules)
    "light": (
        REPO / "scenarios" / "calibration" / "queue.yaml",
        _light,
        "scheduler.max_num_seqs=4",
        ["ttft_p99.tenant.a: no significant increase > 5%"],
    ),
    "loaded": (
        REPO / "scenarios" / "gate-dogfood.yaml",
        lambda d: d,
        "scheduler.policy=fifo",
        ["ttft_p99.tenant.support-bot: no significant increase > 5%"],
    ),
}
AA_RULES = ["ttft_p99: no significant increase > 5%", "e2e_p99: no significant increase > 5%"]


def summaries(name: str, seeds: list[int], regression: bool, tmp: Path) -> list[dict[str, Any]]:
    from fairbench.pipeline import run_scenario
    from fairbench.run.rundir import RunOptions

    file, change, worse, _ = SCENARIOS[name]
    out = []
    for seed in seeds:
        data = change(json.loads(json.dumps(read_yaml(file.read_text()))))
        if regression:
            key, value = worse.split("=")
            data["scheduler"][key.split(".")[1]] = int(value) if value.isdigit() else value
        data["run"]["seed"] = seed
        run_dir = tmp / f"{name}-{'r' if regression else 'a'}-{seed}"
        out.append(run_scenario(parse_scenario(data), RunOptions(out=run_dir, progress=False)))
    return [o.summary for o in out]


def _entry(summary: dict[str, Any], metric: str) -> dict[str, Any]:
    parts = metric.split(".")
    if len(parts) == 1:
        return summary["metrics"]["overall"][parts[0]]
    return summary["metrics"][parts[1]][parts[2]][parts[0]]


def before(rule: str, base: dict[str, Any], cand: dict[str, Any]) -> str:
    """The relative rule as the gate judged it before #32 (git history, decide/gate.py): fail
    when the candidate's interval lies wholly above the baseline's and the change exceeds the
    allowance; `error` when either run declined its interval."""
    metric, allowance = rule.split(":")[0], float(rule.split(">")[1].strip(" %")) / 100
    b, c = _entry(base, metric), _entry(cand, metric)
    if b.get("ci_low") is None or c.get("ci_low") is None or not b["value"]:
        return "error"
    b_high = math.inf if b.get("ci_high") is None else b["ci_high"]
    change = c["value"] / b["value"] - 1
    return "fail" if c["ci_low"] > b_high and change > allowance else "pass"


def _gate_fails(rules: list[str], bases: list[dict[str, Any]], cand: dict[str, Any]) -> str:
    results, blocker = evaluate(parse_rules({"rules": rules}), bases, cand)
    if blocker or any(r.outcome == "error" for r in results):
        return "error" if not any(r.outcome == "fail" for r in results) else "fail"
    return "fail" if any(r.outcome == "fail" for r in results) else "pass"


def gate_rates(
    rules: list[str], runs: list[dict[str, Any]], cands: list[dict[str, Any]] | None
) -> list[list[str]]:
    """Rows of the gate table: (design, gates, fail, cannot evaluate). `cands` None is A/A
    (the candidate is one of the runs, never in its own baseline); else every candidate
    against baselines drawn from `runs`."""
    n = len(runs)
    rows = []
    designs: list[tuple[str, int]] = [("before: 1 baseline run, per-run intervals", 0)]
    designs += [("after: 1 baseline run", 1), ("after: 3 baseline runs", 3)]
    designs += [("after: 5 baseline runs", 5)]
    for label, k in designs:
        outcomes = []
        for i in range(n if cands is None else len(cands)):
            cand = runs[i] if cands is None else cands[i]
            others = [j for j in range(n) if cands is not None or j != i]
            for subset in itertools.combinations(others, max(k, 1)):
                bases = [runs[j] for j in subset]
                if k == 0:
                    each = [before(r, bases[0], cand) for r in rules]
                    outcomes.append(
                        "fail" if "fail" in each else "error" if "error" in each else "pass"
                    )
                else:
                    outcomes.append(_gate_fails(rules, bases, cand))
        total = len(outcomes)
        fails, errors = outcomes.count("fail"), outcomes.count("error")
        rows.append([label, str(total), f"{fails} ({fails / total:.1%})", str(errors)])
    return rows


def _noisy_run(scn: Any, seed: int, noise_seed: int) -> Any:
    """A simulated run in memory with seeded engine step noise (5% CV): same plan for the same
    seed, different noise for a different noise seed — a noisy target, as a live engine is."""
    from fairbench.decide.compare import RunData
    from fairbench.plan.materialize import materialize
    from fairbench.run.records import records_frame
    from fairbench.targets.sim import run_sim

    noise = {"step_noise_cv": 0.05, "seed": noise_seed}
    variant = scn.model_copy(update={"scheduler": {**scn.scheduler, **noise}})
    plan = materialize(variant, seed)
    rows, _ = run_sim(plan, variant)
    window = [variant.run.warmup, (variant.run.duration or 0) - variant.run.cooldown]
    frame = records_frame(rows)
    t = frame["t_intended_ns"] / 1e9
    frame = frame[(t >= window[0]) & (t <= window[1])].reset_index(drop=True)
    meta = {"plan_digest": plan.digest, "scenario": variant.name, "schema_version": 2}
    summary = {**meta, "valid": True, "window_s": window}
    return RunData(Path(f"mem/{seed}-{noise_seed}"), summary, frame)


def compare_aa(reps: int) -> list[list[str]]:
    """Rows called better/worse per design, A vs A with seeded step noise."""
    from fairbench.analysis import registry
    from fairbench.analysis.registry import Name
    from fairbench.decide.compare import compare_scenario_pairs
    from fairbench.workload.loading import load_scenario

    incident = load_scenario(REPO / "scenarios" / "incident-fifo.yaml")
    run = incident.run.model_copy(update={"duration": 30.0, "warmup": 2.0, "cooldown": 2.0})
    tenants = [t.model_copy(update={"phases": []}) for t in incident.tenants]
    short = incident.model_copy(update={"run": run, "tenants": tenants})
    headline = [Name(registry.get(n)) for n in ("ttft_p99", "e2e_p99", "slo_attainment")]
    headline += [
        Name(registry.get(n), "tenant", t.id)
        for t in short.tenants
        for n in ("ttft_p99", "e2e_p99", "slo_attainment")
    ]
    called = {1: 0, 3: 0}
    rows_seen = {1: 0, 3: 0}
    for rep in range(reps):
        pairs = [
            (
                _noisy_run(short, 5000 + 1000 * rep + j, 2 * rep),
                _noisy_run(short, 5000 + 1000 * rep + j, 2 * rep + 1),
            )
            for j in range(3)
        ]
        for k in (1, 3):
            kw = {"resamples": 200, "seed": rep, "rows": headline}
            for v in compare_scenario_pairs(pairs[:k], short, **kw).verdicts:
                rows_seen[k] += 1
                called[k] += v.verdict in ("better", "worse")
    return [
        [
            f"{'ab (3 interleaved pairs)' if k == 3 else 'compare (1 pair, noisy target)'}",
            str(rows_seen[k]),
            f"{called[k]} ({called[k] / rows_seen[k]:.1%})",
        ]
        for k in (3, 1)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 seeds, 8 A/B repetitions")
    args = parser.parse_args()
    seeds = list(range(301, 309 if args.quick else 313))
    with tempfile.TemporaryDirectory() as tmp:
        for name, (_, _, worse, detect_rules) in SCENARIOS.items():
            console.print(f"{name}: {len(seeds)} seeds, and {len(seeds)} with {worse}")
            same = summaries(name, seeds, False, Path(tmp))
            regressed = summaries(name, seeds, True, Path(tmp))
            rules = AA_RULES + detect_rules
            aa = gate_rates(rules, same, None)
            show(
                f"gate A/A, {name} scenario ({len(seeds)} runs of one configuration)",
                ["design", "gates", "fail", "cannot evaluate"],
                aa,
            )
            for row in aa[2:]:
                share = int(row[2].split()[0]) / int(row[1])
                verdict(share <= GOAL, f"{name}: gate A/A {row[0]}: {share:.1%} ≤ {GOAL:.0%}")
            hit = gate_rates(detect_rules, same, regressed)
            show(
                f"gate detection, {name} scenario ({worse} as candidate)",
                ["design", "gates", "fail", "cannot evaluate"],
                hit,
            )
            share = int(hit[3][2].split()[0]) / int(hit[3][1])
            verdict(share >= 0.8, f"{name}: {worse} fails {share:.0%} of 5-run gates (≥ 80%)")
    reps = 8 if args.quick else 20
    rows = compare_aa(reps)
    show(
        f"compare / ab A/A, incident 30 s with 5% step noise ({reps} repetitions)",
        ["design", "rows", "called better/worse"],
        rows,
    )
    for row in rows:
        share = int(row[2].split()[0]) / int(row[1])
        verdict(share <= GOAL, f"{row[0]}: {share:.1%} of rows ≤ {GOAL:.0%}")
    finish()


if __name__ == "__main__":
    main()
