"""A run's records as the per-request arrays every metric is computed from.

The summary computes each figure once on a run's `Cols`; compare computes the same figure, with
the same function, on resamples of it (`take`). That is what makes a name mean one thing in
summary.json, compare, ab, gate, sweep and the reports (fairbench.analysis.registry).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from fairbench.analysis import censored, frame_memo
from fairbench.analysis import metrics as m

T = TypeVar("T")


# a group dimension's column of codes
GROUP_COLUMNS = {"class": "cls", "tenant": "tenant", "workload": "workload"}


class Cols:
    """Per-request columns of one run (its measurement window) as numpy arrays."""

    __slots__ = (
        "_estimates",
        "_memo",
        "_orders",
        "admitted",
        "cls",
        "demand",
        "e2e_o",
        "e2e_t",
        "e2e_x",
        "met",
        "ok",
        "output_tokens",
        "rejected",
        "served",
        "slack",
        "slo_ttft",
        "solo_ttft",
        "solo_ttft_se",
        "t",
        "tenant",
        "tpot_o",
        "tpot_t",
        "tpot_x",
        "ttft_o",
        "ttft_t",
        "ttft_x",
        "unfinished",
        "unloaded",
        "window_s",
        "workload",
    )

    def __init__(self, **arrays: Any) -> None:
        self._memo: dict[tuple[str, Any], Any] = {}  # observations, and figures built on them
        # percentile estimates, kept past `forget` (a few floats each): the summary's intervals
        # and its `metrics` block ask for the same group's same percentile (issue 35)
        self._estimates: dict[tuple[str, int, float], censored.QuantileEstimate] = {}
        # each latency's whole-run order by value, kept past `forget`: a group's order is
        # read off it in O(n) (`sub_order`), not sorted again (issue 35)
        self._orders: dict[str, np.ndarray] = {}
        for name, value in arrays.items():
            setattr(self, name, value)

    @classmethod
    def of(
        cls_,
        df: pd.DataFrame,
        *,
        slos: Mapping[str, Mapping[str, float | None]],
        classes: Sequence[str],
        tenants: Sequence[str],
        workloads: Sequence[str],
        window_s: float,
        timeout_s: float | None,
        unloaded_ns: np.ndarray,
        solo_ttft_p99_ns: Mapping[str, float] | None = None,
        solo_ttft_p99_log_se: Mapping[str, float | None] | None = None,
    ) -> Cols:
        ttft = censored.ttft_rows(df, timeout_s)
        e2e = censored.e2e_rows(df, timeout_s)
        tpot = censored.tpot_rows(df, timeout_s)
        status = lambda value: frame_memo.equals(df, "status", value)  # noqa: E731
        solo = solo_ttft_p99_ns or {}
        solo_se = solo_ttft_p99_log_se or {}
        return cls_(
            ok=status("ok"),
            rejected=status("rejected"),
            admitted=censored.admitted(df),
            unfinished=status("timeout") | status("cancelled"),
            ttft_t=ttft.time,
            ttft_o=ttft.observed,
            ttft_x=ttft.eligible,
            e2e_t=e2e.time,
            e2e_o=e2e.observed,
            e2e_x=e2e.eligible,
            tpot_t=tpot.time,
            tpot_o=tpot.observed,
            tpot_x=tpot.eligible,
            met=m.slo_met(df, slos),
            slack=m.slo_slack(df, slos),
            cls=frame_memo.codes_of(df["slo_class"], classes),
            tenant=frame_memo.codes_of(df["tenant"], tenants),
            workload=frame_memo.codes_of(df["workload"], workloads),
            served=m.service_tokens(df),
            demand=df["prompt_tokens"].to_numpy(dtype=float)
            + 2.0 * df["max_tokens"].to_numpy(dtype=float),
            output_tokens=df["output_tokens"].to_numpy(dtype=float),
            unloaded=np.maximum(np.asarray(unloaded_ns, dtype=float), 1.0),
            t=df["t_intended_ns"].to_numpy(dtype=float),
            slo_ttft=_per_class(df["slo_class"], classes, slos) * 1e9,
            solo_ttft=np.array([solo.get(t, np.nan) for t in tenants], dtype=float),
            solo_ttft_se=np.array(
                [np.nan if solo_se.get(t) is None else solo_se[t] for t in tenants], dtype=float
            ),
            window_s=float(window_s),
        )

    def __len__(self) -> int:
        return len(self.ok)

    def take(self, idx: np.ndarray) -> Cols:
        fixed = ("solo_ttft", "solo_ttft_se", "window_s")
        return Cols(
            **{
                name: getattr(self, name) if name in fixed else getattr(self, name)[idx]
                for name in self.__slots__
                if name not in ("_memo", "_estimates", "_orders")
            }
        )

    def forget(self) -> None:
        """Drop the cached observations (and their curves): bounded memory between stages.
        The whole run's orders by value stay (4 bytes a request each) for the groups'."""
        self._keep_orders()
        self._memo.clear()

    def _keep_orders(self) -> None:
        for (which, mask_key), found in self._memo.items():  # figures too: only observations
            if mask_key != 0 or not isinstance(found, censored.Observations):
                continue
            order = found.__dict__.get("_by_value")
            if order is not None and which not in self._orders:
                self._orders[which] = order.astype(np.int32 if len(order) < 2**31 else np.int64)

    def group_mask(self, dim: str, code: int) -> np.ndarray:
        """The requests in group `code` of `dim` (class, tenant, workload). A bootstrap draw's
        columns (fairbench.decide.draws) keep each and know its group."""
        return getattr(self, GROUP_COLUMNS[dim]) == code  # type: ignore[no-any-return]

    def memo(self, name: str, mask: np.ndarray | None, make: Callable[[], T]) -> T:
        """`make()` for the group (`mask`; None: the run), kept until `forget` under `name`:
        a figure that several others read (a group's slowdowns, its drift, the run's late
        indicator) is computed once. The one way into the memo, so every key has one form."""
        key = (name, _mask_key(mask))
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]  # type: ignore[no-any-return]

    def estimate(self, which: str, mask: np.ndarray | None, q: float) -> censored.QuantileEstimate:
        """The group's percentile `q` of one latency with its interval
        (`censored.quantile_estimate` of `obs`), computed once per run: kept past `forget`, so
        the `metrics` block reads the estimates the summary's `latency_ci_ms` made instead of
        sorting and testing each group's latencies again (its dependence: two FFTs of the
        whole group, 2 of the 9 CPU s of a 2-minute fleet run's summary, issue 35)."""
        key = (which, _mask_key(mask), q)
        found = self._estimates.get(key)
        if found is None:
            found = self._estimates[key] = censored.quantile_estimate(self.obs(which, mask), q)
        return found

    def obs(self, which: str, mask: np.ndarray | None) -> censored.Observations:
        """The group's observations of one latency (`ttft`, `e2e`, `tpot`); the same object for
        the same group, so its Kaplan–Meier curve is computed once for every figure of it."""
        key = (which, _mask_key(mask))
        found = self._memo.get(key)
        if found is None:
            time, seen, eligible = (getattr(self, f"{which}_{s}") for s in ("t", "o", "x"))
            # a group's rows by their indices (`rows_of`), the run's through its dense mask
            keep = eligible if mask is None else rows_of(eligible & mask)
            found = self._memo[key] = censored.Observations(
                time[keep], seen[keep], self.t[keep], ranked=True
            )
            if mask is not None:
                self._keep_orders()
                if which in self._orders:
                    found.__dict__["_by_value"] = sub_order(self._orders[which], mask[eligible])
        return found


