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
    if hw.kind != "cpu" or not flat.inputs or not hw.l1_bytes:
        return None
    blocked = [k for k in flat.reduce_indices if flat.ranges[k] > tile[k]]
    if not blocked or (vec_index is not None and vec_index in flat.reduce_indices):
        return None
    big = max(flat.inputs, key=lambda t: panel_elems(flat, t, tile))
    if panel_elems(flat, big, tile) * es <= hw.l1_bytes:
        return None
    part = acc_points * lanes * es  # one tile's partial sums
    cus = hw.compute_units or max(1, hw.goal_groups // 4)
    floor = min(groups, 4 * cus)
    # The index the output holds closest together first: its tiles' reads of the other
    # inputs overlap most (neighbouring pixels of one row).
    outs = sorted(flat.out_indices, key=lambda k: abs(flat.output.strides[k]) or 1 << 62)
    for k in outs:
        count = flat.ranges[k] // tile[k]
        if big.strides[k] != 0 or k == vec_index or flat.ranges[k] % tile[k] or count < 2:
            continue
        best = 1
        for n in range(2, count + 1):
            if count % n == 0 and n * part <= hw.l1_bytes // 2 and groups // n >= floor:
                best = n
        if best > 1:
            return Sweep(k, best)
    return None
