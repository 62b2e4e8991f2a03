"""Field paths into a scenario document: `tenants.support-bot.weight`, `scheduler.policy`.

What `--set`, `--a`/`--b` and a sweep's grid address. Here, apart from fairbench.decide.sweep
(which uses `set_path`), so that the CLI can check an override without importing the decide
package, whose __init__ loads the analysis stack (about 1 s of CPU for a command that then
fails on its flags).
"""

from __future__ import annotations

import re
from typing import Any

from fairbench.workload.errors import ScenarioError


def _lookup(node: Any, keys: list[str], at: int) -> tuple[Any, int] | None:
    """The child of `node` named by keys[at:], and how many keys that took; None if none.

    A mapping key or a tenant id may itself contain dots (`ids like a.b`), so the longest run
    of keys that names an existing entry wins. In a list, an entry is addressed by its `id` (a
    tenant) or `name`, or by its index."""
    for stop in range(len(keys), at, -1):
        word = ".".join(keys[at:stop])
        if isinstance(node, dict) and word in node:
            return word, stop - at
        if isinstance(node, list):
            for index, item in enumerate(node):
                if isinstance(item, dict) and word in (item.get("id"), item.get("name")):
                    return index, stop - at
    if isinstance(node, list) and re.fullmatch(r"-?[0-9]+", keys[at]):
        index = int(keys[at])
        if -len(node) <= index < len(node):
            return index % len(node), 1
    return None


def resolve_path(data: dict[str, Any], dotted: str) -> list[str | int]:
    """`dotted` as the keys and list indexes it names in `data` (tenants by id or index,
    workloads by name); a key that is not there yet is taken as written, to be created.
    Raises ScenarioError naming the part that cannot be addressed."""
    keys = dotted.split(".")
    if not dotted or any(not k for k in keys):
        raise ScenarioError(
            [
                f"{dotted or '(empty)'}: a path is dot-separated names, "
                "e.g. scheduler.policy or tenants.<id>.weight"
            ]
        )
    node: Any = data
    path: list[str | int] = []
    at = 0
    while at < len(keys):
        found = _lookup(node, keys, at)
        if found is not None:
            step, used = found
        elif isinstance(node, dict):
            step, used = keys[at], 1
        elif isinstance(node, list):
            ids = [str(i.get("id", i.get("name"))) for i in node if isinstance(i, dict)]
            known = [i for i in ids if i != "None"]
            choices = f"an id ({', '.join(known)}) or " if known else ""
            raise ScenarioError(
                [
                    f"{dotted}: {'.'.join(keys[:at]) or '(top level)'} has no entry "
                    f"{keys[at]!r}; use {choices}an index 0..{len(node) - 1}"
                ]
            )
        else:
            where = ".".join(keys[:at])
            raise ScenarioError(
                [f"{dotted}: {where} is {_kind(node)}, not a mapping; it has no field {keys[at]!r}"]
            )
        path.append(step)
        at += used
        node = node[step] if isinstance(node, list) or step in node else {}
    return path


def _kind(value: Any) -> str:
    if isinstance(value, str):
        return f"the string {value!r}"
    if value is None:
        return "empty"
    return f"a {type(value).__name__} ({value!r})"


def set_path(data: dict[str, Any], dotted: str, value: Any) -> list[str | int]:
    """Set the field `dotted` names (see `resolve_path`) to `value`, creating missing mappings;
    returns the resolved path, which the CLI uses to tie a validation error to its override."""
    path = resolve_path(data, dotted)
    node: Any = data
    for step in path[:-1]:
        if isinstance(node, dict) and step not in node:
            node[step] = {}
        node = node[step]
    node[path[-1]] = value
    return path
