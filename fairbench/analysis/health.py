"""Generator health: was the load actually offered as planned? (MLPerf LoadGen's VALID/INVALID.)

A run is INVALID, with the reason, when the generator's send lag p99 exceeds the threshold
(default 5 ms), when a tenant's achieved send rate falls below `min_rate_ratio` of its planned
rate, or when the run was stopped before its schedule ended. Latency from a late generator is
still recorded (from the intended time), but the offered load was not the plan's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from fairbench.analysis.metrics import percentiles, send_lag_ns
from fairbench.workload.scenario import Scenario


def _rate(times_ns: np.ndarray) -> float | None:
    if len(times_ns) < 2:
        return None
    span = float(times_ns.max() - times_ns.min())
    return (len(times_ns) - 1) / (span / 1e9) if span > 0 else None


def generator_health(
    records: pd.DataFrame,
    scn: Scenario,
    loop_lag_ns: np.ndarray | None = None,
    stopped: bool = False,
    virtual: bool = False,
) -> dict[str, Any]:
    lag = send_lag_ns(records)
    lag_ms = {
        k: (None if v is None else round(v / 1e6, 4)) for k, v in percentiles(lag, (50, 99)).items()
    }
    lag_ms["max"] = round(float(lag.max()) / 1e6, 4) if len(lag) else None
    threshold_ms = scn.health.max_send_lag_p99 * 1e3
    closed = scn.run.concurrency_cap
    reasons: list[str] = []
    if stopped:
        reasons.append("the run was stopped before its schedule ended")
    # In a closed-loop run the send lag is the wait for a free slot, by design: reported, and
    # the whole run is labelled closed-loop instead of judged by it.
    if closed is None and lag_ms["p99"] is not None and lag_ms["p99"] > threshold_ms:
        reasons.append(
            f"generator fell behind: send lag p99 {lag_ms['p99']:.2f} ms > {threshold_ms:g} ms"
        )
    tenants: dict[str, Any] = {}
    sent_mask = records["t_sent_ns"].notna().to_numpy()
    intended = records["t_intended_ns"].to_numpy(dtype=np.int64)
    sent = records["t_sent_ns"].to_numpy(dtype=np.float64, na_value=np.nan)
    names = records["tenant"].to_numpy()
    for tenant in sorted(set(names)):
        rows = names == tenant
        planned_rate = _rate(intended[rows])
        achieved_rate = _rate(sent[rows & sent_mask].astype(np.int64))
        ratio = None
        if planned_rate and achieved_rate is not None:
            ratio = achieved_rate / planned_rate
        tenants[tenant] = {
            "planned": int(rows.sum()),
            "sent": int((rows & sent_mask).sum()),
            "planned_rate_per_s": planned_rate,
            "achieved_rate_per_s": achieved_rate,
            "rate_ratio": ratio,
        }
        if ratio is not None and ratio < scn.health.min_rate_ratio and not stopped and not closed:
            reasons.append(
                f"tenant {tenant}: achieved send rate {ratio:.3f} of planned "
                f"(< {scn.health.min_rate_ratio:g})"
            )
    loop = None
    if loop_lag_ns is not None and len(loop_lag_ns):
        loop = {
            k: (None if v is None else round(v / 1e6, 4))
            for k, v in percentiles(loop_lag_ns.astype(np.float64), (50, 99)).items()
        }
    return {
        "closed_loop": None
        if closed is None
        else {
            "concurrency_cap": closed,
            "note": "closed loop: send lag is the wait for one of the capped slots",
        },
        "virtual_time": virtual,
        "send_lag_ms": lag_ms,
        "send_lag_threshold_ms": threshold_ms,
        "event_loop_lag_ms": loop,
        "tenants": tenants,
        "invalid_reasons": reasons,
        "valid": not reasons,
    }
