"""The metric registry: every figure fairbench reports, declared once.

Each `Metric` has its name, unit, direction, formula, population (which records), quantile and
interval methods, the groups it exists for, and the practical threshold a change must exceed to
count in an A/B verdict. summary.json (`metrics`), compare, ab, gate, sweep, pareto, knee, the
reports and `fairbench metrics` all read it, and request-level figures are computed by the one
`compute` function here — on a run's columns in the summary, on resamples of them in compare.

Names: `ttft_p99` is the overall figure; `ttft_p99.tenant.<id>`, `ttft_p99.class.<name>`,
`ttft_p99.workload.<name>` the group's; `ttft_p99.<class>` is kept as the class's. Any other
dotted path reads summary.json directly (`tenants.a.latency_ms.ttft.p99`). An unknown name is
an error with a did-you-mean, never a silent NaN.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from fairbench.analysis import censored
from fairbench.analysis.columns import Cols
from fairbench.analysis.metrics import jain
from fairbench.analysis.stats import proportion_ci

GROUPS = ("overall", "class", "tenant", "workload")
SUMMARY_GROUPS = {"class": "slo_classes", "tenant": "tenants", "workload": "workloads"}

Value = tuple[float, bool]  # (value, is a lower bound)
Compute = Callable[[Cols, "np.ndarray | None"], Value]


class MetricError(ValueError):
    """An unknown metric or group name; the message has a did-you-mean."""


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    better: Literal["lower", "higher"]
    formula: str
    population: str
    groups: tuple[str, ...]
    threshold: float  # practical significance of a change: relative, or absolute if `absolute`
    absolute: bool = False
    headline: bool = False
    quantile: str | None = None
    ci: str = "none in the summary; compare bootstraps it"
    compute: Compute | None = None  # request-level figures; None for timeline figures
    scale: float = 1.0  # summary unit per computed unit (ns → ms: 1e-6)
    latency: tuple[str, float] | None = None  # a percentile: (which latency, q)
    share_of: Callable[[Cols], np.ndarray] | None = None  # a share's population (Wilson CI)

    @property
    def kind(self) -> str:
        return "request" if self.compute is not None else "timeline"


def _mask(c: Cols, mask: np.ndarray | None, base: np.ndarray) -> np.ndarray:
    return base if mask is None else base & mask


def _quantile(which: str, q: float) -> Compute:
    def compute(c: Cols, mask: np.ndarray | None) -> Value:
        return censored.quantile(c.obs(which, mask), q)

    return compute


def _everyone(c: Cols) -> np.ndarray:
    return np.ones(len(c), dtype=bool)


def _with_ttft_slo(c: Cols) -> np.ndarray:
    """Admitted requests of classes with a TTFT SLO."""
    return c.ttft_x & np.isfinite(c.slo_ttft)


def _share(column: str, population: Callable[[Cols], np.ndarray] = _everyone) -> Compute:
    def compute(c: Cols, mask: np.ndarray | None) -> Value:
        sel = _mask(c, mask, population(c))
        return (float(getattr(c, column)[sel].mean()) if sel.any() else math.nan), False

    return compute


def _rate(column: str) -> Compute:
    def compute(c: Cols, mask: np.ndarray | None) -> Value:
        values = getattr(c, column)
        sel = values if mask is None else values * mask
        return (float(np.sum(sel)) / c.window_s if c.window_s > 0 else math.nan), False

    return compute


def _goodput(c: Cols, mask: np.ndarray | None) -> Value:
    met = c.met if mask is None else c.met & mask
    return (float(met.sum()) / c.window_s if c.window_s > 0 else math.nan), False


def _throughput_share(c: Cols, mask: np.ndarray | None) -> Value:
    total = float(c.served.sum())
    if total <= 0:
        return math.nan, False
    return float(c.served[mask].sum() if mask is not None else total) / total, False


def _starved(c: Cols, mask: np.ndarray | None) -> Value:
    pop = _mask(c, mask, _with_ttft_slo(c))
    if not pop.any():
        return math.nan, False
    late = ~c.ttft_o | (c.ttft_t > 10.0 * np.nan_to_num(c.slo_ttft, nan=np.inf))
    return float(late[pop].mean()), False


def _tenant_isolation(c: Cols, k: int) -> Value:
    solo = float(c.solo_ttft[k]) if 0 <= k < len(c.solo_ttft) else math.nan
    if not math.isfinite(solo) or solo <= 0:
        return math.nan, False
    p99, bound = censored.quantile(c.obs("ttft", c.tenant == k), 0.99)
    return p99 / solo, bound


def _isolation(c: Cols, mask: np.ndarray | None) -> Value:
    """Per tenant: its TTFT p99 in the mix ÷ alone; overall (and for other groups): the worst
    tenant's."""
    ks = sorted({int(k) for k in np.unique(c.tenant if mask is None else c.tenant[mask])})
    values = [_tenant_isolation(c, k) for k in ks if k >= 0]
    values = [v for v in values if math.isfinite(v[0])]
    if not values:
        return math.nan, False
    worst = max(values, key=lambda v: v[0])
    return worst


