"""`fairbench gate`: rules over a candidate run (and a baseline) -> pass / fail, for CI.

Rules file:

    rules:
      - valid == true
      - worst_slowdown_ratio <= 5
      - slo_attainment.interactive >= 0.2
      - tenants.support-bot.latency_ms.ttft.p99 <= 4000
      - "tenants.support-bot.latency_ms.ttft.p99: no significant increase > 20%"
      - "goodput: no significant decrease > 10%"

Absolute rules compare a candidate figure with a number (or true/false). Relative rules compare
with the baseline against *run-to-run noise*: the baseline is several replicated runs of the
trusted configuration (different seeds; `--baseline` repeated, or a directory of summaries), and
a figure fails only when the candidate lies outside the baseline runs' 95% prediction interval
(Student t with k − 1 degrees of freedom on the runs' log values: mean ± t · SD · √(1 + 1/k)) in
the rule's direction *and* the change against the baseline's geometric mean exceeds the stated
size. With m relative rules each band is at 1 − 5%/m (Bonferroni), so pure noise fails a gate
at most 2.5% of the time (one side of each band). Each run's own interval says nothing about
the next run (12 seeds of one configuration, every ordered pair, failed 26–64 of 132 pairs on
them), so a relative rule with fewer than MIN_BASELINE_RUNS baseline runs — or runs that do not
vary, copies of one seed — is `cannot evaluate`, naming what would do. Figures are named as the
registry names them (fairbench.analysis.registry: `ttft_p99`, `ttft_p99.tenant.support-bot`,
`slo_attainment.class.interactive` or `slo_attainment.interactive`, `service_difference`, …;
`fairbench metrics` lists them) or by a dotted path into summary.json. An unknown name is a
one-line error with a did-you-mean, before anything is evaluated.

A figure that is only a lower bound (a percentile in censored mass: unfinished requests) passes
a rule only when the bound alone proves it (`ttft_p99 >= 100` with p99 ≥ 3,000 ms); a bound that
cannot show an upper limit holds fails the rule, saying so — a censored tail never passes a
latency ceiling.

Exit codes: 0 every rule passed; 1 a rule failed (a regression); 2 the gate could not be
evaluated — an INVALID candidate or baseline, a baseline of another scenario or plan shape,
a missing figure, a relative rule without a replicated baseline — with the reason.
"""

from __future__ import annotations

import difflib
import json
import math
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scipy import stats as sps

from fairbench.analysis import registry
from fairbench.analysis.registry import MetricError, metric_value
from fairbench.history import drift_rule
from fairbench.history.errors import HistoryError
from fairbench.workload.loading import read_yaml

_ABSOLUTE = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*(>=|<=|==|!=|>|<)\s*(\S+)\s*$")
_RELATIVE = re.compile(
    r"^\s*([A-Za-z0-9_.\-]+)\s*:\s*no\s+significant\s+(increase|decrease)\s*>\s*"
    r"([0-9]*\.?[0-9]+)\s*%\s*$"
)
_OPS = {
    ">=": lambda a, b: a >= b,
    "<=": lambda a, b: a <= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    ">": lambda a, b: a > b,
    "<": lambda a, b: a < b,
}


MIN_BASELINE_RUNS = 3  # the fewest replicated baseline runs a relative rule is judged on
# The noise band's level for one relative rule; with m relative rules each band is at
# 1 − 5%/m (Bonferroni), and a rule looks at one side, so noise fails a gate ≤ 2.5% of the time.
CONFIDENCE = 0.95


