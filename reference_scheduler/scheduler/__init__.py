"""The configured scheduler: `config` turns a `scheduler:` block into policy, profile,
admission, preemption and cache objects; `engine` steps each replica under them. Imports `core`
and `policies`; the drivers import it."""

from reference_scheduler.scheduler.config import (
    SchedulerConfig,
    SchedulerConfigError,
    parse_scheduler_config,
)
from reference_scheduler.scheduler.engine import Engine, StepResult

__all__ = [
    "Engine",
    "SchedulerConfig",
    "SchedulerConfigError",
    "StepResult",
    "parse_scheduler_config",
]
