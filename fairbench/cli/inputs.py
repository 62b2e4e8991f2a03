"""Reading what a user names on the command line: scenario files with PATH=VALUE overrides
(`--a`, `--b`, `--set`), run directories, confidence levels.

It exists so that every command refuses bad input the same way: one line that names the file
or the flag and says what would work, raised as `ScenarioError` or `UsageFailure` and printed
by `fairbench.cli.main` without a traceback (exit 2). An overridden scenario is validated like
the file itself, and each problem is blamed on the override that caused it, not on the file.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from fairbench.workload.errors import ScenarioError

if TYPE_CHECKING:
    from fairbench.workload.models import Scenario

# The scenario model (pydantic, numpy) is imported by the functions that read a scenario, not
# here: every command imports this module, and `fairbench --help` must not pay for the model
# (issue 35: about 0.3 s of CPU, most of the help's time).


class UsageFailure(Exception):
    """Bad input found by a command; its lines are printed without a traceback (exit 2)."""

    def __init__(self, *lines: str) -> None:
        self.lines = list(lines)
        super().__init__("\n".join(lines))


# ------------------------------------------------------------------ scenario files


def read_document(file: Path) -> dict[str, Any]:
    """The scenario file as a validated YAML mapping (the file is checked as a scenario first,
    so that a problem in the file is blamed on the file, before any override is applied)."""
    from fairbench.workload.loading import load_scenario, read_yaml

    load_scenario(file)
    data = read_yaml(file.read_text(encoding="utf-8"))
    assert isinstance(data, dict)  # load_scenario refused anything else
    return data


def _rendered(path: list[str | int]) -> str:
    """A resolved path written the way validation errors write field paths: `tenants[1].weight`."""
    out = ""
    for step in path:
        if isinstance(step, int):
            out += f"[{step}]"
        elif re.fullmatch(r"[A-Za-z0-9_-]+", step):
            out += ("." if out else "") + step
        else:
            out += f"[{step!r}]"
    return out


def _sections(raw: dict[str, Any]) -> dict[str, set[str]]:
    """The fields each top-level section can hold, for 'did you mean' hints."""
    from pydantic import BaseModel

    from fairbench.workload.models import Scenario

    found: dict[str, set[str]] = {}
    for name, info in Scenario.model_fields.items():
        kind = info.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            found[name] = set(kind.model_fields)
    scheduler = raw.get("scheduler")
    found["scheduler"] = {"policy", "profile", "max_num_seqs", "max_num_batched_tokens"} | (
        set(scheduler) if isinstance(scheduler, dict) else set()
    )
    return found


def _did_you_mean(key: str, raw: dict[str, Any]) -> str:
    homes = [f"{section}.{key}" for section, keys in _sections(raw).items() if key in keys]
    return f"; did you mean {' or '.join(homes)}?" if homes else ""


def apply_overrides(
    raw: dict[str, Any], items: list[str], flag: str
) -> tuple[dict[str, Any], list[str]]:
    """A copy of the scenario document with each PATH=VALUE of `items` set (VALUE read as YAML),
    and each override's field path as validation errors write it. Tenants are addressed by id
    or index (`tenants.support-bot.weight=3`), workloads by name."""
    from fairbench.workload.loading import read_yaml
    from fairbench.workload.models import Scenario
    from fairbench.workload.paths import set_path  # not decide's: it loads the analysis stack

    data = json.loads(json.dumps(raw))
    placed: list[str] = []
    for item in items:
        path, sep, text = item.partition("=")
        path = path.strip()
        if not sep or not path:
            raise UsageFailure(
                f"{flag} {item}: use PATH=VALUE, e.g. {flag} scheduler.policy=dwrr "
                "or tenants.<id>.weight=3"
            )
        try:
            value = read_yaml(text)
        except yaml.YAMLError:
            raise UsageFailure(
                f"{flag} {item}: the value {text!r} is not valid YAML (quote it)"
            ) from None
        top = path.split(".")[0]
        if top not in Scenario.model_fields:
            raise UsageFailure(
                f"{flag} {item}: {top!r} is not a scenario field{_did_you_mean(top, raw)}"
            )
        try:
            placed.append(_rendered(set_path(data, path, value)))
        except ScenarioError as error:
            raise UsageFailure(
                *(f"{flag} {item}: {line.partition(': ')[2] or line}" for line in error.lines)
            ) from None
    return data, placed


def blame(error: ScenarioError, items: list[str], placed: list[str], flag: str) -> UsageFailure:
    """The validation problems of an overridden scenario, each tied to its override."""
    lines = []
    for line in error.lines:
        field = line.split(": ", 1)[0]
        owner = next(
            (
                item
                for item, where in zip(items, placed, strict=True)
                if field == where
                or field.startswith((where + ".", where + "["))
                or where.startswith((field + ".", field + "["))
            ),
            None,
        )
        if owner is None:
            owner = items[0] if len(items) == 1 else "(the overrides together)"
        lines.append(f"{flag} {owner}: {line}")
    return UsageFailure(*lines)


def scenario_with(
    file: Path, items: list[str] | None, flag: str, raw: dict[str, Any] | None = None
) -> tuple[dict[str, Any], Scenario]:
    """The scenario `file` with `items` applied by `flag`, as (document, validated scenario)."""
    from fairbench.workload.loading import parse_scenario

    raw = read_document(file) if raw is None else raw
    items = list(items or [])
    if not items:
        return raw, parse_scenario(raw, str(file), file.parent)
    data, placed = apply_overrides(raw, items, flag)
    try:
        return data, parse_scenario(data, str(file), file.parent)
    except ScenarioError as error:
        raise blame(error, items, placed, flag) from None


SET_HELP = (
    "override a scenario field, PATH=VALUE (repeat); tenants by id or index "
    "(tenants.<id>.weight=3), workloads by name (workloads.<name>.output_tokens=64)"
)


# ------------------------------------------------------------------ run directories


def run_dir(path: Path, *needs: str) -> Path:
    """`path` if it is a run directory holding `needs` (summary.json by default)."""
    if not path.exists():
        raise UsageFailure(f"{path}: no such run directory")
    if not path.is_dir():
        raise UsageFailure(f"{path}: not a run directory (give the directory `fairbench run` made)")
    for name in needs or ("summary.json",):
        if not (path / name).is_file():
            raise UsageFailure(f"{path}: not a run directory (no {name})")
    return path


def read_summary(path: Path) -> dict[str, Any]:
    """A run's summary.json, given its directory."""
    run_dir(path)
    try:
        summary = json.loads((path / "summary.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageFailure(f"{path / 'summary.json'}: cannot read ({error})") from None
    if not isinstance(summary, dict):
        raise UsageFailure(f"{path / 'summary.json'}: not a summary (expected a JSON object)")
    return summary


# ------------------------------------------------------------------ confidence


CONFIDENCE_HELP = "confidence level of the intervals, in percent (50 to 99.9), e.g. 95 or 99"


def confidence_level(text: str) -> float:
    """`--confidence` (the same in compare and ab): a percentage, returned as a fraction."""
    hint = "--confidence: a level in percent between 50 and 99.9, e.g. 95 or 99"
    clean = text.strip().removesuffix("%")
    if "," in clean:
        raise UsageFailure(
            f"{hint}; the interval width goes in --precision (e.g. --confidence 99 --precision 5)"
        )
    try:
        level = float(clean)
    except ValueError:
        raise UsageFailure(f"{hint} (got {text!r})") from None
    if 0 < level < 1:
        raise UsageFailure(f"{hint} (got {text}: write {level * 100:g}, not a fraction)")
    if not 50 <= level <= 99.9:
        raise UsageFailure(f"{hint} (got {text})")
    return level / 100
