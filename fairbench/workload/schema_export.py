"""The scenario format as a standard JSON Schema (draft 2020-12), for editors and CI.

pydantic writes its own dialect; this module translates it (bounds, discriminators) so any
validator accepts the shipped scenarios. Imports only the models.
"""

from __future__ import annotations

from typing import Any

from fairbench.workload.models import Scenario

# pydantic writes a bound it cannot push into a validator-wrapped float (the unit fields) under
# its own names; JSON Schema calls them these, and ignores the others without a word.
_BOUND_KEYWORDS = {
    "gt": "exclusiveMinimum",
    "ge": "minimum",
    "lt": "exclusiveMaximum",
    "le": "maximum",
}


def _standard(node: Any) -> Any:
    """The schema with pydantic's own keywords replaced by JSON Schema's (a copy)."""
    if isinstance(node, list):
        return [_standard(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {
        key: _standard(value)
        for key, value in node.items()
        # OpenAPI's `discriminator` (not JSON Schema): each branch's `const` tag already says it
        if not (key == "discriminator" and isinstance(value, dict) and "propertyName" in value)
    }
    bounds = {
        key: out.pop(key)
        for key in _BOUND_KEYWORDS
        if isinstance(out.get(key), int | float) and not isinstance(out.get(key), bool)
    }
    if bounds:
        _apply_bounds(out, bounds)
    return out


def _apply_bounds(node: dict[str, Any], bounds: dict[str, float]) -> None:
    """Put pydantic's bounds on the numeric branches: a string in human units carries no
    bound a pattern could check (`fairbench validate` checks its value)."""
    if node.get("type") in ("number", "integer"):
        node.update({_BOUND_KEYWORDS[key]: value for key, value in bounds.items()})
        return
    for branch in node.get("anyOf", []) + node.get("oneOf", []):
        if isinstance(branch, dict):
            _apply_bounds(branch, bounds)


def json_schema() -> dict[str, Any]:
    """The scenario format as a standard JSON Schema (draft 2020-12), for editors and CI.

    Human units are strings with a pattern (`300ms`, `6/s`), numbers stay numbers with their
    bounds, a length may be a bare token count, and the tagged unions are `oneOf`s whose
    branches each require their tag (`dist`, `process`) as a `const`. What the schema cannot
    say (cross-field rules, a unit string's range) `fairbench validate` still checks."""
    schema = _standard(Scenario.model_json_schema())
    schema["title"] = "fairbench scenario"
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
