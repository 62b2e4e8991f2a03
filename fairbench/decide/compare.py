"""Paired A/B comparison of runs that replayed the same plan, a row per metric and group.

Pairing: A and B replayed the same Plan (identical digests — checked; otherwise we refuse and
name the difference), so request i is the same request in both, and differences come from the
scheduler. Every figure is the registry's (fairbench.analysis.registry), computed by the same
function the summary uses, for the run overall and for each class and tenant.

The design follows what the runs can show:
- **k ≥ 2 pairs**: the interval is the hull of a hierarchical bootstrap (pairs, then time
  blocks within each drawn pair) and a Student-t interval over the k per-pair changes. The
  bootstrap alone is anti-conservative with few pairs (with 3 pairs its percentile interval is
  about [min, max] of three changes, which excludes zero a quarter of the time under A/A); the
  t interval with k − 1 degrees of freedom is what keeps A/A at ≤ 5%.
- **one pair of a deterministic target** (`sim` without step noise): the plan is the only
  source of variation, and a block bootstrap over time windows of the pair (the same blocks
  for A and B) estimates it.
- **one pair of anything else**: run-to-run noise (engine drift, warm-up, a neighbour on the
  machine) is invisible from one pair — three back-to-back runs of one plan on one vLLM gave
  interactive TTFT p99 of 12.1, 3.1 and 2.1 s — so the verdict is `inconclusive`, with the
  values, the change and the within-run interval still shown.
Timeline figures (service difference, Jain among the backlogged) cannot be resampled by
request, so they take the t interval over pairs and need k ≥ 2.

A quantile that is only a lower bound (unfinished requests; fairbench.analysis.censored) is
compared as one, and a bound above the other arm's value is still evidence. With k ≥ 2 pairs
the bounds enter the per-pair changes as values: where only B is bounded every change is at
least what it shows, so only the interval's low end is kept (one-sided, `ci_high` open) and
only `worse` (for a lower-is-better figure) can be shown; where only A is bounded, mirrored;
pairs without a bound simply contribute their change (mixed pairs are fine). Bounds on both
sides are `cannot evaluate`. One deterministic pair: B's bound above A's value (past the
threshold and A's interval) is `worse`, A's above B's `better`. A censored tail never wins.

Too little data is said, not judged: a request-level row needs MIN_PER_ARM observations in
each arm (one pair: in each run; k ≥ 2 pairs: over the arm's runs, since the interval over the
pairs then carries each run's own noise, however few requests made its figure), and the
one-pair block bootstrap needs MIN_BLOCKS time blocks (with k ≥ 2 pairs and fewer blocks, the
t interval over pairs alone is used).

Verdict per row: `better` or `worse` when the interval excludes 0 *and* the change exceeds the
metric's practical threshold (printed with each row); otherwise `no significant change`. An
INVALID run, a metric that cannot be computed, or metadata that differ yield a refusal or
`cannot evaluate` — never a significant result.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as sps

from fairbench.analysis import censored, registry
from fairbench.analysis.blocks import unloaded_ns
from fairbench.analysis.columns import Cols
from fairbench.analysis.registry import Metric, Name
from fairbench.decide.draws import BlockSource
from fairbench.decide.runs import CompareRefused, RunData, check_comparable, load_run

MIN_PER_ARM = 20  # observations of a row's group in each arm below which no verdict is called
MIN_BLOCKS = 10  # time blocks a block bootstrap needs (fewer: its percentiles are a few values)

# Rows compared by default: the headline set per group, and a few more overall.
OVERALL = (
    "ttft_p99",
    "ttft_p50",
    "e2e_p99",
    "tpot_p50",
    "slo_attainment",
    "goodput",
    "rejected_share",
    "unfinished_share",
    "starved_share",
    "isolation",
    "service_difference",
    "jain_backlogged",
    "worst_slowdown_ratio",
    "ttft_p99_drift",
)
PER_CLASS = ("ttft_p99", "e2e_p99", "slo_attainment", "throughput_share")
PER_TENANT = ("ttft_p99", "e2e_p99", "slo_attainment", "throughput_share", "isolation")


@dataclass
class Verdict:
    metric: str  # the registry name with its group: ttft_p99.tenant.support-bot
    a: float
    b: float
    diff: float  # relative (or absolute) B − A, mean over pairs
    ci_low: float
    ci_high: float
    p_value: float
    verdict: str  # better | worse | no significant change | inconclusive | cannot evaluate
    absolute: bool = False
    threshold: float = math.nan
    unit: str = ""
    a_bound: bool = False
    b_bound: bool = False
    reason: str = ""
    a_runs: list[float] = field(default_factory=list)
    b_runs: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        clean = lambda v: None if not math.isfinite(v) else round(v, 6)  # noqa: E731
        return {
            "metric": self.metric,
            "unit": self.unit,
            "a": clean(self.a),
            "b": clean(self.b),
            "a_lower_bound": self.a_bound,
            "b_lower_bound": self.b_bound,
            "change": clean(self.diff),
            "ci_low": clean(self.ci_low),
            "ci_high": clean(self.ci_high),
            "p_value": clean(self.p_value),
            "threshold": clean(self.threshold),
            "verdict": self.verdict,
            "reason": self.reason,
            "change_kind": "absolute" if self.absolute else "relative",
            "a_runs": [clean(x) for x in self.a_runs],
            "b_runs": [clean(x) for x in self.b_runs],
        }


@dataclass
class Comparison:
    pairs: int
    deterministic: bool = False
    confidence: float = 0.95
    verdicts: list[Verdict] = field(default_factory=list)

    @property
    def design(self) -> str:
        if self.pairs >= 2:
            return (
                f"{self.pairs} paired runs: hull of a hierarchical bootstrap (pairs, then time "
                f"blocks) and a t interval over the {self.pairs} per-pair changes; the run is "
                "the unit of replication"
            )
        if self.deterministic:
            return (
                "one pair of a deterministic simulation: block bootstrap over time windows (the "
                "plan is the only source of variation); timeline figures need 2 or more pairs"
            )
        return (
            "one pair: it cannot see run-to-run noise, so no verdict is called (inconclusive) — "
            "run `fairbench ab --iterations 3` or compare 3 or more pairs"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "pairs": self.pairs,
            "design": self.design,
            "confidence": self.confidence,
            "verdicts": [v.as_dict() for v in self.verdicts],
        }

    def get(self, metric: str) -> Verdict | None:
        return next((v for v in self.verdicts if v.metric == metric), None)


def default_rows(classes: list[str], tenants: list[str]) -> list[Name]:
    rows = [Name(registry.get(n)) for n in OVERALL]
    rows += [Name(registry.get(n), "class", c) for c in classes for n in PER_CLASS]
    rows += [Name(registry.get(n), "tenant", t) for t in tenants for n in PER_TENANT]
    return rows


@dataclass
class _Pair:
    a: Cols
    b: Cols
    a_summary: dict[str, Any]
    b_summary: dict[str, Any]
    blocks: list[np.ndarray]


def _mask(c: Cols, name: Name, names: dict[str, list[str]]) -> np.ndarray | None:
    if name.group == "overall":
        return None
    return c.group_mask(name.group, names[name.group].index(name.key or ""))


def _value(
    name: Name, c: Cols, summary: dict[str, Any], names: dict[str, list[str]]
) -> tuple[float, bool]:
    metric = name.metric
    if metric.compute is None:
        return registry.metric_value(summary, str(name)), False
    value, bound = metric.compute(c, _mask(c, name, names))
    return value * metric.scale, bound


def _change(metric: Metric, a: float, b: float) -> float:
    if metric.absolute:
        return b - a
    return (b - a) / a if a else math.nan


def _upper(name: Name, c: Cols, names: dict[str, list[str]], confidence: float) -> float:
    """The upper end of a run's own interval for a quantile row (what a bound must exceed)."""
    metric = name.metric
    if metric.latency is None:
        return -math.inf
    which, q = metric.latency
    est = censored.quantile_estimate(c.obs(which, _mask(c, name, names)), q, confidence)
    return est.high * metric.scale


