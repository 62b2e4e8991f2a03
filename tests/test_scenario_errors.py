"""Bad scenario files get one clear line per problem, never a traceback."""

from __future__ import annotations

import copy
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairbench.plan.materialize import materialize
from fairbench.workload.errors import ScenarioError
from fairbench.workload.loading import load_scenario, parse_scenario, read_yaml
from fairbench.workload.traces import TraceError
from fairbench.workload.units import parse_duration, parse_rate

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted((REPO / "scenarios").glob("*.yaml"))

GOOD: dict[str, Any] = {
    "workloads": {"chat": {"prompt_tokens": 80, "output_tokens": 20}},
    "tenants": [{"id": "a", "mix": "chat", "arrival": {"process": "poisson", "rate": "5/s"}}],
    "run": {"duration": "10s"},
}


def errors_of(data: Any) -> list[str]:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(data)
    return info.value.lines


def with_change(path: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(GOOD)
    node: Any = data
    keys: list[Any] = [int(k) if k.isdigit() else k for k in path.split(".")]
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value
    return data


@pytest.mark.parametrize(
    ("path", "value", "line"),
    [
        (
            "tenants.0.arrival",
            {"process": "gamma", "rate": 5, "cv": -1},
            "tenants[0].arrival.cv: must be > 0.0, got -1",
        ),
        (
            "tenants.0.arrival",
            {"process": "poisson", "rate": "fast"},
            "tenants[0].arrival.rate: must be a rate like '20/s', '5/min' or '100/h', got 'fast'",
        ),
        (
            "tenants.0.arrival",
            {"process": "weibull", "rate": 1},
            "tenants[0].arrival: unknown 'process' 'weibull'; allowed: 'constant', 'poisson', "
            "'gamma', 'onoff', 'ramp', 'trace'",
        ),
        (
            "tenants.0.wieght",
            2,
            "tenants[0].wieght: is not a known field (check the spelling; `fairbench schema` "
            "lists the fields)",
        ),
        ("tenants.0.mix", "chatt", "tenants[0].mix: unknown workload 'chatt'; defined: ['chat']"),
        (
            "tenants.0.slo_class",
            "gold",
            "tenants[0].slo_class: unknown class 'gold'; defined: ['batch', 'best-effort', "
            "'interactive']",
        ),
        (
            "run.duration",
            "1O s",
            "run.duration: must be a duration like '300ms', '2s' or '5min' (units: ns, us, ms, "
            "s, min, h), got '1O s'",
        ),
        ("run.duration", ".nan", "run.duration: must be a finite number, got 'nan'"),
        (
            "workloads.chat.prompt_tokens",
            {"dist": "lognormal", "median": 80, "p99": 40},
            "workloads.chat.prompt_tokens: p99 (40.0) must be >= median (80.0)",
        ),
        (
            "workloads.chat.prompt_tokens",
            -3,
            "workloads.chat.prompt_tokens.value: must be >= 0, got -3",
        ),
        (
            "run.warmup",
            "10s",
            "run.warmup: warmup + cooldown (10.0s) must be shorter than run.duration (10.0s)",
        ),
        (
            "target",
            {"kind": "tgi", "base_url": "http://h", "priority": {"values": {"interactive": 0}}},
            "target.priority: TGI has no per-request priority (it serves first come, first "
            "served); remove it, or use class_extra_body",
        ),
        (
            "target",
            {"kind": "vllm", "base_url": "http://h", "api": "native"},
            "target.api: 'native' is for sglang (/generate) and tgi (/generate_stream); a vllm "
            "target speaks 'openai'",
        ),
        (
            "target",
            {"kind": "sglang", "priority": {"by": "slo_class", "values": {"gold": 1}}},
            "target.priority.values: unknown slo_class 'gold'; defined: ['batch', "
            "'best-effort', 'interactive']",
        ),
        (
            "target",
            {"kind": "vllm", "priority": {"by": "tenant", "values": {}}},
            "target.priority.values: dictionary should have at least 1 item after validation, "
            "not 0, got {}",
        ),
        (
            "target",
            {"kind": "vllm", "tokenizer": "no-such-tokenizer.json"},
            "target.tokenizer: no such file 'no-such-tokenizer.json'",
        ),
    ],
)
def test_one_clear_line(path: str, value: Any, line: str) -> None:
    data = with_change(path, value)
    if value == ".nan":
        data["run"]["duration"] = float("nan")
        line = "run.duration: must be a finite number, got nan"
    assert errors_of(data) == [line]


def test_every_problem_is_reported_once() -> None:
    data = copy.deepcopy(GOOD)
    data["tenants"].append({"id": "a", "mix": "chat", "arrival": {"process": "poisson", "rate": 1}})
    data["tenants"][0]["slo_class"] = "nope"
    lines = errors_of(data)
    assert "tenants[1].id: duplicate tenant id 'a'; ids must be unique" in lines
    assert any(line.startswith("tenants[0].slo_class: unknown class") for line in lines)
    assert len(lines) == len(set(lines)) == 2


def test_yaml_1_2_booleans_keep_on_off_keys() -> None:
    assert read_yaml("a: {on: 1s, off: 2s, x: yes, y: true}") == {
        "a": {"on": "1s", "off": "2s", "x": "yes", "y": True}
    }


def test_units() -> None:
    assert parse_duration("300ms") == pytest.approx(0.3)
    assert parse_duration("1.5min") == 90
    assert parse_duration(2) == 2.0
    assert parse_rate("5/min") == pytest.approx(1 / 12)
    assert parse_rate("20/s") == 20
    for bad in ("", "3 parsecs", True, None, "1/fortnight"):
        with pytest.raises(ValueError):
            parse_duration(bad) if not str(bad).count("/") else parse_rate(bad)


def test_cli_prints_lines_without_traceback_and_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(with_change("tenants.0.arrival.rate", -2)))
    result = subprocess.run(
        [sys.executable, "-m", "fairbench.cli", "validate", str(bad)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == f"{bad}: tenants[0].arrival.rate: must be > 0, got -2"
    assert "Traceback" not in result.stderr + result.stdout


def _mutations(data: Any, rng: random.Random) -> Any:
    """A random mutation of a parsed scenario: replace, delete or add at a random place."""
    junk = [
        None,
        -1,
        0,
        1e308,
        float("nan"),
        "",
        "??",
        [],
        {},
        True,
        "3/s",
        "-5s",
        10**30,
        {"process": "poisson"},
        {"dist": "normal"},
        [1, 2],
        "chat",
    ]
    data = copy.deepcopy(data)
    node: Any = data
    for _ in range(rng.randint(1, 4)):
        if isinstance(node, dict) and node:
            key = rng.choice(sorted(node, key=str))
            if rng.random() < 0.4 or not isinstance(node[key], dict | list):
                choice = rng.random()
                if choice < 0.6:
                    node[key] = rng.choice(junk)
                elif choice < 0.8:
                    del node[key]
                else:
                    node[str(rng.choice(junk))] = rng.choice(junk)
                return data
            node = node[key]
        elif isinstance(node, list) and node:
            index = rng.randrange(len(node))
            if rng.random() < 0.3 or not isinstance(node[index], dict | list):
                node[index] = rng.choice(junk)
                return data
            node = node[index]
    return data


def _plan_or_clear_error(data: Any, base: Path | None = None) -> None:
    try:
        scn = parse_scenario(data, base_dir=base)
        if scn.run.duration is not None and scn.run.duration > 120:
            scn = scn.model_copy(update={"run": scn.run.model_copy(update={"duration": 120.0})})
        materialize(scn, max_requests=300_000)
    except ScenarioError as error:
        assert error.lines and all(isinstance(x, str) and "\n" not in x for x in error.lines)
        assert all(": " in line for line in error.lines)
    except TraceError as error:
        assert str(error).count(":") >= 1


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_scenarios_are_valid(path: Path) -> None:
    scn = load_scenario(path)
    assert len(materialize(scn)) > 0


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_mutated_shipped_scenarios_never_traceback(path: Path) -> None:
    data = read_yaml(path.read_text())
    rng = random.Random(path.name)
    for _ in range(60):
        _plan_or_clear_error(_mutations(data, rng), path.parent)


yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "tenants",
                    "workloads",
                    "run",
                    "id",
                    "mix",
                    "arrival",
                    "process",
                    "rate",
                    "dist",
                    "value",
                    "duration",
                    "prompt_tokens",
                    "cv",
                    "phases",
                ]
            )
            | st.text(max_size=5),
            children,
            max_size=5,
        )
    ),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=yaml_values)
def test_generated_documents_never_traceback(doc: Any) -> None:
    _plan_or_clear_error(doc)


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=200))
def test_arbitrary_text_files_never_traceback(tmp_path_factory: Any, text: str) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "s.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        load_scenario(path)
    except ScenarioError as error:
        assert error.lines
