"""Every metric's definition: its formula, unit, direction, population, interval method and the
function that computes it from a run's columns. The one place a figure is defined; the
registry (fairbench.analysis.registry) looks names up in `METRICS`, the summary block
(fairbench.analysis.metrics_block) computes them, `fairbench metrics` prints them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from fairbench.analysis import censored
from fairbench.analysis import intervals as iv
from fairbench.analysis.columns import Cols
from fairbench.analysis.drift import METHOD as DRIFT_METHOD
from fairbench.analysis.drift import Drift, drift
from fairbench.analysis.fairness_ci import (
    isolation_interval,
    isolation_tenants,
    slowdown_intervals,
    slowdowns,
)
from fairbench.analysis.intervals import Interval
from fairbench.analysis.metric import GROUPS, Compute, Metric, Value
from fairbench.analysis.metrics import distinct, jain


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


def _column(column: str) -> Callable[[Cols], np.ndarray]:
    def indicator(c: Cols) -> np.ndarray:
        return np.asarray(getattr(c, column), dtype=bool)

    return indicator


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


def _late(c: Cols) -> np.ndarray:
    """Per request: its first response took over 10 × its class's TTFT SLO, or never came.
    Kept in the columns' memo: every group's starved share reads it (issue 35)."""
    return c.memo("late", None, lambda: _late_rows(c))


def _late_rows(c: Cols) -> np.ndarray:
    return ~c.ttft_o | (c.ttft_t > 10.0 * np.nan_to_num(c.slo_ttft, nan=np.inf))


def _late_score(c: Cols) -> np.ndarray:
    """Per request: TTFT ÷ (10 × its class's TTFT SLO), ∞ where no first response came: the
    score `_late` thresholds at 1 (its correlation is the starved share's τ)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        score = c.ttft_t / (10.0 * np.nan_to_num(c.slo_ttft, nan=np.inf))
    return np.where(c.ttft_o, np.nan_to_num(score, nan=0.0), np.inf)


def _slack(c: Cols) -> np.ndarray:
    return np.asarray(c.slack, dtype=np.float64)


def _starved(c: Cols, mask: np.ndarray | None) -> Value:
    pop = _mask(c, mask, _with_ttft_slo(c))
    if not pop.any():
        return math.nan, False
    return float(_late(c)[pop].mean()), False


def _tenant_isolation(c: Cols, k: int) -> Value:
    solo = float(c.solo_ttft[k]) if 0 <= k < len(c.solo_ttft) else math.nan
    if not math.isfinite(solo) or solo <= 0:
        return math.nan, False
    p99, bound = censored.quantile(c.obs("ttft", c.tenant == k), 0.99)
    return p99 / solo, bound


def _isolation(c: Cols, mask: np.ndarray | None) -> Value:
    """Per tenant: its TTFT p99 in the mix ÷ alone; overall (and for other groups): the worst
    tenant's."""
    values = [_tenant_isolation(c, k) for k in isolation_tenants(c, mask)]
    values = [v for v in values if math.isfinite(v[0])]
    if not values:
        return math.nan, False
    worst = max(values, key=lambda v: v[0])
    return worst


def _slowdowns(c: Cols, mask: np.ndarray | None) -> list[float]:
    """Each tenant's mean slowdown in the group, computed once for both figures that read it
    (worst ratio, Jain's): kept in the columns' memo."""
    return list(c.memo("tenant_slowdowns", mask, lambda: _tenant_slowdowns(c, mask)))


def _tenant_slowdowns(c: Cols, mask: np.ndarray | None) -> list[float]:
    sel = _mask(c, mask, c.e2e_x)
    slow = slowdowns(c)  # made once per run
    out = []
    for k in distinct(c.tenant[sel]):
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


def _slowdown_cis(c: Cols, mask: np.ndarray | None) -> tuple[Interval, Interval]:
    """The group's slowdown intervals, computed once for both figures (the columns' memo)."""
    return c.memo("slowdown_cis", mask, lambda: slowdown_intervals(c, mask))


def _worst_slowdown_interval(c: Cols, mask: np.ndarray | None) -> Interval:
    return _slowdown_cis(c, mask)[0]


def _jain_slowdown_interval(c: Cols, mask: np.ndarray | None) -> Interval:
    return _slowdown_cis(c, mask)[1]


_SLOWDOWN_CI = (
    "95%: jackknife over time batches of the group's requests (batch means: each batch ≥ 2 "
    "Politis–White block lengths and ≥ n/10), Student t on the pseudo-values' effective "
    "degrees of freedom; with two tenants on "
    "log(mean ratio), and the figure's interval is that one's image (honest at a tie); "
    "declined under 10 batches, or where the ratio rests on fewer than 10 effective independent "
    "contention episodes (a few long backlog episodes make it), with the requests and seconds "
    "that would do (fairbench.analysis.fairness_ci)"
)


def _drift_windows(
    c: Cols, mask: np.ndarray | None
) -> tuple[censored.Observations, censored.Observations] | None:
    """The first and last fifth (by intended time) of the group's TTFT observations."""
    sel = _mask(c, mask, c.ttft_x)
    t = c.t[sel]
    if len(t) < 50:
        return None
    lo, hi = np.quantile(t, [0.2, 0.8])
    time, seen = c.ttft_t[sel], c.ttft_o[sel]
    first, last = t <= lo, t >= hi
    return (
        censored.Observations(time[first], seen[first], t[first]),
        censored.Observations(time[last], seen[last], t[last]),
    )


def _drift_of(c: Cols, mask: np.ndarray | None) -> Drift | None:
    """The group's drift, computed once for its value and its interval (kept in the columns'
    memo beside the observations)."""

    def make() -> Drift | None:
        windows = _drift_windows(c, mask)
        return None if windows is None else drift(*windows, q=0.99)

    return c.memo("ttft_p99_drift", mask, make)


def _ttft_p99_drift(c: Cols, mask: np.ndarray | None) -> Value:
    found = _drift_of(c, mask)
    return (math.nan, False) if found is None else (found.value, found.lower_bound)


def _ttft_p99_drift_interval(c: Cols, mask: np.ndarray | None) -> Interval:
    found = _drift_of(c, mask)
    if found is None:
        return iv.declined(0.95, DRIFT_METHOD, "fewer than 50 requests: no fifths to compare")
    return found.interval


_ALL = GROUPS
_LAT_POP = (
    "admitted requests (sent, not rejected) of the group in the measurement window; a request "
    "that timed out, was cancelled or failed is right-censored at the time it was last seen"
)
_KM = (
    "Kaplan–Meier p_q = min{t : F(t) ≥ q} (the ceil(q·n)-th order statistic without censoring); "
    "a lower bound when q falls in censored mass"
)
_KM_CI = (
    "95%: order statistics with binomial ranks (no censoring) or Kaplan–Meier with Greenwood's "
    "variance inverted (Brookmeyer–Crowley), both widened by batch means for serial correlation "
    "(Student t on the batch means' effective degrees of freedom) and declined when the run is "
    "too short for it (under 10 batches, or a tail exceeded in under 5 independent bursts); "
    "one-sided [x, ∞) when n cannot bound the tail; [bound, ∞) for a bound "
    "(fairbench.analysis.intervals)"
)


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


_SHARE_CI = (
    "95%: Clopper–Pearson (exact binomial: at least 95% at every share of independent "
    "requests; misses in bursts too rare to show their correlation can escape τ, "
    "docs/metrics.md) on the effective sample size n / τ, τ from batch means of the share's "
    "indicator in time order (1 unless serial correlation is significant); where τ counts, at "
    "the level of Student t at the batch means' effective df in place of z; declined where the "
    "run has too few batches to measure τ"
)


def _scored_share_ci(score: str) -> str:
    """The interval of a share that thresholds a per-request score (`Metric.score`)."""
    return (
        "95%: Clopper–Pearson (exact binomial: at least 95% at every share of independent "
        "requests) on the effective sample size n / τ, τ the larger of batch means' of the "
        "share's indicator in time order (1 unless serial correlation is significant) and the "
        f"Gaussian copula's of the score it thresholds ({score}) at the share's level; where τ "
        "counts, at the level of Student t at its effective df in place of z; declined where "
        "the run has too few batches, or its misses too few independent bursts, to measure τ"
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
        ci=_scored_share_ci("the request's worst latency ÷ its target"),
        compute=_share("met"),
        share_of=_everyone,
        indicator=_column("met"),
        score=_slack,
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
        ci=_SHARE_CI,
        compute=_share("rejected"),
        share_of=_everyone,
        indicator=_column("rejected"),
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
        ci=_SHARE_CI,
        compute=_share("unfinished"),
        share_of=_everyone,
        indicator=_column("unfinished"),
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
        ci=_scored_share_ci("TTFT ÷ 10 × its class's TTFT SLO"),
        compute=_starved,
        share_of=_with_ttft_slo,
        indicator=_late,
        score=_late_score,
    ),
    Metric(
        "isolation",
        "ratio",
        "lower",
        "a tenant's TTFT p99 in the mix ÷ its TTFT p99 when the same plan runs with only that "
        "tenant (the solo arm); for the overall figure, the worst tenant's. "
        "Reported with the absolute difference (`fairness.isolation_detail`): not flagged when "
        "both sides meet the tenant's TTFT SLO or differ by under 10 ms (a ratio of small "
        "numbers is no interference anyone feels)",
        "admitted requests; the solo arm is simulated for `sim` targets (live targets need "
        "solo runs: no value otherwise)",
        ("overall", "tenant"),
        0.05,
        headline=True,
        ci="95%: log ratio of the mix's and the solo arm's TTFT p99, each side's standard error "
        "from its own 68% order-statistic interval (widened for serial correlation), taken as "
        "independent (they share the tenant's arrivals, which only widens it); the worst "
        "tenant's figure: [max of lows, max of highs] of the tenants' intervals at 1 − α/k "
        "(Bonferroni); declined where a side has no two-sided "
        "interval, with its reason (fairbench.analysis.fairness_ci). compare bootstraps the "
        "mix with the solo arm fixed",
        compute=_isolation,
        interval=isolation_interval,
    ),
    Metric(
        "worst_slowdown_ratio",
        "ratio",
        "lower",
        "max over tenants of mean slowdown ÷ min over tenants, slowdown = E2E ÷ the request's "
        "E2E alone on the engine (cost model for sim/reference; else 1 ms per prompt + output "
        "token). Larger is worse; the field's rule of thumb: < 2 is acceptable. Not a headline "
        "fairness figure: a fair queue makes a flooding tenant absorb its own backlog, which "
        "raises this ratio, while FIFO's equal misery lowers it",
        "admitted requests (an unfinished one enters with its E2E so far: a lower bound)",
        ("overall", "class"),
        0.05,
        ci=_SLOWDOWN_CI,
        compute=_worst_slowdown,
        interval=_worst_slowdown_interval,
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
        ci=_SLOWDOWN_CI,
        compute=_jain_slowdown,
        interval=_jain_slowdown_interval,
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
        ci=f"95%: {DRIFT_METHOD}; declined where a window cannot bound its p99",
        compute=_ttft_p99_drift,
        interval=_ttft_p99_drift_interval,
    ),
    Metric(
        "service_difference",
        "tokens",
        "lower",
        "max over tenant pairs and intervals in which both were backlogged of |W_f/w_f − "
        "W_g/w_g|, W = service (1·prompt + 2·output tokens, spread over first response → end); "
        "VTC's bounded quantity (Sheng et al., OSDI 2024, Thm 4.2). Backlogged: a request of "
        "the tenant waits for the scheduler — the scheduler passed it over (an admission pass "
        "ended while it waited, or it was preempted) and has not admitted or resumed it; "
        "waiting for the next step boundary, or for one's own prefill, is not contention. 0 "
        "when no two tenants were ever backlogged at once (reason `no contention`)",
        "requests of the measurement window; the waits come from the scheduler's own events "
        "where the target reports them (`passed_over_ns`, `backlog_ns`: the reference "
        "scheduler, simulated or live, and fairbench's gateway, whose queue goes first); "
        "for an opaque engine (vLLM, TGI over HTTP) the proxy is "
        "arrival → first response, which counts a request's own prefill and step-boundary wait "
        "as backlog and so overstates contention (`fairness.service_difference.backlog_basis` "
        "says which was used). Its error, measured on simulated runs where both are known: "
        "under overload within 1.2% (vtc-overload, FIFO 276,381 vs 276,356 tokens, VTC 2,067 "
        "vs 2,042; Jain equal to 4 decimals); with no queueing 187, 1,159 and 5,126 tokens at "
        "50, 200 and 400 req/s beside 5 req/s on two replicas, and 83,569 tokens on 80 "
        "replicas at 3,200 req/s, where the scheduler's own waits give 0",
        ("overall",),
        0.10,
        ci="none, and summary.json says why (`ci_reason`): a maximum over the run's backlogged "
        "intervals is not an estimate of a long-run mean — under an unfair policy it grows with "
        "the run's length, so there is no long-run value for an interval to cover, and the "
        "value is exact for the run",
    ),
    Metric(
        "jain_backlogged",
        "index",
        "higher",
        "mean over windows with ≥ 2 backlogged tenants of Jain's index of weighted service of "
        "the tenants backlogged (waiting for the scheduler, as in service_difference) ≥ half "
        "the window; no value, with the reason `no contended window`, when no window had two",
        "requests of the measurement window (backlog as in service_difference)",
        ("overall",),
        0.02,
        absolute=True,
        headline=True,
        ci="95%: Student t over the contended windows (from 30 windows on, on batch means in "
        "time order past their Politis–White block length); declined under 5 windows (or 10 "
        "batches), with the windows that would do",
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