def _slowdowns(c: Cols, mask: np.ndarray | None) -> list[float]:
    sel = _mask(c, mask, c.e2e_x)
    slow = c.e2e_t / c.unloaded
    out = []
    for k in np.unique(c.tenant[sel]):
        rows = sel & (c.tenant == k)
        if rows.any():
            out.append(float(slow[rows].mean()))
    return [v for v in out if math.isfinite(v)]


def _worst_slowdown(c: Cols, mask: np.ndarray | None) -> Value:
    per = _slowdowns(c, mask)
    if len(per) < 2 or min(per) <= 0:
        return math.nan, False
    return max(per) / min(per), False


def _jain_slowdown(c: Cols, mask: np.ndarray | None) -> Value:
    per = _slowdowns(c, mask)
    return (jain(np.array(per)) if len(per) >= 2 else math.nan), False


def _ttft_p99_drift(c: Cols, mask: np.ndarray | None) -> Value:
    sel = _mask(c, mask, c.ttft_x)
    t = c.t[sel]
    if len(t) < 50:
        return math.nan, False
    lo, hi = np.quantile(t, [0.2, 0.8])
    first = censored.Observations(c.ttft_t[sel][t <= lo], c.ttft_o[sel][t <= lo])
    last = censored.Observations(c.ttft_t[sel][t >= hi], c.ttft_o[sel][t >= hi])
    a, a_bound = censored.quantile(first, 0.99)
    b, b_bound = censored.quantile(last, 0.99)
    if not a > 0 or a_bound:
        return math.nan, False
    return b / a - 1.0, b_bound


_ALL = GROUPS
_LAT_POP = (
    "admitted requests (sent, not rejected) of the group in the measurement window; a request "
    "that timed out, was cancelled or failed is right-censored at the time it was last seen"
)
_KM = (
    "Kaplan–Meier p_q = min{t : F(t) ≥ q} (the ceil(q·n)-th order statistic without censoring); "
    "a lower bound when q falls in censored mass"
)
_KM_CI = "exact bootstrap (no censoring) or Brookmeyer–Crowley/Greenwood; [bound, ∞) for a bound"


def _latency(name: str, which: str, q: float, what: str, headline: bool = False) -> Metric:
    return Metric(
        name,
        "ms",
        "lower",
        what,
        _LAT_POP,
        _ALL,
        0.05,
        headline=headline,
        quantile=_KM,
        ci=_KM_CI,
        compute=_quantile(which, q),
        scale=1e-6,
        latency=(which, q),
    )


_TTFT = "t_first_token (or the whole response, if it streams none) − t_intended"
_E2E = "t_done − t_intended"
_TPOT = "(t_last_token − t_first_token) ÷ (output_tokens − 1)"

