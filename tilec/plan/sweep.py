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
index's tile count, whose partial sums fit half of L1, that leave at least four
work-groups a compute unit (the sweep trades work-groups for reuse), and whose streamed
inputs (those that do depend on the swept index) fit half of a core's L2 over the
work-item's whole reduction, where the work-groups run one after another along an index
the streamed inputs do not read (the schedule's group order): the next work-item then reads
the same streamed rows with the next kept block (a matmul's next column panel), and past L2
they come from the L3 again for every work-item.  On a Zen 3 (512 KiB of L2 a core) the
1024 matmul swept 256 rows of A (1 MiB) a work-item ran 15.8 ms, capped at 64 rows 13.7;
the 2048 matmul 146 -> 121 ms.

Panels are counted with their windows merged (`window_elems`): a convolution's image panel
for a 14-pixel row and a 3x3 window is 16 x 3 pixels, not 14 x 3 x 3, so that the filter,
larger than it, is the block kept in L1 (resnet18's 14x14 3x3 layers on the Zen 3: the
image had been kept and the 2.4 MB filter streamed by each of 14 work-items, 2.3-2.5 ms;
swept along the rows with the filter block kept, 1.7-1.85)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .flat import FlatContraction
from .hw import HwModel
from .layout import load_order


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
                 groups: int, fastest: int | None = None) -> Sweep | None:
    """The sweep for a CPU schedule read through the cache (None: none pays).  `acc_points`:
    the register tile's accumulators (vectors of `lanes`); `groups`: the unswept
    work-groups; `fastest`: the output index whose work-groups run one after another (the
    schedule's group order; None: unknown, no L2 cap)."""
    index, tiles = sweep_many(flat, np.array([tile], np.int64), hw, vec_index=vec_index,
                              lanes=np.array([lanes]), acc=np.array([acc_points]), es=es,
                              groups=np.array([groups]),
                              fastest=None if fastest is None else np.array([fastest]))
    return Sweep(int(index[0]), int(tiles[0])) if tiles[0] > 1 else None


def sweep_many(flat: FlatContraction, T: np.ndarray, hw: HwModel, *, vec_index: int | None,
               lanes: np.ndarray, acc: np.ndarray, es: int, groups: np.ndarray,
               fastest: np.ndarray | None = None,
               panel: tuple[np.ndarray, np.ndarray] | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """`choose_sweep` for every row of tiles T (n x len(names)): the swept index (-1: none)
    and the register tiles a work-item runs along it (1: none).  The cost model asks it for
    every candidate tile, so that a tile whose sweep keeps its filter block in L1 is scored
    with the L2 traffic it really makes.  `fastest` (per row, -1: none): the output index whose
    work-groups run one after another; the L2 cap holds where no streamed input depends on
    it (consecutive work-items then read the same streamed rows).  `panel`: the rows'
    `largest_panel`, where the caller has it."""
    n = T.shape[0]
    index, tiles = np.full(n, -1, np.int64), np.ones(n, np.int64)
    if hw.kind != "cpu" or not flat.inputs or not hw.l1_bytes or \
            (vec_index is not None and vec_index in flat.reduce_indices):
        return index, tiles
    blocked = np.zeros(n, bool)
    for k in flat.reduce_indices:
        blocked |= T[:, k] < flat.ranges[k]
    big, elems = panel if panel is not None else largest_panel(flat, T)
    live = blocked & (elems * es > hw.l1_bytes)
    part = acc * lanes * es  # one tile's partial sums
    cus = hw.compute_units or max(1, hw.goal_groups // 4)
    floor = np.minimum(groups, 4 * cus)
    cap = np.maximum(1, hw.l1_bytes // 2 // np.maximum(part, 1))
    # The index the output holds closest together first: its tiles' reads of the other
    # inputs overlap most (neighbouring pixels of one row).
    outs = sorted(flat.out_indices, key=lambda k: abs(flat.output.strides[k]) or 1 << 62)
    half_l2 = hw.l2_bytes // 2
    for k in outs:
        if k == vec_index:
            continue
        reads = np.array([t.strides[k] != 0 for t in flat.inputs])[big]
        count = flat.ranges[k] // T[:, k]
        ok = live & (index < 0) & ~reads & (flat.ranges[k] % T[:, k] == 0) & (count >= 2)
        if not ok.any():
            continue
        streamed = [t for t in flat.inputs if t.strides[k] != 0]
        # Rows whose next work-item reads the same streamed rows: their sweep keeps those
        # rows within half of L2.
        shared = np.zeros(n, bool)
        if half_l2 and streamed and fastest is not None:
            for f in set(fastest.tolist()) - {-1}:
                if all(t.strides[f] == 0 for t in streamed):
                    shared |= fastest == f
        best = np.ones(n, np.int64)
        # Only a divisor of some row's count can fit (the loop keeps the largest that does):
        # a 56-wide index tries 2, 4, 7, 8, 14, 28 and 56, not every number up to 56.
        top = int(min(count[ok].max(), cap[ok].max()))
        for m in _divisors(np.unique(count[ok]).tolist(), top):
            fits = ok & (count % m == 0) & (m <= cap) & (groups // m >= floor)
            rows = np.flatnonzero(fits & shared)
            if rows.size:
                Tm = T[rows]  # (a copy) the rows whose footprint decides
                Tm[:, k] *= m
                footprint = sum(window_elems(flat, t, Tm) for t in streamed) * es
                fits[rows] &= footprint <= half_l2
            best = np.where(fits, m, best)
        won = best > 1
        index, tiles = np.where(won, k, index), np.where(won, best, tiles)
    return index, tiles


def _divisors(counts: list[int], top: int) -> list[int]:
    """Every divisor from 2 to `top` of any of `counts`, ascending."""
    found: set[int] = set()
    for c in counts:
        for d in range(1, int(c ** 0.5) + 1):
            if c % d == 0:
                found.update((d, c // d))
    return sorted(m for m in found if 2 <= m <= top)


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
    (`window_elems`) is largest, the first on ties, and that panel's elements."""
    P = np.stack([window_elems(flat, t, T) for t in flat.inputs], axis=1)
    return P.argmax(axis=1), P.max(axis=1)


def window_elems(flat: FlatContraction, t, T: np.ndarray) -> np.ndarray:
    """Elements of input `t` one work-item reads, for every row of tiles T (its tile along
    output indices, whole reductions), with its indices merged as `layout.read_plan` merges
    them: an index whose stride is a multiple q of an earlier one's extends that one's span
    by q x (extent - 1) where the span reaches q, so a window `x + k` covers tile + window - 1
    points, not their product.  Where the span falls short (a row of the tile narrower than
    the stride to the next row) the index counts as a factor of its own."""
    outs = set(flat.out_indices)
    n = T.shape[0]
    spans: list[list] = []  # [span per row, base |stride|]
    apart = np.ones(n, np.int64)
    for k in load_order(t):
        s = abs(t.strides[k])
        ext = T[:, k].astype(np.int64) if k in outs else np.full(n, flat.ranges[k], np.int64)
        for span in spans:
            q, rem = divmod(s, span[1])
            if rem == 0:
                joins = span[0] >= q
                span[0] = np.where(joins, span[0] + q * (ext - 1), span[0])
                apart = np.where(joins, apart, apart * ext)
                break
        else:
            spans.append([ext, s])
    total = apart
    for span, _ in spans:
        total = total * span
    return total
