"""The fourth layer of the GPU tree's evaluator (tree.py): the refit (docs/tree.md, "The GPU refit"). With
rebuild_every = R > 1, a domain split's evaluations between builds recompute the last build's moments and
grow its cells' cubes over the current rows, which the devices keep in that build's key order, then walk
its groups (`_refit_phases`). `Built` is what a refit reuses of the build besides its device buffers."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from app.backends.cuda.policies import ceil_div, launch
from app.backends.cuda.tree_kernels import BLOCK, CELL_FIELDS
from app.backends.cuda.tree_walk import TreeWalk
from app.engine.forces import Span


class TreeRefit(TreeWalk):
    """The tree evaluator's refit of its last domain build."""

    kept_order: bool  # the last evaluation was a refit: the rows kept their (key) order

    def _refit_phases(self, pos: int, out: int, built: Built, stream, prev=(0, 0)):
        """A refit of the last domain build (docs/tree.md, "Refit"): no keys, sort or build; the state's
        rows, in that build's key order, are its sorted bodies as they are now. Per level from the
        deepest, tree_refit recomputes the moments and grows each cell's build cube to hold its current
        bodies; tree_pack makes the rows from those cubes; the walk takes the build's groups and cuts.
        Stages: the refit under "moments" (keys, sort and build take no time)."""
        n = built.key[0]
        on = partial(self._on, stream, n)
        self._stream = stream
        levels = built.levels
        ncell = levels[-1]
        b = self._buffers
        cell_ptrs = [b[f"cell-{k}"].data.ptr for k in CELL_FIELDS]
        group = int(self._tunables["group"])

        def run(symbol, count, *args):
            launch(self._fn(symbol), (ceil_div(count, BLOCK), 1), BLOCK, stream, *args)

        with on():
            events = self._events
            assert events is not None  # made by the build this refit follows
            for k in range(4):  # keys, sort and build: empty
                events[k].record(stream)
            lo3 = self._buf("refit-lo", 3 * ncell, np.float32)
            hi3 = self._buf("refit-hi", 3 * ncell, np.float32)
            cubes = self._buf("refit-cubes", 4 * ncell, np.float64)
            grown = self._buf("refit-grown", 1, np.int32)
            self._set32(grown.data.ptr, 0, 1, stream)
            for lv in range(len(levels) - 2, -1, -1):
                self._per_level(
                    "tree_refit",
                    stream,
                    b["levels"].data.ptr,
                    lv,
                    pos,
                    *cell_ptrs,
                    b["skeys"].data.ptr,
                    b["box"].data.ptr,
                    b["mass"].data.ptr,
                    b["com"].data.ptr,
                    b["m2"].data.ptr,
                    b["bmax"].data.ptr,
                    lo3.data.ptr,
                    hi3.data.ptr,
                    cubes.data.ptr,
                    grown.data.ptr,
                )
            mac, rel, pack, links = self._pack(run, levels, cell_ptrs, cubes.data.ptr)
            events[4].record(stream)
        everyone = Span.all(n)
        work = yield from self._walk_all(
            on,
            group,
            b["group-start"],
            everyone,
            everyone,
            pos,
            b["sorder"].data.ptr,
            links,
            mac,
            rel,
            pack,
            out,
            stream,
            built.groups,
            sorted_out=True,
            prev=prev,
        )
        index = built.key[1]
        pairs = (built.aligned[index + 1] - built.aligned[index]) * n
        return self._finish(on, work, pairs), list(built.aligned)

    @property
    def last_grown(self) -> int:
        """Cells whose cube the last refit grew (0 after a build); a host read: for tests and diagnostics."""
        if not self.kept_order:
            return 0
        with self.device.scope:
            return int(self._buffers["refit-grown"][:1].get()[0])


@dataclass(frozen=True)
class Built:
    """What a refit reuses of the last domain build besides its device buffers (cells, levels, sorted
    keys, cube, groups): the evaluation it was for (n, the device's index), its level starts, this
    device's run of groups and the aligned cuts."""

    key: tuple
    levels: list[int]
    groups: tuple[int, int]
    aligned: list[int]