METRICS: tuple[Metric, ...] = (
    _latency("ttft_p50", "ttft", 0.50, f"p50 of TTFT = {_TTFT}"),
    _latency("ttft_p90", "ttft", 0.90, f"p90 of TTFT = {_TTFT}"),
    _latency("ttft_p99", "ttft", 0.99, f"p99 of TTFT = {_TTFT}", headline=True),
    _latency("e2e_p50", "e2e", 0.50, f"p50 of E2E = {_E2E}"),
    _latency("e2e_p99", "e2e", 0.99, f"p99 of E2E = {_E2E}", headline=True),
    _latency("tpot_p50", "tpot", 0.50, f"p50 of TPOT = {_TPOT}"),
    _latency("tpot_p99", "tpot", 0.99, f"p99 of TPOT = {_TPOT}"),
    Metric(
        "slo_attainment",
        "share",
        "higher",
        "requests that ended ok with TTFT, TPOT and E2E within their class's SLO ÷ requests",
        "every request of the group in the measurement window (a rejected, failed or unfinished "
        "request did not meet its SLO)",
        _ALL,
        0.01,
        absolute=True,
        headline=True,
        ci="Wilson score interval",
        compute=_share("met"),
        share_of=_everyone,
    ),
    Metric(
        "goodput",
        "req/s",
        "higher",
        "requests that met their SLO ÷ measurement window length",
        "every request of the group in the measurement window",
        _ALL,
        0.05,
        compute=_goodput,
    ),
    Metric(
        "throughput",
        "req/s",
        "higher",
        "requests that ended ok ÷ measurement window length",
        "every request of the group in the measurement window",
        _ALL,
        0.05,
        compute=_rate("ok"),
    ),
    Metric(
        "throughput_share",
        "share",
        "higher",
        "the group's service (1·prompt + 2·output tokens served) ÷ all service in the window",
        "requests that were served (ok, or any output token) in the measurement window",
        ("tenant", "class", "workload"),
        0.02,
        absolute=True,
        headline=True,
        compute=_throughput_share,
    ),
    Metric(
        "rejected_share",
        "share",
        "lower",
        "requests rejected (429/503) ÷ requests",
        "every request of the group in the measurement window",
        _ALL,
        0.01,
        absolute=True,
        ci="Wilson score interval",
        compute=_share("rejected"),
        share_of=_everyone,
    ),
    Metric(
        "unfinished_share",
        "share",
        "lower",
        "requests that timed out or were cancelled ÷ requests",
        "every request of the group in the measurement window",
        _ALL,
        0.01,
        absolute=True,
        ci="Wilson score interval",
        compute=_share("unfinished"),
        share_of=_everyone,
    ),
    Metric(
        "starved_share",
        "share",
        "lower",
        "requests whose first response took over 10 × their class's TTFT SLO, or never came ÷ "
        "requests",
        "admitted requests of classes with a TTFT SLO (rejected ones are `rejected_share`)",
        _ALL,
        0.01,
        absolute=True,
        headline=True,
        ci="Wilson score interval",
        compute=_starved,
        share_of=_with_ttft_slo,
    ),
    Metric(
        "isolation",
        "ratio",
        "lower",
        "a tenant's TTFT p99 in the mix ÷ its TTFT p99 when the same plan runs with only that "
        "tenant (the solo arm); for the overall figure and classes, the worst tenant's",
        "admitted requests; the solo arm is simulated for `sim` targets (live targets need "
        "solo runs: no value otherwise)",
        ("overall", "tenant"),
        0.05,
        headline=True,
        ci="compare bootstraps the mix; the solo arm is fixed",
        compute=_isolation,
    ),
    Metric(
        "worst_slowdown_ratio",
        "ratio",
        "lower",
        "max over tenants of mean slowdown ÷ min over tenants, slowdown = E2E ÷ the request's "
        "E2E alone on the engine (cost model for sim/reference; else 1 ms per prompt + output "
        "token). Not a headline fairness figure: a fair queue makes a flooding tenant absorb "
        "its own backlog, which raises this ratio, while FIFO's equal misery lowers it",
        "admitted requests (an unfinished one enters with its E2E so far: a lower bound)",
        ("overall", "class"),
        0.05,
        compute=_worst_slowdown,
    ),
    Metric(
        "jain_slowdown",
        "index",
        "higher",
        "Jain's index over tenants of mean slowdown (as in worst_slowdown_ratio)",
        "admitted requests",
        ("overall", "class"),
        0.02,
        absolute=True,
        compute=_jain_slowdown,
    ),
    Metric(
        "ttft_p99_drift",
        "ratio",
        "lower",
        "TTFT p99 of the last fifth of the window (by intended time) ÷ that of the first fifth − 1",
        _LAT_POP,
        ("overall",),
        0.05,
        absolute=True,
        compute=_ttft_p99_drift,
    ),
    Metric(
        "service_difference",
        "tokens",
        "lower",
        "max over tenant pairs and intervals in which both were backlogged (a request waiting "
        "for its first response) of |W_f/w_f − W_g/w_g|, W = service (1·prompt + 2·output "
        "tokens, spread over first response → end); VTC's bounded quantity (Sheng et al., "
        "OSDI 2024, Thm 4.2)",
        "requests of the measurement window",
        ("overall",),
        0.10,
    ),
    Metric(
        "jain_backlogged",
        "index",
        "higher",
        "mean over windows with ≥ 2 backlogged tenants of Jain's index of weighted service of "
        "the tenants backlogged ≥ half the window",
        "requests of the measurement window",
        ("overall",),
        0.02,
        absolute=True,
        headline=True,
    ),
    Metric(
        "jain_backlogged_min",
        "index",
        "higher",
        "the smallest per-window value of jain_backlogged",
        "requests of the measurement window",
        ("overall",),
        0.02,
        absolute=True,
    ),
)
BY_NAME: dict[str, Metric] = {metric.name: metric for metric in METRICS}
HEADLINE = tuple(metric for metric in METRICS if metric.headline)
# Fairness figures the one-line headline uses (each can fail: FIFO and fair policies differ).
FAIRNESS_HEADLINE = ("service_difference", "jain_backlogged", "isolation", "worst_slowdown_ratio")
# Names of the first wave, kept readable: what each now means.
ALIASES = {"jain_service": "fairness.jain_service"}


