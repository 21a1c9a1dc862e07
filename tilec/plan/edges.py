"""Which CPU kernel tile runs its partial last tile with code of its own, and what that
saves (`codegen.edge` writes the code).

A CPU schedule moves the last tile along an output index its tile does not divide back, to
end where the range ends (`Schedule.shift`), repeating points.  `edge_index` picks the index
whose last tile gets code of its own instead; `edge_work` is the same rule over many tiles,
for the time model."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .flat import FlatContraction

if TYPE_CHECKING:
    from .schedule import Schedule

# The last, partial tile along an output index gets code of its own (`codegen.edge`) where
# the moved-back tiles compute this many points or more for each one of the range: a second
# copy of the loops costs PoCL 0.5-0.9 s to generate a 3x3 convolution's code, which a
# 56-wide row in tiles of 3 (57 points computed for 56, 1.02) does not win back (the seed conv
# within noise on the Zen 3), where a 7-wide one in tiles of 4 (1.14) ran 0.77 of the time.
EDGE_WASTE = 1.04


def edge_index(s: Schedule) -> int | None:
    """The output index whose last, partial tile runs code of its own (`codegen.edge`), or
    None: CPU kernels that read through the cache without barriers (the edge code returns
    early), never the vector index (its lanes fix the tile's steps) nor a swept one, and
    only where the moved-back tiles repeat enough points (`EDGE_WASTE`); where several
    are partial, the one repeating the most (`edge_work` counts the same)."""
    if not s.shift or not s.edges or s.pipeline or s.split > 1 or \
            s.run is not None or any(st is not None for st in s.staged) or \
            s.wg_threads != 1:
        return None
    best, waste = None, 0.0
    for k in s.flat.out_indices:
        if k == s.vec_index or not s.shifted(k) or \
                (s.sweep is not None and k == s.sweep.index):
            continue
        r = s.flat.ranges[k]
        w = -(-r // s.tile[k]) * s.tile[k] / r
        if w >= EDGE_WASTE and w > waste:
            best, waste = k, w
    return best


def edge_work(flat: FlatContraction, T: np.ndarray, u: int | None, shift: bool) -> np.ndarray:
    """For every row of tiles T: a work-item's mean work against a whole tile's, where the
    last, partial tile along one output index has code of its own (`edge_index`'s rule: not
    the vector index `u`, the index repeating the most points, 4% or more): its register tile
    is as wide as the range's rest, counted at no less than half a tile (fewer accumulators
    hide less latency).  `shift`: the schedule moves partial tiles back at all."""
    n = T.shape[0]
    if not shift:
        return np.ones(n)
    best, work = np.ones(n), np.ones(n)
    for k in flat.out_indices:
        if k == u:
            continue
        r, t = flat.ranges[k], T[:, k]
        count = -(-r // t)
        waste = count * t / r
        ragged = (t < r) & (r % t != 0) & (waste >= EDGE_WASTE)
        rest = (r - (count - 1) * t) / t
        take = ragged & (waste > best)
        best = np.where(take, waste, best)
        work = np.where(take, (count - 1 + np.maximum(rest, 0.5)) / count, work)
    return work