def _bound_verdict(
    name: Name,
    pairs: list[_Pair],
    values: list[tuple[float, bool, float, bool]],
    names: dict[str, list[str]],
    confidence: float,
) -> tuple[str, str]:
    """One deterministic pair with a lower bound: the bound must clear the other arm's value
    by the threshold and the other arm's own interval."""
    metric = name.metric
    (pair,) = pairs
    ((a, a_bound, b, b_bound),) = values
    word = "cannot evaluate"
    b_clears = b > a * (1 + metric.threshold) and b > _upper(name, pair.a, names, confidence)
    a_clears = a > b * (1 + metric.threshold) and a > _upper(name, pair.b, names, confidence)
    if b_bound and not a_bound and b_clears:  # B ≥ b
        word = "worse" if metric.better == "lower" else "better"
    elif a_bound and not b_bound and a_clears:  # A ≥ a
        word = "better" if metric.better == "lower" else "worse"
    which = "A and B" if a_bound and b_bound else "B" if b_bound else "A"
    reason = f"{which}'s value is a lower bound (unfinished requests)"
    if word == "cannot evaluate":
        reason += ": it does not clear the other arm's value, so no direction is known"
    return word, reason


def _bound_pairs(
    metric: Metric, diffs: np.ndarray, a_side: bool, b_side: bool, confidence: float
) -> tuple[float, float, float, str, str]:
    """k ≥ 2 pairs where some values are lower bounds: (low, high, p, verdict, reason) from the
    t interval over the per-pair changes with the bounds taken as values, one-sided."""
    if a_side and b_side:
        return (
            math.nan,
            math.nan,
            math.nan,
            "cannot evaluate",
            "values are lower bounds in both arms (unfinished requests): no direction is known",
        )
    low, high, p = _t_interval(diffs, confidence)
    point = float(diffs.mean())
    which = "B" if b_side else "A"
    reason = f"{which}'s value is a lower bound in some pairs (unfinished requests): one-sided"
    if b_side:  # every true change is at least the one shown
        high, shown = math.inf, low > 0 and point >= metric.threshold
        word = ("worse" if metric.better == "lower" else "better") if shown else ""
    else:  # every true change is at most the one shown
        low, shown = -math.inf, high < 0 and -point >= metric.threshold
        word = ("better" if metric.better == "lower" else "worse") if shown else ""
    if not word:
        word = "cannot evaluate"
        reason += "; the bound does not clear the other arm's values, so no direction is known"
    return low, high, p, word, reason


