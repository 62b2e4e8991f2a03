"""One clock for a Ray run: each actor's offset measured by ping-pong before the run and after
it, the reasons a run is INVALID when an offset is uncertain past the send-lag budget, and the
clock block each actor gets in run.json.

It exists so that the driver's clock handling reads in one place; the arithmetic itself is
`run.ray_clock` (pure). Imports `run.ray_clock`, `run.ray_actor` and `workload`.
"""

from __future__ import annotations

from typing import Any

from fairbench.run.ray_actor import CALL_TIMEOUT_S, ActorRun, now
from fairbench.run.ray_clock import PINGS, ClockOffset, drift, estimate_offset
from fairbench.workload.models import Scenario


def ping(ray: Any, handle: Any, pings: int = PINGS) -> ClockOffset:
    """The actor's clock offset from `pings` round trips of its `clock` method."""
    samples = []
    for _ in range(pings):
        send = now()
        actor_t = ray.get(handle.clock.remote(), timeout=CALL_TIMEOUT_S)
        samples.append((send, int(actor_t), now()))
    return estimate_offset(samples)


def clock_reasons(actors: list[ActorRun], scn: Scenario) -> list[str]:
    """Why the run is INVALID: each actor whose offset is uncertain past the send-lag budget."""
    budget_ns = scn.health.max_send_lag_p99 * 1e9
    reasons = []
    for actor in actors:
        if actor.before is None:
            continue
        bound = drift(actor.before, actor.after).uncertainty_ns
        if bound > budget_ns:
            reasons.append(
                f"ray actor {actor.k} ({actor.node.get('hostname', '?')}): clock offset "
                f"uncertain by {bound / 1e6:.2f} ms > the {budget_ns / 1e6:g} ms send-lag budget"
            )
    return reasons


def clock_json(a: ActorRun) -> dict[str, Any]:
    """An actor's offsets before and after the run, its drift and whether it was corrected."""
    clock: dict[str, Any] = {"before": a.before.as_dict() if a.before else None}
    if a.before is not None:
        d = drift(a.before, a.after)
        clock.update(
            after=a.after.as_dict() if a.after else None,
            drift_ns=d.drift_ns,
            drift_corrected=d.significant,
            uncertainty_ns=d.uncertainty_ns,
        )
    return clock
