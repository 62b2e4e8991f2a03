"""What the user asks for: the scenario model and its one-line errors, human units, token-length
distributions, arrival processes, trace readers and prompt recipes.

The first stage of the pipeline. It imports nothing of fairbench's other packages (only the
reference scheduler's config and fault models, whose fields a scenario embeds); every other
package may import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fairbench._lazy import lazy_exports

_API = {
    "Scenario": "fairbench.workload.scenario",
    "ScenarioError": "fairbench.workload.scenario",
    "Tenant": "fairbench.workload.scenario",
    "TraceError": "fairbench.workload.traces",
    "Workload": "fairbench.workload.scenario",
    "json_schema": "fairbench.workload.scenario",
    "load_scenario": "fairbench.workload.scenario",
    "parse_duration": "fairbench.workload.units",
    "parse_rate": "fairbench.workload.units",
    "parse_scenario": "fairbench.workload.scenario",
    "read_trace": "fairbench.workload.traces",
    "read_yaml": "fairbench.workload.scenario",
}

__all__ = [
    "Scenario",
    "ScenarioError",
    "Tenant",
    "TraceError",
    "Workload",
    "json_schema",
    "load_scenario",
    "parse_duration",
    "parse_rate",
    "parse_scenario",
    "read_trace",
    "read_yaml",
]

if TYPE_CHECKING:  # pragma: no cover
    from fairbench.workload.scenario import (
        Scenario,
        ScenarioError,
        Tenant,
        Workload,
        json_schema,
        load_scenario,
        parse_scenario,
        read_yaml,
    )
    from fairbench.workload.traces import TraceError, read_trace
    from fairbench.workload.units import parse_duration, parse_rate

__getattr__, __dir__ = lazy_exports(__name__, _API, globals())
