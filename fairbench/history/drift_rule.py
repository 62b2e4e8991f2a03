"""The gate's drift rule: `drift(ttft_p99, window=14d, baseline=28d) <= 5%`.

Optional arguments: `group=tenant.X`, `scenario=NAME` (default: the newest run's),
`db=FILE` (default reports/history.duckdb, relative to where the gate runs). The figure is the
relative change of the last window against the baseline before it, with its 95% interval
(fairbench.history.trends.drift), and the rule is judged on the interval, like the gate's
relative rules: `<= X%` fails only when the interval's low end exceeds X% (the drift is shown
to be larger than allowed), `>= X%` only when its high end is below X%. A history too short for
the windows, or a store that cannot be read, is `cannot evaluate` (the gate's exit 2).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from fairbench.history.errors import HistoryError
from fairbench.history.windows import parse_window

_RULE = re.compile(
    r"^\s*drift\(\s*([A-Za-z0-9_.\-]+)\s*((?:,\s*[a-z]+\s*=\s*[^,)\s]+\s*)*)\)\s*"
    r"(<=|>=|<|>)\s*(-?[0-9]*\.?[0-9]+)\s*%\s*$"
)
_ARGS = {"window", "baseline", "group", "scenario", "db"}


@dataclass(frozen=True)
class DriftRule:
    text: str
    metric: str
    op: str
    threshold: float  # a fraction
    window_s: float
    baseline_s: float
    group: str | None = None
    scenario: str | None = None
    db: Path = Path("reports/history.duckdb")
    relative: bool = False  # the gate's Rule has it; a drift rule needs no --baseline


def is_drift(text: str) -> bool:
    return text.strip().startswith("drift(")


def parse(text: str) -> DriftRule:
    """A drift rule, or HistoryError (one line) saying how to write one."""
    m = _RULE.match(text)
    if not m:
        raise HistoryError(
            f"cannot read {text!r}; write 'drift(METRIC, window=14d, baseline=28d) <= 5%'"
        )
    args: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in m.group(2).split(","))):
        key, _, value = part.partition("=")
        key = key.strip()
        if key not in _ARGS:
            raise HistoryError(f"{text!r}: unknown argument {key!r} (known: {sorted(_ARGS)})")
        args[key] = value.strip()
    window = parse_window(args.get("window", "14d"), "window")
    baseline = parse_window(args.get("baseline", args.get("window", "14d")), "baseline")
    name, group = m.group(1), args.get("group")
    head, _, rest = name.partition(".")
    if rest and group is None:  # ttft_p99.tenant.vip
        name, group = head, rest
    return DriftRule(
        text.strip(),
        name,
        m.group(3),
        float(m.group(4)) / 100,
        window,
        baseline,
        group,
        args.get("scenario"),
        Path(args.get("db", "reports/history.duckdb")),
    )


def evaluate(rule: DriftRule) -> tuple[str, str, str]:
    """(outcome pass|fail|error, the drift as shown, detail)."""
    from fairbench.history import trends
    from fairbench.history.view import load_points

    try:
        points, scenario = load_points(rule.db, rule.metric, rule.group, rule.scenario)
    except HistoryError as error:
        return "error", "-", f"cannot evaluate: {error}"
    d = trends.drift(points, rule.window_s, rule.baseline_s)
    if d["status"] != "ok":
        return "error", "-", f"cannot evaluate: {d['reason']}"
    rel, low, high = float(d["relative"]), float(d["ci_low"]), float(d["ci_high"])  # type: ignore[arg-type]
    shown = f"{rel:+.1%}"
    detail = (
        f"{scenario}: window mean {d['window_mean']:.4g} ({d['n_window']} runs) vs baseline "
        f"{d['baseline_mean']:.4g} ({d['n_baseline']} runs); 95% CI {low:+.1%}..{high:+.1%}"
    )
    if rule.op in ("<=", "<"):
        failed = low > rule.threshold if rule.op == "<=" else low >= rule.threshold
        if not failed and d.get("lower_bound"):
            return "fail", "≥ " + shown, detail + "; the window holds lower bounds (censored)"
    else:
        failed = high < rule.threshold if rule.op == ">=" else high <= rule.threshold
    return ("fail" if failed else "pass"), shown, detail
