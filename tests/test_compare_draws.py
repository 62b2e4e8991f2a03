"""A bootstrap draw assembled from a run's time blocks (fairbench.decide.draws) is what copying
the drawn rows (`Cols.take`) would give, to the bit: the columns, every group's observations
and their sorted values, and so `compare`'s draws and verdicts."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from fairbench.analysis import registry
from fairbench.analysis.columns import Cols
from fairbench.analysis.registry import Name
from fairbench.decide import compare
from fairbench.decide.compare import compare_scenario_pairs
from fairbench.decide.draws import OVERALL, BlockSource, Group
from fairbench.workload.loading import load_scenario
from tests.test_compare import INCIDENT, REPO, sim_run

DIMENSIONS = {"class": "cls", "tenant": "tenant", "workload": "workload"}


def synthetic_cols(n: int, seed: int) -> Cols:
    """A run's columns with what the fast paths must get right: tied latencies (rounded),
    censored and ineligible requests, zero latencies, and groups of every dimension."""
    rng = np.random.default_rng(seed)

    def latency() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        time = np.round(rng.exponential(50.0, n)) * 1e6  # ties: whole milliseconds, and 0
        return time, rng.random(n) > 0.1, rng.random(n) > 0.05

    ttft, e2e, tpot = latency(), latency(), latency()
    ok = rng.random(n) > 0.2
    return Cols(
        ok=ok,
        rejected=~ok & (rng.random(n) > 0.5),
        admitted=rng.random(n) > 0.1,
        unfinished=~ok & (rng.random(n) > 0.5),
        ttft_t=ttft[0],
        ttft_o=ttft[1],
        ttft_x=ttft[2],
        e2e_t=e2e[0],
        e2e_o=e2e[1],
        e2e_x=e2e[2],
        tpot_t=tpot[0],
        tpot_o=tpot[1],
        tpot_x=tpot[2],
        met=rng.random(n) > 0.3,
        slack=rng.exponential(1.0, n),
        cls=rng.integers(0, 3, n),
        tenant=rng.integers(0, 4, n),
        workload=rng.integers(0, 2, n),
        served=rng.exponential(300.0, n),
        demand=rng.exponential(400.0, n),
        output_tokens=rng.integers(0, 200, n).astype(float),
        unloaded=rng.exponential(2e7, n) + 1.0,
        t=np.sort(rng.uniform(0, 60e9, n)),
        slo_ttft=np.where(rng.random(n) > 0.3, 2e9, np.nan),
        solo_ttft=np.array([1e8, np.nan, 3e8, 4e8]),
        solo_ttft_se=np.array([0.1, np.nan, 0.1, 0.1]),
        window_s=60.0,
    )


def time_blocks(c: Cols, seconds: float) -> list[np.ndarray]:
    block = (c.t // (seconds * 1e9)).astype(np.int64)
    _, block = np.unique(block, return_inverse=True)
    return [np.flatnonzero(block == k) for k in range(block.max() + 1)]


def groups(c: Cols) -> Iterator[Group]:
    yield OVERALL
    for dim, column in DIMENSIONS.items():
        for code in range(int(getattr(c, column).max()) + 2):  # and one with no rows
            yield dim, code


def same_array(a: Any, b: Any) -> None:
    assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()  # to the bit (NaNs and the sign of zeros too)


@pytest.mark.parametrize("layout", ["tiled", "interleaved"])
def test_a_draw_is_the_take_of_its_rows_to_the_bit(layout: str) -> None:
    """Every column, and every latency's observations of every group with their sorted values,
    equal `Cols.take` of the drawn rows and `Cols.obs` on it, whether the blocks tile the rows
    in order (slices) or not (a gather)."""
    c = synthetic_cols(3000, seed=1)
    blocks = time_blocks(c, 4.0)
    if layout == "interleaved":  # every 7th row a block: not contiguous, in another order
        rows = np.arange(len(c))
        blocks = [rows[k::7] for k in (3, 0, 6, 1, 5, 2, 4)]
    source = BlockSource(c, blocks)
    assert source.tiled == (layout == "tiled")
    rng = np.random.default_rng(2)
    for _ in range(5):
        picked = rng.integers(0, len(blocks), len(blocks))
        draw = source.draw(picked)
        taken = c.take(np.concatenate([blocks[i] for i in picked]))
        assert len(draw) == len(taken)
        for name in source.per_request:
            same_array(getattr(draw, name), getattr(taken, name))
        for name in source.whole:
            assert getattr(draw, name) is getattr(taken, name)
        for dim, code in groups(c):
            mask = want_mask = None
            if dim != "overall":
                mask = draw.group_mask(dim, code)
                want_mask = getattr(taken, DIMENSIONS[dim]) == code
                same_array(mask, want_mask)
            for which in ("ttft", "e2e", "tpot"):
                got, want = draw.obs(which, mask), taken.obs(which, want_mask)
                for field in ("time", "observed", "t", "sorted_time"):
                    same_array(getattr(got, field), getattr(want, field))
                assert got.ranked == want.ranked


def test_a_mask_made_elsewhere_finds_the_same_observations() -> None:
    """A metric's own `c.tenant == k` (the isolation figures') reads what `group_mask`'s made,
    through the columns' memo; a mask of no known group goes the plain way."""
    c = synthetic_cols(2000, seed=3)
    draw = BlockSource(c, time_blocks(c, 5.0)).draw(np.array([2, 2, 0, 5, 7, 1, 9, 3, 3, 4, 11]))
    made = draw.obs("ttft", draw.group_mask("tenant", 2))
    assert draw.obs("ttft", draw.tenant == 2) is made
    other = draw.tenant >= 2
    plain = draw.obs("ttft", other)
    keep = draw.ttft_x & other
    same_array(plain.time, draw.ttft_t[keep])
    same_array(plain.sorted_time, np.sort(draw.ttft_t[keep]))