def _group_size(name: Name, c: Cols, names: dict[str, list[str]]) -> int:
    """Observations behind a request-level row in one arm: its latency's, or its group's."""
    mask = _mask(c, name, names)
    if name.metric.latency is not None:
        return len(c.obs(name.metric.latency[0], mask))
    return len(c) if mask is None else int(np.count_nonzero(mask))


def _no_spread(diffs: np.ndarray, a_runs: list[float], b_runs: list[float]) -> bool:
    """Every pair's change the same, and not 0, because each arm's runs are one value repeated
    (repeats of one seed on a deterministic target). Why: the t interval over the pairs is then
    [m, m] with p = 0, a verdict without any noise seen (two copies of one deterministic pair
    called a timeline figure `worse` at [+50%, +50%]); the gate refuses identical baseline
    runs for the same reason. Identical zeros stay `no significant change`; runs that differ
    but change alike (starved 0 → 1 in every pair) are evidence, and keep their verdict."""
    repeats = float(np.ptp(a_runs)) == 0.0 and float(np.ptp(b_runs)) == 0.0
    return (
        repeats
        and bool(np.all(np.isfinite(diffs)))
        and float(np.ptp(diffs)) == 0.0
        and diffs[0] != 0
    )


def _t_interval(diffs: np.ndarray, confidence: float) -> tuple[float, float, float]:
    k = len(diffs)
    mean, sd = float(diffs.mean()), float(diffs.std(ddof=1))
    if sd == 0:
        return mean, mean, 0.0 if mean != 0 else 1.0
    half = float(sps.t.ppf(0.5 + confidence / 2, k - 1)) * sd / math.sqrt(k)
    p = float(2 * sps.t.sf(abs(mean) / (sd / math.sqrt(k)), k - 1))
    return mean - half, mean + half, p


