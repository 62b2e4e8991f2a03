"""Metrics: one function per metric, formula and unit in its docstring; pure, over records.

Integer nanoseconds inside; milliseconds only when a summary presents them. Latencies are
measured from the *intended* send time (coordinated-omission free); the `_sent` variants measure
from the actual send time, kept beside them so a late generator is visible, not hidden.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

from fairbench.analysis import frame_memo

PERCENTILES = (50, 90, 95, 99, 99.9)


def _col(df: pd.DataFrame, name: str) -> np.ndarray:
    return frame_memo.floats(df, name)  # converted once per summary (frame_memo)


def _first_response_ns(df: pd.DataFrame) -> np.ndarray:
    """When the first token reached the client. A response that streams no token (embeddings,
    non-streamed completions) delivers its first token with the whole response."""
    first = _col(df, "t_first_token_ns")
    return np.where(np.isnan(first), _col(df, "t_done_ns"), first)


def ttft_ns(df: pd.DataFrame) -> np.ndarray:
    """Time to first token: t_first_token − t_intended (ns); for responses that stream no token,
    the time to the response; NaN where neither arrived."""
    return _first_response_ns(df) - _col(df, "t_intended_ns")


def ttft_sent_ns(df: pd.DataFrame) -> np.ndarray:
    """TTFT from the actual send: t_first_token − t_sent (ns)."""
    return _first_response_ns(df) - _col(df, "t_sent_ns")


def e2e_ns(df: pd.DataFrame) -> np.ndarray:
    """End-to-end latency: t_done − t_intended (ns)."""
    return _col(df, "t_done_ns") - _col(df, "t_intended_ns")


def e2e_sent_ns(df: pd.DataFrame) -> np.ndarray:
    """End-to-end latency from the actual send: t_done − t_sent (ns)."""
    return _col(df, "t_done_ns") - _col(df, "t_sent_ns")


def tpot_ns(df: pd.DataFrame) -> np.ndarray:
    """Time per output token after the first: (t_last_token − t_first_token) / (tokens − 1), ns;
    NaN for fewer than 2 tokens."""
    tokens = _col(df, "output_tokens")
    span = _col(df, "t_last_token_ns") - _col(df, "t_first_token_ns")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(tokens >= 2, span / (tokens - 1), np.nan)


def itl_max_ns(df: pd.DataFrame) -> np.ndarray:
    """The largest gap between two consecutive token events of a request (ns)."""
    return _col(df, "itl_max_ns")


def send_lag_ns(df: pd.DataFrame) -> np.ndarray:
    """Generator lateness: t_sent − t_intended (ns), for requests that were sent."""
    lag = _col(df, "t_sent_ns") - _col(df, "t_intended_ns")
    return lag[~np.isnan(lag)]


def receive_delay_ns(df: pd.DataFrame) -> np.ndarray:
    """The generator's own receive delay (ns): per request, kernel receive stamp to the event
    loop's read of the bytes that gave its first token (or, with no token, its end); only for
    requests whose transport had kernel stamps."""
    if "rx_delay_ns" not in df.columns:
        return np.empty(0)
    delay = _col(df, "rx_delay_ns")
    return delay[~np.isnan(delay)]


def receive_error_ns(df: pd.DataFrame) -> np.ndarray:
    """How far the generator's late reading can have moved each request's first-token stamp
    (ns): 0 when the token's bytes were the newest of their read (the kernel stamped them on
    arrival, however late the read), else the span since the previous read in which they may
    have arrived; only where the transport had kernel stamps."""
    if "rx_error_ns" not in df.columns:
        return np.empty(0)
    error = _col(df, "rx_error_ns")
    return error[~np.isnan(error)]


def percentiles(values: np.ndarray, qs: Sequence[float] = PERCENTILES) -> dict[str, float | None]:
    """Linear-interpolated percentiles of the finite values; None when there are none."""
    finite = values[np.isfinite(values)]
    if not len(finite):
        return {f"p{q:g}": None for q in qs}
    points = np.percentile(finite, qs)
    return {f"p{q:g}": float(v) for q, v in zip(qs, points, strict=True)}


def _slo_terms(
    df: pd.DataFrame, slos: Mapping[str, Mapping[str, float | None]]
) -> Iterator[tuple[np.ndarray, str, np.ndarray, float]]:
    """(rows of a class, latency name, its values in ns over every row, the class's target in
    ns) for each target a class sets: what `slo_met` and `slo_slack` both read."""
    classes = frame_memo.name_codes(df, "slo_class", list(slos))  # codes: no str per row
    latencies = {"ttft": ttft_ns(df), "tpot": tpot_ns(df), "e2e": e2e_ns(df)}
    for k, slo in enumerate(slos.values()):
        rows = classes == k
        for key, values in latencies.items():
            limit = slo.get(key)
            if limit is not None and rows.any():
                yield rows, key, values, limit * 1e9


def slo_met(df: pd.DataFrame, slos: Mapping[str, Mapping[str, float | None]]) -> np.ndarray:
    """Per request: ok, and TTFT, TPOT and E2E within its class's targets (seconds; a missing
    target is no constraint). The DistServe notion behind goodput."""
    met = frame_memo.equals(df, "status", "ok").copy()
    for rows, key, values, limit in _slo_terms(df, slos):
        with np.errstate(invalid="ignore"):
            within = (values <= limit) | (np.isnan(values) & (key == "tpot"))
        met[rows] &= within[rows]
    return met


def slo_slack(df: pd.DataFrame, slos: Mapping[str, Mapping[str, float | None]]) -> np.ndarray:
    """Per request: its worst latency over its class's target, max(TTFT/target, TPOT/target,
    E2E/target) (a missing target or TPOT: no term; a missing TTFT or E2E: ∞; no target at
    all: 0), ∞ unless ok. The continuous score `slo_met` thresholds at 1: its serial
    correlation is what an attainment's interval reads where the misses themselves are too
    few (intervals.share_dependence)."""
    slack = np.zeros(len(df))
    for rows, key, values, limit in _slo_terms(df, slos):
        ratio = values[rows] / limit
        if key != "tpot":  # as slo_met: only a TPOT may be missing (a one-token response)
            ratio[np.isnan(ratio)] = np.inf
        slack[rows] = np.fmax(slack[rows], ratio)  # fmax: a NaN TPOT adds no term
    slack[~frame_memo.equals(df, "status", "ok")] = np.inf
    return slack


def service_tokens(
    df: pd.DataFrame, input_weight: float = 1.0, output_weight: float = 2.0
) -> np.ndarray:
    """Service a request received, in weighted tokens: 1·input + 2·output by default (VTC's
    prices), counting only what was served (prompt if any output or an ok embedding)."""
    return frame_memo.memo(
        df,
        ("service_tokens", input_weight, output_weight),
        lambda: _service_tokens(df, input_weight, output_weight),
    )


def _service_tokens(df: pd.DataFrame, input_weight: float, output_weight: float) -> np.ndarray:
    served = frame_memo.equals(df, "status", "ok") | (_col(df, "output_tokens") > 0)
    return np.where(
        served,
        input_weight * _col(df, "prompt_tokens") + output_weight * _col(df, "output_tokens"),
        0.0,
    )


def water_fill(demands: np.ndarray, weights: np.ndarray, capacity: float) -> np.ndarray:
    """Weighted max-min fair shares: each tenant gets min(demand, level·weight), with the level
    raised until the shares sum to `capacity` (or every demand is met).

    A tenant that asked for little is not "unfairly" served little."""
    demands = np.asarray(demands, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    share = np.zeros_like(demands)
    active = demands > 0
    left = float(capacity)
    while active.any() and left > 1e-12 * max(capacity, 1.0):
        level = left / weights[active].sum()
        want = demands - share
        full = active & (want <= level * weights)
        if not full.any():
            share[active] += level * weights[active]
            break
        left -= want[full].sum()
        share[full] = demands[full]
        active &= ~full
    return share


def jain(x: np.ndarray) -> float:
    """Jain's index (Σx)² / (n·Σx²): 1 when all equal, 1/n when one takes all; NaN if all 0."""
    x = np.asarray(x, dtype=np.float64)
    top = float(x.max()) if len(x) else 0.0
    if top <= 0:
        return float("nan")
    x = x / top  # scale first: squares of tiny (or huge) values under/overflow
    return float(x.sum() ** 2 / (len(x) * float(np.square(x).sum())))