class GateError(Exception):
    """A rules file that cannot be used: one line per problem."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class Rule:
    text: str
    metric: str
    relative: bool
    op: str = ""
    value: float | bool = 0.0
    direction: str = ""  # increase | decrease
    threshold: float = 0.0  # fraction


@dataclass
class Result:
    rule: Rule
    outcome: str  # pass | fail | error
    candidate: str = "-"
    baseline: str = "-"
    detail: str = ""


def parse_rules(data: Any) -> list[Rule]:
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list) or not data["rules"]:
        raise GateError(["rules: the file needs a non-empty list under `rules:`"])
    rules, problems = [], []
    for i, item in enumerate(data["rules"]):
        at = f"rules[{i}]"
        if isinstance(item, dict) and len(item) == 1:  # YAML read `a: no significant ...` as a map
            key, value = next(iter(item.items()))
            item = f"{key}: {value}"
        if not isinstance(item, str):
            problems.append(f"{at}: a rule is a string like 'jain >= 0.9', got {item!r}")
            continue
        if drift_rule.is_drift(item):  # a drift over the history store (fairbench.history)
            try:
                rules.append(drift_rule.parse(item))  # type: ignore[arg-type]
            except HistoryError as error:
                problems.append(f"{at}: {error}")
            continue
        m = _RELATIVE.match(item) or _ABSOLUTE.match(item)
        if m and m.group(1) != "valid":
            try:
                registry.parse_name(m.group(1))
            except MetricError as error:
                problems.append(f"{at}: {error}")
                continue
        if m := _RELATIVE.match(item):
            rules.append(
                Rule(
                    item.strip(),
                    m.group(1),
                    True,
                    direction=m.group(2),
                    threshold=float(m.group(3)) / 100,
                )
            )
            continue
        if m := _ABSOLUTE.match(item):
            raw = m.group(3)
            if raw.lower() in ("true", "false"):
                value: float | bool = raw.lower() == "true"
            else:
                try:
                    value = float(raw)
                except ValueError:
                    problems.append(f"{at}: {raw!r} is not a number or true/false in {item!r}")
                    continue
            rules.append(Rule(item.strip(), m.group(1), False, op=m.group(2), value=value))
            continue
        problems.append(
            f"{at}: cannot read {item!r}; write 'METRIC OP NUMBER' (ops: >= <= > < "
            "== !=) or 'METRIC: no significant increase|decrease > N%'"
        )
    if problems:
        raise GateError(problems)
    return rules


def load_rules(path: Path) -> list[Rule]:
    try:
        return parse_rules(read_yaml(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise GateError([f"{path}: file not found"]) from None


def load_summary(path: Path) -> dict[str, Any]:
    """A run directory or a summary.json; one line (a GateError, exit 2) when it is missing,
    unreadable, not JSON, or not a summary object, never a traceback."""
    file = path / "summary.json" if path.is_dir() else path
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        hint = (
            "the run did not finish (its summary is written last) or this is not a run directory"
            if path.is_dir()
            else "give a run directory or its summary.json"
        )
        raise GateError([f"{file}: no summary here; {hint}"]) from None
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise GateError([f"{file}: cannot read the summary ({reason})"]) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise GateError(
            [
                f"{file}: not valid JSON (line {error.lineno}, column {error.colno}: "
                f"{error.msg}); give a run's summary.json as fairbench wrote it"
            ]
        ) from None
    if not isinstance(data, dict) or "valid" not in data:
        raise GateError([f"{file}: not a fairbench summary (a JSON object with `valid`)"])
    return data


def load_baselines(paths: list[Path]) -> list[dict[str, Any]]:
    """Replicated baseline runs: each path a run directory, a summary.json, or a directory of
    them (its `*.json` files and the run directories under it, in name order)."""
    summaries = []
    for path in paths:
        if path.is_dir() and not (path / "summary.json").exists():
            found = sorted(
                [f for f in path.glob("*.json") if f.is_file()]
                + [d for d in path.iterdir() if (d / "summary.json").is_file()]
            )
            if not found:
                raise GateError(
                    [f"{path}: no run directory, summary.json or directory of summaries here"]
                )
            summaries += [load_summary(f) for f in found]
        else:
            summaries.append(load_summary(path))
    return summaries


def noise_band(values: list[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(centre, low, high) of where one more run of the baseline's configuration falls: the
    geometric mean of the replicated runs and their prediction interval, Student t with k − 1
    degrees of freedom on log values (latencies and rates are right-skewed and their run-to-run
    spread scales with them): exp(m ± t · s · √(1 + 1/k)). Needs k ≥ 2 positive values."""
    logs = [math.log(v) for v in values]
    k = len(logs)
    mean = sum(logs) / k
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (k - 1))
    half = float(sps.t.ppf(0.5 + confidence / 2, k - 1)) * sd * math.sqrt(1 + 1 / k)
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def _relative(
    rule: Rule, cand: float, shown: str, bound: bool, bases: list[dict[str, Any]], level: float
) -> Result:
    """A relative rule against replicated baseline runs (see the module docstring), its band
    at `level` (two-sided; the rule looks at one side)."""
    k = len(bases)
    values = [_value(b, rule.metric) for b in bases]
    if any(v is None or isinstance(v, bool) for v in values):
        return Result(rule, "error", shown, "-", "no such figure in every baseline run")
    if any(_bound(b, rule.metric) for b in bases):
        return Result(
            rule,
            "error",
            shown,
            "-",
            "a baseline value is only a lower bound: no change can be measured against it "
            "(regenerate the baseline with fewer unfinished requests)",
        )
    base_values = [float(v) for v in values]  # type: ignore[arg-type]
    if k < MIN_BASELINE_RUNS:
        return Result(
            rule,
            "error",
            shown,
            _fmt(base_values[0]) if k == 1 else "-",
            f"baseline has {k} run{'s' if k != 1 else ''}: run-to-run noise needs "
            f"≥ {MIN_BASELINE_RUNS} replicated runs (repeat --baseline with runs of other "
            "seeds) or `fairbench ab`",
        )
    if min(base_values) <= 0 or not cand > 0:
        return Result(
            rule, "error", shown, "-", "a relative rule needs positive values in every run"
        )
    if len(set(base_values)) == 1:
        return Result(
            rule,
            "error",
            shown,
            _fmt(base_values[0]),
            f"the {k} baseline runs are identical (copies of one seed?): they show no "
            "run-to-run noise; replicate with other seeds",
        )
    centre, low, high = noise_band(base_values, level)
    change = cand / centre - 1
    if rule.direction == "increase":
        outside, big = cand > high, change > rule.threshold
    else:
        outside, big = cand < low, -change > rule.threshold
    detail = (
        f"{change:+.1%} vs {k} runs' geometric mean; noise band {_fmt(low)}..{_fmt(high)} "
        f"({100 * level:.3g}% prediction, t on log values)"
    )
    base_shown = f"{_fmt(centre)} ({k} runs)"
    if outside and big:
        return Result(rule, "fail", shown, base_shown, detail)
    if bound and rule.direction == "increase":
        detail += "; the candidate's value is only a lower bound (unfinished requests)"
        return Result(rule, "fail", shown, base_shown, detail)
    detail += " (within noise)" if not outside else " (within the allowance)"
    return Result(rule, "pass", shown, base_shown, detail)


