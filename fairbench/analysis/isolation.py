"""Isolation with a floor: a ratio is flagged only where the difference matters.

Why: a tenant's TTFT p99 in the mix ÷ alone reads 2.18× when the absolute change is 8 ms and
every SLO holds (issue 33). A ratio of small numbers is not interference anyone feels, so each
tenant's figure carries the absolute difference and a verdict: not flagged when both sides meet
the tenant's TTFT SLO (the strictest of its classes'), or when they differ by less than
`FLOOR_MS`; flagged otherwise, with the reason in words.

The solo arms cost one more simulation per tenant (together about as many requests as the mix,
measured at 17 s of a 35 s fleet run in issue 35), so they run only when asked
(`analysis.isolation`): `skip_reason` decides, and the summary carries its sentence when they
were skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FLOOR_MS = 10.0  # a change in TTFT p99 smaller than this is not flagged, whatever the ratio
# `auto` runs the solo arms up to this many planned requests. Every shipped scenario but the
# fleet is under 60,000 (mixed-three-tenants, 10 min: 19,650), where the arms add seconds; the
# 60 s fleet (192k) spent half its wall on them. At this size the arms cost about as much as the
# mix again (a few seconds on one core), which a person waiting for one run still accepts.
AUTO_MAX_REQUESTS = 100_000


def isolation_detail(
    mix_p99_ms: Mapping[str, float | None],
    solo_p99_ms: Mapping[str, float | None],
    slo_ms: Mapping[str, float | None],
    floor_ms: float = FLOOR_MS,
) -> dict[str, dict[str, Any]]:
    """Per tenant with both sides: the ratio, the absolute difference (ms), and whether it is
    flagged, with why (`within the SLO on both sides`, `under the 10 ms floor`, or `worse by
    N ms and over the SLO`)."""
    out: dict[str, dict[str, Any]] = {}
    for tenant, mix in mix_p99_ms.items():
        solo = solo_p99_ms.get(tenant)
        if mix is None or solo is None or solo <= 0:
            continue
        diff = mix - solo
        slo = slo_ms.get(tenant)
        if slo is not None and mix <= slo and solo <= slo:
            flagged, why = False, f"within the {slo:g} ms TTFT SLO on both sides"
        elif abs(diff) < floor_ms:
            flagged, why = False, f"under the {floor_ms:g} ms floor"
        else:
            flagged, why = diff > 0, f"{'worse' if diff > 0 else 'better'} by {abs(diff):,.1f} ms"
        out[tenant] = {
            "ratio": round(mix / solo, 6),
            "difference_ms": round(diff, 4),
            "flagged": flagged,
            "why": why,
            "floor_ms": floor_ms,
        }
    return out


def skip_reason(setting: str, planned: int, simulated: bool) -> str | None:
    """Why isolation's solo arms are not run, in words, or None when they are.

    `setting` is the scenario's `analysis.isolation` (auto, on, off); `planned` the plan's
    requests; only a simulated target can replay a tenant alone on the same plan."""
    if not simulated:
        return None  # a live run has no solo arm to skip: the figure never applies
    if setting == "off":
        return "isolation not computed: analysis.isolation is off"
    if setting == "auto" and planned > AUTO_MAX_REQUESTS:
        return (
            f"isolation not computed: {planned:,} planned requests is above the "
            f"{AUTO_MAX_REQUESTS:,} at which analysis.isolation: auto runs the solo arms "
            "(one more simulation per tenant); set analysis.isolation: on to run them"
        )
    return None
