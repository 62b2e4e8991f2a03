"""The error a scenario that cannot be used raises: one `field.path: problem` line per problem.

Why a module of its own: the models, the cross-checks and the loader all raise it, and the CLI
prints its lines without a traceback. Imports nothing of fairbench.
"""

from __future__ import annotations


class ScenarioError(Exception):
    """A scenario that cannot be used. `lines` holds one `path: problem` line per problem."""

    def __init__(self, lines: list[str], source: str | None = None) -> None:
        self.lines = lines
        self.source = source
        prefix = f"{source}: " if source else ""
        super().__init__("\n".join(prefix + line for line in lines))
