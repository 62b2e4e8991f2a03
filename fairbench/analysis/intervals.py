"""Intervals that keep their promise: percentiles from order statistics, widened for dependence.

Why this module exists: a bootstrap of a tail percentile can never pass the sample maximum (at
n = 100 the maximum lies below the true p99 37% of the time), and resampling single requests of
one run as if they were independent ignores that neighbours wait in the same queue. Both made
fairbench's intervals cover the truth in 13–62% of cases where they claimed 95%.

**Percentiles (no censoring).** The number of values at or below the true q-quantile ξ is
Binomial(n, q) for i.i.d. data of any continuous distribution, so

    P(X_(l) ≤ ξ) = P(Bin(n, q) ≥ l)        P(X_(u) ≥ ξ) = P(Bin(n, q) ≤ u − 1)

and the ranks l, u that make each tail α/2 give an interval that is exact whatever the
distribution (`scipy.stats.binom`). Between two adjacent ranks the bound is interpolated in
proportion to the coverage each rank gives (the Hettmansperger–Sheather idea), so the coverage
is near the nominal level instead of up to a few points above it. When no rank ≤ n gives the
upper tail (n < log(α/2) / log(q): 367 for a 95% p99), the upper end is unbounded and the
interval is one-sided, `[x, ∞)` at the full confidence — with the reason and the n that would
bound it. Nothing is ever narrower than this.

**Dependence.** Latencies from one queue are serially correlated. Σ 1{X_i ≤ ξ} then has variance
n·σ²∞, σ²∞ the long-run variance of the indicator series, instead of n·q(1−q). σ²∞ is estimated
by batch means (Law & Kelton: 10–30 non-overlapping batches, each longer than the correlation
time) on the requests in time order; the batch length is at least twice the Politis–White block
length of the series' normal scores (`block_length.py`, as `arch.bootstrap` computes it). A tail
indicator is too rare for batch means alone (about one p99 exceedance a batch at n = 1,000), so
where the series' lag-1 correlation is significant τ is also read off its normal-score
autocorrelations through a Gaussian copula (`copula_factor`), and the larger of the two is used.
The ranks become n·q ± t_ν·√(n·σ²∞) and the interval is the wider of this and the exact one. ν is
the batch means' effective degrees of freedom: B − 1 for normal batch means, fewer when they are
heavy-tailed (Satterthwaite, from their kurtosis: `batch_means_df`) — a tail indicator's batch
means are mostly 0 with a few bursts, and their variance is far noisier than B − 1 claims —
and never more than the exceedances' bursts give (`cluster_df`, the same formula on the sizes
of the Ferro–Segers bursts): a tail made by a few very large bursts is known from those few.
Where the tail clusters beyond what the copula implies (a queue's bursts), a tail rarer than
p95 takes at least the p95 indicator's τ: its own rests on n/100 exceedances and follows the
run's own percentile, so a quiet run measured a small τ. When a correlated run (τ > 1) has
fewer than 10 batches of that length, or its exceedances come in fewer than 5 bursts (Ferro–Segers
declustering: `exceedance_clusters`), it cannot support a statement about its own noise: the
interval is declined, with the number of requests (and, where the rate is known, the duration)
that would do. Measured: the calibration queue's p99 at 9/s per tenant covered 83% of 60 seeds
with B − 1 and no burst count, 98% of those given (93 of 120 seeds) with them.

**Censoring.** With right-censored observations (requests that never finished), the
Kaplan–Meier analogue: Greenwood's variance of F (scaled by the same dependence factor),
inverted at q (Brookmeyer–Crowley). An upper end that Greenwood cannot reach is unbounded, as
above; a quantile that falls in censored mass is a lower bound, `[bound, ∞)`.

**Shares** (SLO attainment, rejected share): Clopper–Pearson on n / τ, τ = σ²∞/(p(1−p)), t(ν).
A share that thresholds a per-request score (SLO attainment: the request's worst latency over its
target; the starved share: TTFT over ten times it) also takes the score's Gaussian-copula τ at
the share's level, as a percentile does: a run whose misses came in one burst, or in none,
cannot show their correlation in the 0/1 series.

Every result says its method, its confidence and, where it declines or is one-sided, why.
Coverage is measured (`benchmarks/bench_calibration.py`, `tests/test_interval_calibration.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import fft as sfft
from scipy import stats as sps

MIN_BATCHES = 10  # fewer cannot estimate a long-run variance (Law & Kelton: 10–30)
MAX_BATCHES = 30
MIN_DEPENDENCE_N = 30  # below this the series is treated as i.i.d. (nothing to estimate)
DEPENDENCE_LEVEL = 0.90
MIN_CLUSTERS = 5  # fewer independent bursts of exceedances cannot show how large bursts get
TAIL_FLOOR_Q = 0.95  # a rarer indicator's τ is at least the p95 indicator's (see `tail_floor`)
MAX_BLOCK_SAMPLE = 20_000  # Politis–White on at most this many leading values (10 ms, not 0.3 s)

METHOD_EXACT = "order statistics (binomial ranks, interpolated)"
METHOD_DEPENDENT = (
    "order statistics, ranks widened for serial correlation (batch means, {batches} batches of "
    "{batch}; a Gaussian copula of the normal scores for a rare tail)"
)
METHOD_KM = "Kaplan–Meier, Greenwood variance inverted (Brookmeyer–Crowley)"
METHOD_SHARE = "Clopper–Pearson (exact binomial)"


@dataclass(frozen=True)
class Dependence:
    """How correlated a series is: the batch length that outlasts its correlation, how many such
    batches the run has, and the variance factor τ = σ²∞ / σ² of the figure's own indicator
    (1 for i.i.d.; never below 1 here, so dependence only ever widens)."""

    batch: int
    batches: int
    factor: float = 1.0
    rate_per_s: float | None = None  # requests per second of the series, where times are known
    df: float | None = None  # effective degrees of freedom of τ (None: batches − 1)
    clusters: int | None = None  # independent bursts of the exceedances (None: not counted)
    n: int = 0  # the series' length, where the clusters were counted on it

    @property
    def enough(self) -> bool:
        return self.batches >= MIN_BATCHES and (
            self.clusters is None or self.clusters >= MIN_CLUSTERS
        )

    @property
    def needed_n(self) -> int:
        need = self.batch * MIN_BATCHES
        if self.clusters is not None and self.clusters < MIN_CLUSTERS and self.n:
            need = max(need, math.ceil(self.n * MIN_CLUSTERS / max(self.clusters, 1)))
        return need

    @property
    def degrees(self) -> float:
        """Student t's degrees of freedom for τ: the batch means' effective ones (`df`), never
        more than batches − 1."""
        plain = float(max(self.batches - 1, 1))
        return plain if self.df is None else max(1.0, min(self.df, plain))


IID = Dependence(batch=1, batches=MAX_BATCHES)


@dataclass(frozen=True)
class Interval:
    """An interval with its promise: `low`/`high` (±inf where open), `confidence`, `method`, and
    `reason` when it is declined (both NaN) or one-sided."""

    low: float
    high: float
    confidence: float
    method: str
    reason: str | None = None

    @property
    def declined(self) -> bool:
        return math.isnan(self.low) and math.isnan(self.high)

    def fields(self, scale: float = 1.0) -> dict[str, float | str | None]:
        """summary.json's interval fields: ci_low/ci_high (null where open or declined), the
        method, the confidence, and the reason beside them."""

        def f(v: float) -> float | None:
            return None if not math.isfinite(v) else round(v * scale, 6)

        return {
            "ci_low": f(self.low),
            "ci_high": f(self.high),
            "ci_method": self.method,
            "ci_confidence": self.confidence,
            "ci_reason": self.reason,
        }


def declined(confidence: float, method: str, reason: str) -> Interval:
    return Interval(math.nan, math.nan, confidence, method, reason)


# ------------------------------------------------------------------ dependence


def block_length(x: np.ndarray) -> float:
    """Politis–White's circular-block length of a series (its normal scores, so a heavy tail
    does not dominate); 1 for a short or constant series. Computed as arch's
    `optimal_block_length(...)["circular"]` is, vectorized (fairbench.analysis.block_length:
    arch's loop over lags and its DataFrame were half the summary's CPU on a fleet run)."""
    n = len(x)
    if n < MIN_DEPENDENCE_N or np.all(x == x[0]):
        return 1.0
    from scipy import special

    from fairbench.analysis.block_length import circular_block_length  # arch's, vectorized

    x = x[:MAX_BLOCK_SAMPLE]
    n = len(x)
    ranks = sps.rankdata(x, method="average")
    scores = special.ndtri(ranks / (n + 1))  # = sps.norm.ppf on (0, 1), without its checks
    found = circular_block_length(scores)
    return found if math.isfinite(found) and found >= 1 else 1.0


def batching(x_in_time_order: np.ndarray) -> Dependence:
    """The batches a series' long-run variance is estimated on: length ≥ 2 × its block length
    and ≥ n / 30, at most 30 of them (τ still to be measured per figure: `with_factor`)."""
    n = len(x_in_time_order)
    if n < MIN_DEPENDENCE_N:
        return Dependence(batch=1, batches=max(n, 1))
    batch = max(math.ceil(2 * block_length(x_in_time_order)), math.ceil(n / MAX_BATCHES), 1)
    return Dependence(batch=batch, batches=n // batch)


def long_run_factor(indicator: np.ndarray, dep: Dependence) -> float:
    """τ = σ²∞ / (p(1−p)) of a 0/1 series in time order, σ²∞ by batch means; 1 unless the
    dependence is significant at 5%."""
    n = len(indicator)
    if dep.batch <= 1 or dep.batches < 2 or n < MIN_DEPENDENCE_N:
        return 1.0
    p = float(indicator.mean())
    if p <= 0.0 or p >= 1.0:
        return 1.0
    used = indicator[n - dep.batches * dep.batch :].astype(np.float64)
    means = used.reshape(dep.batches, dep.batch).mean(axis=1)
    lrv = dep.batch * float(np.var(means, ddof=1))
    factor = lrv / (p * (1.0 - p))
    # Batch means of an i.i.d. series give (B−1)·τ̂ ~ χ²(B−1): only a factor above its 90th
    # percentile counts as dependence; below it the exact i.i.d. interval stands. (Calibrated:
    # a 95th-percentile gate missed AR(1) φ = 0.5 tails, 92% coverage; a median gate widened
    # i.i.d. samples of 50 to 98.7%.)
    df = dep.batches - 1
    significant = factor > float(sps.chi2.ppf(DEPENDENCE_LEVEL, df)) / df
    return factor if significant else 1.0


def normal_scores_acf(x: np.ndarray, max_lag: int, z: np.ndarray | None = None) -> np.ndarray:
    """The autocorrelations r_1 … r_max_lag of a series' normal scores `z` (ranks mapped through
    Φ⁻¹, so a heavy tail does not dominate; the caller's where its sort gave them), by FFT at a
    fast length (a 2n with a large prime factor took 10–20× longer, issue 35). x in time order."""
    n = len(x)
    lag = max(0, min(max_lag, n - 1))
    if n < 2 or lag == 0:
        return np.zeros(0)
    z = sps.norm.ppf(sps.rankdata(x, method="average") / (n + 1)) if z is None else z
    # ≥ n + lag: a product that wraps around lands at a lag above `lag` (2n − 1, every lag's
    # room, was 1.8× the transform at a fleet run's n / 8 lags, issue 35)
    size = sfft.next_fast_len(n + lag, real=True)
    f = sfft.rfft(z - z.mean(), size)
    acov = sfft.irfft(f.real**2 + f.imag**2, size)[: lag + 1]
    return acov[1:] / acov[0] if acov[0] > 0 else np.zeros(lag)


def copula_factor(acf: np.ndarray, n: int, q: float) -> float:
    """τ of the indicator 1{X ≤ ξ_q} read off the series' normal-score autocorrelations r_k,
    as a Gaussian copula with those correlations implies: the indicators' lag-k correlation
    is (Φ₂(h, h; r_k) − q²) / (q(1 − q)), h = Φ⁻¹(q), Φ₂(h, h; r) = Φ(h) − 2·T(h, √((1−r)/(1+r)))
    (Owen's T), summed with Bartlett weights: τ = 1 + 2 Σ (1 − k/(L+1)) ρ_k. Why: for a tail
    indicator (p99 of 1,000 requests: about ten exceedances) batch means see one exceedance a
    batch and rarely find the correlation significant, so AR(1) series at φ = 0.5 and 0.9 got
    the i.i.d. interval and 89% coverage; every request's latency informs r_k. Used only when
    the lag-1 correlation is significant (r_1 > 2.5/√n: an i.i.d. series keeps its exact
    interval), and only ever to widen (the larger of this and batch means' τ)."""
    if len(acf) == 0 or n < MIN_DEPENDENCE_N or not 0.0 < q < 1.0:
        return 1.0
    if acf[0] <= 2.5 / math.sqrt(n):
        return 1.0
    from scipy import special

    h = float(sps.norm.ppf(q))
    r = np.clip(acf, -0.999, 0.999)
    joint = float(sps.norm.cdf(h)) - 2.0 * special.owens_t(h, np.sqrt((1.0 - r) / (1.0 + r)))
    rho = (joint - q * q) / (q * (1.0 - q))
    weights = 1.0 - np.arange(1, len(r) + 1) / (len(r) + 1)
    return max(1.0, 1.0 + 2.0 * float((weights * rho).sum()))


def copula_lags(n: int, dep: Dependence) -> int:
    """How many lags `copula_factor` sums: four batch lengths (at least 10), at most n / 4."""
    return int(min(n // 4, max(10, 4 * dep.batch)))


def with_factor(
    dep: Dependence, factor: float, df: float | None = None, clusters: int | None = None, n: int = 0
) -> Dependence:
    return Dependence(dep.batch, dep.batches, factor, dep.rate_per_s, df, clusters, n)


def with_rate(dep: Dependence, rate_per_s: float | None) -> Dependence:
    return Dependence(dep.batch, dep.batches, dep.factor, rate_per_s, dep.df, dep.clusters, dep.n)


def effective_df(means: np.ndarray) -> float | None:
    """ν = 2 / (2/(B − 1) + κ/B) of B batch means with excess kurtosis κ (see
    `batch_means_df`); None where they have no spread."""
    b = len(means)
    if b < 4 or float(np.std(means)) == 0.0:
        return None
    kappa = max(0.0, float(sps.kurtosis(means, fisher=True, bias=False)))
    return max(1.0, 2.0 / (2.0 / (b - 1) + kappa / b))


def batch_means_df(indicator: np.ndarray, dep: Dependence) -> float | None:
    """The effective degrees of freedom of batch means' variance when the batch means are not
    normal. Why: a tail indicator's batch means are mostly 0 with a few bursts, so their
    sample variance is far noisier than χ²(B − 1) says, and a quiet run's small variance was
    read as precise (sim p99 at 9/s covered 83% of 60 seeds). With κ the batch means' excess
    kurtosis, Var(s²)/σ⁴ = 2/(B − 1) + κ/B; matching a scaled χ²(ν) (Satterthwaite) gives
    ν = 2 / (2/(B − 1) + κ/B), never above B − 1. None where there are no batches to read."""
    n = len(indicator)
    if dep.batch <= 1 or dep.batches < 4 or n < MIN_DEPENDENCE_N:
        return None
    used = indicator[n - dep.batches * dep.batch :].astype(np.float64)
    return effective_df(used.reshape(dep.batches, dep.batch).mean(axis=1))


def exceedance_clusters(exceed: np.ndarray) -> int:
    """How many independent bursts a series' exceedances (a 0/1 series in time order) come in:
    the extremal index θ by Ferro and Segers' intervals estimator (J. R. Stat. Soc. B 65,
    2003), which needs no run length chosen by hand, and the N exceedances declustered into
    ⌊θ·N⌋ clusters at their largest gaps. Why: a queue's tail comes in bursts, and how far a
    run's percentile can be from the long-run one depends on how many bursts the run saw, not
    on how many requests exceeded it; 60 requests over p99 in two bursts are two
    observations."""
    where = np.flatnonzero(exceed)
    n = len(where)
    if n < 2:
        return n
    gaps = np.diff(where).astype(np.float64)
    if gaps.max() <= 2:
        theta = 2.0 * gaps.sum() ** 2 / ((n - 1) * float((gaps * gaps).sum()))
    else:
        theta = 2.0 * (gaps - 1).sum() ** 2 / ((n - 1) * float(((gaps - 1) * (gaps - 2)).sum()))
    return max(1, math.floor(min(1.0, theta) * n))


def cluster_df(exceed: np.ndarray) -> float | None:
    """The effective degrees of freedom the exceedances' bursts give τ: `effective_df` of the
    sizes of the `exceedance_clusters` bursts (split at the largest gaps). Why: a run whose
    tail came in a few very large bursts read its τ from batch means that saw mostly one of
    them; with the bursts' sizes heavy-tailed their count carries little information. Capping
    ν by it took sim TTFT p90 at 9/s from 92.0% to 93.5% of 200 seeds (p99 at 7/s 91.2% → 93.8%).
    None with fewer than 4 bursts or bursts all of one size."""
    where = np.flatnonzero(exceed)
    count = exceedance_clusters(exceed)
    if count < 4:
        return None
    cut = np.sort(np.argsort(np.diff(where), kind="stable")[::-1][: count - 1])
    return effective_df(np.diff(np.concatenate([[0], cut + 1, [len(where)]])).astype(np.float64))


# ------------------------------------------------------------------ percentiles


def _at_rank(sorted_x: np.ndarray, rank: float) -> float:
    """The order statistic at a (fractional) 1-based rank, linear between neighbours."""
    n = len(sorted_x)
    rank = min(max(rank, 1.0), float(n))
    lo = math.floor(rank)
    frac = rank - lo
    if frac <= 0 or lo >= n:
        return float(sorted_x[lo - 1])
    return float(sorted_x[lo - 1] + frac * (sorted_x[lo] - sorted_x[lo - 1]))


def min_n_two_sided(q: float, confidence: float) -> int:
    """The smallest n whose maximum bounds the q-quantile from above at the two-sided level."""
    alpha = (1 - confidence) / 2
    return math.ceil(math.log(alpha) / math.log(q)) if 0 < q < 1 else 1


def needed_n(q: float, confidence: float, dep: Dependence = IID) -> int:
    """The smallest n bounding the q-quantile's upper end: the exact binomial's, or for a
    dependent series n·q + ½ + t·√(n·q(1−q)·τ) ≤ n, `_dependent_ranks`' (+ 1 overstated n)."""
    exact = min_n_two_sided(q, confidence)
    if dep.factor <= 1.0:
        return exact
    crit = float(sps.t.ppf(1 - (1 - confidence) / 2, dep.degrees))
    b = crit * math.sqrt(q * (1 - q) * dep.factor)
    root = (b + math.sqrt(b * b + 2 * (1 - q))) / (2 * (1 - q))
    return max(exact, math.ceil(root * root))


@lru_cache(maxsize=1024)
def _exact_ranks(n: int, q: float, tail: float) -> tuple[float, float]:
    """Fractional ranks (lower, upper) whose one-sided coverage is `1 − tail` each, from the
    binomial; lower 0 = unbounded below, upper > n = unbounded above. Kept per (n, q, tail):
    a run's TTFT and E2E (and often TPOT) have the same n in every group, and each call is
    ~6k binomial tails at 1.9M requests (0.45 of a fleet summary's CPU s, issue 35).

    The binomial tails are computed only on ranks within z + 8 standard deviations of n·q, where
    both crossings lie (`_exact_ranks_on` checks it, and takes every rank where they do not):
    each tail value is the same computed alone, so the ranks are the same, and a 96,097-request
    group costs 0.6 ms instead of 23 (issue 35: these were 1.5 of a fleet summary's 3.4 CPU s)."""
    sd = math.sqrt(n * q * (1 - q))
    half = (float(sps.norm.isf(tail)) + 8.0) * sd + 16
    a = max(0, int(n * q - half))
    b = min(n + 1, math.ceil(n * q + half))
    return _exact_ranks_on(n, q, tail, a, b) or _exact_ranks_on(n, q, tail, 0, n + 1) or (0, 0)


def _exact_ranks_on(n: int, q: float, tail: float, a: int, b: int) -> tuple[float, float] | None:
    """`_exact_ranks` from the tails on ranks a … b; None when a crossing may lie outside."""
    target = 1.0 - tail
    ranks = np.arange(a, b + 1)
    g = sps.binom.sf(ranks - 1, n, q)  # P(X_(l) ≤ ξ) = P(Bin ≥ l), decreasing in l
    h = sps.binom.cdf(ranks - 1, n, q)  # P(X_(u) ≥ ξ) = P(Bin ≤ u − 1), increasing in u
    ok_low = np.flatnonzero((g >= target) & (ranks >= 1))
    ok_high = np.flatnonzero((h >= target) & (ranks >= 1) & (ranks <= n))
    if (g[-1] >= target and b < n + 1) or (len(ok_low) == 0 and a > 1):
        return None
    if (h[0] >= target and a > 1) or (len(ok_high) == 0 and b < n):
        return None
    if len(ok_low) == 0:
        lower = 0.0
    else:
        i = int(ok_low[-1])
        if a + i >= n or g[i] <= g[i + 1]:
            lower = float(a + i)
        else:
            lower = a + i + (g[i] - target) / (g[i] - g[i + 1])
    if len(ok_high) == 0:
        upper = math.inf
    else:
        i = int(ok_high[0])
        if a + i <= 1 or h[i] <= h[i - 1]:
            upper = float(a + i)
        else:
            upper = a + i - (h[i] - target) / (h[i] - h[i - 1])
    return lower, upper


def _dependent_ranks(n: int, q: float, dep: Dependence, tail: float) -> tuple[float, float]:
    """n·q + ½ ∓ t·√(n·q(1−q)·τ): C = #{X ≤ ξ} is a count, so P(C ≥ l) and P(C ≤ u − 1) take
    the continuity correction (without it AR(1) φ = 0.5 p99, n = 1,000, covered 98.1%)."""
    crit = float(sps.t.ppf(1 - tail, dep.degrees))
    half = crit * math.sqrt(n * q * (1 - q) * dep.factor)
    centre = n * q + 0.5
    upper = centre + half
    return max(centre - half, 0.0), (upper if upper <= n else math.inf)


def percentile_interval(
    sorted_x: np.ndarray,
    q: float,
    confidence: float = 0.95,
    dep: Dependence = IID,
    floor: float = 0.0,
) -> Interval:
    """The interval of the q-quantile of finite sorted values (see the module docstring)."""
    n = len(sorted_x)
    if n == 0:
        return declined(confidence, METHOD_EXACT, "no observations")
    dependent = dep.factor > 1.0
    method = (
        METHOD_DEPENDENT.format(batches=dep.batches, batch=dep.batch) if dependent else METHOD_EXACT
    )
    if dependent and not dep.enough:
        return declined(confidence, method, _too_short(dep))
    alpha = 1 - confidence

    def ranks(tail: float) -> tuple[float, float]:
        lo, hi = _exact_ranks(n, q, tail)
        if dependent:
            dlo, dhi = _dependent_ranks(n, q, dep, tail)
            lo, hi = min(lo, dlo), max(hi, dhi)
        return lo, hi

    lo_rank, hi_rank = ranks(alpha / 2)
    reason = None
    if not math.isfinite(hi_rank):  # one-sided: the lower bound at the full confidence
        lo_rank, _ = ranks(alpha)
        reason = (
            f"upper end unbounded, the lower end a one-sided {confidence:.0%} bound: n = {n} "
            f"cannot bound p{_pct(q)} from above at {confidence:.0%} "
            f"(needs n ≥ {needed_n(q, confidence, dep if dependent else IID)})"
        )
    low = floor if lo_rank < 1 else _at_rank(sorted_x, lo_rank)
    high = math.inf if not math.isfinite(hi_rank) else _at_rank(sorted_x, hi_rank)
    return Interval(low, high, confidence, method, reason)


def _too_short(dep: Dependence) -> str:
    duration = ""
    if dep.rate_per_s:
        duration = f", ≈ {dep.needed_n / dep.rate_per_s:,.0f} s at this rate"
    if dep.batches >= MIN_BATCHES and dep.clusters is not None:
        return (
            f"run too short for its own correlation: its exceedances come in {dep.clusters} "
            f"independent bursts, an interval needs ≥ {MIN_CLUSTERS} (≥ {dep.needed_n:,} "
            f"requests{duration})"
        )
    return (
        f"run too short for its own correlation: {dep.batches} batches of {dep.batch} requests, "
        f"an interval needs ≥ {MIN_BATCHES} (≥ {dep.needed_n:,} requests{duration})"
    )


def _pct(q: float) -> str:
    return f"{q * 100:.3f}".rstrip("0").rstrip(".")


def km_interval(
    times: np.ndarray,
    cdf: np.ndarray,
    var: np.ndarray,
    q: float,
    value: float,
    confidence: float = 0.95,
    dep: Dependence = IID,
) -> Interval:
    """Brookmeyer–Crowley: the event times t whose pointwise interval of F(t) contains q, with
    Greenwood's variance scaled by the dependence factor; one-sided where F + z·se never falls
    below q above the estimate."""
    method = METHOD_KM if dep.factor <= 1.0 else f"{METHOD_KM}, × {dep.factor:.2f} for dependence"
    if dep.factor > 1.0 and not dep.enough:
        return declined(confidence, method, _too_short(dep))
    se = np.sqrt(np.maximum(var, 0.0) * max(dep.factor, 1.0))
    dependent = dep.factor > 1.0
    tail = 1 - (1 - confidence) / 2
    z = float(sps.t.ppf(tail, dep.degrees) if dependent else sps.norm.ppf(tail))
    lo_hit = np.flatnonzero(cdf + z * se >= q - 1e-12)
    hi_hit = np.flatnonzero(cdf - z * se >= q - 1e-12)
    if len(hi_hit):
        low = float(times[lo_hit[0]]) if len(lo_hit) else value
        return Interval(min(low, value), max(float(times[hi_hit[0]]), value), confidence, method)
    z1 = float(sps.t.ppf(confidence, dep.degrees) if dependent else sps.norm.ppf(confidence))
    lo_hit = np.flatnonzero(cdf + z1 * se >= q - 1e-12)
    low = float(times[lo_hit[0]]) if len(lo_hit) else value
    return Interval(
        min(low, value),
        math.inf,
        confidence,
        method,
        f"upper end unbounded, the lower end a one-sided {confidence:.0%} bound: too few "
        f"requests finished beyond p{_pct(q)}",
    )


# ------------------------------------------------------------------ shares


def clopper_pearson(successes: float, n: float, confidence: float = 0.95) -> tuple[float, float]:
    """The exact binomial interval (beta quantiles, for an effective n too): ≥ `confidence` at
    every p. Wilson's gave 91% at p = 0.99, n = 50 (86% at some p), where attainments live."""
    a, k = (1 - confidence) / 2, successes
    low = float(sps.beta.ppf(a, k, n - k + 1)) if k > 0 else 0.0
    return low, float(sps.beta.ppf(1 - a, k + 1, n - k)) if k < n else 1.0


def share_dependence(
    x: np.ndarray, scores: np.ndarray | None, normal: np.ndarray | None = None
) -> tuple[Dependence, str]:
    """The batching, τ, df and bursts of a share's 0/1 series `x` in time order, and where τ
    came from. τ: batch means of `x`, and where `scores` (a continuous per-request series in
    the same order that `x` thresholds) is given, also its normal scores' Gaussian copula at
    the share's level p̂ (kept inside [1/n, 1 − 1/n]: a run that saw no miss still has the
    score's correlation), the larger counts (`normal`: the scores' normal scores where the
    caller has them, Φ⁻¹ of their average ranks over n + 1). Bursts of the rarer outcome are
    counted where there are 2 × MIN_CLUSTERS of them or more, as a percentile's exceedances
    are (fewer leave the interval to Clopper–Pearson's width): fewer than MIN_CLUSTERS bursts
    decline.

    Why: a share's misses are an SLO's exceedances, and come in bursts. From the indicator
    alone, a run that saw one burst or none read τ = 1: a latent AR(1) latency (φ = 0.9,
    n = 1,000) thresholded at an attainment of 0.99 covered 85.9% of 397 runs, at 0.995
    81.2%, at φ = 0.97 54.9% and 44.1% (benchmarks/bench_calibration.py --only
    share-ar1-0.9:1000:p99 and its neighbours). The p95-floor a
    percentile takes is not taken here: it held an AR(1) φ = 0.5 attainment of 0.99 at 99.8%
    where the copula alone gives 97.8%."""
    n = len(x)
    if scores is None or n < MIN_DEPENDENCE_N:
        dep = batching(x.astype(np.float64))
        factor = long_run_factor(x, dep)
        return with_factor(dep, factor, df=batch_means_df(x, dep)), "batch means"
    dep = batching(scores)
    p = float(x.mean())
    copula = copula_factor(
        normal_scores_acf(scores, copula_lags(n, dep), normal),
        n,
        min(max(p, 1.0 / n), 1.0 - 1.0 / n),
    )
    batched = long_run_factor(x, dep)
    factor = max(batched, copula)
    rare = ~x if p >= 0.5 else x
    bursts = exceedance_clusters(rare) if int(rare.sum()) >= 2 * MIN_CLUSTERS else None
    if batched >= copula:
        return with_factor(dep, factor, batch_means_df(x, dep), bursts, n), "batch means"
    return with_factor(dep, factor, None, bursts, n), "Gaussian copula of the score"


def share_interval(
    indicator_in_time_order: np.ndarray,
    confidence: float = 0.95,
    scores: np.ndarray | None = None,
    normal: np.ndarray | None = None,
) -> Interval:
    """Clopper–Pearson's interval of a share on n / τ (τ: `share_dependence`), at the level
    whose z is Student t's at τ's effective df where τ counts (as the percentiles' ranks: τ̂
    from 10–30 batch means is noisy and low; at the plain level a Markov chain's share at
    0.98, τ = 19, n = 5,000, covered 91.0% of 300 runs, at 0.95, τ = 9, n = 1,000, 85.7%).
    Declined where τ counts and the run has too few batches or bursts to measure it."""
    x = np.asarray(indicator_in_time_order, dtype=bool)
    n = len(x)
    if n == 0:
        return declined(confidence, METHOD_SHARE, "no requests")
    s = None if scores is None else np.asarray(scores, dtype=np.float64)
    dep, source = share_dependence(x, s, normal)
    if dep.factor <= 1.0:
        low, high = clopper_pearson(float(x.sum()), n, confidence)
        return Interval(low, high, confidence, METHOD_SHARE)
    if not dep.enough:
        return declined(confidence, METHOD_SHARE, _too_short(dep))
    nu = dep.degrees
    method = f"{METHOD_SHARE} (t, {nu:.1f} df) on n / {dep.factor:.2f} ({source})"
    level = 2 * float(sps.norm.cdf(sps.t.ppf(0.5 + confidence / 2, nu))) - 1  # z = t(ν)
    low, high = clopper_pearson(float(x.sum()) / dep.factor, n / dep.factor, level)
    return Interval(low, high, confidence, method)


# ------------------------------------------------------------------ means of window series

METHOD_WINDOW_MEAN = "Student t on batch means of the windows in time order ({batches} of {batch})"
METHOD_WINDOWS_IID = (
    "Student t over the {n} windows, taken as independent (fewer than "
    f"{MIN_DEPENDENCE_N}: too few to measure their correlation)"
)
MIN_WINDOWS = 5  # below this a window series' spread is a guess (t with < 4 degrees of freedom)


def window_mean_interval(
    values_in_time_order: np.ndarray,
    confidence: float = 0.95,
    bounds: tuple[float, float] = (-math.inf, math.inf),
    what: str = "windows",
    window_s: float | None = None,
) -> Interval:
    """The mean of a per-window series (a fairness index per contended window) with Student's t.
    Consecutive windows share a backlog, so from MIN_DEPENDENCE_N windows on they are batched
    past the series' Politis–White block length (as `batching` does for requests) and the B
    batch means are taken as independent, t with B − 1 degrees of freedom; fewer than
    MIN_BATCHES batches decline. Below MIN_DEPENDENCE_N windows (a run of 100–600 s has 10 of
    its 10–60 s windows) their correlation cannot be measured, and the windows themselves are
    taken as independent: the windows are at least 10 s, far past a queue's usual correlation
    time, and the coverage this gives is measured (benchmarks/bench_calibration.py); fewer than
    MIN_WINDOWS decline. A declined interval says how many windows, and seconds, would do. The
    ends are clipped to `bounds` (an index cannot leave its range)."""
    x = np.asarray(values_in_time_order, dtype=np.float64)
    x = x[np.isfinite(x)]
    n = len(x)
    if n < MIN_DEPENDENCE_N:
        method = METHOD_WINDOWS_IID.format(n=n)
        means, need = x, MIN_WINDOWS
    else:
        dep = batching(x)
        method = METHOD_WINDOW_MEAN.format(batches=dep.batches, batch=dep.batch)
        used = x[n - dep.batches * dep.batch :]
        means = used.reshape(dep.batches, dep.batch).mean(axis=1)
        need = dep.batch * MIN_BATCHES if dep.batches < MIN_BATCHES else 0
    if len(means) < (MIN_WINDOWS if n < MIN_DEPENDENCE_N else MIN_BATCHES):
        length = f", ≈ {need * window_s:.0f} s of them" if window_s else ""
        return declined(
            confidence,
            method,
            f"{n} {what}; a mean's interval needs ≥ {need} {what}{length}: run longer",
        )
    centre = float(x.mean())
    if np.all(means == means[0]):  # every value alike (an index pinned at 1): no spread to show
        half = 0.0
    else:
        t = float(sps.t.ppf(0.5 + confidence / 2, len(means) - 1))
        half = t * float(np.std(means, ddof=1)) / math.sqrt(len(means))
    low, high = max(bounds[0], centre - half), min(bounds[1], centre + half)
    return Interval(low, high, confidence, method)
