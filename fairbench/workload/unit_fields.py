"""Field types for human units (`300ms`, `6/s`) and what the JSON Schema says of them.

The parsers live in fairbench.workload.units; this module wraps them as pydantic field types
whose JSON Schema accepts either a number or a string matching a pattern built from the
parsers' own unit tables (tests/test_schema.py checks that they agree). Imports only
fairbench.workload.units.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated

from pydantic import BeforeValidator, Field, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from fairbench.workload.units import (
    _DURATION_UNITS,
    _NUMBER,
    _RATE_UNITS,
    parse_duration,
    parse_rate,
)


def _any_case(unit: str) -> str:
    """A regex for `unit` in any case the parser folds to it (it lower-cases its input first).

    Spelled with character classes, not a flag: JSON Schema patterns are ECMA-262 regexes,
    which have no inline `(?i)`."""
    out = []
    for char in unit:
        forms = sorted({c for c in (char, char.upper()) if len(c) == 1 and c.lower() == char})
        out.append(re.escape(forms[0]) if len(forms) == 1 else f"[{''.join(forms)}]")
    return "".join(out)


def _units_alternation(units: dict[str, float]) -> str:
    return "(?:" + "|".join(_any_case(u) for u in sorted(units, key=lambda u: (-len(u), u))) + ")"


# The JSON Schema's patterns for human units, built from fairbench.workload.units' own tables so
# that a unit added there reaches the schema too; tests/test_schema.py checks that they accept
# what the parsers accept. `\d` becomes [0-9]: ECMA-262 and Python disagree on non-ASCII digits.
_SCHEMA_NUMBER = _NUMBER.replace(r"\d", "[0-9]")
DURATION_PATTERN = rf"^\s*{_SCHEMA_NUMBER}\s*{_units_alternation(_DURATION_UNITS)}?\s*$"
RATE_PATTERN = rf"^\s*{_SCHEMA_NUMBER}\s*(?:/\s*{_units_alternation(_RATE_UNITS)}\s*)?$"


@dataclass(frozen=True)
class _OrString:
    """JSON Schema of a number that may also be written as a string in human units.

    pydantic only sees the float the parser returns, so left alone it would tell editors that
    `rate: 6/s` is not a number."""

    pattern: str
    examples: tuple[str, ...]

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        as_string = {"type": "string", "pattern": self.pattern, "examples": list(self.examples)}
        return {"anyOf": [handler(core_schema), as_string]}


@dataclass(frozen=True)
class _OrCount:
    """JSON Schema of a length distribution that may also be a bare token count (`80`)."""

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {"anyOf": [{"type": "integer", "minimum": 0}, handler(core_schema)]}


Seconds = Annotated[
    float,
    BeforeValidator(parse_duration),
    _OrString(DURATION_PATTERN, ("300ms", "2s", "1.5min")),
]
PerSecond = Annotated[
    float, BeforeValidator(parse_rate), _OrString(RATE_PATTERN, ("6/s", "20/min"))
]
PositiveSeconds = Annotated[Seconds, Field(gt=0)]
NonNegSeconds = Annotated[Seconds, Field(ge=0)]
PositiveRate = Annotated[PerSecond, Field(gt=0)]
NonNegRate = Annotated[PerSecond, Field(ge=0)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
