"""The search: optuna's TPE sampler, seeded, over the space of `space.py`, each trial one
simulated run of the scenario (`decide.points`, the path `sweep` and `knee` take), judged on
the metric registry's figures.

Why optuna rather than our own grid: the space has 15–20 knobs, some categorical and some
continuous, and a grid of even three values each would be millions of runs. TPE (Bergstra et
al., NeurIPS 2011; multi-objective as MOTPE, Ozaki et al. 2022) models which regions held the
better trials and samples there, handles the mixed space and the SLO constraints (a trial
whose constraint is > 0 is infeasible and ranks behind every feasible one), and with a seed it
proposes the same trials in the same order on any machine.

Reproducible: every trial runs on the same plan (the search seed), and the sampler is seeded
with it too. Trials are asked in batches of `ASK_BATCH` whatever `--parallel` is, so the
proposals do not depend on how many processes run them; the simulator is deterministic, so the
same seed and budget give the same trials, parameters and values.

What a trial is told: one value per objective (registry names; `jain_backlogged` has no value
when no two tenants were ever backlogged at once, and is then told as 1, the index's maximum:
nothing was waiting to be treated unfairly), and one constraint per target,
`needed − attainment` (feasible at ≤ 0), plus `valid` (an INVALID run is never feasible).
`headroom` is the smallest `attainment − needed` over the targets: the margin by which the
tightest SLO holds (> 0) or misses (< 0).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fairbench.decide.advise.problem import Problem, scenario_with
from fairbench.decide.advise.space import knobs, relevant, scheduler_block, suggest, warm_starts
from fairbench.decide.points import PointJob, PointResult, PointRunner, PointsFailed

ASK_BATCH = 4
NAN_AS_FAIR = ("jain_backlogged", "jain_backlogged_min")  # no contended window: told as 1
Progress = Callable[[str, int, int], None]  # phase, done, total


@dataclass
class Evaluation:
    """One configuration's run on one seed, as the search and the verification read it."""

    label: str
    block: dict[str, Any]
    seed: int
    run_dir: str
    values: dict[str, float] = field(default_factory=dict)  # objective -> value
    attainment: dict[str, float] = field(default_factory=dict)  # class -> share
    headroom: float = -math.inf
    valid: bool = False
    solo_ttft_p99_ms: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    @property
    def feasible(self) -> bool:
        return self.error is None and self.valid and self.headroom >= 0


@dataclass
class Trial:
    """One trial of the search: what was drawn, what of it the block uses, and its run."""

    number: int
    params: dict[str, Any]
    used: dict[str, Any]
    run: Evaluation


@dataclass
class SearchResult:
    trials: list[Trial]
    own: Evaluation  # the scenario's own configuration on the search seed
    importance: dict[str, dict[str, float]]  # target ("headroom" or objective) -> knob -> share
    importance_note: str


def evaluate(problem: Problem, result: PointResult, block: dict[str, Any]) -> Evaluation:
    """A run's objectives, attainments and headroom from its summary (registry names)."""
    from fairbench.analysis.registry import metric_value

    job = result.job
    ev = Evaluation(job.label, block, int(job.seed or 0), job.out)
    if result.failed:
        ev.error = result.error
        return ev
    summary = result.summary
    ev.valid = bool(summary.get("valid"))
    for name in problem.names:
        value = metric_value(summary, name)
        if math.isnan(value) and name.split(".")[0] in NAN_AS_FAIR:
            value = 1.0
        ev.values[name] = value
    for target in problem.targets:
        ev.attainment[target.cls] = metric_value(summary, target.metric)
    margins = [ev.attainment[t.cls] - t.share for t in problem.targets]
    ev.headroom = min(m if math.isfinite(m) else -1.0 for m in margins)
    solo = (summary.get("fairness") or {}).get("solo_ttft_p99_ms") or {}
    ev.solo_ttft_p99_ms = {str(k): float(v) for k, v in solo.items() if v is not None}
    missing = [n for n, v in ev.values.items() if not math.isfinite(v)]
    if missing:
        ev.error = f"{job.label}: {missing[0]} has no value in this run; it cannot be ranked"
    return ev


def run_blocks(
    problem: Problem,
    items: list[tuple[str, dict[str, Any], int, Path]],
    runner: PointRunner,
) -> list[Evaluation]:
    """Run each (label, block, seed, run dir) and read its evaluation."""
    jobs = [
        PointJob(label, scenario_with(problem, block), str(problem.source), str(out), seed)
        for label, block, seed, out in items
    ]
    results = runner.run(jobs, problem.ask.parallel)
    bad = [r for r in results if r.failed and r.bad_input]
    if bad and len(bad) == len(results):
        raise PointsFailed.of(bad)
    return [evaluate(problem, r, b) for r, (_, b, _, _) in zip(results, items, strict=True)]


