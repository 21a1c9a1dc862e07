"""CPU sweeps: one work-item computes several register tiles along an output index, one
reduction block at a time, keeping each tile's partial sums in private memory between blocks.

A direct convolution's register tile (4 pixels x 64 output channels, say) reads, over its
whole reduction, a panel of the filter bigger than L1 (64 input channels x 3 x 3 x 64 output
channels: 147 KB); the next tile reads the same panel again, from L2.  At 16 multiply-adds
per four 64-byte filter vectors the filter alone asks about 32 bytes a cycle of L2, more than
it gives.  Swept, a work-item takes a whole image row: for each block of input channels
(16 x 3 x 3 x 64: 36 KB) it runs every tile of the row, so the block is read from L2 once and
from L1 by the other tiles; a tile's accumulators go to a private array between blocks and
come back for the next one (32 vector loads and stores per 2,304 multiply-adds).  This is
the loop order of the best CPU convolutions (input-channel blocks outside, output pixels
inside, output kept in cache).  resnet18's first 3x3 convolution (64 -> 64, 56x56) on a
2-core AVX-512 Xeon (PoCL 3.0): 0.92 -> 0.62 ms with the caches flushed between runs.

The choice: the input whose per-work-item panel is largest (the filter) must exceed L1 and
must not depend on the swept index; the reduction must be blocked (otherwise there is nothing
to keep between blocks); the swept index's tile must divide its range, so that every swept
tile is a whole tile of the unswept kernel.  Tiles per work-item: the most that divide the
index's tile count, whose partial sums fit half of L1, and that leave at least four
work-groups a compute unit (the sweep trades work-groups for reuse)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .flat import FlatContraction
from .hw import HwModel


@dataclass(frozen=True)
class Sweep:
    index: int  # the output index whose register tiles one work-item runs in turn
    tiles: int  # register tiles per work-item along it

    def describe(self, flat: FlatContraction, tile_k: int) -> str:
        n = flat.names[self.index]
        return (f"sweep: {self.tiles} register tiles along {n} per work-item ({n} "
                f"{tile_k * self.tiles} a work-item), reduction blocks outside, partial "
                f"sums kept in private memory between them")


def panel_elems(flat: FlatContraction, t, tile: tuple[int, ...]) -> int:
    """Elements of input `t` one work-item reads: its tile along output indices, whole
    reductions."""
    outs = set(flat.out_indices)
    n = 1
    for k, st in enumerate(t.strides):
        if st:
            n *= tile[k] if k in outs else flat.ranges[k]
    return n


def choose_sweep(flat: FlatContraction, tile: tuple[int, ...], hw: HwModel, *,
                 vec_index: int | None, lanes: int, acc_points: int, es: int,
                 groups: int) -> Sweep | None:
    """The sweep for a CPU schedule read through the cache (None: none pays).  `acc_points`:
    the register tile's accumulators (vectors of `lanes`); `groups`: the unswept
    work-groups."""
    index, tiles = sweep_many(flat, np.array([tile], np.int64), hw, vec_index=vec_index,
                              lanes=np.array([lanes]), acc=np.array([acc_points]), es=es,
                              groups=np.array([groups]))
    return Sweep(int(index[0]), int(tiles[0])) if tiles[0] > 1 else None


def sweep_many(flat: FlatContraction, T: np.ndarray, hw: HwModel, *, vec_index: int | None,
               lanes: np.ndarray, acc: np.ndarray, es: int,
               groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`choose_sweep` for every row of tiles T (n x len(names)): the swept index (-1: none)
    and the register tiles a work-item runs along it (1: none).  The cost model asks it for
    every candidate tile, so that a tile whose sweep keeps its filter block in L1 is scored
    with the L2 traffic it really makes."""
    n = T.shape[0]
    index, tiles = np.full(n, -1, np.int64), np.ones(n, np.int64)
    if hw.kind != "cpu" or not flat.inputs or not hw.l1_bytes or \
            (vec_index is not None and vec_index in flat.reduce_indices):
        return index, tiles
    blocked = np.zeros(n, bool)
    for k in flat.reduce_indices:
        blocked |= T[:, k] < flat.ranges[k]
    big, elems = largest_panel(flat, T)
    live = blocked & (elems * es > hw.l1_bytes)
    part = acc * lanes * es  # one tile's partial sums
    cus = hw.compute_units or max(1, hw.goal_groups // 4)
    floor = np.minimum(groups, 4 * cus)
    cap = np.maximum(1, hw.l1_bytes // 2 // np.maximum(part, 1))
    # The index the output holds closest together first: its tiles' reads of the other
    # inputs overlap most (neighbouring pixels of one row).
    outs = sorted(flat.out_indices, key=lambda k: abs(flat.output.strides[k]) or 1 << 62)
    for k in outs:
        if k == vec_index:
            continue
        reads = np.array([t.strides[k] != 0 for t in flat.inputs])[big]
        count = flat.ranges[k] // T[:, k]
        ok = live & (index < 0) & ~reads & (flat.ranges[k] % T[:, k] == 0) & (count >= 2)
        if not ok.any():
            continue
        best = np.ones(n, np.int64)
        for m in range(2, int(min(count[ok].max(), cap[ok].max())) + 1):
            fits = ok & (count % m == 0) & (m <= cap) & (groups // m >= floor)
            best = np.where(fits, m, best)
        won = best > 1
        index, tiles = np.where(won, k, index), np.where(won, best, tiles)
    return index, tiles


def sweep_reuse(tiles: np.ndarray, *, chunk_bytes: np.ndarray, partial_bytes: np.ndarray,
                l1_bytes: int) -> np.ndarray:
    """How many times fewer bytes of the largest input a swept work-item brings from L2 than
    its tiles would one a work-item: all its tiles where one reduction block of that input
    stays in L1 while a tile runs, else 1 (each tile streams the block from L2).  A tile
    runs with the block and its own blocks of the other inputs (`chunk_bytes`: the cache
    lines of one reduction chunk, `cost`'s mr) and its partial sums in L1; the other tiles'
    sums wait elsewhere.  Squeezenet's classifier swept 13 tiles deep ran 0.67 ms with a
    32 KB filter block, 13 KB of pixels and 1.7 KB of sums against a 48 KB L1, as fast as
    with a 16 KB block (1.26 ms unswept); resnet18's 14x14 3x3 layers, 37 KB of filter and
    6 KB of rows a chunk, 0.75 ms swept."""
    return np.where(chunk_bytes + partial_bytes <= l1_bytes, tiles, 1)


def largest_panel(flat: FlatContraction, T: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For every row of tiles T: the input (its position) whose per-work-item panel
    (`panel_elems`) is largest, the first on ties, and that panel's elements."""
    outs = set(flat.out_indices)
    panels = []
    for t in flat.inputs:
        n = np.ones(T.shape[0], np.int64)
        for k, st in enumerate(t.strides):
            if st:
                n = n * (T[:, k] if k in outs else flat.ranges[k])
        panels.append(n)
    P = np.stack(panels, axis=1)
    return P.argmax(axis=1), P.max(axis=1)
