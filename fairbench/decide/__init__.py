"""Decisions across runs: paired A/B verdicts (`compare`), the CI gate (`gate`), and sweeps,
Pareto fronts and the knee search (`sweep`); where their runs run, here or as Ray tasks
(`points`).

Runs scenarios through `fairbench.pipeline` and reads their summaries and records. Imports
everything below it; `report` and `cli` may import it.
"""

from fairbench.decide.compare import CompareRefused, Comparison, Verdict, compare_dirs
from fairbench.decide.gate import GateError, Rule, evaluate, load_rules, parse_rules
from fairbench.decide.sweep import knee, pareto_front, run_sweep

__all__ = [
    "CompareRefused",
    "Comparison",
    "GateError",
    "Rule",
    "Verdict",
    "compare_dirs",
    "evaluate",
    "knee",
    "load_rules",
    "pareto_front",
    "parse_rules",
    "run_sweep",
]
