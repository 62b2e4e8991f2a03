"""One clock across machines: a remote generator's monotonic-clock offset, and its error bound.

CLOCK_MONOTONIC is per machine: two hosts' readings differ by an arbitrary constant (and drift a
few ppm apart). The driver estimates each Ray actor's offset by ping-pong: it stamps `send`,
the actor returns its own clock `actor_t`, the driver stamps `recv`. The actor read its clock
somewhere inside the round trip, so `offset = actor_t - (send + recv) / 2` is wrong by at most
`RTT / 2`. Of many pings only the tightest round trips are kept (queueing inflates the others):
the estimate is the mean of the `k` tightest midpoints, each within `RTT_k / 2` of the truth, so
the mean is too. The driver sets each actor's t0 to `t0_driver + offset`, so intended send times
agree across machines to within that bound; a bound larger than the send-lag budget makes the run
INVALID (the schedule itself could be off by more than the lateness we promise to detect).

Pure arithmetic: the caller supplies the samples (no clock is read here).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

PINGS = 40  # round trips per estimate
TIGHTEST = 5  # of which the k smallest RTTs are kept


@dataclass(frozen=True)
class ClockOffset:
    """actor clock − driver clock, in ns, with its bound (|error| ≤ uncertainty_ns)."""

    offset_ns: int
    uncertainty_ns: int
    rtt_min_ns: int
    samples: int
    kept: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def estimate_offset(samples: list[tuple[int, int, int]], k: int = TIGHTEST) -> ClockOffset:
    """From (send, actor_t, recv) triples: the offset and its bound, from the k tightest RTTs."""
    if not samples:
        raise ValueError("no clock samples: the actor never answered a ping")
    good = [s for s in samples if s[2] >= s[0]]
    if not good:
        raise ValueError("clock samples with recv before send: the driver's clock is not monotonic")
    tight = sorted(good, key=lambda s: s[2] - s[0])[: max(1, k)]
    mids = [actor - (send + recv) / 2 for send, actor, recv in tight]
    worst_rtt = max(recv - send for send, _, recv in tight)
    return ClockOffset(
        offset_ns=round(sum(mids) / len(mids)),
        uncertainty_ns=(worst_rtt + 1) // 2,
        rtt_min_ns=tight[0][2] - tight[0][0],
        samples=len(samples),
        kept=len(tight),
    )


@dataclass(frozen=True)
class Drift:
    """How an actor's offset moved between the estimates before and after the run."""

    drift_ns: int  # offset after − offset before
    significant: bool  # larger than the two estimates' bounds together: a real rate difference
    uncertainty_ns: int  # the bound on any record's time on the driver's timeline


def drift(before: ClockOffset, after: ClockOffset | None) -> Drift:
    """The drift over the run and the resulting bound on converted times.

    Without an `after` estimate (the actor died) the bound is the start estimate's alone. A drift
    within the estimates' noise is not a drift: correcting for it would only add that noise.
    """
    if after is None:
        return Drift(0, False, before.uncertainty_ns)
    moved = after.offset_ns - before.offset_ns
    noise = before.uncertainty_ns + after.uncertainty_ns
    significant = abs(moved) > noise
    bound = max(before.uncertainty_ns, after.uncertainty_ns) + (abs(moved) if significant else 0)
    return Drift(moved, significant, bound)


TIME_FIELDS = (
    "t_intended_ns",
    "t_sent_ns",
    "t_first_byte_ns",
    "t_first_token_ns",
    "t_last_token_ns",
    "t_done_ns",
    "t_end_ns",
)


def to_driver_timeline(row: dict[str, Any], d: Drift, span_ns: int) -> dict[str, Any]:
    """A record's times on the driver's timeline.

    Record times are relative to t0, and each actor's t0 is the driver's t0 in the actor's clock,
    so relative times already agree up to the offset's bound: no shift is needed. What remains is
    drift: where it is significant, the actor's clock ran `drift_ns` ahead over `span_ns`, and a
    time `t` after t0 is corrected by `-drift_ns * t / span_ns` (linear in t). Durations inside
    one record change by parts per million; intended times move with the actor's schedule,
    which is what the driver's clock saw.
    """
    if not d.significant or span_ns <= 0:
        return row
    rate = d.drift_ns / span_ns
    for name in TIME_FIELDS:
        value = row.get(name)
        if value is not None:
            row[name] = int(value - round(value * rate))
    return row