def _sampler(problem: Problem) -> Any:
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            seed=problem.seed,
            multivariate=True,
            n_startup_trials=min(10, max(4, problem.ask.budget // 3)),
        )


def _tell(study: Any, trial: Any, problem: Problem, ev: Evaluation) -> None:
    import optuna

    if ev.error is not None:
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        return
    for target in problem.targets:
        got = ev.attainment[target.cls]
        trial.set_constraint(target.cls, target.share - got if math.isfinite(got) else 1.0)
    trial.set_constraint("valid", 0.0 if ev.valid else 1.0)
    trial.set_user_attr("headroom", ev.headroom)
    study.tell(trial, [ev.values[n] for n in problem.names])


def search(
    problem: Problem, runner: PointRunner, base: Path, progress: Progress | None = None
) -> SearchResult:
    """`problem.ask.budget` trials on the search seed, plus the scenario's own configuration
    (not a trial: the search only compares against it)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    directions = ["maximize" if s == "max" else "minimize" for s in problem.senses]
    study = optuna.create_study(directions=directions, sampler=_sampler(problem))
    budget = problem.ask.budget
    own_item = ("own configuration", problem.setting.own, problem.seed, base / "own")
    (own,) = run_blocks(problem, [own_item], runner)  # its bad block raises PointsFailed
    for start in warm_starts(problem.setting)[:budget]:
        study.enqueue_trial(start)
    trials: list[Trial] = []
    if progress is not None:
        progress("search", 0, budget)
    while len(trials) < budget:
        asked = [study.ask() for _ in range(min(ASK_BATCH, budget - len(trials)))]
        params = [suggest(t, problem.setting) for t in asked]
        blocks = [scheduler_block(p, problem.setting) for p in params]
        items = [
            (f"trial {t.number}", b, problem.seed, base / f"trial-{t.number:03d}")
            for t, b in zip(asked, blocks, strict=True)
        ]
        for t, p, ev in zip(asked, params, run_blocks(problem, items, runner), strict=True):
            _tell(study, t, problem, ev)
            trials.append(Trial(t.number, p, relevant(p, problem.setting), ev))
        if progress is not None:
            progress("search", len(trials), budget)
    importance, note = importances(trials, problem)
    return SearchResult(trials, own, importance, note)


def _groups(values: list[Any]) -> np.ndarray:
    """Group labels of a knob's drawn values: its choices, its distinct values where there are
    at most four, else the quartile bins of what was drawn."""
    if any(isinstance(v, str) for v in values) or len(set(values)) <= 4:
        _, labels = np.unique(np.array([str(v) for v in values]), return_inverse=True)
        return np.asarray(labels)
    x = np.asarray(values, dtype=np.float64)
    edges = np.quantile(x, [0.25, 0.5, 0.75])
    return np.searchsorted(edges, x, side="right")


def omega_squared(y: np.ndarray, groups: np.ndarray) -> float:
    """Hays' ω²: the share of y's variance that the groups explain, less what as many groups
    of random labels would explain by chance (so an unused knob reads ≈ 0, not (g−1)/(n−1) as
    η² would); clipped at 0."""
    labels = np.unique(groups)
    n, g = len(y), len(labels)
    if g < 2 or n <= g:
        return 0.0
    mean = y.mean()
    ss_total = float(((y - mean) ** 2).sum())
    if ss_total == 0:
        return 0.0
    ss_between = float(
        sum((groups == k).sum() * (y[groups == k].mean() - mean) ** 2 for k in labels)
    )
    ms_within = (ss_total - ss_between) / (n - g)
    return max(0.0, (ss_between - (g - 1) * ms_within) / (ss_total + ms_within))


def importances(trials: list[Trial], problem: Problem) -> tuple[dict[str, dict[str, float]], str]:
    """What each knob did: for headroom and for each objective, the share of its variance
    across the completed trials that the knob's value explains on its own (ω², a one-way
    analysis of variance per knob: categorical knobs by choice, numeric ones by quartile of
    the values drawn). Marginal: two knobs that act only together share the credit, and
    with tens of trials the figure is rough (it says which knobs moved the result, not by how
    much exactly).

    Why not optuna's importance: fANOVA needs scikit-learn, and PED-ANOVA, optuna's own, was
    measured here on a 16-trial search of scenarios/advise-three-tier.yaml, where the policy
    and preemption decide everything (every trial with headroom was priority with
    preemption): it gave the policy 0.5% and an unused weight 20%."""
    done = [t for t in trials if t.run.error is None]
    if len(done) < 6:
        return {}, f"{len(done)} completed trials: importance needs at least 6"
    targets = {"headroom": np.array([t.run.headroom for t in done])}
    for name in problem.names:
        targets[name] = np.array([t.run.values[name] for t in done])
    out: dict[str, dict[str, float]] = {}
    for key, y in targets.items():
        out[key] = {
            k.name: round(omega_squared(y, _groups([t.params[k.name] for t in done])), 6)
            for k in knobs(problem.setting)
        }
    method = (
        f"ω² (one-way analysis of variance per knob) over {len(done)} completed trials: the "
        "share of each figure's variance across trials that the knob explains alone"
    )
    return out, method


def candidates(result: SearchResult, problem: Problem) -> list[Trial]:
    """The trials to verify: the feasible Pareto front over the objectives (the same front
    `sweep` and `pareto` compute), one trial per distinct outcome, most headroom first, at
    most `problem.ask.top` of them."""
    from fairbench.decide.sweep import pareto_front

    feasible: list[Trial] = []
    seen: set[str] = set()
    for trial in sorted(result.trials, key=lambda t: (-t.run.headroom, t.number)):
        # one candidate per outcome: two blocks that ran the seed's plan to the same figures
        # (a knob that did not act) would be verified twice for nothing
        outcome = [trial.run.values[n] for n in problem.names] + sorted(
            trial.run.attainment.items()
        )
        key = json.dumps(outcome, default=str)
        if trial.run.feasible and key not in seen:
            seen.add(key)
            feasible.append(trial)
    if not feasible:
        return []
    values = np.array([[t.run.values[n] for n in problem.names] for t in feasible])
    front = pareto_front(values, list(problem.senses))
    return [t for t, on in zip(feasible, front, strict=True) if on][: problem.ask.top]
