"""The profile fit on its own (fairbench/targets/profile/fit.py, issue 36 item 4b): the step floor,
`a` apart from the request overhead, on data whose truth is known and on a real engine's probes.

Why a file apart from test_profile_probe.py: these run no server, so they hold the fit's logic
in a second, where the live probes of the reference server take a minute each. What would
break: a fit whose start or scale leaves `a` at 0 (on the CPU vLLM the floor and the overhead
then took its part: a = 1e-16, the overhead 7.3 ms, and the fidelity test's twins ran 31%
fast), a floor fitted to one short prompt's noise, or a floor missed where the data hold one;
an arrival's cost (the arrival phase) left in the mixed steps, or taken out twice; the arrival
and mixed windows read off the wrong gaps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from fairbench.targets.profile import Observation, Stream
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


# What an arriving request adds to a busy engine's steps in `arrival_design` (the CPU vLLM's
# API server tokenising it on the engine's core: more for a longer prompt).
ARRIVAL = {244: 1.0, 488: 1.5, 976: 2.5}


def arrival_design(rounds: int = 3) -> list[Observation]:
    """`cpu_design` as an engine that pays ARRIVAL per arriving request gives it: each mixed
    step (its long prompt arrives while the batch decodes) carries its prompt's arrival cost,
    and the arrival phase reads it on a full batch (3 of 4 decoding: batch 4), `rounds` times
    (the later ones 0.2 ms to either side, as a round's noise)."""
    obs = []
    for o in cpu_design(0.0):
        extra = ARRIVAL[o.n] if o.kind == "mixed" else 0.0
        obs.append(Observation(o.kind, o.n, o.batch, o.context, o.ms + extra, o.key))
    for r in range(rounds):
        wobble = (-0.2, 0.0, 0.2)[r % 3]
        obs += [
            Observation("arrival", n, 4, 4 * 44, ms + wobble, f"arrival {n}")
            for n, ms in ARRIVAL.items()
        ]
    return obs


def test_the_arrival_cost_comes_out_of_the_mixed_steps() -> None:
    """The mixed steps' long prompts arrive at a busy engine, so what an arrival costs (an API
    server on the engine's core parsing and tokenising it; an engine's charge per arrival) is
    in them. Taken out by the arrival phase's measure of it, `a` and the overhead come back;
    left in (no arrival rows: profiles written before the phase, which fit as they did), the
    fit bends the other coefficients to the mixed steps (here d 2.45 read as 0.78, e 0.15 as
    0.047, the overhead 3.0 as 2.75). The data keep the mixed steps as measured, so a merge of
    this fit takes the cost out once more, not twice."""
    obs = arrival_design()
    chosen = fit(obs)
    got = chosen.coefficients
    for key, true in {**CPU, "overhead": OVERHEAD}.items():
        assert got[key] == pytest.approx(true, rel=1e-2, abs=1e-6), (key, got)
    assert chosen.arrival is not None
    assert chosen.arrival["by_prompt"] == ARRIVAL
    assert chosen.arrival["per_token_ms"] == pytest.approx(0.5 / 244, rel=1e-3)
    assert chosen.arrival["observations"] == 3 * len(ARRIVAL)
    assert chosen.summary()["arrival"] is chosen.arrival
    measured = {r["key"]: r["ms"] for r in chosen.raw if r["kind"] == "mixed"}
    assert measured == {o.key: round(o.ms, 3) for o in obs if o.kind == "mixed"}
    assert sum(1 for r in chosen.raw if r["kind"] == "arrival") == 3 * len(ARRIVAL)
    # without the arrival phase: the old fit, the cost in `a`
    old = fit([o for o in obs if o.kind != "arrival"])
    assert old.arrival is None and "arrival" not in old.summary()
    assert old.coefficients["d"] < 0.5 * CPU["d"], old.coefficients
    # one arrival read in a noisy window (-5 ms for +2.5: a loaded machine's steps jitter by
    # ±3 ms) moves the line, fitted over every observation, little
    noisy = fit([*obs, Observation("arrival", 976, 4, 176, -5.0, "arrival 976")])
    for n, ms in noisy.arrival["by_prompt"].items():
        assert ms == pytest.approx(ARRIVAL[n], abs=0.25), noisy.arrival
    # a merge's probe data takes an arrival below 0 (a difference of steps: noise either way)
    doc = {"fit": {"data": [*chosen.raw[:-1], {**chosen.raw[-1], "ms": -0.4}]}}
    assert probe_data(doc, "probe.yaml")[-1].ms == -0.4


def _stream(gaps_ms: list[float]) -> Stream:
    """A decode stream whose first token came at 0 and whose tokens follow `gaps_ms` apart."""
    t = np.concatenate([[0.0], np.cumsum(gaps_ms)]) * 1e6
    return Stream(0, [round(float(v)) for v in t])


def test_the_arrival_window_reads_what_the_steps_gained() -> None:
    """`arrival_costs` on decode streams of 10 ms steps: a request sent in gap 5 whose engine
    charged 3 ms to the next step reads 3.0, in every stream, even where the client stamped the
    token between the two 2 ms late (that gap longer, the next shorter: the window's sum holds
    it); a request sent where no whole window follows reads None; a stream too short for a
    baseline is left out."""
    from fairbench.targets.profile.probe import arrival_costs

    gaps = [10.0] * 20
    gaps[6] += 3.0  # the step after the one it arrived in (gap 5: 50-60 ms)
    late = list(gaps)
    late[5] += 2.0  # token 6 stamped 2 ms late
    late[6] -= 2.0
    streams = [_stream(gaps), _stream(late), _stream(gaps)]
    sent = [int(52e6), int(195e6)]
    assert arrival_costs(streams, sent) == [pytest.approx(3.0), None]
    assert arrival_costs([_stream(late)], [int(52e6)]) == [pytest.approx(3.0)]
    assert arrival_costs([_stream([10.0] * 3)], [int(2e6)]) == [None]
    # steps that grow with the context (0.1 ms a step here): read against the line they lie
    # on, not their median, which the middle's gap sets (here 1 ms above the window's)
    growing = [10.0 + 0.1 * i for i in range(30)]
    growing[6] += 3.0
    t = np.cumsum([0.0, *growing])
    assert arrival_costs([_stream(growing)], [int((t[5] + 2.0) * 1e6)]) == [pytest.approx(3.0)]


def test_the_mixed_step_ends_at_its_first_output() -> None:
    """`gap_at`: decode streams of 10 ms steps, then a 30 ms mixed step whose long prompt's
    token came at its end (90 ms) and the decodes' tokens 1.5 ms after it, as the server
    finishing the long request first delivers them (the reference server: the mixed steps read
    1.5-2 ms long, which went to `a`). The step is read to the first of its outputs, 30 ms;
    the decodes' own stamps read 31.5."""
    from fairbench.targets.profile.probe import gap_at

    gaps = [10.0] * 6 + [31.5, 8.5] + [10.0] * 4  # token 7 (the mixed step's) at 91.5 ms
    streams = [_stream(gaps) for _ in range(3)]
    assert gap_at(streams, int(90e6)) == pytest.approx(30.0)
    assert gap_at(streams, int(91.5e6)) == pytest.approx(31.5)


def test_the_mixed_step_is_read_from_the_gap_its_prompt_was_sent_in() -> None:
    """`gap_at` with the send time: decode streams of 10 ms steps; the long prompt sent at
    52 ms (gap 5), its front end on the engine's core 3 ms of gap 5 and 2 ms of gap 6 (the CPU
    vLLM's API server tokenising it before its engine sees it), then a 30 ms mixed step (gap 7).
    From the gap it was sent in, the window holds the step and the whole arrival (35), as the
    arrival phase's window does, so the arrival phase's 5 ms taken out leaves the step; the
    two gaps alone hold 2 ms of it (32), and 5 taken out of those read the step 3 ms short.
    Sent in the gap before the step (the reference server's charge on the next step), both
    windows are the same two gaps."""
    from fairbench.targets.profile.probe import gap_at

    gaps = [10.0] * 5 + [13.0, 12.0, 30.0] + [10.0] * 4
    streams = [_stream(gaps) for _ in range(3)]
    end = int(sum(gaps[:8]) * 1e6)  # the mixed step's token, and the long prompt's with it
    assert gap_at(streams, end) == pytest.approx(32.0)
    assert gap_at(streams, end, sent_ns=int(52e6)) == pytest.approx(35.0)
    assert gap_at(streams, end, sent_ns=int(64e6)) == pytest.approx(32.0)
    # its first output before the decodes' tokens (`test_the_mixed_step_ends_at_its_first_output`)
    assert gap_at(streams, end - int(1e6), sent_ns=int(52e6)) == pytest.approx(34.0)


def test_the_wider_read_is_kept_only_beside_an_arrival_measure() -> None:
    """`mixed_points`: a round whose arrival phase measured something keeps each mixed step's
    read from its prompt's send (the fit takes the arrival out of it); a round where it
    measured nothing, or a step with no wider read, keeps the two gaps, which the fit uses as
    they are."""
    from fairbench.targets.profile.probe import mixed_points

    two = [Observation("mixed", n, 3, 200, 20.0, f"mixed {n}+3") for n in (256, 512)]
    read = [(two[0], Observation("mixed", 256, 3, 200, 24.0, "mixed 256+3")), (two[1], None)]
    assert [o.ms for o in mixed_points(read, True)] == [24.0, 20.0]
    assert mixed_points(read, False) == two
