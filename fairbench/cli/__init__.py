"""The `fairbench` command: thin typer commands that parse, call, and print.

`main` holds the app and the plan/validate/schema commands, `run` the main job, `analysis`
compare, ab, sweep, pareto, knee, gate and report, and `inputs` what they all read from the
command line (scenarios with `--a`/`--b`/`--set` overrides, run directories, `--confidence`),
refusing bad input in one line. Nothing here computes a figure. Nothing
imports it but the console script and `python -m fairbench.cli`.
"""

import os

# The command's process settings, set before anything loads NumPy (which reads them at import)
# and inherited by the processes it starts (a sweep's pool, the solo arms); a variable the user
# set wins. NUMPY_MADVISE_HUGEPAGE=0: NumPy otherwise asks the kernel for transparent huge pages
# for every array of 4 MiB or more, and on the VMs measured each such fault cost milliseconds
# (compaction): a 10-minute fleet run spent 8.3-8.9 CPU s in the kernel with them, 5.1-5.7
# without, its user time no lower with them (benchmarks/bench_sim.py --stages, issue 35).
PROCESS_ENV = {"NUMPY_MADVISE_HUGEPAGE": "0"}
for _name, _value in PROCESS_ENV.items():
    os.environ.setdefault(_name, _value)

from fairbench.cli.main import app, main  # noqa: E402  (after the settings above)

__all__ = ["PROCESS_ENV", "app", "main"]
