"""Pages people read: the run report (`run`, one function per figure in `figures`), its
Markdown summary (`markdown`), the A/B, history and Pareto pages (`decisions`) and the
simulator-fidelity page (`fidelity`), built from the page pieces in `html`; and what the
terminal shows of a run (`terminal`, `headline`).

Renders what `analysis` and `decide` computed; computes nothing of its own. Two modules also
write files, because only this top layer may write pages: `fidelity_outputs` (the fidelity
files) and `twin` (`run --simulate`'s simulated run and its fidelity files). Only `cli` imports
it. Pages load plotly.js from a `plotly.min.js` beside them: write every page with `write_page`
(or `write_run_report`), which puts it there, hard-linked to one shared copy.
"""

from fairbench.report.decisions import comparison_report, history_report, pareto_report
from fairbench.report.fidelity import fidelity_markdown, fidelity_report
from fairbench.report.html import write_page
from fairbench.report.markdown import markdown_summary
from fairbench.report.run import run_report, write_run_report

__all__ = [
    "comparison_report",
    "fidelity_markdown",
    "fidelity_report",
    "history_report",
    "markdown_summary",
    "pareto_report",
    "run_report",
    "write_page",
    "write_run_report",
]
