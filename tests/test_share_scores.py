"""A share's score and its indicator agree: SLO attainment's `met` is `slack <= 1` and the
starved share's `late` is `score > 1`, request for request, on a simulated run with misses of
both kinds (the copula reads the score's correlation as the indicator's, so a score that did
not threshold to the indicator would widen the interval by another series' dependence)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fairbench.analysis.blocks import unloaded_ns
from fairbench.analysis.columns import Cols
from fairbench.analysis.definitions import METRICS
from fairbench.analysis.summary import slo_table
from fairbench.plan import materialize
from fairbench.run.records import records_frame
from fairbench.targets.sim import run_sim
from fairbench.workload import load_scenario

REPO = Path(__file__).resolve().parents[1]


def test_each_share_thresholds_its_score() -> None:
    scn = load_scenario(REPO / "scenarios" / "incident-fifo.yaml")  # misses from 60 s on
    rows, _ = run_sim(materialize(scn, 3), scn)
    df = records_frame(rows)
    c = Cols.of(
        df,
        slos=slo_table(scn),
        classes=list(scn.slo_classes),
        tenants=[t.id for t in scn.tenants],
        workloads=list(scn.workloads),
        window_s=180.0,
        timeout_s=scn.run.timeout,
        unloaded_ns=unloaded_ns(df, scn)[0],
    )
    by_name = {m.name: m for m in METRICS}
    attainment, starved = by_name["slo_attainment"], by_name["starved_share"]
    assert attainment.score is not None and starved.score is not None
    met, slack = np.asarray(c.met), attainment.score(c)
    assert 0 < met.sum() < len(met), "the run must have misses and hits"
    assert np.array_equal(met, slack <= 1.0)
    assert starved.share_of is not None and starved.indicator is not None
    pop = starved.share_of(c)
    late, score = np.asarray(starved.indicator(c))[pop], starved.score(c)[pop]
    assert late.any()
    assert np.array_equal(late, score > 1.0)
