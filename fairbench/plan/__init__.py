"""The plan: every request a run will send, decided up front from the scenario and one seed.

`materialize(scenario, seed)` is deterministic (same scenario and seed, same plan, byte for
byte: the sha256 digest says so), and the `Plan` value is what the executor replays and what an
A/B pairs on. Imports only `workload`; `targets`, `run` and everything above may import it.
"""

from fairbench.plan.materialize import materialize
from fairbench.plan.model import Plan, PlannedRequest, load_plan

__all__ = ["Plan", "PlannedRequest", "load_plan", "materialize"]
