"""The configured scheduler: `config` turns a `scheduler:` block into policy, profile,
admission, preemption and cache objects; `engine` steps each replica under them; `vllm` is the
vLLM V1 scheduling model that `engine: vllm` selects (`make_engine` picks). Imports `core` and
`policies`; the drivers import it."""

from reference_scheduler.scheduler.config import (
    SchedulerConfig,
    SchedulerConfigError,
    parse_scheduler_config,
)
from reference_scheduler.scheduler.engine import Engine, StepResult
from reference_scheduler.scheduler.vllm import VllmEngine, make_engine

__all__ = [
    "Engine",
    "SchedulerConfig",
    "SchedulerConfigError",
    "StepResult",
    "VllmEngine",
    "make_engine",
    "parse_scheduler_config",
]
