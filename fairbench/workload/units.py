"""Human units for scenario files: durations (`300ms`, `2s`, `5min`) and rates (`20/s`, `5/min`).

Scenario authors think in milliseconds and requests per second; the code thinks in seconds
(floats, for configuration) and integer nanoseconds (for plans and records). Parsing happens
once, at load time, so a typo is reported with its field path instead of surfacing mid-run.
"""

from __future__ import annotations

import math
import re

NS_PER_S = 1_000_000_000

_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
}
_RATE_UNITS = {"s": 1.0, "sec": 1.0, "m": 1 / 60, "min": 1 / 60, "h": 1 / 3600}
_NUMBER = r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?"
_DURATION_RE = re.compile(rf"^\s*({_NUMBER})\s*([a-zµ]*)\s*$")
_RATE_RE = re.compile(rf"^\s*({_NUMBER})\s*/\s*([a-z]+)\s*$")


def _finite(value: float, text: object) -> float:
    if not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {text!r}")
    return value


def parse_duration(value: object) -> float:
    """Seconds from `300ms`, `2s`, `1.5min`, `1h`, or a bare number (seconds)."""
    if isinstance(value, bool):
        raise ValueError(f"must be a duration like '300ms' or '2s', got {value!r}")
    if isinstance(value, int | float):
        return _finite(float(value), value)
    if not isinstance(value, str):
        raise ValueError(f"must be a duration like '300ms' or '2s', got {value!r}")
    match = _DURATION_RE.match(value.lower())
    if not match or match.group(2) not in ("", *_DURATION_UNITS):
        raise ValueError(
            f"must be a duration like '300ms', '2s' or '5min' (units: ns, us, ms, s, min, h), "
            f"got {value!r}"
        )
    number = _finite(float(match.group(1)), value)
    return number * _DURATION_UNITS.get(match.group(2) or "s", 1.0)


def parse_rate(value: object) -> float:
    """Events per second from `20/s`, `5/min`, `100/h`, or a bare number (per second)."""
    if isinstance(value, bool):
        raise ValueError(f"must be a rate like '20/s' or '5/min', got {value!r}")
    if isinstance(value, int | float):
        return _finite(float(value), value)
    if not isinstance(value, str):
        raise ValueError(f"must be a rate like '20/s' or '5/min', got {value!r}")
    text = value.lower()
    match = _RATE_RE.match(text)
    if match and match.group(2) in _RATE_UNITS:
        return _finite(float(match.group(1)), value) * _RATE_UNITS[match.group(2)]
    try:
        return _finite(float(text), value)
    except ValueError:
        raise ValueError(f"must be a rate like '20/s', '5/min' or '100/h', got {value!r}") from None


def seconds_to_ns(seconds: float) -> int:
    return round(seconds * NS_PER_S)
