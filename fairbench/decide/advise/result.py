"""What an advice search found (`Advice`): its own module so that `outputs`, which writes it,
and the package's `advise`, which makes it, both import it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the search's stack (optuna, scipy) loads only when a search runs
    from fairbench.decide.advise.problem import Problem
    from fairbench.decide.advise.search import SearchResult, Trial
    from fairbench.decide.advise.verify import Verified


@dataclass
class Advice:
    """What a search found: the problem, every trial, the candidates verified, their
    verification (the scenario's own configuration first), the recommendation, or the one line
    saying why there is none; and how long it took (wall seconds, not written to advice.json)."""

    problem: Problem
    search: SearchResult
    chosen: list[Trial]
    verified: list[Verified]
    recommendation: Verified | None
    refused: str | None
    elapsed_s: float = 0.0
