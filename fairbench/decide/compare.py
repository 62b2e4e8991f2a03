"""Paired A/B comparison of runs that replayed the same plan.

Pairing: A and B replayed the same Plan (identical digests — checked; otherwise we refuse and
name the difference), so request i is the same request in both, and differences come from the
scheduler. With one or more (A, B) pairs, each pair's request timeline is cut into blocks of
`block_s` seconds (load is correlated in time, so requests are not independent: blocks keep that
correlation), blocks are resampled with replacement — the same blocks for A and B — and each
metric's B − A difference is recomputed per draw, averaged over pairs. The percentile interval of
the relative difference and a two-sided bootstrap p-value follow.

Verdict per metric: `better` or `worse` when the interval excludes 0 *and* the change exceeds the
metric's practical threshold; otherwise `no significant change`. A run that is INVALID, a metric
that cannot be computed, or metadata that differ yield a refusal or `cannot evaluate` — never a
significant result (STYLE.md: never fail open).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fairbench.analysis import metrics as m

CHECKED_METADATA = ("plan_digest", "scenario", "schema_version")


class CompareRefused(Exception):
    """The runs cannot be compared; the message says why."""


class Cols:
    """Per-request columns of one run as numpy arrays; `take` is one resample (cheap)."""

    __slots__ = (
        "cls",
        "demand",
        "done",
        "e2e",
        "met",
        "ok",
        "served",
        "size",
        "slo_ttft",
        "start",
        "t",
        "tenant",
        "tpot",
        "ttft",
    )

    def __init__(self, **arrays: np.ndarray) -> None:
        for name, value in arrays.items():
            setattr(self, name, value)

    @classmethod
    def of(
        cls_, df: pd.DataFrame, slos: dict[str, Any], classes: list[str], tenants: list[str]
    ) -> Cols:
        size = df["prompt_tokens"].to_numpy(dtype=float) + df["output_tokens"].to_numpy(float)
        return cls_(
            ok=(df["status"] == "ok").to_numpy(),
            ttft=m.ttft_ns(df),
            e2e=m.e2e_ns(df),
            tpot=m.tpot_ns(df),
            met=m.slo_met(df, slos),
            cls=np.array([classes.index(c) for c in df["slo_class"]], dtype=np.int64),
            tenant=np.array([tenants.index(t) for t in df["tenant"]], dtype=np.int64),
            served=m.service_tokens(df),
            demand=df["prompt_tokens"].to_numpy(dtype=float)
            + 2.0 * df["max_tokens"].to_numpy(dtype=float),
            size=np.maximum(size, 1.0),
            t=df["t_intended_ns"].to_numpy(dtype=float),
            start=df["t_first_token_ns"]
            .fillna(df["t_done_ns"])
            .to_numpy(dtype=float, na_value=np.nan),
            done=df["t_done_ns"].to_numpy(dtype=float, na_value=np.nan),
            slo_ttft=np.array(
                [(slos.get(c) or {}).get("ttft") or np.nan for c in df["slo_class"]], dtype=float
            )
            * 1e9,
        )

    def take(self, idx: np.ndarray) -> Cols:
        return Cols(**{name: getattr(self, name)[idx] for name in self.__slots__})


@dataclass(frozen=True)
class Metric:
    """One comparable figure, computed on a (resampled) run."""

    name: str
    better: str  # "lower" | "higher"
    threshold: float  # practical significance: relative change (or absolute, see `absolute`)
    compute: Callable[[Cols], float]
    absolute: bool = False  # threshold on the absolute difference (for shares in [0, 1])


def _quantile(column: str, q: float, cls: int | None = None) -> Callable[[Cols], float]:
    def compute(c: Cols) -> float:
        keep = c.ok if cls is None else c.ok & (c.cls == cls)
        values = getattr(c, column)[keep]
        values = values[np.isfinite(values)]
        return float(np.quantile(values, q)) if len(values) else math.nan

    return compute


def _attainment(cls: int | None) -> Callable[[Cols], float]:
    def compute(c: Cols) -> float:
        met = c.met if cls is None else c.met[c.cls == cls]
        return float(met.mean()) if len(met) else math.nan

    return compute


def _jain_service(weights: np.ndarray) -> Callable[[Cols], float]:
    """Jain over tenants of service ÷ weighted max-min fair share given demand."""

    def compute(c: Cols) -> float:
        got = np.bincount(c.tenant, c.served, minlength=len(weights))
        want = np.bincount(c.tenant, c.demand, minlength=len(weights))
        fair = m.water_fill(want, weights, got.sum())
        present = fair > 0
        return m.jain(got[present] / fair[present]) if present.any() else math.nan

    return compute


def _worst_slowdown(n_tenants: int) -> Callable[[Cols], float]:
    """Slowest tenant's mean size-normalized E2E ÷ fastest tenant's: E2E per token of prompt +
    output, so a tenant with long requests is not counted as slowed down."""

    def compute(c: Cols) -> float:
        keep = c.ok & np.isfinite(c.e2e)
        norm = c.e2e[keep] / c.size[keep]
        total = np.bincount(c.tenant[keep], norm, minlength=n_tenants)
        count = np.bincount(c.tenant[keep], minlength=n_tenants)
        per = total[count > 0] / count[count > 0]
        return float(per.max() / per.min()) if len(per) > 1 and per.min() > 0 else math.nan

    return compute


def _ttft_p99_drift(c: Cols) -> float:
    """p99 TTFT of the last fifth of the run (by intended time) ÷ that of the first fifth − 1:
    compared between runs, whether B's tail degrades over time more than A's."""
    keep = c.ok & np.isfinite(c.ttft)
    t, v = c.t[keep], c.ttft[keep]
    if len(t) < 50:
        return math.nan
    lo, hi = np.quantile(t, [0.2, 0.8])
    first, last = v[t <= lo], v[t >= hi]
    base = np.quantile(first, 0.99)
    return float(np.quantile(last, 0.99) / base - 1) if base > 0 else math.nan


def _starved_share(c: Cols) -> float:
    """Share of requests whose first response took over 10× their class's TTFT SLO, or never
    came (timeouts, errors): the starvation the issue lists among fairness measures."""
    has_slo = np.isfinite(c.slo_ttft)
    if not has_slo.any():
        return math.nan
    late = ~c.ok | (c.ttft > 10 * c.slo_ttft)
    return float(late[has_slo].mean())


def default_metrics(classes: list[str], weights: np.ndarray) -> list[Metric]:
    out = [
        Metric("ttft_p99", "lower", 0.05, _quantile("ttft", 0.99)),
        Metric("ttft_p50", "lower", 0.05, _quantile("ttft", 0.50)),
        Metric("e2e_p99", "lower", 0.05, _quantile("e2e", 0.99)),
        Metric("tpot_p50", "lower", 0.05, _quantile("tpot", 0.50)),
        Metric("slo_attainment", "higher", 0.01, _attainment(None), absolute=True),
        Metric("jain_service", "higher", 0.02, _jain_service(weights), absolute=True),
        Metric("starved_share", "lower", 0.01, _starved_share, absolute=True),
        Metric("worst_slowdown_ratio", "lower", 0.05, _worst_slowdown(len(weights))),
        Metric("ttft_p99_drift", "lower", 0.05, _ttft_p99_drift, absolute=True),
    ]
    for k, cls in enumerate(classes):
        out.append(Metric(f"ttft_p99.{cls}", "lower", 0.05, _quantile("ttft", 0.99, k)))
        out.append(Metric(f"slo_attainment.{cls}", "higher", 0.01, _attainment(k), absolute=True))
    return out


@dataclass
class Verdict:
    metric: str
    a: float
    b: float
    diff: float  # relative (or absolute) B − A
    ci_low: float
    ci_high: float
    p_value: float
    verdict: str  # better | worse | no significant change | cannot evaluate
    absolute: bool = False

    def as_dict(self) -> dict[str, Any]:
        clean = lambda v: None if not math.isfinite(v) else round(v, 6)  # noqa: E731
        return {
            "metric": self.metric,
            "a": clean(self.a),
            "b": clean(self.b),
            "change": clean(self.diff),
            "ci_low": clean(self.ci_low),
            "ci_high": clean(self.ci_high),
            "p_value": clean(self.p_value),
            "verdict": self.verdict,
            "change_kind": "absolute" if self.absolute else "relative",
        }


@dataclass
class Comparison:
    pairs: int
    verdicts: list[Verdict] = field(default_factory=list)

    @property
    def design(self) -> str:
        if self.pairs >= 2:
            return (
                f"{self.pairs} paired runs: hierarchical bootstrap (pairs, then time blocks "
                "within each pair); the run is the unit of replication"
            )
        return (
            "one pair: block bootstrap over time windows; it cannot see run-to-run noise, "
            "so tail metrics can look significant by chance — use --iterations 3 or more"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "pairs": self.pairs,
            "design": self.design,
            "verdicts": [v.as_dict() for v in self.verdicts],
        }


@dataclass(frozen=True)
class RunData:
    path: Path
    summary: dict[str, Any]
    records: pd.DataFrame  # measurement window only, sorted by request_id


def load_run(path: Path) -> RunData:
    summary = json.loads((path / "summary.json").read_text(encoding="utf-8"))
    records = pd.read_parquet(path / "records.parquet")
    lo, hi = summary["window_s"]
    t = records["t_intended_ns"].to_numpy(dtype=np.float64) / 1e9
    records = records[(t >= lo) & (t <= hi)].sort_values("request_id").reset_index(drop=True)
    return RunData(path, summary, records)


def check_comparable(a: RunData, b: RunData) -> None:
    for key in CHECKED_METADATA:
        if a.summary.get(key) != b.summary.get(key):
            raise CompareRefused(
                f"{key} differs: {a.summary.get(key)!r} ({a.path}) vs {b.summary.get(key)!r} "
                f"({b.path}); A and B must replay the same plan"
            )
    for run in (a, b):
        if not run.summary.get("valid", False):
            reasons = "; ".join(run.summary.get("invalid_reasons", [])) or "unknown"
            raise CompareRefused(
                f"{run.path} is INVALID ({reasons}); an invalid run is not compared"
            )


def _unevaluable(metric: Metric, a: float, b: float, change: float) -> Verdict:
    """A metric that cannot be judged: reported as such, never as a significant change."""
    nan = math.nan
    return Verdict(metric.name, a, b, change, nan, nan, nan, "cannot evaluate", metric.absolute)


def compare_pairs(
    pairs: list[tuple[RunData, RunData]],
    metric_list: list[Metric],
    slos: dict[str, Any],
    classes: list[str],
    tenants: list[str],
    resamples: int = 1000,
    confidence: float = 0.95,
    block_s: float = 10.0,
    seed: int = 0,
) -> Comparison:
    for a, b in pairs:
        check_comparable(a, b)
    rng = np.random.default_rng(seed)
    prepared = []
    for a, b in pairs:
        ids = np.intersect1d(a.records["request_id"], b.records["request_id"])
        ra = a.records.set_index("request_id").loc[ids].reset_index()
        rb = b.records.set_index("request_id").loc[ids].reset_index()
        block = (ra["t_intended_ns"].to_numpy() // int(block_s * 1e9)).astype(np.int64)
        _, block = np.unique(block, return_inverse=True)
        members = [np.flatnonzero(block == k) for k in range(block.max() + 1)] if len(block) else []
        ca, cb = Cols.of(ra, slos, classes, tenants), Cols.of(rb, slos, classes, tenants)
        picks = (
            [
                np.concatenate([members[k] for k in rng.integers(0, len(members), len(members))])
                for _ in range(resamples)
            ]
            if members
            else []
        )
        prepared.append((ca, cb, picks))
    comparison = Comparison(len(pairs))
    alpha = (1 - confidence) / 2
    for metric in metric_list:
        base_a = np.array([metric.compute(ca) for ca, _, _ in prepared])
        base_b = np.array([metric.compute(cb) for _, cb, _ in prepared])
        a_val, b_val = float(np.mean(base_a)), float(np.mean(base_b))
        usable = bool(np.all(np.isfinite(base_a)) and np.all(np.isfinite(base_b)))
        if not usable or (not metric.absolute and a_val == 0):
            comparison.verdicts.append(_unevaluable(metric, a_val, b_val, math.nan))
            continue
        point = (b_val - a_val) if metric.absolute else (b_val - a_val) / a_val
        # Hierarchical bootstrap: draw pairs (the run is the unit of replication), then time
        # blocks within each drawn pair (load is correlated in time). With one pair only the
        # second level remains, and run-to-run noise is invisible (see Comparison.design).
        k = len(prepared)
        draws = np.zeros(resamples)
        for d in range(resamples):
            chosen = rng.integers(0, k, k) if k > 1 else (0,)
            total = 0.0
            for j in chosen:
                ca, cb, picks = prepared[j]
                pick = picks[int(rng.integers(0, len(picks)))] if k > 1 else picks[d]
                va, vb = metric.compute(ca.take(pick)), metric.compute(cb.take(pick))
                total += (vb - va) if metric.absolute else (vb - va) / va
            draws[d] = total / len(chosen)
        finite = draws[np.isfinite(draws)]
        if len(finite) < resamples * 0.9:  # the metric is undefined on too many resamples
            comparison.verdicts.append(_unevaluable(metric, a_val, b_val, point))
            continue
        low, high = np.quantile(finite, [alpha, 1 - alpha])
        p = float(min(1.0, 2 * min((finite <= 0).mean(), (finite >= 0).mean())))
        if (low > 0 or high < 0) and abs(point) >= metric.threshold:
            improved = point < 0 if metric.better == "lower" else point > 0
            word = "better" if improved else "worse"
        else:
            word = "no significant change"
        comparison.verdicts.append(
            Verdict(
                metric.name, a_val, b_val, point, float(low), float(high), p, word, metric.absolute
            )
        )
    return comparison


def compare_dirs(
    a_dirs: list[Path],
    b_dirs: list[Path],
    resamples: int = 1000,
    confidence: float = 0.95,
    block_s: float = 10.0,
) -> Comparison:
    """Pair A and B runs by plan digest (each A run needs a B run that replayed its plan)."""
    a_runs = [load_run(p) for p in a_dirs]
    b_runs = {run.summary["plan_digest"]: run for run in (load_run(p) for p in b_dirs)}
    pairs = []
    for a in a_runs:
        b = b_runs.get(a.summary["plan_digest"])
        if b is None:
            raise CompareRefused(
                f"no B run replayed the plan of {a.path} ({a.summary['plan_digest'][:19]}...)"
            )
        pairs.append((a, b))
    from fairbench.workload.scenario import load_scenario

    scn = load_scenario(a_runs[0].path / "scenario.yaml")
    return compare_scenario_pairs(pairs, scn, resamples, confidence, block_s)


def compare_scenario_pairs(
    pairs: list[tuple[RunData, RunData]],
    scn: Any,
    resamples: int = 1000,
    confidence: float = 0.95,
    block_s: float = 10.0,
    seed: int = 0,
) -> Comparison:
    slos = {
        name: {"ttft": c.ttft, "tpot": c.tpot, "e2e": c.e2e} for name, c in scn.slo_classes.items()
    }
    classes = list(scn.slo_classes)
    tenants = [t.id for t in scn.tenants]
    weights = np.array([t.weight for t in scn.tenants], dtype=float)
    present = set().union(*(set(r.records["slo_class"]) for pair in pairs for r in pair))
    metric_list = [
        metric
        for metric in default_metrics(classes, weights)
        if "." not in metric.name or metric.name.split(".", 1)[1] in present
    ]
    return compare_pairs(
        pairs, metric_list, slos, classes, tenants, resamples, confidence, block_s, seed
    )
