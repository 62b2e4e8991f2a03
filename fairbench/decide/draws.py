"""One bootstrap draw's columns, assembled from a run's time blocks instead of copied and sorted
again row by row.

Why: `compare`'s block bootstrap recomputes every request-level row on each draw. Done plainly
(`Cols.take` of the drawn rows, then each row's metric), two 10-minute fleet runs (1.7M
requests in the window) cost 2.3-3 CPU s a draw, most of it in copying every column of both
arms and in sorting each latency's observations again, overall and in every class and tenant
(the percentiles read `Observations.sorted_time`). A draw is a list of whole time blocks, so
both have a cheaper exact form, and a draw costs 0.5-0.8 CPU s (0.3 of it the drift figure's
own windows, metric code), after 2-3 CPU s laying the two runs out once:

- a column is taken when a metric first reads it (`DrawCols.__getattr__`), once per draw and
  shared by every row; columns no row reads are never copied;
- a latency's observations of a group (overall, or the mask `DrawCols.group_mask` handed to
  the rows) are the group's eligible requests of each drawn block, in the draw's order: laid out
  block by block once per run (`_Layout`), a draw concatenates slices instead of masking all
  rows; and their sorted values are the run's sorted values, each repeated as often as its
  block was drawn (linear: `_repeat`) instead of an argsort of the draw.

What the metrics see is what `Cols.take` and `Cols.obs` would give, to the bit: the same
arrays (the same elements in the same order and dtype), and `sorted_time` holds the same sorted
values (a sorted sequence of numbers is one sequence, whichever sort made it; only the sign of a
zero latency could tell, and latencies are ≥ +0). `_by_value` is left to be computed if
anything asks (only Kaplan–Meier, where a draw has censored latencies, and any order by value
serves it: censored._km), so no tie order is assumed. A mask the rows
did not get from `group_mask` (a metric's own `c.tenant == k`) goes through `Cols.obs` as
before, and finds what this module put in the columns' memo under the same key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fairbench.analysis import censored
from fairbench.analysis.columns import GROUP_COLUMNS, Cols

_LATENCIES = ("ttft", "e2e", "tpot")  # what `Cols.obs` reads: `{which}_t`, `_o`, `_x`
Group = tuple[str, int]  # ("overall", -1), or a dimension and its code
OVERALL: Group = ("overall", -1)


@dataclass(frozen=True)
class _Layout:
    """One latency's observations of one group of a run, laid out block after block (block
    b's in `[bounds[b], bounds[b + 1])`, each block's in the run's order), and their values
    sorted once, each with the block it came from."""

    time: np.ndarray
    observed: np.ndarray
    t: np.ndarray
    bounds: np.ndarray
    sorted_time: np.ndarray
    sorted_block: np.ndarray

    @classmethod
    def of(
        cls, cols: Cols, which: str, keep: np.ndarray, blocks: list[np.ndarray]
    ) -> tuple[_Layout, np.ndarray, np.ndarray]:
        """The layout of the rows `keep`, with the run's row of each of its observations and
        their order by value (what `within` derives a group's layout from)."""
        rows = np.concatenate([b[keep[b]] for b in blocks])
        counts = np.array([np.count_nonzero(keep[b]) for b in blocks], dtype=np.int64)
        time = getattr(cols, f"{which}_t")[rows]
        ids = np.int16 if len(blocks) < 2**15 else np.int32  # the repeat reads it every draw
        order = np.argsort(time)  # any order of ties: their values are one sequence
        layout = cls(
            time,
            getattr(cols, f"{which}_o")[rows],
            cols.t[rows],
            np.concatenate([[0], np.cumsum(counts)]),
            time[order],
            np.repeat(np.arange(len(blocks), dtype=ids), counts)[order],
        )
        return layout, rows, order

    def within(self, member: np.ndarray, order: np.ndarray) -> _Layout:
        """The layout of a group (`member`: which of these observations are its), `order` this
        layout's order by value: the group's sorted values are the members' among these, so
        a group costs no sort of its own."""
        before = np.concatenate([[0], np.cumsum(member)])  # members before each position
        in_order = member[order]
        return _Layout(
            self.time[member],
            self.observed[member],
            self.t[member],
            before[self.bounds],
            self.sorted_time[in_order],
            self.sorted_block[in_order],
        )

    def observations(self, picked: np.ndarray, times_drawn: np.ndarray) -> censored.Observations:
        """The group's observations in a draw of blocks `picked` (`times_drawn`: how often each
        block is in it), what `Cols.obs` makes of the drawn rows, with their sorted values."""
        obs = censored.Observations(
            _blocks_of(self.time, self.bounds, picked),
            _blocks_of(self.observed, self.bounds, picked),
            _blocks_of(self.t, self.bounds, picked),
            ranked=True,
        )
        # the draw's values in order: each of the run's, as often as its block was drawn
        obs.__dict__["sorted_time"] = _repeat(self.sorted_time, times_drawn[self.sorted_block])
        return obs


def _repeat(values: np.ndarray, times: np.ndarray) -> np.ndarray:
    """`np.repeat(values, times)` as one gather: the index of each output's value is how many
    values end before it. Why: np.repeat copies value by value, a gather a third faster (26
    sorted draws of up to 1.7M values each a draw on the 10-minute fleet)."""
    ends = np.cumsum(times)
    total = int(ends[-1]) if len(ends) else 0
    return values[np.cumsum(np.bincount(ends[:-1], minlength=total + 1)[:total])]


def _blocks_of(values: np.ndarray, bounds: np.ndarray, picked: np.ndarray) -> np.ndarray:
    """Blocks `picked` of `values` (block b is `values[bounds[b]:bounds[b + 1]]`), one after
    another: `values[rows]` of the same rows, as copies of slices (a third of a gather's CPU
    at 1.7M rows)."""
    lo, hi = bounds[picked].tolist(), bounds[picked + 1].tolist()
    if not lo:  # no blocks: the empty column (np.concatenate needs one)
        return values[:0].copy()
    return np.concatenate([values[a:b] for a, b in zip(lo, hi, strict=True)])


class BlockSource:
    """One run of a pair with its time blocks: what every draw of it shares (the layouts, made
    when a draw first asks for them) and the draws themselves (`draw`)."""

    def __init__(self, cols: Cols, blocks: list[np.ndarray]) -> None:
        self.cols = cols
        self.blocks = blocks
        # which columns a take copies and which it keeps whole (the solo arm, the window):
        # `Cols.take` of no rows says, so the two cannot disagree
        empty = cols.take(np.zeros(0, dtype=np.intp))
        names = [n for n in Cols.__slots__ if not n.startswith("_")]
        self.whole = frozenset(n for n in names if getattr(empty, n) is getattr(cols, n))
        self.per_request = frozenset(names) - self.whole
        # where the blocks tile the rows in order (records by id, ids in time order: always,
        # for a run's records), a draw's column is slices of the run's, else a gather
        self.sizes = np.array([len(b) for b in blocks], dtype=np.int64)
        self.bounds = np.concatenate([[0], np.cumsum(self.sizes)])
        rows = np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.intp)
        self.tiled = bool(np.array_equal(rows, np.arange(len(cols))))
        self._layouts: dict[tuple[str, Group], _Layout] = {}
        # each latency's rows of the whole layout and its order by value, for the groups'
        self._overall: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def draw(self, picked: np.ndarray) -> DrawCols:
        """The columns of the draw that concatenates blocks `picked`, in that order."""
        return DrawCols(self, picked)

    def layout(self, which: str, group: Group) -> _Layout:
        """One latency's layout of one group, made on first use (a group's from the whole
        run's)."""
        key = (which, group)
        found = self._layouts.get(key)
        if found is not None:
            return found
        dim, code = group
        if dim == "overall":
            keep = getattr(self.cols, f"{which}_x")
            found, rows, order = _Layout.of(self.cols, which, keep, self.blocks)
            self._overall[which] = rows, order
        else:
            whole = self.layout(which, OVERALL)
            rows, order = self._overall[which]
            found = whole.within(getattr(self.cols, GROUP_COLUMNS[dim])[rows] == code, order)
        self._layouts[key] = found
        return found


