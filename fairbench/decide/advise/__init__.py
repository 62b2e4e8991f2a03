"""`fairbench advise`: from a scenario's SLOs to a `scheduler:` block that meets them, found by
a seeded search in simulation and verified on seeds the search never saw (docs/advise.md).

The steps, one module each: `problem` (the targets, objectives and simulated document, and every
refusal that needs no run), `space` (the knobs and how a point becomes a block), `search` (optuna's
TPE over the space, one simulated run a trial, knob importance), `verify` (candidates and the
scenario's own configuration on new seeds, intervals across them, the recommendation), `refusal`
(which constraint binds when nothing meets), `result` (what a search found), `outputs`
(advice.yaml, advice.json). Runs go through `decide.points`, as a sweep's do; the page is
`fairbench.report.advice`'s, passed nothing but advice.json.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fairbench.decide.advise.problem import AdviceRefused, Ask, prepare
from fairbench.decide.advise.result import Advice
from fairbench.workload.models import Scenario

if TYPE_CHECKING:  # the search's stack (optuna, scipy) loads only when a search runs
    from fairbench.decide.advise.search import Progress
    from fairbench.decide.advise.verify import Verified
    from fairbench.decide.points import PointRunner


def advise(
    file: Path,
    raw: dict[str, Any],
    scn: Scenario,
    ask: Ask,
    out: Path,
    runner: PointRunner,
    progress: Progress | None = None,
    trace: Path | None = None,
) -> Advice:
    """Search, verify, recommend, and write advice.json (and advice.yaml when there is a
    recommendation) into `out`. AdviceRefused (one line) for input that cannot be advised on;
    a search that finds nothing is an Advice with `refused` set, its files written."""
    from fairbench.decide.advise.outputs import write_outputs
    from fairbench.decide.advise.refusal import infeasible_line, unverified_line
    from fairbench.decide.advise.search import candidates, search
    from fairbench.decide.advise.verify import recommend, verify

    started = time.monotonic()
    problem = prepare(file, raw, scn, ask, trace)
    found = search(problem, runner, out / "search", progress)
    chosen = candidates(found, problem)
    verified: list[Verified] = []
    rec = None
    if not chosen and not found.own.feasible:
        refused: str | None = infeasible_line(problem, [found.own, *(t.run for t in found.trials)])
    else:
        verified = verify(problem, chosen, runner, out / "verify", progress)
        rec = recommend(verified)
        refused = None if rec is not None else unverified_line(problem, verified)
    advice = Advice(problem, found, chosen, verified, rec, refused)
    write_outputs(advice, out)
    advice.elapsed_s = time.monotonic() - started
    return advice


__all__ = ["Advice", "AdviceRefused", "Ask", "advise"]
