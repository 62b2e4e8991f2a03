"""An A/B of one scenario as the `ab` and `compare` commands run it: the arms' checks, the
loop of interleaved pairs (A B B A ...) with its stopping rules (--precision, --detect), and
the comparison document they write.

It exists so that what `fairbench ab` computes is importable and tested without the command
line: the CLI parses flags and prints; this module decides how many pairs run and why they
stopped. It imports `decide.compare`, `decide.power`, `decide.points`, `plan` and `run` (for
writing JSON); the report writer a run gets is passed in by the caller (`report` is above it).
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fairbench.decide.compare import Comparison, compare_dirs, default_rows
from fairbench.decide.points import PointJob, PointResult, PointRunner, PointsFailed
from fairbench.workload.models import Scenario

COMPARE_ADVICE = "compare 3 or more pairs (repeat --a RUN --b RUN)"
AB_ADVICE = "use --iterations 3 or more"


class ABRefused(ValueError):
    """The arms cannot make an A/B as asked (one line naming the flag and the fix)."""


class ABFailed(RuntimeError):
    """The pairs ran but cannot be compared (an arm ran INVALID): a measured failure."""


def design_note(comparison: Comparison, advice: str) -> str:
    """The comparison's design line, with the advice for one pair given by the command that
    prints it (compare has no --iterations; ab has no --a RUN)."""
    text = comparison.design
    if comparison.pairs < 2:
        text = text.split(" — ")[0] + " — " + advice
    return text


def compare_power(comparison: Comparison, metric: str, change: float, window_s: float) -> Any:
    """compare --detect: the power plan from the pairs given (ABRefused when it has none)."""
    from fairbench.decide.power import PowerError, from_comparison

    try:
        return from_comparison(comparison, metric, change, window_s)
    except PowerError as error:
        raise ABRefused(f"--detect: {error}") from None


def compare_runs(
    a_dirs: list[Path],
    b_dirs: list[Path],
    resamples: int,
    level: float,
    metric: str,
    change: float | None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[Comparison, Any]:
    """`fairbench compare`: the paired verdicts of the runs given, and with --detect the
    power plan over the measurement window of the first A run. Raises CompareRefused.
    `progress(done, total)`: the bootstrap's draws, for a person's bar."""
    comparison = compare_dirs(a_dirs, b_dirs, resamples, level, progress=progress)
    found = None
    if change is not None:
        lo, hi = json.loads((a_dirs[0] / "summary.json").read_text())["window_s"]
        found = compare_power(comparison, metric, change, hi - lo)
    return comparison, found


def compare_payload(comparison: Comparison, note: str, level: float, found: Any) -> dict[str, Any]:
    """`compare --json`: the verdicts, the design line, the level and the power plan if any."""
    payload = {**comparison.as_dict(), "design": note, "confidence": level}
    if found is not None:
        payload["power"] = found.as_dict()
    return payload


def detect_step(
    comparison: Comparison, metric: str, change: float, scn: Any, limit: int
) -> tuple[Any, str | None]:
    """The power plan after the pairs run so far, and why to stop (None: one pair more)."""
    from fairbench.decide.power import PowerError, from_comparison, stop_reason

    window = (scn.run.duration or 0) - scn.run.warmup - scn.run.cooldown
    try:
        found = from_comparison(comparison, metric, change, window)
    except PowerError as error:
        return None, f"{metric}: no power calculation: {error}"
    return found, stop_reason(found, limit)


def check_same_plan(arms: dict[str, Scenario], a: list[str], b: list[str]) -> None:
    """Before anything runs: both arms plan the same requests (ABRefused otherwise)."""
    from fairbench.plan.materialize import materialize

    seed0 = arms["A"].run.seed
    if materialize(arms["A"], seed0).digest != materialize(arms["B"], seed0).digest:
        raise ABRefused(
            f"--a {' '.join(a)} / --b {' '.join(b)}: the arms plan different requests, and "
            "an A/B replays one plan in both: override what serves the requests (scheduler, "
            "target, tenant weights), not what makes them (workloads, arrivals, run)"
        )


def check_metric(scn: Scenario, metric: str) -> None:
    """A watched --metric is one the comparison has (ABRefused with the closest otherwise)."""
    rows = default_rows(list(scn.slo_classes), [t.id for t in scn.tenants])
    known = [str(r) for r in rows]
    if metric not in known:
        close = difflib.get_close_matches(metric, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ABRefused(f"--metric {metric!r}: not a compared metric{hint}")


@dataclass
class ABOutcome:
    """What an A/B ran and found: the comparison, why it stopped, the power plan (--detect)
    and each arm's run directories."""

    comparison: Comparison
    stopped: str
    power: Any = None
    dirs: dict[str, list[Path]] = field(default_factory=dict)


