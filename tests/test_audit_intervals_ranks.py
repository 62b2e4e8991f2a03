"""Known-truth audit of the percentile intervals' ranks (fairbench.analysis.intervals).

Each promise of the module is checked against a brute-force oracle on small random inputs:
the binomial ranks by enumerating scipy.stats.binom at every rank, "the n that would bound it"
by trying every n, the order statistics by sorting. Why: the code reads formulas at chosen
points (a window of ranks around n·q, fractional ranks between neighbours), and a formula
read at the wrong point passes every test that only looks at typical values.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from fairbench.analysis import intervals as iv
from fairbench.analysis.stats import quantile_ci

QS = st.sampled_from([0.5, 0.9, 0.95, 0.99, 0.999]) | st.floats(0.01, 0.995)
TAILS = st.sampled_from([0.025, 0.05, 0.005, 0.1587, 0.25])


def _oracle_ranks(n: int, q: float, tail: float) -> tuple[int, float]:
    """The largest rank l with P(Bin(n, q) ≥ l) ≥ 1 − tail (0: none) and the smallest u ≤ n
    with P(Bin(n, q) ≤ u − 1) ≥ 1 − tail (∞: none), every rank enumerated."""
    ranks = np.arange(1, n + 1)
    low_ok = ranks[sps.binom.sf(ranks - 1, n, q) >= 1 - tail]
    high_ok = ranks[sps.binom.cdf(ranks - 1, n, q) >= 1 - tail]
    return (int(low_ok.max()) if len(low_ok) else 0), (
        float(high_ok.min()) if len(high_ok) else math.inf
    )


@settings(deadline=None, max_examples=100)
@given(n=st.integers(1, 3000), q=QS, tail=TAILS)
def test_exact_ranks_are_the_binomial_ranks_every_rank_enumerated(
    n: int, q: float, tail: float
) -> None:
    """`_exact_ranks` reads the binomial only in a window around n·q (issue 35): its ranks
    must be the ones every rank gives, interpolated no further than to the next rank."""
    lo, hi = iv._exact_ranks(n, q, tail)
    want_lo, want_hi = _oracle_ranks(n, q, tail)
    assert math.floor(lo) == want_lo and lo < want_lo + 1
    if math.isinf(want_hi):
        assert math.isinf(hi)
    else:
        assert want_hi - 1 < hi <= want_hi


@settings(deadline=None, max_examples=60)
@given(
    q=st.sampled_from([0.5, 0.9, 0.95, 0.99, 0.999]),
    confidence=st.sampled_from([0.6827, 0.9, 0.95, 0.99]),
)
def test_the_n_an_iid_interval_asks_for_is_the_smallest_that_bounds_it(
    q: float, confidence: float
) -> None:
    """A one-sided interval says `needs n ≥ N`: at N the upper end is bounded, at N − 1 not."""
    need = iv.needed_n(q, confidence)

    def bounded(n: int) -> bool:
        return math.isfinite(iv.percentile_interval(np.arange(float(n)), q, confidence).high)

    assert bounded(need) and (need == 1 or not bounded(need - 1))
    if need > 1:
        reason = iv.percentile_interval(np.arange(float(need - 1)), q, confidence).reason
        assert reason is not None and f"needs n ≥ {need})" in reason


@settings(deadline=None, max_examples=100)
@given(
    q=st.sampled_from([0.5, 0.9, 0.95, 0.99]),
    factor=st.floats(1.01, 40.0),
    batch=st.integers(2, 60),
    batches=st.integers(10, 30),
)
def test_the_n_a_dependent_interval_asks_for_is_the_smallest_that_bounds_it(
    q: float, factor: float, batch: int, batches: int
) -> None:
    """Bug fixed here: `needed_n` solved n·q + t·√(n·q(1−q)·τ) + 1 ≤ n while the upper rank
    (`_dependent_ranks`) is n·q + ½ + t·√(…), so the n a declined or one-sided interval asked
    for was up to 6% more than the one that bounds it (q = 0.95, τ = 5.8: 502, where 482
    does)."""
    dep = iv.Dependence(batch=batch, batches=batches, factor=factor)
    need = iv.needed_n(q, 0.95, dep)

    def bounded(n: int) -> bool:
        return math.isfinite(iv.percentile_interval(np.arange(float(n)), q, 0.95, dep).high)

    assert bounded(need) and not bounded(need - 1)


@settings(deadline=None, max_examples=100)
@given(
    values=st.lists(
        st.integers(0, 6).map(float) | st.just(math.nan) | st.floats(0, 1e6),
        min_size=0,
        max_size=60,
    ),
    q=st.sampled_from([0.5, 0.9, 0.99]),
)
def test_quantile_ci_is_the_sorted_order_statistic_and_holds_it(
    values: list[float], q: float
) -> None:
    """The point is the ceil(q·n)-th of the finite values sorted (ties and NaN included), and
    the interval always holds it; an empty sample is NaN, never an interval."""
    x = np.array(values, dtype=float)
    est = quantile_ci(x, q)
    finite = sorted(v for v in values if math.isfinite(v))
    if not finite:
        assert est.n == 0 and math.isnan(est.value) and math.isnan(est.low)
        return
    assert est.n == len(finite)
    assert est.value == finite[max(1, math.ceil(q * len(finite))) - 1]
    assert est.low <= est.value <= est.high
    assert finite[0] <= est.low or est.low == 0.0  # an unbounded-below end is the floor 0
    if math.isfinite(est.high):
        assert est.high <= finite[-1]


@settings(deadline=None, max_examples=60)
@given(n=st.integers(1, 400), q=st.sampled_from([0.5, 0.9, 0.99]), seed=st.integers(0, 2**32 - 1))
def test_an_interval_never_narrows_below_its_integer_ranks(n: int, q: float, seed: int) -> None:
    """Interpolation moves each end only toward the rank inside it: the interval always holds
    [X_(l+1), X_(u−1)] of the oracle's integer ranks l, u (nothing narrower than exact), and a
    tail the sample cannot bound is one-sided with the reason."""
    x = np.sort(np.random.default_rng(seed).lognormal(size=n))
    it = iv.percentile_interval(x, q, 0.95)
    lo, hi = _oracle_ranks(n, q, 0.025)
    if math.isinf(hi):  # one-sided: the lower end at the full 95%
        assert math.isinf(it.high) and it.reason and "upper end unbounded" in it.reason
        lo = _oracle_ranks(n, q, 0.05)[0]
    elif hi >= 2:
        assert it.high >= x[int(hi) - 2]  # at least the next order statistic down
    if lo >= 1:
        assert it.low <= x[min(lo, n - 1)]  # at most the next order statistic up
    else:
        assert it.low == 0.0


@settings(deadline=None, max_examples=60)
@given(
    r=st.lists(st.floats(-0.95, 0.95), min_size=1, max_size=6),
    q=st.sampled_from([0.5, 0.9, 0.99]) | st.floats(0.05, 0.95),
)
def test_the_copula_factor_is_the_bivariate_normal_sum(r: list[float], q: float) -> None:
    """Oracle: each lag's indicator correlation from scipy's bivariate normal CDF (not Owen's
    T), summed with Bartlett weights, floored at 1; only read when r_1 > 2.5/√n."""
    n = 10_000
    acf = np.array(r)
    got = iv.copula_factor(acf, n, q)
    if acf[0] <= 2.5 / math.sqrt(n):
        assert got == 1.0
        return
    h = float(sps.norm.ppf(q))
    rho = [
        (sps.multivariate_normal([0, 0], [[1, rk], [rk, 1]]).cdf([h, h]) - q * q) / (q * (1 - q))
        for rk in acf
    ]
    weights = 1 - np.arange(1, len(acf) + 1) / (len(acf) + 1)
    want = max(1.0, 1 + 2 * float(np.dot(weights, rho)))
    assert math.isclose(got, want, rel_tol=1e-4, abs_tol=1e-4)


@settings(deadline=None, max_examples=60)
@given(
    values=st.lists(st.floats(0.0, 1.0), min_size=0, max_size=29),
    confidence=st.sampled_from([0.9, 0.95]),
)
def test_a_short_window_series_gets_the_student_t_interval_or_declines(
    values: list[float], confidence: float
) -> None:
    """Fewer than 30 windows: Student's t over the windows, clipped to the bounds; fewer than
    5 decline with the number that would do."""
    x = np.array(values)
    it = iv.window_mean_interval(x, confidence, bounds=(0.0, 1.0))
    if len(x) < iv.MIN_WINDOWS:
        assert it.declined and it.reason and f"needs ≥ {iv.MIN_WINDOWS}" in it.reason
        return
    half = 0.0
    if float(np.ptp(x)) > 0:
        half = sps.t.ppf(0.5 + confidence / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    assert math.isclose(it.low, max(0.0, x.mean() - half), abs_tol=1e-12)
    assert math.isclose(it.high, min(1.0, x.mean() + half), abs_tol=1e-12)


@settings(deadline=None, max_examples=100)
@given(n=st.integers(1, 500), data=st.data(), confidence=st.sampled_from([0.9, 0.95, 0.99]))
def test_clopper_pearson_is_the_exact_binomial(
    n: int, data: st.DataObject, confidence: float
) -> None:
    """Oracle: the ends are where the binomial tails reach α/2, P(X ≥ k | low) = α/2 and
    P(X ≤ k | high) = α/2 (0 and 1 at k = 0 and k = n)."""
    k = data.draw(st.integers(0, n))
    low, high = iv.clopper_pearson(k, n, confidence)
    a = (1 - confidence) / 2
    assert low == 0.0 if k == 0 else math.isclose(sps.binom.sf(k - 1, n, low), a, rel_tol=1e-6)
    assert high == 1.0 if k == n else math.isclose(sps.binom.cdf(k, n, high), a, rel_tol=1e-6)
