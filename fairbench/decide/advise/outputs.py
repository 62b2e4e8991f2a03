"""What an advice search leaves in its directory: `advice.yaml` (the recommended `scheduler:`
block, as a scenario file or `--set scheduler=...` takes it) and `advice.json` (everything the
page and a reader need: targets, every trial, the front, importance, the verification with its
intervals, the recommendation or the refusal, the profile and its fidelity).

advice.json names run directories relative to the advice directory and holds no clock time, so
the same scenario, seed and budget give the same file byte for byte wherever it ran.
"""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from fairbench.analysis.intervals import Interval
from fairbench.decide.advise.search import Evaluation

if TYPE_CHECKING:
    from fairbench.decide.advise.result import Advice


def _num(x: float) -> float | None:
    return round(float(x), 6) if isinstance(x, int | float) and math.isfinite(x) else None


def _interval(it: Interval) -> dict[str, Any]:
    return it.fields()


def _rel(path: str, base: Path) -> str:
    try:
        return Path(path).resolve().relative_to(base.resolve()).as_posix()
    except ValueError:
        return path


def _run(ev: Evaluation, base: Path) -> dict[str, Any]:
    return {
        "label": ev.label,
        "seed": ev.seed,
        "run_dir": _rel(ev.run_dir, base),
        "valid": ev.valid,
        "values": {k: _num(v) for k, v in ev.values.items()},
        "attainment": {k: _num(v) for k, v in ev.attainment.items()},
        "headroom": _num(ev.headroom),
        "feasible": ev.feasible,
        "error": ev.error,
    }


def flow(block: dict[str, Any]) -> str:
    """The block on one line, as YAML flow style (what `--set scheduler=VALUE` reads)."""
    return str(yaml.safe_dump(block, default_flow_style=True, sort_keys=False, width=10**6)).strip()


def run_command(advice: Advice) -> str:
    """The command that runs the scenario with the advised block."""
    rec = advice.recommendation
    assert rec is not None
    sets = [*advice.problem.sets, "scheduler=" + flow(rec.block)]
    return f"fairbench run {shlex.quote(str(advice.problem.source))} " + " ".join(
        f"--set {shlex.quote(s)}" for s in sets
    )


def advice_yaml(advice: Advice) -> str:
    """advice.yaml: comments saying what the block is and how to use it, then the block."""
    rec = advice.recommendation
    assert rec is not None
    p = advice.problem
    seeds = p.verify_seeds
    origin = "the scenario's own configuration" if rec.own else f"{rec.label} of {p.ask.budget}"
    head = [
        f"# fairbench advise {p.source}: {origin}, searched on seed {p.seed}, verified on seeds "
        f"{seeds[0]}-{seeds[-1]}.",
        f"# Simulated on profile {p.profile}; {p.fidelity}.",
        "# Use it as it is: paste the block in place of the scenario's scheduler: block, or",
        f"#   {run_command(advice)}",
    ]
    body = yaml.safe_dump({"scheduler": rec.block}, sort_keys=False, width=100)
    return "\n".join(head) + "\n" + str(body)


def _verified(v: Any, base: Path) -> dict[str, Any]:
    return {
        "label": v.label,
        "trial": v.trial,
        "block": v.block,
        "attainment": {
            c: {"mean": _num(m), **_interval(v.attainment_ci[c])} for c, m in v.attainment.items()
        },
        "values": {n: {"mean": _num(m), **_interval(v.values_ci[n])} for n, m in v.values.items()},
        "gain": {c: {"mean": _num(m), **_interval(v.gain_ci[c])} for c, m in v.gain.items()},
        "headroom": _num(v.headroom),
        "meets": v.meets,
        "confident": v.confident,
        "errors": v.errors,
        "runs": [_run(r, base) for r in v.runs],
    }


def advice_json(advice: Advice, base: Path) -> dict[str, Any]:
    """advice.json's content (see the module docstring)."""
    from fairbench.decide.advise.space import knobs
    from fairbench.decide.sweep import pareto_front

    p = advice.problem
    trials = advice.search.trials
    ok = [t for t in trials if t.run.error is None]
    values = np.array([[t.run.values[n] for n in p.names] for t in ok]).reshape(
        len(ok), len(p.names)
    )
    front = pareto_front(values, list(p.senses)) if ok else np.zeros(0, dtype=bool)
    on_front = {t.number for t, f in zip(ok, front, strict=True) if f}
    rec = advice.recommendation
    return {
        "scenario": str(p.source),
        "seed": p.seed,
        "budget": p.ask.budget,
        "overrides": list(p.sets),
        "verify_seeds": p.verify_seeds,
        "confidence": p.ask.confidence,
        "profile": p.profile,
        "fidelity": p.fidelity,
        "notes": list(p.notes),
        "targets": [{"class": t.cls, "needs": t.share, "slo": t.slo} for t in p.targets],
        "objectives": [{"name": n, "sense": s} for n, s in zip(p.names, p.senses, strict=True)],
        "knobs": [
            {"name": k.name, "range": k.range_text, "sets": k.sets} for k in knobs(p.setting)
        ],
        "own": {**_run(advice.search.own, base), "block": p.setting.own},
        "trials": [
            {
                "number": t.number,
                "params": {
                    k: (_num(v) if isinstance(v, float) else v) for k, v in t.params.items()
                },
                "used": {k: (_num(v) if isinstance(v, float) else v) for k, v in t.used.items()},
                "block": t.run.block,
                "front": t.number in on_front,
                **_run(t.run, base),
            }
            for t in trials
        ],
        "candidates": [t.number for t in advice.chosen],
        "importance": advice.search.importance,
        "importance_method": advice.search.importance_note,
        "verification": [_verified(v, base) for v in advice.verified],
        "recommendation": None
        if rec is None
        else {
            "label": rec.label,
            "trial": rec.trial,
            "block": rec.block,
            "confident": rec.confident,
        },
        "refused": advice.refused,
    }


def write_outputs(advice: Advice, base: Path) -> list[Path]:
    """advice.json always; advice.yaml when there is a recommendation."""
    from fairbench.run import write_json

    base.mkdir(parents=True, exist_ok=True)
    written = [base / "advice.json"]
    write_json(written[0], advice_json(advice, base))
    if advice.recommendation is not None:
        path = base / "advice.yaml"
        path.write_text(advice_yaml(advice), encoding="utf-8")
        written.append(path)
    return written


def read_advice(base: Path) -> dict[str, Any]:
    """advice.json as `write_outputs` left it in `base`: the page and the command's table are
    rendered from the file, so they show what it holds."""
    data: dict[str, Any] = json.loads((base / "advice.json").read_text(encoding="utf-8"))
    return data
