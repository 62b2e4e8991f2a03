"""Window lengths as people write them: `14d`, `12h`, `90min`, `30s`, `2w` -> seconds."""

from __future__ import annotations

import re

from fairbench.history.errors import HistoryError

_UNITS = {"s": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_WINDOW = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(s|min|m|h|d|w)\s*$")


def parse_window(text: str, what: str = "--window") -> float:
    match = _WINDOW.match(str(text))
    if not match or float(match.group(1)) <= 0:
        raise HistoryError(f"{what}: {text!r} is not a window; write e.g. 14d, 12h, 90min or 2w")
    return float(match.group(1)) * _UNITS[match.group(2)]