class DrawCols(Cols):
    """The columns of one draw (`BlockSource.draw`): `Cols.take` of the drawn rows as far as
    any metric can tell, but each column copied on first read, its length counted from the
    blocks, and the observations of the whole draw and of the masks from `group_mask`
    assembled from the run's layouts."""

    def __init__(self, source: BlockSource, picked: np.ndarray) -> None:
        super().__init__()
        self._source = source
        self._picked = picked
        self._rows: np.ndarray | None = None
        self._times_drawn = np.bincount(picked, minlength=len(source.blocks))
        self._masks: dict[Group, np.ndarray] = {}
        self._groups: dict[int, Group] = {}  # id of a mask handed out -> its group

    def __getattr__(self, name: str) -> Any:
        """A column not read yet in this draw (an unset slot): taken now, kept for the rest."""
        source = self.__dict__.get("_source")
        if source is not None and name in source.per_request:
            value = self._take(getattr(source.cols, name))
        elif source is not None and name in source.whole:
            value = getattr(source.cols, name)
        else:
            raise AttributeError(name)
        setattr(self, name, value)
        return value

    def _take(self, values: np.ndarray) -> np.ndarray:
        """`values[rows]` of the drawn rows (the blocks `picked`, in order)."""
        source = self._source
        if source.tiled:
            return _blocks_of(values, source.bounds, self._picked)
        if self._rows is None:
            self._rows = np.concatenate([source.blocks[int(i)] for i in self._picked])
        return values[self._rows]

    def __len__(self) -> int:  # the drawn rows, without copying a column to count them
        return int(self._source.sizes[self._picked].sum())

    def group_mask(self, dim: str, code: int) -> np.ndarray:
        """The draw's rows in group `code` of `dim` (class, tenant, workload): computed once a
        draw for all its rows, and recognised by `obs`."""
        group = (dim, code)
        mask = self._masks.get(group)
        if mask is None:
            mask = self._masks[group] = super().group_mask(dim, code)
            self._groups[id(mask)] = group
        return mask

    def obs(self, which: str, mask: np.ndarray | None) -> censored.Observations:
        group = OVERALL if mask is None else self._groups.get(id(mask))
        if group is None or which not in _LATENCIES:
            return super().obs(which, mask)
        # the memo's key for (which, mask) is the one `Cols.obs` uses: an equal mask made
        # elsewhere finds these observations
        return self.memo(
            which,
            mask,
            lambda: self._source.layout(which, group).observations(self._picked, self._times_drawn),
        )
