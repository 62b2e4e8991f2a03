"""Why there is no advice, in one line: which constraint binds, how close the best configuration
came, and what that says about the pool.

Two cases. A target that no configuration reached, even on its own: the line names that
target's best attainment and what it needs; the solo arm of the best run (the same plan with
only that tenant, which a simulated run computes for its `isolation` figure) says whether the
class's own requests already miss alone — then no schedule can help, the pool or the profile
is too slow for them — or hold alone and miss only in the mix: the pool is too small for the
offered load. Every target reached somewhere, never all at once: the line names the
configuration that came closest and what each of its targets got; the classes compete for a
pool too small for both.
"""

from __future__ import annotations

import math

from fairbench.decide.advise.problem import Problem, Target
from fairbench.decide.advise.search import Evaluation
from fairbench.decide.advise.verify import Verified


def _pct(x: float) -> str:
    return "no value" if not math.isfinite(x) else f"{x:.1%}"


def _need(t: Target) -> str:
    return f"{t.share:.0%}" if round(t.share * 100, 6).is_integer() else f"{t.share:.1%}"


def _why_alone(t: Target, best: Evaluation, problem: Problem) -> str:
    tenants = [k for k, c in problem.setting.tenant_class.items() if c == t.cls]
    solo = [best.solo_ttft_p99_ms[k] for k in tenants if k in best.solo_ttft_p99_ms]
    if t.ttft_s is None or not solo:
        return "the pool is too small for the offered load"
    worst = max(solo)
    if worst <= t.ttft_s * 1000:
        return (
            f"the pool is too small for the offered load (alone on the pool the class's TTFT "
            f"p99 is {worst:,.0f} ms, within its target: it misses only when shared)"
        )
    return (
        f"its own requests miss even alone on the pool (solo TTFT p99 {worst:,.0f} ms): a "
        "bigger pool or a faster engine, not a schedule, is what it needs"
    )


def infeasible_line(problem: Problem, runs: list[Evaluation]) -> str:
    """No searched configuration (nor the scenario's own) met every target on the search seed."""
    ok = [r for r in runs if r.error is None]
    if not ok:
        return "no configuration ran: " + next((r.error for r in runs if r.error), "no runs")
    short: list[tuple[float, Target, Evaluation]] = []
    for t in problem.targets:
        best = max(ok, key=lambda r: _value(r, t))
        if _value(best, t) < t.share:
            short.append((t.share - _value(best, t), t, best))
    n = f"{len(ok)} configurations"
    if short:
        _, t, best = max(short, key=lambda s: s[0])
        got = _value(best, t)
        return (
            f"{t.text} attained {_pct(got)} at best (needs {_need(t)}) over {n} on seed "
            f"{problem.seed}: {_why_alone(t, best, problem)}"
        )
    closest = max(ok, key=lambda r: r.headroom)
    parts = ", ".join(
        f"{t.text} {_pct(closest.attainment.get(t.cls, math.nan))} (needs {_need(t)})"
        for t in problem.targets
    )
    return (
        f"no configuration meets every SLO at once over {n} on seed {problem.seed}: at best "
        f"{parts} ({closest.label}); each holds alone, so the classes compete for a pool too "
        "small for all of them"
    )


def _value(r: Evaluation, t: Target) -> float:
    v = r.attainment.get(t.cls, math.nan)
    return v if math.isfinite(v) else -1.0


def unverified_line(problem: Problem, verified: list[Verified]) -> str:
    """Candidates met the targets on the search seed but none (nor the own) on the new seeds."""
    seeds = problem.verify_seeds
    span = f"seeds {seeds[0]}–{seeds[-1]}" if len(seeds) > 1 else f"seed {seeds[0]}"
    broken = [v for v in verified if v.errors]
    if broken and len(broken) == len(verified):
        return f"no verification run succeeded: {broken[0].errors[0]}"
    best = max(verified, key=lambda v: v.headroom)
    worst_t = min(problem.targets, key=lambda t: best.attainment.get(t.cls, -1.0) - t.share)
    got = best.attainment.get(worst_t.cls, math.nan)
    return (
        f"{worst_t.text} attained {_pct(got)} on average over {span} at best (needs "
        f"{_need(worst_t)}; {best.label}): the configurations that met it on the search seed "
        "do not hold on seeds it did not see; try a larger --budget or a longer run.duration"
    )
