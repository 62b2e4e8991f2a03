"""fairbench: an open-loop, multi-tenant benchmark for LLM request schedulers.

The package tree is the pipeline (see docs/architecture.md):

    workload → plan → targets → run → analysis → pipeline → decide → report → cli

and each package imports only the ones before it. This module is the public API; the names are
loaded on first use, so importing one stage (a shard worker imports `fairbench.run`) does not
pay for the stages after it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fairbench._lazy import lazy_exports
from fairbench._version import __version__

_API = {
    "Scenario": "fairbench.workload",
    "ScenarioError": "fairbench.workload",
    "load_scenario": "fairbench.workload",
    "parse_scenario": "fairbench.workload",
    "Plan": "fairbench.plan",
    "load_plan": "fairbench.plan",
    "materialize": "fairbench.plan",
    "make_target": "fairbench.targets",
    "RunOptions": "fairbench.run",
    "read_records": "fairbench.run",
    "build_summary": "fairbench.analysis",
    "metric_value": "fairbench.analysis",
    "RunOutcome": "fairbench.pipeline",
    "load_partial_run": "fairbench.pipeline",
    "run_scenario": "fairbench.pipeline",
    "CompareRefused": "fairbench.decide",
    "Comparison": "fairbench.decide",
    "compare_dirs": "fairbench.decide",
    "evaluate": "fairbench.decide",
    "load_rules": "fairbench.decide",
    "run_sweep": "fairbench.decide",
    "comparison_report": "fairbench.report",
    "write_run_report": "fairbench.report",
}

__all__ = [
    "CompareRefused",
    "Comparison",
    "Plan",
    "RunOptions",
    "RunOutcome",
    "Scenario",
    "ScenarioError",
    "__version__",
    "build_summary",
    "compare_dirs",
    "comparison_report",
    "evaluate",
    "load_partial_run",
    "load_plan",
    "load_rules",
    "load_scenario",
    "make_target",
    "materialize",
    "metric_value",
    "parse_scenario",
    "read_records",
    "run_scenario",
    "run_sweep",
    "write_run_report",
]

if TYPE_CHECKING:  # pragma: no cover
    from fairbench.analysis import build_summary, metric_value
    from fairbench.decide import (
        CompareRefused,
        Comparison,
        compare_dirs,
        evaluate,
        load_rules,
        run_sweep,
    )
    from fairbench.pipeline import RunOutcome, load_partial_run, run_scenario
    from fairbench.plan import Plan, load_plan, materialize
    from fairbench.report import comparison_report, write_run_report
    from fairbench.run import RunOptions, read_records
    from fairbench.targets import make_target
    from fairbench.workload import Scenario, ScenarioError, load_scenario, parse_scenario


__getattr__, __dir__ = lazy_exports(__name__, _API, globals())