def _bound(summary: dict[str, Any], name: str) -> bool:
    """Whether the figure is only a lower bound (a percentile in censored mass)."""
    if registry.parse_name(name) is not None:
        return registry.is_lower_bound(summary, name)
    parts = name.split(".")
    node: Any = summary
    for key in parts[:-1]:
        if not isinstance(node, dict):
            return False
        node = node.get(key)
    return isinstance(node, dict) and parts[-1] in (node.get("lower_bound") or [])


def _value(summary: dict[str, Any], name: str) -> float | bool | None:
    if name == "valid":
        return bool(summary.get("valid"))
    value = metric_value(summary, name)
    return None if math.isnan(value) else value


def _known_names(summary: dict[str, Any]) -> list[str]:
    return ["valid", *registry.known_names(summary)]


def _fmt(value: float | bool | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:.4g}"


def evaluate(
    rules: list[Rule],
    baseline: dict[str, Any] | list[dict[str, Any]] | None,
    candidate: dict[str, Any],
) -> tuple[list[Result], str | None]:
    """Results per rule, and a reason the whole gate cannot be evaluated (or None). The
    baseline is one summary or several replicated runs of the trusted configuration."""
    bases = [] if baseline is None else [baseline] if isinstance(baseline, dict) else baseline
    blocker = None
    for base in bases:
        for key in ("scenario", "schema_version"):
            if base.get(key) != candidate.get(key):
                blocker = (
                    f"baseline and candidate differ in {key}: {base.get(key)!r} vs "
                    f"{candidate.get(key)!r}"
                )
        if not base.get("valid", False):
            blocker = "the baseline run is INVALID: " + "; ".join(base.get("invalid_reasons", []))
    if not candidate.get("valid", False):
        blocker = "the candidate run is INVALID: " + "; ".join(
            candidate.get("invalid_reasons", []) or ["no reason recorded"]
        )
    results = []
    relative = sum(isinstance(r, Rule) and r.relative for r in rules)
    level = 1 - (1 - CONFIDENCE) / max(relative, 1)  # Bonferroni over the relative rules
    for rule in rules:
        if isinstance(rule, drift_rule.DriftRule):
            outcome, shown, detail = drift_rule.evaluate(rule)
            results.append(Result(rule, outcome, shown, detail=detail))  # type: ignore[arg-type]
            continue
        cand = _value(candidate, rule.metric)
        if cand is None:
            close = difflib.get_close_matches(rule.metric, _known_names(candidate), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            results.append(
                Result(rule, "error", detail=f"no figure {rule.metric!r} in the candidate{hint}")
            )
            continue
        if rule.metric != "valid" and not candidate.get("valid", False):
            results.append(Result(rule, "error", _fmt(cand), detail="the candidate run is INVALID"))
            continue
        bound = rule.metric != "valid" and _bound(candidate, rule.metric)
        shown = ("≥ " if bound else "") + _fmt(cand)
        if not rule.relative:
            ok = _OPS[rule.op](cand, rule.value)
            detail = f"needs {rule.op} {_fmt(rule.value)}"
            if bound and ok and rule.op not in (">=", ">"):
                ok = False
                detail += "; the value is only a lower bound (unfinished requests), so it cannot "
                detail += "show the rule holds"
            results.append(Result(rule, "pass" if ok else "fail", shown, detail=detail))
            continue
        if not bases:
            results.append(Result(rule, "error", _fmt(cand), detail="needs --baseline"))
            continue
        results.append(_relative(rule, float(cand), shown, bound, bases, level))
    return results, blocker


def exit_code(results: list[Result], blocker: str | None) -> int:
    if blocker is not None:
        return 2
    if any(r.outcome == "fail" for r in results):
        return 1
    if any(r.outcome == "error" for r in results):
        return 2
    return 0


def as_text(results: list[Result], blocker: str | None) -> str:
    """A plain, stable table (golden-tested; no colour, no terminal width)."""
    head = ["rule", "result", "candidate", "baseline", "detail"]
    rows = [[r.rule.text, r.outcome.upper(), r.candidate, r.baseline, r.detail] for r in results]
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))  # noqa: E731
    out = [line(head).rstrip(), "  ".join("-" * w for w in widths)]
    out += [line(row).rstrip() for row in rows]
    verdict = {0: "PASS", 1: "FAIL: regression", 2: "CANNOT EVALUATE"}[exit_code(results, blocker)]
    if blocker:
        out.append(f"cannot evaluate: {blocker}")
    out.append(f"gate: {verdict}")
    return "\n".join(out) + "\n"


