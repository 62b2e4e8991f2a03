"""`fairbench run --simulate PROFILE`: the simulated twin of a live run's scenario.

It exists so that the flags `--simulate` and `--simulate-set` are read in one place: the twin
itself is `fairbench.workload.twin` (its engine mode, its `scheduler:` block, the classes'
priorities, the same-plan check and the line that says how it was chosen); this module applies
`--simulate-set` on top of it, as `--set` is applied to a scenario, and turns each refusal into
one `UsageFailure` line naming the flag. Imports `cli.inputs`, `workload` and, lazily,
`plan.materialize` (the digests the twin is checked by).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fairbench.cli.inputs import UsageFailure, scenario_with
from fairbench.workload.errors import ScenarioError
from fairbench.workload.models import Scenario
from fairbench.workload.twin import Simulation, TwinRefused, check_twin, twin_document, twin_line

__all__ = ["Simulation", "simulated_scenario"]


def _digest(scn: Scenario, seed: int | None) -> str:
    """The plan digest of `scn` at `seed` (pyarrow and the plan load here, after the refusals
    that need neither)."""
    from fairbench.plan.materialize import materialize

    return materialize(scn, seed).digest


def simulated_scenario(
    doc: dict[str, Any],
    scn: Scenario,
    file: Path,
    profile: str,
    overrides: list[str] | None = None,
    seed: int | None = None,
) -> Simulation:
    """The live scenario `scn` (document `doc`, from `file`) as `target: sim` on `profile`
    (workload.twin.twin_document), `overrides` (`--simulate-set`) applied last, checked to plan
    the same requests at `seed`."""
    items = list(overrides or [])
    try:
        data, spec = twin_document(doc, scn, profile)
        try:
            sim_doc, sim = scenario_with(file, items, "--simulate-set", raw=data)
        except ScenarioError as error:  # the twin itself (not an override) does not validate
            raise UsageFailure(
                *(f"--simulate {profile}: the simulated scenario: {line}" for line in error.lines)
            ) from None
        what = f"--simulate-set {' '.join(items)}" if items else f"--simulate {profile}"
        check_twin(scn, sim, what, lambda s: _digest(s, seed))
    except TwinRefused as error:
        raise UsageFailure(str(error)) from None
    return Simulation(sim, spec, twin_line(sim_doc["scheduler"], profile, scn.target.kind))
