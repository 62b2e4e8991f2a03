"""`fairbench run --simulate`'s second half: the live run's plan simulated into RUN/sim/, its
report written, and the fidelity files of the pair, with the lines the command prints.

It exists so that the command line parses `--simulate` (cli/simulate.py chooses the twin
scenario) and prints, while the twin's run, its check that it replayed the live run's plan and
its comparison are a library call, tested without typer. It sits in `report` because it writes
the twin's report and the fidelity pages, which only this top layer may do. Imports
`pipeline` (the twin's run), `run` (its options), `decide.fidelity` (the measurement and the
count of live requests that ended early) and this package's `run` and `fidelity_outputs`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fairbench.workload.models import Scenario


class SimulationMismatch(Exception):
    """The simulated twin replayed another plan than the live run (never expected: the digests
    are compared before the live run starts); the command exits 1."""


def simulate_and_compare(
    run_dir: Path, summary: dict[str, Any], scn: Scenario, line: str, seed: int | None
) -> list[str]:
    """Simulate the live run's plan (`scn`, the twin scenario `line` describes) into RUN/sim/
    and write the fidelity files there, as `fairbench fidelity RUN RUN/sim` does; the headline
    lines to print. The live run's verdict stays the exit code: a simulation that cannot be
    compared says why in a line. Raises SimulationMismatch if the twin planned other requests."""
    from fairbench.decide.fidelity import FidelityRefused, ended_early
    from fairbench.pipeline import run_scenario
    from fairbench.report.fidelity_outputs import mape_line, measure_fidelity
    from fairbench.report.run import write_run_report
    from fairbench.run import RunOptions
    from fairbench.run.memory import release_freed_memory

    sim_dir = run_dir / "sim"
    sim = run_scenario(scn, RunOptions(out=sim_dir, seed=seed, workers=1), keep_records=True)
    write_run_report(sim.run_dir, sim.records)
    sim.records = None
    release_freed_memory()  # the twin's table, given back before the fidelity pages
    digest = str(sim.summary.get("plan_digest", ""))
    if digest != summary.get("plan_digest"):  # checked before the live run: this is a bug
        raise SimulationMismatch(
            f"simulated: {sim_dir}: its plan {digest[:19]}… is not the live run's "
            f"{str(summary.get('plan_digest'))[:19]}…; fidelity not measured"
        )
    lines = [f"simulated: {sim_dir} ({line}); plan {digest[:19]}…, the live run's"]
    try:
        fid, written = measure_fidelity(run_dir, sim_dir)
    except FidelityRefused as error:
        return [*lines, f"fidelity not measured: {error}"]
    lines.append(f"fidelity (sim vs live): {mape_line(fid)}")
    short = ended_early(run_dir)
    if short:
        lines.append(
            f"note: {short} live requests ended before their max_tokens (EOS or a stop; the "
            "engine may not honour ignore_eos), the simulated ones ran to it: output-length "
            "figures differ for that reason, not the simulator's speed"
        )
    lines.append("wrote " + ", ".join(str(p) for p in written))
    return lines