def get(name: str) -> Metric:
    metric = BY_NAME.get(name)
    if metric is None:
        raise MetricError(f"unknown metric {name!r}{_did_you_mean(name, list(BY_NAME))}")
    return metric


def _did_you_mean(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=3, cutoff=0.5)
    if close:
        return "; did you mean " + " or ".join(repr(c) for c in close) + "?"
    return "; `fairbench metrics` lists them"


@dataclass(frozen=True)
class Name:
    """A parsed metric name: the metric, and the group (`overall` or a dimension and a key)."""

    metric: Metric
    group: str = "overall"
    key: str | None = None

    def __str__(self) -> str:
        if self.group == "overall":
            return self.metric.name
        return f"{self.metric.name}.{self.group}.{self.key}"


def parse_name(name: str, classes: list[str] | None = None) -> Name | None:
    """The metric name as registry terms; None for a dotted path into summary.json. Raises
    MetricError for a name that is neither."""
    head, _, rest = name.partition(".")
    if head not in BY_NAME:
        if rest and head in _SUMMARY_KEYS:
            return None
        raise MetricError(f"unknown metric {name!r}{_did_you_mean(head, list(BY_NAME))}")
    metric = BY_NAME[head]
    if not rest:
        return Name(metric)
    dim, _, key = rest.partition(".")
    if dim in SUMMARY_GROUPS and key:
        group = dim
    else:  # `ttft_p99.<class>`: the first wave's form
        group, key = "class", rest
    if group not in metric.groups:
        raise MetricError(
            f"{name!r}: {metric.name} exists for {', '.join(metric.groups)}, not per {group}"
        )
    return Name(metric, group, key)