@dataclass(frozen=True)
class ABDesign:
    """How many pairs an A/B runs: `iterations` (the pilot with --detect), and with --precision
    (`width`, a fraction) or --detect (`change`) up to `max_iterations`, watching `metric`."""

    iterations: int
    max_iterations: int
    metric: str
    width: float | None = None
    change: float | None = None


def run_ab(
    file: Path,
    docs: dict[str, dict[str, Any]],
    arms: dict[str, Scenario],
    design: ABDesign,
    base: Path,
    runner: PointRunner,
    write_report: Callable[[Path], Any],
    done: Callable[[PointResult, int, int], None],
    resamples: int,
    level: float,
) -> ABOutcome:
    """Run the pairs (seeds interleaved A B B A ...) until the design says stop and compare
    them. Raises PointsFailed when a run fails (the runs that finished stay in `base`) and
    ABFailed when the pairs cannot be compared."""
    from fairbench.decide.compare import CompareRefused

    seed0 = arms["A"].run.seed
    width, change, metric = design.width, design.change, design.metric
    iterations, max_iterations = design.iterations, design.max_iterations
    dirs: dict[str, list[Path]] = {"A": [], "B": []}
    i = 0
    comparison: Comparison | None = None
    why = "the planned iterations ran"
    limit = max(max_iterations, iterations) if change is not None else iterations
    limit = max_iterations if width is not None else limit
    power_plan = None
    while i < limit:
        # without --precision every pair at once (a runner may run them together);
        # with it, one pair more until the interval is narrow enough
        pairs = range(i, iterations if width is None and i == 0 else i + 1)
        arms_run = [a for k in pairs for a in (("A", "B") if k % 2 == 0 else ("B", "A"))]
        keys = [k for k in pairs for _ in range(2)]
        jobs = [
            PointJob(
                f"{arm} seed {seed0 + k}",
                docs[arm],
                str(file),
                str(base / f"{arm}-{k}"),
                seed0 + k,
                write_report,
            )
            for arm, k in zip(arms_run, keys, strict=True)
        ]
        results = runner.run(jobs, 1, done)
        failed = [r for r in results if r.failed]
        if failed:  # the runs that finished stay in --out
            raise PointsFailed.of(failed)
        for arm, result in zip(arms_run, results, strict=True):
            dirs[arm].append(Path(result.job.out))
        i = pairs[-1] + 1
        try:
            comparison = compare_dirs(dirs["A"], dirs["B"], resamples, level)
        except CompareRefused as error:
            raise ABFailed(f"cannot compare: {error}") from None
        if change is not None:
            power_plan, stop = detect_step(comparison, metric, change, arms["A"], limit)
            why = stop or why
            if stop:
                break
            continue
        if width is None:
            break
        target = next((v for v in comparison.verdicts if v.metric == metric), None)
        half = math.nan if target is None else (target.ci_high - target.ci_low) / 2
        if i >= 2 and math.isfinite(half) and half <= width / 2:
            why = f"{metric}: CI half-width {half:.2%} within ±{width / 2:.2%} after {i}"
            break
        why = f"{metric}: max iterations ({max_iterations}) reached before ±{width / 2:.2%}"
    assert comparison is not None
    return ABOutcome(comparison, why, power_plan, dirs)


def write_ab(base: Path, outcome: ABOutcome, note: str, level: float) -> None:
    """comparison.json of an A/B: the verdicts, design, level, why it stopped, the power plan
    (--detect) and each arm's run directories."""
    from fairbench.run import write_json

    write_json(
        base / "comparison.json",
        {
            **outcome.comparison.as_dict(),
            "design": note,
            "confidence": level,
            "stopped": outcome.stopped,
            **({"power": outcome.power.as_dict()} if outcome.power is not None else {}),
            "a": [str(p) for p in outcome.dirs["A"]],
            "b": [str(p) for p in outcome.dirs["B"]],
        },
    )
