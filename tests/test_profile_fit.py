"""The profile fit on its own (fairbench/targets/profile/fit.py, issue 36 item 4b): the step floor,
`a` apart from the request overhead, on data whose truth is known and on a real engine's probes.

Why a file apart from test_profile_probe.py: these run no server, so they hold the fit's logic
in a second, where the live probes of the reference server take a minute each. What would
break: a fit whose start or scale leaves `a` at 0 (on the CPU vLLM the floor and the overhead
then took its part: a = 1e-16, the overhead 7.3 ms, and the fidelity test's twins ran 31%
fast), a floor fitted to one short prompt's noise, or a floor missed where the data hold one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fairbench.targets.profile import Observation
from fairbench.targets.profile.load import fit
from fairbench.targets.profile.merge import probe_data
from tests.profile_design import exact_design

FIXTURES = Path(__file__).parent / "fixtures" / "profile"

# A CPU vLLM as `fairbench profile` read one (the tests' tiny model on one core, 2026-12-04):
# the sum form, a prefill that bends up (c·n² a third of the longest prompt's), a small `a`.
CPU = {"a": 2.6, "b": 0.03, "c": 1.5e-5, "d": 2.45, "e": 0.15, "f": 0.00035}
OVERHEAD = 3.0


def cpu_design(floor: float, form: str = "sum") -> list[Observation]:
    """The probe's design points on the CPU vLLM's limits (max_num_seqs 4, 2,048 tokens a step)
    as an exact engine of CPU (and `floor`) gives them: each prefill's TTFT with OVERHEAD in
    it, the decode and mixed steps without."""
    return exact_design(
        {**CPU, "mixed_step": form},
        floor=floor,
        overhead=OVERHEAD,
        prefills=(16, 32, 63, 125, 248, 492, 977, 1938),
        decode_prompts=(32, 969),
        decode_batches=(1, 2, 4),
        mixed=((244, 488, 976), 3, 190),
        mixed_label="mixed {n}+3",
    )


@pytest.mark.parametrize("floor", [0.0, 5.0])
def test_a_bending_prefill_keeps_a_apart_from_the_overhead(floor: float) -> None:
    """On exact data of the CPU vLLM's shape every coefficient comes back, the floor included
    where it binds (16-63 tokens at 5 ms). Before, the start drew a line through the prefills
    whose intercept the bend pushed below 0, started `a` and the overhead at 0 and scaled them
    by 1e-6, so they stayed there (a = 1e-16) and the floor and b took their part."""
    chosen = fit(cpu_design(floor))
    assert chosen.form == "sum", chosen.rms_by_form
    got = chosen.coefficients
    for key, true in {**CPU, "floor": floor, "overhead": OVERHEAD}.items():
        assert got[key] == pytest.approx(true, rel=1e-2, abs=1e-6), (key, got)


def test_one_high_short_prompt_is_not_a_floor() -> None:
    """A sweep whose 16-token prefill came out 40% high (a wake, a neighbour) has no floor in
    it: the floor fitted there binds one length, or predicts held-out points worse than none,
    so none is written and `a` keeps its value."""
    obs = cpu_design(0.0)
    obs[0] = Observation("prefill", 16, 0, 0, 1.4 * obs[0].ms, "prefill 16")
    chosen = fit(obs)
    got = chosen.coefficients
    assert got["floor"] == 0.0, (got, chosen.held_by_model)
    assert got["a"] == pytest.approx(CPU["a"], rel=0.15), got


def _probe(name: str) -> list[Observation]:
    doc = yaml.safe_load((FIXTURES / name).read_text(encoding="utf-8"))
    return probe_data(doc, name)


PROBES = sorted(p.name for p in FIXTURES.glob("cpu-vllm-probe-*.yaml"))


@pytest.mark.parametrize("name", PROBES)
def test_the_cpu_vllms_probes_fit_a_and_the_sum_form(name: str) -> None:
    """Real probes of the CPU vLLM (a fidelity test's, 2026-12-04; fit.data as the probe wrote
    it): the sum form, and `a` where the mixed steps put it. The floor fit as it was first
    merged read a = 1e-16 on all three, a floor of 3.9-9.2 ms, the overhead 0-4.3 ms, and the
    max form on two (its rule took sum only 5% ahead; in that state the fidelity test's twins
    ran 31% fast); main's fit without a floor read a = 2.6-2.8 ms, sum."""
    the_fit = fit(_probe(name))
    got: dict[str, Any] = the_fit.coefficients
    assert the_fit.form == "sum", the_fit.rms_by_form
    assert 1.5 <= got["a"] <= 5.0, got
    assert got["overhead"] + min(got["floor"], got["a"]) <= 10.0, got