def take_draw(
    rows: list[Name],
    pairs: list[_Pair],
    names: dict[str, list[str]],
    rng: np.random.Generator,
    draws: np.ndarray,
    d: int,
) -> None:
    """Draw `d` of the bootstrap by its definition, into `draws[:, d]`: pairs picked, then time
    blocks within each pair, the drawn rows copied (`Cols.take`) and every row's metric computed
    on the copies. `_bootstrap` computes the same from the blocks, to the bit, with the same
    calls to `rng`; this is the reference that tests/test_compare_draws.py and
    benchmarks/bench_compare.py hold it to (2.3-3.1 CPU s a draw at fleet size, against 0.5-0.8)."""
    k = len(pairs)
    chosen = rng.integers(0, k, k) if k > 1 else np.zeros(1, dtype=np.int64)
    for j in chosen:
        pair = pairs[int(j)]
        blocks = pair.blocks
        pick = np.concatenate([blocks[i] for i in rng.integers(0, len(blocks), len(blocks))])
        ta, tb = pair.a.take(pick), pair.b.take(pick)
        for r, name in enumerate(rows):
            va, _ = _value(name, ta, pair.a_summary, names)
            vb, _ = _value(name, tb, pair.b_summary, names)
            draws[r, d] += _change(name.metric, va, vb)
    draws[:, d] /= len(chosen)


