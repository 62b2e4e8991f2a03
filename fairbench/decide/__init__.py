"""Decisions across runs: paired A/B verdicts (`compare`), the CI gate (`gate`), sweeps,
Pareto fronts and the knee search (`sweep`), the simulator's error against a real run of the
same plan (`fidelity`); and where their runs run, here or as Ray tasks (`points`).

Runs scenarios through `fairbench.pipeline` and reads their summaries and records. Imports
everything below it; `report` and `cli` may import it.
"""

from fairbench.decide.compare import CompareRefused, Comparison, Verdict, compare_dirs
from fairbench.decide.fidelity import Fidelity, FidelityRefused, fidelity
from fairbench.decide.gate import GateError, Rule, evaluate, load_rules, parse_rules
from fairbench.decide.sweep import knee, pareto_front, run_sweep

__all__ = [
    "CompareRefused",
    "Comparison",
    "Fidelity",
    "FidelityRefused",
    "GateError",
    "Rule",
    "Verdict",
    "compare_dirs",
    "evaluate",
    "fidelity",
    "knee",
    "load_rules",
    "pareto_front",
    "parse_rules",
    "run_sweep",
]
