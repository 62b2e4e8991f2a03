"""Reading a scenario: YAML 1.2 text, then the models, then the cross-field checks.

`load_scenario` (a file) and `parse_scenario` (an already-parsed document, e.g. after
`--set` overrides) both end in one ScenarioError listing every problem. Imports the models,
the checks and the reference scheduler's validators (lazily, for the blocks it owns).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from fairbench.workload.checks import _check_scheduler_block, _cross_check
from fairbench.workload.errors import ScenarioError
from fairbench.workload.models import Scenario
from reference_scheduler.core.validation import lines_from


def parse_scenario(
    data: object, source: str | None = None, base_dir: Path | None = None
) -> Scenario:
    """Validate an already-parsed YAML document. Trace paths are resolved against `base_dir`."""
    if not isinstance(data, dict):
        raise ScenarioError(
            [f"(top level): must be a mapping of fields, got {type(data).__name__}"], source
        )
    try:
        scn = Scenario.model_validate(data)
    except ValidationError as error:
        raise ScenarioError(lines_from(error), source) from None
    problems = _cross_check(scn)
    if scn.scheduler:
        problems += _check_scheduler_block(scn.scheduler)
        if scn.scheduler.get("engine") == "vllm" and scn.target.kind != "sim":
            problems.append(
                "scheduler.engine: 'vllm' is vLLM's scheduler simulated in virtual time; use "
                "target: {kind: sim}, or target: {kind: vllm} for a real vLLM"
            )
    if scn.target.faults is not None:
        from reference_scheduler.server.faults import FaultSpec

        try:
            FaultSpec.model_validate(scn.target.faults)
        except ValidationError as error:
            problems += [f"target.faults.{line}" for line in lines_from(error)]
    tokenizer = scn.target.tokenizer
    if tokenizer is not None:
        path = Path(tokenizer) if base_dir is None else base_dir / tokenizer
        if not path.is_file():
            problems.append(f"target.tokenizer: no such file {str(path)!r}")
        else:
            target = scn.target.model_copy(update={"tokenizer": str(path.resolve())})
            scn = scn.model_copy(update={"target": target})
    if problems:
        raise ScenarioError(problems, source)
    if base_dir is not None and scn.traces:
        resolved = {
            name: spec.model_copy(update={"path": str((base_dir / spec.path).resolve())})
            if not Path(spec.path).is_absolute()
            else spec
            for name, spec in scn.traces.items()
        }
        scn = scn.model_copy(update={"traces": resolved})
    return scn


class _Yaml12Loader(yaml.SafeLoader):
    """YAML 1.2 booleans: only true/false. YAML 1.1 also reads on/off/yes/no as booleans, which
    would turn an on/off arrival's `on:` key into `True:`."""


_Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"),
)


def read_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Yaml12Loader)


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file; raises ScenarioError with one line per problem."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(["file not found"], source) from None
    except (OSError, UnicodeDecodeError) as error:
        raise ScenarioError([f"cannot read: {error}"], source) from None
    try:
        data = read_yaml(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ScenarioError([f"(yaml) {where}: {problem}"], source) from None
    return parse_scenario(data, source, path.parent)


# pydantic writes a bound it cannot push into a validator-wrapped float (the unit fields) under
