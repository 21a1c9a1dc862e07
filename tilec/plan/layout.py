"""Memory layout and threading of one tile: what the cost model counts and codegen emits.

For a `FlatContraction` and a tile (one size per index) this module decides, as PlaidML did
(shared/reference/plaidml-notes.md, "Threading / layout"; written from that description):

* Merged load indices per input.  The input's indices with a non-zero stride are sorted by
  |stride| (ties in index order).  An index merges into an earlier merged index when its stride is
  an exact multiple q of that one's stride and the earlier merged range is >= q: the two then
  walk one contiguous run of memory (a conv's `x+i` becomes `i_x`, tile + halo).  The merged
  range grows by q * (tile - 1); the name is the earlier name, "_", the merged one.
* Local strides in the staging buffer.  Merged indices go odd ranges first (they need no
  padding), then larger ranges first (padding a large stride wastes least); the running size is
  bumped by one whenever it is even, so that threads walking any index hit distinct banks.  The
  bump after the last index is dropped: it pads nothing.
* Output threads.  Output indices sorted by |output stride| (ties: the later index first); the
  lowest-stride one gets pow2ceil(min(me, threads, tile)) threads so neighbouring threads write
  neighbouring elements (coalesced); the remaining threads are doubled one at a time onto an index
  whose tile still has room, preferring one whose tile splits evenly, then the least threaded,
  then the lower stride.  Each thread keeps prod_out ceil(tile / threads) accumulators.

The same rules are also written over numpy arrays (`merge_stats`, `thread_split`) so that the
tile search can score hundreds of thousands of tiles at once; tests check the two agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .flat import FlatContraction, FlatTensor

if TYPE_CHECKING:
    from .hw import HwModel


@dataclass(frozen=True)
class MergedIndex:
    """One loop of an input's load: original indices that walk one run of memory together."""

    name: str  # "i_x": the base index, then the indices merged into it
    range: int  # elements the tile spans along it (tile plus halo)
    global_stride: int  # element stride of the base index in the tensor (signed)
    local_stride: int  # stride in the padded local buffer
    parts: tuple[tuple[str, int], ...]  # (original index, its stride / global_stride)
    zero: int = 0  # position of index value 0 along this loop, when a part runs backwards


@dataclass(frozen=True)
class InputLayout:
    """How one input's tile is loaded and where it sits in local memory."""

    tensor: str
    indices: tuple[MergedIndex, ...]  # merged ones first, then the rest, each by name
    local_size_elems: int  # padded staging-buffer size (elements)
    loads: int  # mem_width-byte transactions to fill the tile (PlaidML's numLoads)

    @property
    def by_local_stride(self) -> tuple[MergedIndex, ...]:
        """Innermost (local stride 1) first: the order the staging buffer is laid out in."""
        return tuple(sorted(self.indices, key=lambda m: m.local_stride))

    def table(self) -> str:
        """The seed's table: `Range Global Local` per merged index."""
        w = max([4] + [len(m.name) + 1 for m in self.indices])
        rows = [f"{'':>{w}}{'Range':>10}{'Global':>10}{'Local':>10}"]
        rows += [f"{m.name:>{w}}{m.range:>10}{m.global_stride:>10}{m.local_stride:>10}"
                 for m in self.indices]
        return "\n".join(rows)


