"""`fairbench schema` is a standard JSON Schema that agrees with the scenario parser.

Editors and CI validate scenario files against it with any draft 2020-12 validator, so it must
accept what `fairbench validate` accepts (human units included) and flag what it rejects, with
no pydantic-only keywords that a validator would silently ignore.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from fairbench.workload.errors import ScenarioError
from fairbench.workload.loading import parse_scenario, read_yaml
from fairbench.workload.schema_export import json_schema
from fairbench.workload.unit_fields import DURATION_PATTERN, RATE_PATTERN
from fairbench.workload.units import _DURATION_UNITS, _RATE_UNITS, parse_duration, parse_rate
from tests.cli import run_cli

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted((REPO / "scenarios").glob("*.yaml"))

GOOD: dict[str, Any] = {
    "workloads": {"chat": {"prompt_tokens": 80, "output_tokens": 20}},
    "tenants": [{"id": "a", "mix": "chat", "arrival": {"process": "poisson", "rate": "5/s"}}],
    "run": {"duration": "10s"},
    "target": {"kind": "sim"},
}


@pytest.fixture(scope="module")
def validator() -> Draft202012Validator:
    schema = json_schema()
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def schema_accepts(validator: Draft202012Validator, data: Any) -> bool:
    return not list(validator.iter_errors(data))


def fairbench_accepts(data: Any) -> bool:
    try:
        parse_scenario(data)
    except ScenarioError:
        return False
    return True


def changed(path: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(GOOD)
    node: Any = data
    keys: list[Any] = [int(k) if k.isdigit() else k for k in path.split(".")]
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value
    return data


def test_the_schema_is_draft_2020_12_with_only_standard_keywords() -> None:
    schema = json_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)
    found: list[str] = []

    def walk(node: Any, at: str) -> None:
        if isinstance(node, list):
            for i, item in enumerate(node):
                walk(item, f"{at}[{i}]")
        elif isinstance(node, dict):
            for key, value in node.items():
                if key in ("gt", "ge", "lt", "le") and isinstance(value, int | float):
                    found.append(f"{at}.{key}")
                if key == "discriminator" and isinstance(value, dict):
                    found.append(f"{at}.{key}")
                walk(value, f"{at}.{key}")

    walk(schema, "")
    assert found == []


def test_the_cli_prints_the_same_schema() -> None:
    result = run_cli("schema")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == json.loads(json.dumps(json_schema()))


def test_every_shipped_scenario_is_valid(validator: Draft202012Validator) -> None:
    assert len(SHIPPED) >= 10
    for path in SHIPPED:
        data = read_yaml(path.read_text(encoding="utf-8"))
        errors = [
            f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(data)
        ]
        assert errors == [], path.name


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("run.duration", 10),
        ("run.duration", "1.5min"),
        ("run.duration", " 300 MS "),
        ("tenants.0.arrival.rate", 5),
        ("tenants.0.arrival.rate", "20/min"),
        ("tenants.0.arrival.rate", "0.5"),
        ("tenants.0.arrival", {"process": "gamma", "rate": "6/s", "cv": 2}),
        ("tenants.0.arrival", {"process": "onoff", "rate": 8, "on": "2s", "off": "500ms"}),
        ("tenants.0.arrival", {"process": "ramp", "start_rate": 0, "end_rate": "5/s", "over": 3}),
        ("workloads.chat.prompt_tokens", {"dist": "lognormal", "median": 100, "p99": 900}),
        ("workloads.chat.prompt_tokens", {"dist": "uniform", "low": 1, "high": 9}),
        ("workloads.chat.output_tokens", 0),
        ("tenants.0.phases", [{"start": "2s", "end": "4s", "multiplier": 3}]),
        ("target", {"kind": "vllm", "base_url": "http://127.0.0.1:8000"}),
    ],
)
def test_what_fairbench_accepts_the_schema_accepts(
    validator: Draft202012Validator, path: str, value: Any
) -> None:
    data = changed(path, value)
    assert fairbench_accepts(data)
    assert schema_accepts(validator, data)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("tenants.0.arrival.rate", "6/fortnight"),  # a unit neither knows
        ("tenants.0.arrival.rate", "fast"),
        ("tenants.0.arrival.rate", 0),  # rate > 0: exclusiveMinimum
        ("tenants.0.arrival.rate", True),
        ("run.duration", "2 parsecs"),
        ("run.duration", -1),
        ("run.warmup", -0.5),  # warmup >= 0: minimum
        ("run.timeout", 0),
        ("run.requests", 0),
        ("run.colour", "blue"),  # unknown field
        ("tenants.0.arrival", {"process": "bursty", "rate": 5}),  # unknown tag
        ("tenants.0.arrival", {"process": "poisson"}),  # the tagged branch needs its rate
        ("tenants.0.arrival", {"process": "poisson", "rate": 5, "cv": 2}),  # gamma's field
        ("workloads.chat.prompt_tokens", -5),
        ("workloads.chat.prompt_tokens", {"dist": "normal", "mean": 0, "std": 1}),
        ("workloads.chat.prompt_tokens", {"dist": "zipf", "value": 3}),
        ("workloads.chat.endpoint", "images"),
        ("tenants.0.id", "has space"),
        ("target.kind", "triton"),
    ],
)
def test_what_the_schema_can_see_it_flags(
    validator: Draft202012Validator, path: str, value: Any
) -> None:
    data = changed(path, value)
    assert not fairbench_accepts(data)
    assert not schema_accepts(validator, data)


def test_a_file_flagged_by_the_schema(validator: Draft202012Validator, tmp_path: Path) -> None:
    text = (REPO / "scenarios" / "quickstart.yaml").read_text(encoding="utf-8")
    data = read_yaml(text)
    data["tenants"][0]["arrival"]["rate"] = "6 per second"
    errors = list(validator.iter_errors(data))
    assert errors
    assert any("tenants" in map(str, e.absolute_path) for e in errors)


# ---------------------------------------------------------------- the unit patterns


def parses(parser: Any, text: str) -> bool:
    try:
        parser(text)
    except ValueError:
        return False
    return True


def matches(pattern: str, text: str) -> bool:
    return re.search(pattern, text) is not None  # what jsonschema's `pattern` does


DURATIONS_GOOD = [
    "300ms", "2s", "1.5min", "1h", "5", "0.5", ".5s", "5.s", "+2s", "-1s", "  2 s ", "2s\n",
    "2S", "300MS", "1.5MIN", "1Min", "1e3ms", "1E-3s", "10us", "10µs", "10µS", "7ns", "7NS",
    "2sec", "2SEC", "3m", "2 min", "1h ", "0",
]  # fmt: skip
DURATIONS_BAD = [
    "", " ", "s", "ms", "2 seconds", "2hours", "2d", "1.2.3s", "2 s s", "2μs", "2ΜS", "1es",
    "0x10s", "2/s", "1_000s", "inf", "nan", "infs", "e5s", "2 ms ms", "--2s", "2-s", "5/min",
]  # fmt: skip
RATES_GOOD = [
    "6/s", "20/min", "100/h", "5 / s", " 6/s ", "6/S", "20/MIN", "2/sec", "2/Sec", "3/m",
    "5", "0.5", "1e3", "1e3/s", ".5/s", "+6/s", "-6/s", "6/h\n",
]  # fmt: skip
RATES_BAD = [
    "", "6/", "/s", "6 per s", "6/d", "6/ms", "6s", "fast", "6//s", "inf", "nan", "6/s/s",
    "6/μs", "6/ hours", "s/6", "6/s s",
]  # fmt: skip


@pytest.mark.parametrize("text", DURATIONS_GOOD + DURATIONS_BAD)
def test_the_duration_pattern_agrees_with_the_parser(text: str) -> None:
    assert parses(parse_duration, text) == (text in DURATIONS_GOOD)
    assert matches(DURATION_PATTERN, text) == (text in DURATIONS_GOOD)


@pytest.mark.parametrize("text", RATES_GOOD + RATES_BAD)
def test_the_rate_pattern_agrees_with_the_parser(text: str) -> None:
    assert parses(parse_rate, text) == (text in RATES_GOOD)
    assert matches(RATE_PATTERN, text) == (text in RATES_GOOD)


def test_every_unit_in_every_case_the_parser_folds() -> None:
    """Units come from fairbench.workload.units' tables, so one added there reaches the schema;
    the parser lower-cases, so each upper-case spelling must match too."""
    for unit in _DURATION_UNITS:
        for text in (f"2{unit}", f"2{unit.upper()}", f"2 {unit.title()}"):
            assert parses(parse_duration, text) == matches(DURATION_PATTERN, text), text
    for unit in _RATE_UNITS:
        for text in (f"2/{unit}", f"2/{unit.upper()}", f"2 / {unit.title()}"):
            assert parses(parse_rate, text) and matches(RATE_PATTERN, text), text


def test_pattern_and_parser_agree_on_every_character() -> None:
    """After a number, any one code point (and that code point before `s`): the pattern says
    yes exactly when the parser does. Non-ASCII decimal digits are the one deliberate gap: the
    parser's `\\d` and float() take them, the schema keeps to 0-9 (ECMA-262's `\\d`).

    Both sides see text only through the characters of numbers, units and `/`, compared after
    lower-casing (the parser) or in either case (the pattern), and whitespace; every code point
    that is or folds to one of those is tried (a few hundred), the rest cannot match either."""
    alphabet = set("0123456789+-.eE/") | {
        c for unit in (*_DURATION_UNITS, *_RATE_UNITS) for c in unit
    }
    points = [
        chr(p)
        for p in range(sys.maxunicode + 1)
        if not 0xD800 <= p <= 0xDFFF
        and (
            chr(p) in alphabet
            or chr(p).lower() in alphabet
            or chr(p).upper() in alphabet
            or chr(p).isspace()
        )
    ]
    assert len(points) > 40
    disagree = []
    for char in points:
        for text in (f"2{char}", f"2{char}s"):
            if parses(parse_duration, text) != matches(DURATION_PATTERN, text):
                disagree.append(("duration", text))
        rate = f"2/{char}"
        if parses(parse_rate, rate) != matches(RATE_PATTERN, rate):
            disagree.append(("rate", rate))
    assert disagree == []


def test_the_patterns_mean_the_same_as_ecma_262_regexes(tmp_path: Path) -> None:
    """JSON Schema patterns are ECMA-262 regexes (editors run them in JavaScript), Python's
    `re` is what jsonschema uses: both must give the same answers on the lists above."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the ECMA-262 reading of the patterns is not checked")
    cases = {
        "duration": [DURATION_PATTERN, DURATIONS_GOOD, DURATIONS_BAD],
        "rate": [RATE_PATTERN, RATES_GOOD, RATES_BAD],
    }
    (tmp_path / "cases.json").write_text(json.dumps(cases), encoding="utf-8")
    script = (
        "const cases = JSON.parse(require('fs').readFileSync(process.argv[1], 'utf8'));"
        "const wrong = [];"
        "for (const [name, [pattern, good, bad]] of Object.entries(cases)) {"
        "  const re = new RegExp(pattern, 'u');"
        "  for (const s of good) if (!re.test(s)) wrong.push([name, 'rejects', s]);"
        "  for (const s of bad) if (re.test(s)) wrong.push([name, 'accepts', s]);"
        "}"
        "console.log(JSON.stringify(wrong));"
    )
    result = subprocess.run(
        [node, "-e", script, str(tmp_path / "cases.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []
