"""Names of a package loaded on first use (PEP 562), so that importing a package for one light
module does not import the heavy ones beside it.

Why: every command, `--help` and each one-line refusal included, imports the scenario model,
whose package also re-exports the trace readers (pandas); and the analysis package re-exports
the summary, which imports the run stage (scipy, aiohttp). Imported eagerly, every command paid
about two seconds of CPU before it parsed a flag. A name exported this way must not be the name
of one of the package's submodules: importing that submodule would rebind the name to it. The
package's `_API` is what tests/test_architecture.py reads, both for that and for the layers.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(
    package: str, api: dict[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`, whose names `api` maps to the module that
    defines each; a name is imported once and then kept in the package's `namespace`."""

    def __getattr__(name: str) -> Any:
        module = api.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(api))

    return __getattr__, __dir__
