"""What the user asks for: the scenario model and its one-line errors, human units, token-length
distributions, arrival processes, trace readers and prompt recipes.

The first stage of the pipeline. It imports nothing of fairbench's other packages (only the
reference scheduler's config and fault models, whose fields a scenario embeds); every other
package may import it.
"""

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
