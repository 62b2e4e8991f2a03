"""Pydantic validation errors as one line each: `field.path: what is wrong (what is allowed)`.

Shared by the reference scheduler's config and fairbench's scenario files (fairbench imports it;
this package never imports fairbench).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

_UNION_FIELDS = {"arrival", "prompt_tokens", "output_tokens", "spread"}
_UNION_TAGS = {
    "constant",
    "poisson",
    "gamma",
    "onoff",
    "ramp",
    "trace",
    "uniform",
    "normal",
    "lognormal",
    "exponential",
    "empirical",
    "literal['none','auto']",
    "function-before[parse_duration(), float]",
    "float",
    "function-before[_dist_shorthand(), tagged-union[ConstantDist,UniformDist,NormalDist,"
    "LogNormalDist,ExponentialDist,EmpiricalDist]]",
}


def _field_path(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    previous: int | str | None = None
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif previous in _UNION_FIELDS and (item in _UNION_TAGS or item.startswith("function-")):
            continue  # pydantic names the union member; users only know the field
        elif re.fullmatch(r"[A-Za-z0-9_-]+", str(item)):
            parts.append(("." if parts else "") + str(item))
        else:
            parts.append(f"[{str(item)!r}]")  # odd keys stay on one line, quoted
        previous = item
    return "".join(parts) or "(top level)"


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _message(error: dict[str, Any]) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    got = _short(error.get("input"))
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "is not a known field (check the spelling; `fairbench schema` lists the fields)"
    if kind == "union_tag_invalid":
        return (
            f"unknown {ctx.get('discriminator', 'kind')} {_short(ctx.get('tag'))}; "
            f"allowed: {ctx.get('expected_tags')}"
        )
    if kind == "union_tag_not_found":
        return f"needs {ctx.get('discriminator')} (one of the kinds `fairbench schema` lists)"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        op = {
            "greater_than": ">",
            "greater_than_equal": ">=",
            "less_than": "<",
            "less_than_equal": "<=",
        }[kind]
        bound = next(iter(ctx.values()), "?")
        return f"must be {op} {bound}, got {got}"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}, got {got}"
    msg = error["msg"]
    msg = msg[0].lower() + msg[1:] if msg else msg
    return f"{msg}, got {got}"


def lines_from(error: ValidationError) -> list[str]:
    lines = []
    for item in error.errors():
        lines.append(f"{_field_path(tuple(item['loc']))}: {_message(item)}")
    return list(dict.fromkeys(lines))