_SUMMARY_KEYS = {
    "overall",
    "tenants",
    "slo_classes",
    "workloads",
    "fairness",
    "generator_health",
    "accounting",
    "drift",
    "metrics",
    "completion",
    "valid",
}


def metric_entry(summary: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """The summary's entry for a registry name ({value, ci_low, ci_high, lower_bound, ...}), or
    None where the summary has no such group (a tenant that sent nothing in the window)."""
    parsed = parse_name(name)
    if parsed is None:
        return None
    block = summary.get("metrics", {})
    if parsed.group == "overall":
        entry = block.get("overall", {}).get(parsed.metric.name)
    else:
        entry = block.get(parsed.group, {}).get(parsed.key or "", {}).get(parsed.metric.name)
    return entry if isinstance(entry, dict) else None


def metric_value(summary: Mapping[str, Any], name: str) -> float:
    """A figure from a summary by registry name or dotted path; NaN when the run has no value
    for it. An unknown name raises MetricError."""
    parsed = parse_name(name)
    if parsed is not None:
        entry = metric_entry(summary, name)
        value = None if entry is None else entry.get("value")
        return float(value) if isinstance(value, int | float) else math.nan
    node: Any = summary
    for key in name.split("."):
        if not isinstance(node, dict) or key not in node:
            return math.nan
        node = node[key]
    return float(node) if isinstance(node, int | float) and not isinstance(node, bool) else math.nan


def is_lower_bound(summary: Mapping[str, Any], name: str) -> bool:
    entry = metric_entry(summary, name) if parse_name(name) is not None else None
    return bool(entry and entry.get("lower_bound"))


def known_names(summary: Mapping[str, Any]) -> list[str]:
    """Every registry name this summary has a value for, groups spelled out."""
    out = []
    block = summary.get("metrics", {})
    for name, entry in block.get("overall", {}).items():
        if isinstance(entry, dict) and entry.get("value") is not None:
            out.append(name)
    for group in ("class", "tenant", "workload"):
        for key, entries in block.get(group, {}).items():
            for name, entry in entries.items():
                if isinstance(entry, dict) and entry.get("value") is not None:
                    out.append(f"{name}.{group}.{key}")
    return out


# ---------------------------------------------------------------- computing the summary block


def _entry(metric: Metric, c: Cols, mask: np.ndarray | None) -> dict[str, Any]:
    assert metric.compute is not None
    value, bound = metric.compute(c, mask)
    entry: dict[str, Any] = {"value": _clean(value * metric.scale), "lower_bound": bound}
    if metric.latency is not None:
        which, q = metric.latency
        est = censored.quantile_estimate(c.obs(which, mask), q)
        entry.update(est.as_dict(scale=metric.scale))
    elif metric.share_of is not None:
        pop = metric.share_of(c)
        n = int(pop.sum() if mask is None else (pop & mask).sum())
        if n and math.isfinite(value):
            est = proportion_ci(round(value * n), n)
            entry.update(ci_low=_clean(est.low), ci_high=_clean(est.high), n=n)
    return entry


def _clean(v: float) -> float | None:
    return None if not math.isfinite(v) else round(float(v), 6)


def metrics_block(
    c: Cols,
    names: Mapping[str, list[str]],
    timeline_values: Mapping[str, float | None],
) -> dict[str, Any]:
    """summary.json's `metrics`: every registry figure for every group it exists for.

    `names`: the group keys per dimension (tenant ids, class names, workload names), in the
    order `c`'s codes use; `timeline_values`: the overall timeline figures."""
    out: dict[str, Any] = {"overall": {}, "class": {}, "tenant": {}, "workload": {}}
    codes = {"class": c.cls, "tenant": c.tenant, "workload": c.workload}
    for i, metric in enumerate(METRICS):
        if metric.compute is None:
            if "overall" in metric.groups:
                value = timeline_values.get(metric.name)
                out["overall"][metric.name] = {
                    "value": None if value is None else _clean(value),
                    "lower_bound": False,
                }
            continue
        if "overall" in metric.groups:
            out["overall"][metric.name] = _entry(metric, c, None)
        for group in ("class", "tenant", "workload"):
            if group not in metric.groups:
                continue
            for k, key in enumerate(names[group]):
                mask = codes[group] == k
                if not mask.any():
                    continue
                out[group].setdefault(key, {})[metric.name] = _entry(metric, c, mask)
        following = METRICS[i + 1].latency if i + 1 < len(METRICS) else None
        if metric.latency is not None and (following is None or following[0] != metric.latency[0]):
            c.forget()  # the last percentile of this latency: its curves go (bounded memory)
    return out


def reference_markdown() -> str:
    """docs/metrics.md, generated from the registry (tests/test_metrics_registry.py keeps the
    committed page equal to this)."""
    lines = [
        "# Metrics",
        "",
        "Generated from `fairbench/analysis/registry.py` by `fairbench metrics --markdown`; do "
        "not edit by hand. Every command that names a metric — `compare`, `ab`, `gate`, `sweep "
        "--objective`, `pareto`, `knee`, `report --history` — uses these names and these "
        "definitions.",
        "",
        "Names: `NAME` is the run's overall figure; `NAME.tenant.ID`, `NAME.class.CLASS` and "
        "`NAME.workload.WORKLOAD` the group's (`NAME.CLASS` also reads a class). **Headline** "
        "figures get a row per tenant and class in every A/B.",
        "",
        "Latency under overload: every admitted request counts. A request that timed out, was "
        "cancelled or failed after it was sent is right-censored at the time it was last seen; "
        "percentiles are Kaplan–Meier estimates, and a percentile that falls in censored mass is "
        "reported as a lower bound (`p99 ≥ 3,000 ms, 52 of 60 unfinished`). Rejected requests "
        "(429/503) are not latencies: they are `rejected_share`.",
        "",
    ]
    for metric in METRICS:
        head = " (headline)" if metric.headline else ""
        change = "absolute" if metric.absolute else "relative"
        lines += [
            f"## `{metric.name}`{head}",
            "",
            f"- **Definition**: {metric.formula}",
            f"- **Unit**: {metric.unit}; **better**: {metric.better}",
            f"- **Population**: {metric.population}",
            f"- **Groups**: {', '.join(metric.groups)}",
        ]
        if metric.quantile:
            lines.append(f"- **Quantile**: {metric.quantile}")
        lines += [
            f"- **Interval**: {metric.ci}",
            f"- **A/B threshold**: {change} change of {metric.threshold:g}",
            f"- **Computed**: {'per request (resampled in compare)' if metric.kind == 'request' else 'from the run timeline (compared across pairs)'}",  # noqa: E501
            "",
        ]
    return "\n".join(lines)


def show(unit: str, value: float | None, bound: bool = False) -> str:
    """A value as people read it, by its unit; `≥` marks a lower bound. One formatter for the
    terminal, the pages and summary.md."""
    if value is None or not math.isfinite(value):
        return "-"
    prefix = "≥ " if bound else ""
    if unit == "ms":
        text = f"{value:,.1f} ms"
    elif unit == "share":
        text = f"{value:.1%}"
    elif unit == "ratio":
        text = f"{value:,.2f}×"
    elif unit == "tokens":
        text = f"{value:,.0f} tokens"
    elif unit in ("req/s", "tokens/s"):
        text = f"{value:,.2f} {unit}"
    else:
        text = f"{value:.3f}"
    return prefix + text


def show_change(metric: Metric | None, change: float) -> str:
    if not math.isfinite(change):
        return "-"
    if metric is None or not metric.absolute:
        return f"{change:+.1%}"
    if metric.unit == "share":
        return f"{change * 100:+.1f} pts"
    return f"{change:+.3f}"


def of_name(name: str) -> Metric | None:
    """The registry metric a (grouped) name refers to, or None for a summary path."""
    try:
        parsed = parse_name(name)
    except MetricError:
        return None
    return None if parsed is None else parsed.metric
