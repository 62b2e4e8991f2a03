"""The served scheduler's configuration file (`python -m reference_scheduler serve CONFIG`).

    model: reference                 # the one model name served
    host: 127.0.0.1                  # loopback unless told otherwise
    port: 8000                       # 0 picks a free port (printed on the first stdout line)
    scheduler: {policy: dwrr, ...}   # the same block scenarios use
    tenants:                         # API key -> tenant; with keys, unknown keys get 401
      - {id: chat-app, api_key: sk-..., weight: 2, classes: [interactive]}
    slo_classes: {interactive: 0, batch: 1, best-effort: 2}   # class -> priority rank
    timing_extension: false          # add queue time etc. to responses (off: strict OpenAI shape)
    max_tokens_limit: 32768

A tenant's first listed class is its default; a request may ask for another class only if the
tenant lists it (header `X-SLO-Class`). Nothing in a request can name another tenant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reference_scheduler.core.validation import lines_from
from reference_scheduler.scheduler.config import (
    SchedulerConfig,
    SchedulerConfigError,
    parse_scheduler_config,
)
from reference_scheduler.server.faults import FaultSpec


class TenantEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str = Field(min_length=1, max_length=128)
    api_key: str | None = Field(None, min_length=1)
    weight: float = Field(1.0, gt=0, allow_inf_nan=False)
    classes: list[str] = Field(default_factory=lambda: ["interactive"], min_length=1)


class ServerSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    model: str = "reference"
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    scheduler: dict[str, Any] = Field(default_factory=dict)
    tenants: list[TenantEntry] = Field(default_factory=list)
    slo_classes: dict[str, int] = Field(
        default_factory=lambda: {"interactive": 0, "batch": 1, "best-effort": 2}
    )
    timing_extension: bool = False
    max_tokens_limit: int = Field(32768, ge=1)
    faults: FaultSpec | None = None  # see faults.py: seeded, counted failure injection


class ServerConfig:
    def __init__(self, spec: ServerSpec, scheduler: SchedulerConfig) -> None:
        self.spec = spec
        self.scheduler = scheduler
        self.by_key = {t.api_key: t for t in spec.tenants if t.api_key}
        self.by_id = {t.id: t for t in spec.tenants}
        self.default_tenant = TenantEntry(id="default", classes=[next(iter(spec.slo_classes))])

    @property
    def keys_required(self) -> bool:
        return bool(self.by_key)


def parse_server_config(data: Any) -> ServerConfig:
    try:
        spec = ServerSpec.model_validate(data or {})
    except ValidationError as error:
        raise SchedulerConfigError(lines_from(error)) from None
    try:
        scheduler = parse_scheduler_config(spec.scheduler)
    except SchedulerConfigError as error:
        raise SchedulerConfigError([f"scheduler.{line}" for line in error.lines]) from None
    problems = []
    for i, tenant in enumerate(spec.tenants):
        for cls in tenant.classes:
            if cls not in spec.slo_classes:
                problems.append(
                    f"tenants[{i}].classes: unknown class {cls!r}; "
                    f"defined: {sorted(spec.slo_classes)}"
                )
    dis = scheduler.spec.disaggregation
    if dis is not None and dis.decode_admission != "pooled":
        problems.append(
            "scheduler.disaggregation.decode_admission: the real-time server runs `pooled` only, "
            "for now; remove it, or run the scenario in the simulator (target: sim)"
        )
    keys = [t.api_key for t in spec.tenants if t.api_key]
    if len(keys) != len(set(keys)):
        problems.append("tenants: two tenants share an api_key")
    if problems:
        raise SchedulerConfigError(problems)
    return ServerConfig(spec, scheduler)


def load_server_config(path: str | Path) -> ServerConfig:
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    return parse_server_config(data)