def test_a_column_no_metric_reads_is_never_copied() -> None:
    c = synthetic_cols(500, seed=4)
    draw = BlockSource(c, time_blocks(c, 6.0)).draw(np.array([0, 1, 1, 3, 4, 5, 6, 7, 8, 9]))
    draw.obs("e2e", draw.group_mask("class", 1))
    assert not _is_set(draw, "demand")
    assert _is_set(draw, "cls") and not _is_set(draw, "e2e_t")  # observations come from layouts
    with pytest.raises(AttributeError):
        draw.no_such_column  # noqa: B018


def _is_set(c: Cols, name: str) -> bool:
    """Whether the slot `name` holds a value (without `DrawCols.__getattr__` taking it)."""
    try:
        Cols.__dict__[name].__get__(c)
    except AttributeError:
        return False
    return True


def plain_bootstrap(
    rows: list[Name], pairs: list[Any], names: dict[str, list[str]], resamples: int, seed: int
) -> np.ndarray:
    """`compare._bootstrap`'s draws by the definition (`compare.take_draw`: the drawn rows
    copied with `Cols.take`, each row's metric computed on the copies)."""
    rng = np.random.default_rng(seed)
    draws = np.zeros((len(rows), resamples))
    for d in range(resamples):
        compare.take_draw(rows, pairs, names, rng, draws, d)
    return draws


def every_request_row(scn: Any) -> list[Name]:
    """Every request-level metric for every group it exists for (a workload's, TPOT's and the
    isolation figures' too, which the default rows leave out)."""
    keys = {
        "class": list(scn.slo_classes),
        "tenant": [t.id for t in scn.tenants],
        "workload": list(scn.workloads),
    }
    rows = []
    for metric in registry.METRICS:
        if metric.compute is None:
            continue
        for group in metric.groups:
            if group == "overall":
                rows.append(Name(metric))
            else:
                rows += [Name(metric, group, key) for key in keys[group]]
    return rows


def bootstrap_twice(
    monkeypatch: pytest.MonkeyPatch, pairs: list[Any], scn: Any, rows: list[Name] | None
) -> tuple[np.ndarray, np.ndarray, int]:
    """The draws of one comparison, by `compare._bootstrap` and by `plain_bootstrap`, on the
    arguments the comparison gave it."""
    seen: list[tuple[Any, ...]] = []
    real = compare._bootstrap

    def spy(*args: Any) -> np.ndarray:
        seen.append(args)
        return real(*args)

    monkeypatch.setattr(compare, "_bootstrap", spy)
    compare_scenario_pairs(pairs, scn, resamples=12, deterministic=True, rows=rows)
    (args,) = seen
    boot_rows, boot_pairs, names, resamples, seed, _ = args
    fast = real(boot_rows, boot_pairs, names, resamples, seed)
    return fast, plain_bootstrap(boot_rows, boot_pairs, names, resamples, seed), len(boot_rows)


def test_the_draws_are_the_plain_bootstraps_to_the_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """One pair, every request-level row of every group, with a solo arm (the isolation
    figures, whose own tenant masks read the draw's observations): the same draws, bit for
    bit."""
    pairs = [(sim_run(INCIDENT, 1, "fifo", 1), sim_run(INCIDENT, 1, "dwrr", 2))]
    solo = {t.id: 40.0 + 10.0 * k for k, t in enumerate(INCIDENT.tenants)}  # ms
    for run in pairs[0]:
        run.summary["fairness"] = {"solo_ttft_p99_ms": solo}
    fast, plain, n_rows = bootstrap_twice(monkeypatch, pairs, INCIDENT, every_request_row(INCIDENT))
    assert n_rows > 80
    assert fast.tobytes() == plain.tobytes()
    assert np.isfinite(fast).any()


def test_the_draws_of_several_pairs_and_of_unfinished_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two pairs (the pairs drawn, then blocks in each), and an overloaded run whose
    latencies are censored (Kaplan–Meier and lower bounds): the same draws, bit for bit."""
    pairs = [
        (sim_run(INCIDENT, s, "fifo", s), sim_run(INCIDENT, s, "dwrr", s + 10)) for s in (1, 2)
    ]
    fast, plain, _ = bootstrap_twice(monkeypatch, pairs, INCIDENT, None)
    assert fast.tobytes() == plain.tobytes()
    overload = load_scenario(REPO / "scenarios" / "vtc-overload.yaml")
    run = overload.run.model_copy(update={"duration": 120.0, "warmup": 0.0, "cooldown": 0.0})
    overload = overload.model_copy(update={"run": run})
    censored = [(sim_run(overload, 1, "fifo", 1, 0.0), sim_run(overload, 1, "vtc", 1, 0.0))]
    assert not censored[0][0].records["status"].eq("ok").all()
    fast, plain, _ = bootstrap_twice(monkeypatch, censored, overload, every_request_row(overload))
    assert fast.tobytes() == plain.tobytes()