def nondecreasing(x: np.ndarray) -> bool:
    """Whether `x` is already in order (ties kept; any NaN: not). Why: records come in plan
    order, so a run's (or a records window's) send times need no argsort, and a slice by
    `searchsorted` picks what a mask would; every such fast path asks this one question."""
    return len(x) < 2 or bool(np.all(x[1:] >= x[:-1]))


def distinct(codes: np.ndarray) -> np.ndarray:
    """`np.unique(codes)` of integer codes (tenant, class: a few distinct values over a
    million rows), by counting instead of hashing or sorting: the same sorted values, same
    dtype. Why: the summary asks for the tenants present in a group about 30 times, each
    np.unique of 1.7M codes 23 ms on the 10-minute fleet, a bincount 3 (issue 35). Other
    dtypes, or codes spread wider than the rows, go to np.unique."""
    codes = np.asarray(codes)
    if len(codes) == 0 or codes.dtype.kind not in "iu":
        return np.unique(codes)
    lo, hi = int(codes.min()), int(codes.max())
    if hi - lo > len(codes) + 1024:
        return np.unique(codes)
    # shifted in intp, not the codes' own dtype: int8 codes from -100 to 100 wrap there
    shifted = np.subtract(codes, lo, dtype=np.intp) if lo else codes
    present = np.flatnonzero(np.bincount(shifted, minlength=hi - lo + 1))
    return (present + lo).astype(codes.dtype, copy=False)


def distinct_inverse(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(codes, return_inverse=True)` of integer codes by counting (`distinct`) and a
    lookup table: the same values, inverse as intp. Why: np.unique argsorts the codes for the
    inverse (1.5M codes of four tenants on the 10-minute fleet's VTC table). Other dtypes, or
    codes spread wider than the rows, go to np.unique."""
    codes = np.asarray(codes)
    if codes.ndim != 1 or len(codes) == 0 or codes.dtype.kind not in "iu":
        return np.unique(codes, return_inverse=True)
    lo, hi = int(codes.min()), int(codes.max())
    if hi - lo > len(codes) + 1024:
        return np.unique(codes, return_inverse=True)
    uniques = distinct(codes)
    table = np.zeros(hi - lo + 1, dtype=np.intp)
    table[uniques.astype(np.intp) - lo] = np.arange(len(uniques), dtype=np.intp)
    return uniques, table[np.subtract(codes, lo, dtype=np.intp) if lo else codes]
