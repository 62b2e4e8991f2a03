"""Generator health per Ray actor: which generator fell behind, not only that one did.

A run split over machines can be late on one node alone (a busy host, a slow NIC) while the
whole run's send-lag p99 still passes. Each actor's records (the `worker` column) and loop-lag
samples get the same judgement as the whole run (`generator_health`); an actor that fails it
makes the run INVALID with the actor named.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from fairbench.analysis.health import generator_health
from fairbench.workload.models import Scenario

STOPPED = "the run was stopped before its schedule ended"


def actor_health(
    records: pd.DataFrame,
    scn: Scenario,
    actors: list[dict[str, Any]],
    loop_lags: dict[int, np.ndarray] | None,
    stopped: bool = False,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Per actor: send lag, achieved rates and loop lag; and the reasons naming late actors."""
    out: list[dict[str, Any]] = []
    reasons: list[str] = []
    workers = records["worker"].to_numpy()
    for actor in actors:
        k = int(actor["worker"])
        frame = records[workers == k].reset_index(drop=True)
        lags = (loop_lags or {}).get(k)
        health = generator_health(frame, scn, lags, stopped=stopped)
        where = f"ray actor {k} ({actor.get('hostname', '?')})"
        own = [r for r in health["invalid_reasons"] if r != STOPPED]
        if actor.get("status") == "finished":  # a dead actor is the incomplete reason already
            reasons += [f"{where}: {reason}" for reason in own]
        out.append(
            {
                "worker": k,
                "hostname": actor.get("hostname"),
                "node_id": actor.get("node_id"),
                "send_lag_ms": health["send_lag_ms"],
                "event_loop_lag_ms": health["event_loop_lag_ms"],
                "achieved_rate_per_s": {
                    t: v["achieved_rate_per_s"] for t, v in health["tenants"].items()
                },
                "rate_ratio": {t: v["rate_ratio"] for t, v in health["tenants"].items()},
                "valid": not own,
                "invalid_reasons": own,
            }
        )
    return out, reasons