@dataclass(frozen=True)
class Layout:
    """The schedule of one tile: merged loads, staging buffers, threads and accumulators.

    Per-index tuples are aligned with `names` (the FlatContraction's index order).
    """

    names: tuple[str, ...]
    ranges: tuple[int, ...]
    tile: tuple[int, ...]
    inputs: tuple[InputLayout, ...]
    threads: tuple[int, ...]  # threads on each output index; 1 on reduction indices
    out_order: tuple[int, ...]  # output indices by |output stride| (threading order)
    accumulators: int  # per thread: prod_out ceil(tile / threads)
    total_threads: int  # work-group size (hw.threads)
    output_threads: int  # threads that own accumulators: prod of `threads`
    outputs: int  # output elements per tile: prod_out tile
    groups: tuple[int, ...]  # ceil(range / tile) on output indices; 1 on reduction indices
    group_order: tuple[int, ...]  # output indices with more than one group, fastest first
    vector_width: int  # lanes codegen may use along the unit-stride output index
    staging: str  # "local" (buffers above live in local memory) or "global" (read via cache)
    elem_size: int

    @property
    def acc_shape(self) -> tuple[int, ...]:
        """Accumulators per thread along each index (ceil(tile / threads); 1 off the output)."""
        return tuple(-(-t // th) if k in self.out_order else 1
                     for k, (t, th) in enumerate(zip(self.tile, self.threads, strict=True)))

    @property
    def reduce_threads(self) -> int:
        """Threads left over for the reduction (combined by a tree in local memory)."""
        return max(1, self.total_threads // max(1, self.output_threads))

    @property
    def local_bytes(self) -> int:
        if self.staging != "local":
            return 0
        return sum(i.local_size_elems for i in self.inputs) * self.elem_size

    def describe(self) -> str:
        """The seed's layout tables, one per input, then the threading line."""
        out = []
        for inp in self.inputs:
            out.append(f"Input {inp.tensor}:")
            out.append(inp.table())
        out.append(f"{self.total_threads} threads, {self.outputs} outputs, "
                   f"{self.accumulators} accumulators each")
        per = ", ".join(f"{self.names[k]} {self.threads[k]}x{self.acc_shape[k]}"
                        for k in self.out_order)
        if per:
            out.append(f"threads x accumulators per output index: {per}")
        return "\n".join(out)


Schedule = Layout


# -- scalar rules -------------------------------------------------------------------------------

def pow2ceil(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def load_order(tensor: FlatTensor) -> list[int]:
    """Indices with a non-zero stride, by |stride|, ties in index order."""
    nz = [k for k, s in enumerate(tensor.strides) if s != 0]
    return sorted(nz, key=lambda k: abs(tensor.strides[k]))


def read_plan(names: Sequence[str], tensor: FlatTensor, tile: Sequence[int],
              me: int) -> InputLayout:
    """Merge the tensor's indices for this tile, lay them out in local memory, count loads."""
    # Each slot: [range, base |stride|, parts as (k, signed multiple of base stride)]
    slots: list[list] = []
    for k in load_order(tensor):
        s = tensor.strides[k]
        for slot in slots:
            q, rem = divmod(abs(s), slot[1])
            if rem == 0 and slot[0] >= q:
                slot[0] += q * (tile[k] - 1)
                base_sign = 1 if tensor.strides[slot[2][0][0]] > 0 else -1
                slot[2].append((k, q * (1 if s > 0 else -1) * base_sign))
                break
        else:
            slots.append([tile[k], abs(s), [(k, 1)]])

    loads = 1
    best = 1
    for rng, stride, _ in slots:
        loads *= rng
        best = max(best, min(me, stride * rng) // stride)
    loads //= best

    # Odd ranges first, then larger ranges; Python's sort is stable, so ties keep slot order.
    order = sorted(range(len(slots)), key=lambda i: (slots[i][0] % 2 == 0, -slots[i][0]))
    local = [0] * len(slots)
    size = 1
    padded = False
    for i in order:
        local[i] = size
        size *= slots[i][0]
        if size % 2 == 0:
            size += 1
            padded = True
    if padded:
        size -= 1

    merged = []
    for i, (rng, _, parts) in enumerate(slots):
        base = parts[0][0]
        zero = sum(-m * (tile[k] - 1) for k, m in parts if m < 0)
        merged.append(MergedIndex(
            name="_".join(names[k] for k, _ in parts), range=rng,
            global_stride=tensor.strides[base], local_stride=local[i],
            parts=tuple((names[k], m) for k, m in parts), zero=zero))
    merged.sort(key=lambda m: (len(m.parts) == 1, m.name))
    return InputLayout(tensor.name, tuple(merged), size, loads)


def output_order(flat: FlatContraction) -> list[int]:
    """Output indices by |output stride|, ties to the later index."""
    strides = flat.output.strides
    outs = [k for k, s in enumerate(strides) if s != 0]
    return sorted(outs, key=lambda k: (abs(strides[k]), -k))


def assign_threads(flat: FlatContraction, tile: Sequence[int], threads: int,
                   me: int) -> dict[int, int]:
    """Threads on each output index (see the module docstring for the rule)."""
    outs = output_order(flat)
    thr = {k: 1 for k in outs}
    if not outs:
        return thr
    low = pow2ceil(min(me, threads, tile[outs[0]]))
    while low > threads:  # only for a thread count that is not a power of two
        low //= 2
    thr[outs[0]] = low
    left = threads // low
    while left > 1:
        pick = None
        for pos, k in enumerate(outs):
            if thr[k] >= tile[k]:
                continue
            key = (tile[k] % (2 * thr[k]) != 0, thr[k], pos)
            if pick is None or key < pick[0]:
                pick = (key, k)
        if pick is None:
            break
        thr[pick[1]] *= 2
        left //= 2
    return thr


def layout(flat: FlatContraction, tile: Sequence[int], hw: HwModel,
           dtype: str = "float32") -> Layout:
    """The schedule codegen renders for this tile on this hardware model."""
    tile = tuple(int(t) for t in tile)
    es = hw.elem_size(dtype)
    me = max(1, hw.mem_width // es)
    inputs = tuple(read_plan(flat.names, t, tile, me) for t in flat.inputs)
    thr = assign_threads(flat, tile, hw.threads, me)
    outs = output_order(flat)
    threads = tuple(thr.get(k, 1) for k in range(len(tile)))
    acc = 1
    outputs = 1
    for k in outs:
        acc *= -(-tile[k] // thr[k])
        outputs *= tile[k]
    out_threads = 1
    for k in outs:
        out_threads *= thr[k]
    groups = tuple(-(-r // t) if k in thr else 1
                   for k, (r, t) in enumerate(zip(flat.ranges, tile, strict=True)))
    group_order = tuple(k for k in outs if groups[k] > 1)
    return Layout(
        names=tuple(flat.names), ranges=tuple(flat.ranges), tile=tile, inputs=inputs,
        threads=threads, out_order=tuple(outs), accumulators=acc, total_threads=hw.threads,
        output_threads=out_threads, outputs=outputs, groups=groups, group_order=group_order,
        vector_width=_vector_width(flat, tile, thr, hw.vec_size), staging=hw.staging,
        elem_size=es)


def _vector_width(flat: FlatContraction, tile: Sequence[int], thr: dict[int, int],
                  vec: int) -> int:
    """Lanes along the unit-stride output index, when one thread owns a contiguous run of it.

    Threads interleaved along that index (the GPU rule above, for coalescing) leave each thread
    a strided set of elements: no vectors then.
    """
    u = unit_index(flat)
    if u is None or thr[u] != 1:
        return 1
    w = 1
    while w * 2 <= vec and tile[u] % (w * 2) == 0:
        w *= 2
    return w


def unit_index(flat: FlatContraction) -> int | None:
    """The output index with output stride 1 (the one vector lanes run along), if any."""
    for k, s in enumerate(flat.output.strides):
        if s == 1:
            return k
    return None


# -- the same rules over arrays of tiles ------------------------------------------------------

def merge_stats(tensor: FlatTensor, tiles: np.ndarray,
                me: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(loads, local_size_elems, distinct elements) of `read_plan` for every row of `tiles`
    (n x len(strides))."""
    order = load_order(tensor)
    n = tiles.shape[0]
    m = len(order)
    strides = [abs(tensor.strides[k]) for k in order]
    exists = np.zeros((n, m), dtype=bool)
    rng = np.ones((n, m), dtype=np.int64)
    for j, k in enumerate(order):
        t = tiles[:, k].astype(np.int64)
        merged = np.zeros(n, dtype=bool)
        for q in range(j):
            mult, rem = divmod(strides[j], strides[q])
            if rem:
                continue
            hit = exists[:, q] & ~merged & (rng[:, q] >= mult)
            rng[:, q] += np.where(hit, mult * (t - 1), 0)
            merged |= hit
        exists[:, j] = ~merged
        rng[:, j] = np.where(merged, 1, t)

    loads = np.prod(rng, axis=1)
    elems = loads.copy()
    best = np.ones(n, dtype=np.int64)
    for j in range(m):
        speed = np.minimum(me, strides[j] * rng[:, j]) // strides[j]
        best = np.maximum(best, np.where(exists[:, j], speed, 1))
    loads //= best

    # Odd ranges multiply without padding; even ones go largest first, each followed by +1.
    odd = np.where(rng % 2 == 1, rng, 1)
    size = np.prod(odd, axis=1)
    evens = np.sort(np.where(rng % 2 == 0, rng, 0), axis=1)
    for j in range(m - 1, -1, -1):
        e = evens[:, j]
        size = np.where(e > 0, size * e + 1, size)
    size -= (evens[:, -1] > 0) if m else 0
    return loads, size, elems


def thread_split(flat: FlatContraction, tiles: np.ndarray, threads: int,
                 me: int) -> np.ndarray:
    """Threads per index (n x k; 1 on reduction indices) of `assign_threads`, for every row."""
    n, k = tiles.shape
    out = np.ones((n, k), dtype=np.int64)
    outs = output_order(flat)
    if not outs:
        return out
    t = tiles[:, outs].astype(np.int64)
    thr = np.ones_like(t)
    low = np.ones(n, dtype=np.int64)
    cap = np.minimum(t[:, 0], min(me, threads))
    while True:  # pow2ceil
        grow = low < cap
        if not grow.any():
            break
        low = np.where(grow, low * 2, low)
    while (low > threads).any():
        low = np.where(low > threads, low // 2, low)
    thr[:, 0] = low
    left = threads // low
    rows = np.arange(n)
    pos = np.arange(len(outs), dtype=np.int64)
    big = len(outs) * (threads + 1)
    while True:
        room = (thr < t) & (left > 1)[:, None]
        live = room.any(axis=1)
        if not live.any():
            break
        uneven = (t % (2 * thr)) != 0
        key = uneven * big + thr * len(outs) + pos
        key = np.where(room, key, np.iinfo(np.int64).max)
        pick = np.argmin(key, axis=1)
        r = rows[live]
        thr[r, pick[live]] *= 2
        left = np.where(live, left // 2, left)
    out[:, outs] = thr
    return out