def as_junit(results: list[Result], blocker: str | None) -> str:
    failures = sum(r.outcome == "fail" for r in results)
    errors = sum(r.outcome == "error" for r in results) + (1 if blocker else 0)
    suite = ET.Element(
        "testsuite",
        name="fairbench gate",
        tests=str(len(results)),
        failures=str(failures),
        errors=str(errors),
    )
    for r in results:
        case = ET.SubElement(suite, "testcase", classname="fairbench.gate", name=r.rule.text)
        message = f"candidate {r.candidate}, baseline {r.baseline}: {r.detail}"
        if r.outcome == "fail":
            ET.SubElement(case, "failure", message=message)
        elif r.outcome == "error":
            ET.SubElement(case, "error", message=message)
        elif r.detail:
            ET.SubElement(case, "system-out").text = message
    if blocker:
        case = ET.SubElement(suite, "testcase", classname="fairbench.gate", name="comparable runs")
        ET.SubElement(case, "error", message=blocker)
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode") + "\n"


def as_markdown(results: list[Result], blocker: str | None) -> str:
    code = exit_code(results, blocker)
    icon = {"pass": "✅", "fail": "❌", "error": "⚠️"}
    out = [f"### fairbench gate: {['PASS', 'FAIL (regression)', 'CANNOT EVALUATE'][code]}", ""]
    if blocker:
        out += [f"> cannot evaluate: {blocker}", ""]
    out += ["| rule | result | candidate | baseline | detail |", "|---|---|---|---|---|"]
    for r in results:
        text = r.rule.text.replace("|", "\\|")
        out.append(
            f"| `{text}` | {icon[r.outcome]} {r.outcome} | {r.candidate} | {r.baseline} "
            f"| {r.detail} |"
        )
    return "\n".join(out) + "\n"