def sub_order(order: np.ndarray, member: np.ndarray) -> np.ndarray:
    """A group's order by value from the whole run's (`order` sorts the run's values, `member`
    marks the group's among them): the members in the run's order, as indices into the
    group. Why not argsort the group: two gathers cost half the sort (9 groups × 3 latencies
    on a 10-minute fleet run). Ties may come in another order than the group's own argsort
    would give; what reads it does not see that (`Observations.sorted_time`, whose values
    are the same, and `censored.average_ranks`, which gives ties the mean of their ranks)."""
    # each member's index in the group, as int32 where it fits: half the bytes of cumsum's
    # int64 and no second array for the − 1 (a fifth off each call at 1.7M requests)
    within = np.cumsum(member, dtype=np.int32 if len(member) < 2**31 else np.int64)
    within -= 1
    return within[order[rows_of(member[order])]]


def rows_of(mask: np.ndarray) -> np.ndarray:
    """The indices of a mask's True rows: `values[rows_of(mask)]` is `values[mask]`, the same
    elements in the same order. Why: NumPy gathers through a boolean mask element by element,
    a branch each, and a group's rows interleave with the others' at random, so the branch is
    mispredicted about as often as not; finding the indices once (vectorised) and taking by
    them was 5x faster for three columns of a fleet tenant (issue 35: 864k of the 10-minute
    three-tier run's 1.73M rows, 23.5 -> 4.2 ms), and pays off from the second column on."""
    return np.flatnonzero(mask)


def _mask_key(mask: np.ndarray | None) -> int:
    """A group's key in the memos: 0 for every row, else the hash of its packed mask."""
    return 0 if mask is None else hash(np.packbits(mask).tobytes())


def _per_class(
    values: pd.Series, classes: Sequence[str], slos: Mapping[str, Mapping[str, float | None]]
) -> np.ndarray:
    """Each request's class TTFT target in seconds (NaN where none)."""
    table = np.array(
        [(slos.get(c) or {}).get("ttft") or np.nan for c in classes] + [np.nan], dtype=float
    )
    return table[frame_memo.codes_of(values, classes)]