def _bootstrap(
    rows: list[Name],
    pairs: list[_Pair],
    names: dict[str, list[str]],
    resamples: int,
    seed: int,
    progress: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """(rows × resamples) mean changes over a (hierarchical) block bootstrap: each draw picks
    pairs, then time blocks within each pair — the same blocks for A and B and for every row —
    and recomputes every request-level row on them. `progress(done, resamples)` is told after
    each draw (a person's bar: two 10-minute fleet runs take 0.5-0.8 CPU s a draw, 10-14
    minutes for the default 1,000, after a few seconds laying the runs out).

    A draw's columns are `DrawCols` (fairbench.decide.draws): what `Cols.take` of the drawn
    rows gives, to the bit, assembled from the blocks instead (2.3-3 CPU s a draw at fleet
    size before; the same draws, verdicts and JSON)."""
    rng = np.random.default_rng(seed)
    k = len(pairs)
    sources = [(BlockSource(p.a, p.blocks), BlockSource(p.b, p.blocks)) for p in pairs]
    draws = np.zeros((len(rows), resamples))
    for d in range(resamples):
        chosen = rng.integers(0, k, k) if k > 1 else np.zeros(1, dtype=np.int64)
        for j in chosen:
            pair = pairs[int(j)]
            source_a, source_b = sources[int(j)]
            picked = rng.integers(0, len(pair.blocks), len(pair.blocks))
            ta, tb = source_a.draw(picked), source_b.draw(picked)
            for r, name in enumerate(rows):
                va, _ = _value(name, ta, pair.a_summary, names)
                vb, _ = _value(name, tb, pair.b_summary, names)
                draws[r, d] += _change(name.metric, va, vb)
        draws[:, d] /= len(chosen)
        if progress is not None:
            progress(d + 1, resamples)
    return draws


def _interval(draws: np.ndarray, confidence: float) -> tuple[float, float, float, bool]:
    """Percentile interval and two-sided p of one row's draws; False where the figure is
    undefined on too many resamples."""
    finite = draws[np.isfinite(draws)]
    if len(finite) < len(draws) * 0.9:
        return math.nan, math.nan, math.nan, False
    alpha = (1 - confidence) / 2
    low, high = np.quantile(finite, [alpha, 1 - alpha])
    p = float(min(1.0, 2 * min((finite <= 0).mean(), (finite >= 0).mean())))
    return float(low), float(high), p, True


def compare_pairs(
    pairs_in: list[tuple[RunData, RunData]],
    rows: list[Name],
    cols: list[tuple[Cols, Cols]],
    names: dict[str, list[str]],
    deterministic: bool,
    resamples: int = 1000,
    confidence: float = 0.95,
    block_s: float = 10.0,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> Comparison:
    pairs = []
    for (a, b), (ca, cb) in zip(pairs_in, cols, strict=True):
        block = (a.records["t_intended_ns"].to_numpy() // int(block_s * 1e9)).astype(np.int64)
        _, block = np.unique(block, return_inverse=True)
        members = [np.flatnonzero(block == k) for k in range(block.max() + 1)] if len(block) else []
        pairs.append(_Pair(ca, cb, a.summary, b.summary, members))
    k = len(pairs)
    comparison = Comparison(k, deterministic and k == 1, confidence)
    few_blocks = min(len(p.blocks) for p in pairs)
    enough = few_blocks >= MIN_BLOCKS
    resampled = [n for n in rows if n.metric.compute is not None] if enough else []
    draws = _bootstrap(resampled, pairs, names, resamples, seed, progress) if resampled else None
    for name in rows:
        metric = name.metric
        values = []
        for pair in pairs:
            a, a_bound = _value(name, pair.a, pair.a_summary, names)
            b, b_bound = _value(name, pair.b, pair.b_summary, names)
            values.append((a, a_bound, b, b_bound))
        a_runs = [v[0] for v in values]
        b_runs = [v[2] for v in values]
        a_val, b_val = float(np.mean(a_runs)), float(np.mean(b_runs))
        a_bound, b_bound = any(v[1] for v in values), any(v[3] for v in values)
        diffs = np.array([_change(metric, v[0], v[2]) for v in values])
        verdict = Verdict(
            str(name),
            a_val,
            b_val,
            float(diffs.mean()) if np.all(np.isfinite(diffs)) else math.nan,
            math.nan,
            math.nan,
            math.nan,
            "cannot evaluate",
            metric.absolute,
            metric.threshold,
            metric.unit,
            a_bound,
            b_bound,
            a_runs=a_runs if k > 1 else [],
            b_runs=b_runs if k > 1 else [],
        )
        comparison.verdicts.append(verdict)
        if not (np.all(np.isfinite(a_runs)) and np.all(np.isfinite(b_runs))):
            verdict.reason = "no value in at least one run"
            continue
        if metric.compute is not None:
            # one pair: the within-run bootstrap judges, so each run needs the data; k ≥ 2:
            # the interval over the pairs carries each run's noise, so the arms' totals count
            small = min(
                sum(_group_size(name, p.a, names) for p in pairs),
                sum(_group_size(name, p.b, names) for p in pairs),
            )
            if small < MIN_PER_ARM:
                verdict.reason = (
                    f"too few requests: {small} in an arm (a verdict needs ≥ {MIN_PER_ARM} "
                    "per arm, over its runs); run longer, at a higher rate or more seeds"
                )
                continue
        only_t = draws is None or name not in resampled or a_bound or b_bound
        if k >= 2 and only_t and _no_spread(diffs, a_runs, b_runs):
            verdict.reason = (
                f"the {k} pairs' changes are identical (repeats of one seed on a deterministic "
                "target?): they show no run-to-run noise; compare pairs of other seeds"
            )
            continue
        if k == 1 and not deterministic and (a_bound or b_bound):
            verdict.verdict = "inconclusive"
            verdict.reason = (
                "one pair cannot see run-to-run noise (see the design line); a value is only a "
                "lower bound (unfinished requests)"
            )
            continue
        if (a_bound or b_bound) and k == 1:
            verdict.verdict, verdict.reason = _bound_verdict(name, pairs, values, names, confidence)
            continue
        if a_bound or b_bound:
            a_side = any(v[1] for v in values)
            b_side = any(v[3] for v in values)
            low, high, p, word, reason = _bound_pairs(metric, diffs, a_side, b_side, confidence)
            verdict.ci_low, verdict.ci_high, verdict.p_value = low, high, p
            verdict.verdict, verdict.reason = word, reason
            continue
        if not np.all(np.isfinite(diffs)):
            verdict.reason = "A's value is 0: a relative change is undefined"
            continue
        point = verdict.diff
        low = high = p = math.nan
        if draws is not None and name in resampled:
            low, high, p, ok = _interval(draws[resampled.index(name)], confidence)
            if not ok:
                verdict.reason = "undefined on too many resamples"
                continue
        if k >= 2:
            t_low, t_high, t_p = _t_interval(diffs, confidence)
            low = t_low if math.isnan(low) else min(low, t_low)
            high = t_high if math.isnan(high) else max(high, t_high)
            p = t_p if math.isnan(p) else max(p, t_p)
        elif metric.compute is None:
            verdict.reason = "a timeline figure needs 2 or more pairs for an interval"
            continue
        elif not enough:
            verdict.reason = (
                f"the run has {few_blocks} time blocks of {block_s:g} s; a block bootstrap needs "
                f"≥ {MIN_BLOCKS} (a measurement window of ≥ {MIN_BLOCKS * block_s:g} s) or "
                "2 or more pairs"
            )
            if not deterministic:
                verdict.verdict = "inconclusive"
            continue
        low, high = min(low, point), max(high, point)  # the estimate always lies inside
        verdict.ci_low, verdict.ci_high, verdict.p_value = low, high, p
        significant = (low > 0 or high < 0) and abs(point) >= metric.threshold
        if k == 1 and not deterministic:
            verdict.verdict = "inconclusive"
            verdict.reason = "one pair cannot see run-to-run noise (see the design line)"
        elif significant:
            improved = point < 0 if metric.better == "lower" else point > 0
            verdict.verdict = "better" if improved else "worse"
        else:
            verdict.verdict = "no significant change"
            if low > 0 or high < 0:
                kind = "absolute" if metric.absolute else "relative"
                verdict.reason = (
                    f"the interval excludes 0 but the change is under the practical "
                    f"threshold ({kind} {metric.threshold:g})"
                )
    return comparison


def _columns(run: RunData, scn: Any, names: dict[str, list[str]]) -> Cols:
    slos = {
        name: {"ttft": c.ttft, "tpot": c.tpot, "e2e": c.e2e} for name, c in scn.slo_classes.items()
    }
    lo, hi = run.summary["window_s"]
    df = run.records
    solo_ms = run.summary.get("fairness", {}).get("solo_ttft_p99_ms") or {}
    solo = {t: float(v) * 1e6 for t, v in solo_ms.items() if v is not None}
    return Cols.of(
        df,
        slos=slos,
        classes=names["class"],
        tenants=names["tenant"],
        workloads=names["workload"],
        window_s=hi - lo,
        timeout_s=scn.run.timeout,
        unloaded_ns=unloaded_ns(df, scn)[0] if len(df) else np.zeros(0),
        solo_ttft_p99_ns=solo,
    )


def compare_dirs(
    a_dirs: list[Path],
    b_dirs: list[Path],
    resamples: int = 1000,
    confidence: float = 0.95,
    block_s: float = 10.0,
    progress: Callable[[int, int], None] | None = None,
) -> Comparison:
    """Pair A and B runs by plan digest: each A run needs a B run that replayed its plan, and
    runs that replayed one plan several times (repeats of one seed) pair in the order given —
    the i-th A of a plan with its i-th B, so interleaved repeats pair with their neighbours —
    and need as many runs in B as in A (a B run reused for two A runs would count one
    measurement twice); a B run whose plan no A run replayed is refused, not left out."""
    a_runs = [load_run(p) for p in a_dirs]
    b_runs: dict[str, list[RunData]] = {}
    for run in (load_run(p) for p in b_dirs):
        b_runs.setdefault(run.summary["plan_digest"], []).append(run)
    a_count: dict[str, int] = {}
    for a in a_runs:
        digest = a.summary["plan_digest"]
        a_count[digest] = a_count.get(digest, 0) + 1
    pairs = []
    taken: dict[str, int] = {}
    for a in a_runs:
        digest = a.summary["plan_digest"]
        bs = b_runs.get(digest, [])
        if not bs:
            raise CompareRefused(f"no B run replayed the plan of {a.path} ({digest[:19]}...)")
        if len(bs) != a_count[digest]:
            raise CompareRefused(
                f"{a_count[digest]} A run(s) but {len(bs)} B run(s) replayed the plan of "
                f"{a.path} ({digest[:19]}...): give each plan as many runs in B as in A"
            )
        pairs.append((a, bs[taken.get(digest, 0)]))
        taken[digest] = taken.get(digest, 0) + 1
    for digest, bs in b_runs.items():
        if digest not in a_count:  # a B run nothing pairs with would be silently left out
            raise CompareRefused(f"no A run replayed the plan of {bs[0].path} ({digest[:19]}...)")
    from fairbench.workload.loading import load_scenario

    scn = load_scenario(a_runs[0].path / "scenario.yaml")
    b_scn = load_scenario(pairs[0][1].path / "scenario.yaml")
    deterministic = all(
        s.target.kind == "sim" and not float(s.scheduler.get("step_noise_cv", 0) or 0)
        for s in (scn, b_scn)
    )
    return compare_scenario_pairs(
        pairs, scn, resamples, confidence, block_s, 0, deterministic, progress=progress
    )


def compare_scenario_pairs(
    pairs: list[tuple[RunData, RunData]],
    scn: Any,
    resamples: int = 1000,
    confidence: float = 0.95,
    block_s: float = 10.0,
    seed: int = 0,
    deterministic: bool = False,
    rows: list[Name] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Comparison:
    for a, b in pairs:
        check_comparable(a, b)
    names = {
        "tenant": [t.id for t in scn.tenants],
        "class": list(scn.slo_classes),
        "workload": list(scn.workloads),
    }
    aligned = []
    for a, b in pairs:
        ids = np.intersect1d(a.records["request_id"], b.records["request_id"])
        ra = a.records.set_index("request_id").loc[ids].reset_index()
        rb = b.records.set_index("request_id").loc[ids].reset_index()
        aligned.append((RunData(a.path, a.summary, ra), RunData(b.path, b.summary, rb)))
    # the distinct values, not a set built from every row: iterating 1.9M Arrow-backed strings
    # one by one was 4.5 CPU s of a fleet run pair's compare (issue 35)
    present = {
        group: set().union(
            *(set(r.records[col].unique().tolist()) for pair in aligned for r in pair)
        )
        for group, col in (("class", "slo_class"), ("tenant", "tenant"))
    }
    if rows is None:
        rows = default_rows(
            [c for c in names["class"] if c in present["class"]],
            [t for t in names["tenant"] if t in present["tenant"]],
        )
    cols = [(_columns(a, scn, names), _columns(b, scn, names)) for a, b in aligned]
    return compare_pairs(
        aligned, rows, cols, names, deterministic, resamples, confidence, block_s, seed, progress
    )
