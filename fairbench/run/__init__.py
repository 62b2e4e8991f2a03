"""Execution: a plan replayed open-loop against a target into a run directory of records.

The run directory (`rundir`), the open-loop executor (`executor`), the journal and record
schema (`records`), one live process (`live`), several shards with one t0 (`shards`), the
Prometheus scraper (`scrape`), the simulated path and the `Measurement` they all end in
(`measure`), and read-back of a crashed run (`recovery`). It computes no figures: analysis is
the next stage. Imports `workload`, `plan` and `targets`; `analysis` and above may import it.
"""

from typing import TYPE_CHECKING

from fairbench._lazy import lazy_exports
from fairbench.run.exec_types import ExecOptions, LiveCounters
from fairbench.run.measure import Measurement, measure
from fairbench.run.records import check_accounting, read_records, records_frame
from fairbench.run.recovery import read_partial
from fairbench.run.rundir import RunOptions, write_json

__all__ = [
    "ExecOptions",
    "Executor",
    "LiveCounters",
    "Measurement",
    "RunOptions",
    "check_accounting",
    "measure",
    "read_partial",
    "read_records",
    "records_frame",
    "write_json",
]

# the executor (asyncio and the live path) on first use: a simulated run never starts it
_API = {"Executor": "fairbench.run.executor"}

if TYPE_CHECKING:  # pragma: no cover
    from fairbench.run.executor import Executor

__getattr__, __dir__ = lazy_exports(__name__, _API, globals())
