"""The scenario file: a whole multi-tenant experiment as YAML, validated before anything runs.

Validation is pydantic (it also gives us the JSON Schema editors autocomplete against); what
users see is not pydantic's report but one line per problem, `field.path: what is wrong (what is
allowed)`, raised as `ScenarioError` and printed by the CLI without a traceback. Cross-field
rules (a tenant's mix names a defined workload, a trace tenant names a defined trace, …) are
checked after the field-level pass so that they can name the exact field too.

This module is the format's public face: the code is split by job (fairbench.workload.errors,
unit_fields, models, checks, loading, schema_export) and re-exported here so that
`from fairbench.workload.scenario import Scenario, parse_scenario` keeps working.
"""

from __future__ import annotations

from fairbench.workload.checks import URL_KINDS, target_url, url_problem
from fairbench.workload.errors import ScenarioError
from fairbench.workload.loading import load_scenario, parse_scenario, read_yaml
from fairbench.workload.models import (
    DEFAULT_SLO_CLASSES,
    Arrival,
    ConstantArrival,
    ConstantDist,
    EmpiricalDist,
    ExponentialDist,
    GammaArrival,
    GatewayDispatch,
    GatewayUpstream,
    HealthSpec,
    LengthDist,
    LogNormalDist,
    NormalDist,
    OnOffArrival,
    Phase,
    PoissonArrival,
    Prefix,
    PrioritySpec,
    RampArrival,
    RunSpec,
    Scenario,
    SLOClass,
    TargetSpec,
    Tenant,
    TraceArrival,
    TraceSpec,
    UniformDist,
    Workload,
)
from fairbench.workload.schema_export import json_schema
from fairbench.workload.unit_fields import (
    DURATION_PATTERN,
    RATE_PATTERN,
    Finite,
    NonNegRate,
    NonNegSeconds,
    PerSecond,
    PositiveRate,
    PositiveSeconds,
    Seconds,
)

__all__ = [
    "DEFAULT_SLO_CLASSES",
    "DURATION_PATTERN",
    "RATE_PATTERN",
    "URL_KINDS",
    "Arrival",
    "ConstantArrival",
    "ConstantDist",
    "EmpiricalDist",
    "ExponentialDist",
    "Finite",
    "GammaArrival",
    "GatewayDispatch",
    "GatewayUpstream",
    "HealthSpec",
    "LengthDist",
    "LogNormalDist",
    "NonNegRate",
    "NonNegSeconds",
    "NormalDist",
    "OnOffArrival",
    "PerSecond",
    "Phase",
    "PoissonArrival",
    "PositiveRate",
    "PositiveSeconds",
    "Prefix",
    "PrioritySpec",
    "RampArrival",
    "RunSpec",
    "SLOClass",
    "Scenario",
    "ScenarioError",
    "Seconds",
    "TargetSpec",
    "Tenant",
    "TraceArrival",
    "TraceSpec",
    "UniformDist",
    "Workload",
    "json_schema",
    "load_scenario",
    "parse_scenario",
    "read_yaml",
    "target_url",
    "url_problem",
]
