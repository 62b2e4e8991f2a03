"""Paired A/B verdicts: refusals, the expected sign on the incident, and the A/A false-positive
rate."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from fairbench.decide.compare import CompareRefused, RunData, compare_dirs, compare_scenario_pairs
from fairbench.pipeline import run_scenario
from fairbench.plan.materialize import materialize
from fairbench.run import RunOptions
from fairbench.run.records import records_frame
from fairbench.targets.sim import run_sim
from fairbench.workload.scenario import Scenario, load_scenario

REPO = Path(__file__).resolve().parents[1]
INCIDENT = load_scenario(REPO / "scenarios" / "incident-fifo.yaml")


def sim_run(scn: Scenario, seed: int, policy: str, noise_seed: int) -> RunData:
    """A simulated run held in memory (what load_run would read from a run directory)."""
    variant = scn.model_copy(
        update={
            "scheduler": {
                **scn.scheduler,
                "policy": policy,
                "step_noise_cv": 0.05,
                "seed": noise_seed,
            }
        }
    )
    plan = materialize(variant, seed)
    rows, _ = run_sim(plan, variant)
    window = [variant.run.warmup, (variant.run.duration or 0) - variant.run.cooldown]
    frame = records_frame(rows)
    t = frame["t_intended_ns"] / 1e9
    frame = frame[(t >= window[0]) & (t <= window[1])].reset_index(drop=True)
    summary = {
        "plan_digest": plan.digest,
        "scenario": variant.name,
        "schema_version": 1,
        "valid": True,
        "window_s": window,
    }
    return RunData(Path(f"mem/{policy}-{seed}-{noise_seed}"), summary, frame)


def test_refuses_runs_of_different_plans_and_says_which(tmp_path: Path) -> None:
    short = INCIDENT.run.model_copy(update={"duration": 20.0, "warmup": 0.0, "cooldown": 0.0})
    tenants = [t.model_copy(update={"phases": []}) for t in INCIDENT.tenants]
    scn = INCIDENT.model_copy(update={"run": short, "tenants": tenants})
    a = run_scenario(scn, RunOptions(out=tmp_path / "a", seed=1)).run_dir
    b = run_scenario(scn, RunOptions(out=tmp_path / "b", seed=2)).run_dir
    with pytest.raises(CompareRefused, match="no B run replayed the plan"):
        compare_dirs([a], [b], resamples=100)
    ra, rb = sim_run(scn, 1, "fifo", 0), sim_run(scn, 2, "fifo", 0)
    with pytest.raises(CompareRefused, match="plan_digest differs"):
        compare_scenario_pairs([(ra, rb)], scn, resamples=100)


def test_refuses_an_invalid_run() -> None:
    a = sim_run(INCIDENT, 1, "fifo", 0)
    b = sim_run(INCIDENT, 1, "dwrr", 0)
    b.summary.update(valid=False, invalid_reasons=["generator fell behind"])
    with pytest.raises(CompareRefused, match=r"INVALID \(generator fell behind\)"):
        compare_scenario_pairs([(a, b)], INCIDENT, resamples=100)


def test_dwrr_beats_fifo_on_the_incident_with_the_expected_sign() -> None:
    pairs = [
        (sim_run(INCIDENT, s, "fifo", 1), sim_run(INCIDENT, s, "dwrr", 1)) for s in (11, 12, 13)
    ]
    verdicts = {
        v.metric: v for v in compare_scenario_pairs(pairs, INCIDENT, resamples=400).verdicts
    }
    starved = verdicts["starved_share"]
    # FIFO lets the bursting tenant starve everyone behind it; DWRR across tenants lets the
    # well-behaved ones through: fewer requests wait past 10x their SLO. (The worst/best
    # slowdown ratio does not improve: DWRR makes the bursting tenant absorb its own burst,
    # so the spread between tenants stays; FIFO's misery is equal. See docs/ci-gate.md.)
    assert starved.verdict == "better" and starved.diff < -0.05 and starved.ci_high < 0
    assert verdicts["slo_attainment.interactive"].verdict == "better"


@pytest.mark.slow
def test_a_vs_a_false_positive_rate_holds() -> None:
    """100 repetitions of A vs A (3 paired runs each, only the engine noise differs): each metric
    reports a significant change in at most 5 of them."""
    short = INCIDENT.model_copy(
        update={
            "run": INCIDENT.run.model_copy(
                update={"duration": 30.0, "warmup": 2.0, "cooldown": 2.0}
            )
        }
    )
    short = short.model_copy(
        update={"tenants": [t.model_copy(update={"phases": []}) for t in short.tenants]}
    )
    false_alarms: Counter[str] = Counter()
    for rep in range(100):
        pairs = [
            (
                sim_run(short, 1000 * rep + j, "fifo", 2 * rep),
                sim_run(short, 1000 * rep + j, "fifo", 2 * rep + 1),
            )
            for j in range(3)
        ]
        for v in compare_scenario_pairs(pairs, short, resamples=100, seed=rep).verdicts:
            if v.verdict in ("better", "worse"):
                false_alarms[v.metric] += 1
    assert all(n <= 5 for n in false_alarms.values()), false_alarms
