"""`fairbench fidelity REAL SIM`'s measurement and its files, and its headline line.

It exists so that `fairbench fidelity` and `fairbench run --simulate` write the same
fidelity.json, fidelity.md and fidelity.html and print the same MAPE line, computed outside the
command line. Imports `decide.fidelity` (the measurement) and this package's page builders.
"""

from __future__ import annotations

import math
from pathlib import Path

from fairbench.decide.fidelity import Fidelity


def measure_fidelity(
    real: Path, sim: Path, noise: Path | None = None, factor: float = 1.0, out: Path | None = None
) -> tuple[Fidelity, list[Path]]:
    """The fidelity of `sim` against `real` and its files (fidelity.json, .md, .html in `out`,
    default SIM). Raises FidelityRefused (one line) when the runs cannot be compared."""
    from fairbench.decide.fidelity import fidelity as measure
    from fairbench.decide.fidelity import write_outputs
    from fairbench.report.fidelity import fidelity_markdown, fidelity_report
    from fairbench.report.html import write_page

    fid = measure(real, sim, noise, factor)
    target = out if out is not None else sim
    written = write_outputs(fid, target, fidelity_markdown(fid))
    written.append(write_page(target / "fidelity.html", fidelity_report(fid)))
    return fid, written


def mape_line(fid: Fidelity) -> str:
    """The headline: MAPE over every figure, and per tenant."""
    mape = fid.mape()
    if not math.isfinite(mape):
        return "MAPE: no figure both runs have"
    tenants = [
        f"{key} {fid.mape('tenant', key):.1f}%"
        for group, key in fid.groups()
        if group == "tenant" and math.isfinite(fid.mape("tenant", key))
    ]
    per = f" (per tenant: {', '.join(tenants)})" if tenants else ""
    return f"MAPE {mape:.1f}% over {len(fid.finite())} figures{per}"
