"""Isolation with a floor: a ratio is flagged only where the difference matters.

Why: a tenant's TTFT p99 in the mix ÷ alone reads 2.18× when the absolute change is 8 ms and
every SLO holds (issue 33). A ratio of small numbers is not interference anyone feels, so each
tenant's figure carries the absolute difference and a verdict: not flagged when both sides meet
the tenant's TTFT SLO (the strictest of its classes'), or when they differ by less than
`FLOOR_MS`; flagged otherwise, with the reason in words.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FLOOR_MS = 10.0  # a change in TTFT p99 smaller than this is not flagged, whatever the ratio


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
