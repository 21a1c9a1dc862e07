"""What neighbouring CPU work-items read of an input in common: a window's overlap.

A 3x3 stride-2 max pool's work-item reads 3 columns of its input for one output column; the
next work-item along the row reads the next 3 columns, one of which it shares with this one.
`cost_cpu` counts each work-item's panel of an input past half of L2 as DRAM traffic, so it
counted every shared column twice: squeezenet's 55x55x128 pool read 3.7 MB for a 1.5 MB input
with a one-column tile (2.4x) and 3.0 MB with a three-column tile (1.9x), and the time model
preferred the three columns, which ran 1.3-1.6x slower on the Zen 3 (PoCL 3.0); the shared
column was written a few work-items earlier and is still in the core's cache.

`neighbour_shares` finds the shared part from the input's stride table with its indices merged
as `layout.read_plan` merges them (an index whose stride is a multiple q of an earlier slot's
base stride extends that slot where the slot already reaches q): along an output index k, the
slot holding k spans E base strides over a work-item's whole reduction and moves by tile_k x q
from one work-item to the next, so (E - tile_k x q) / E of the panel is read by both.
`reread_factors` turns that into the part of a panel that is new to a cache: a neighbour's
share is a hit where the work-items between the two (the groups of the output indices that
vary faster in the cost model's group order) read less than the cache holds."""

from __future__ import annotations

import functools

import numpy as np

from .flat import FlatContraction, FlatTensor
from .layout import load_order


def neighbour_shares(flat: FlatContraction, t: FlatTensor, T: np.ndarray
                     ) -> list[tuple[int, np.ndarray]]:
    """For every output index k that input t reads: the fraction (per row of tiles T) of a
    work-item's panel of t that the next work-item along k reads too."""
    if not windowed(flat, t):
        return []
    # The shares depend on the tile's output sides that t reads alone (its reductions count
    # whole): work them out once for each distinct set of sides.
    cols = [k for k in flat.out_indices if t.strides[k] != 0]
    sub = T[:, cols].astype(np.int64)
    if float(np.prod([flat.ranges[k] + 1.0 for k in cols])) >= 2.0**62:
        return _shares(flat, t, T)
    key = np.zeros(T.shape[0], np.int64)
    for j, k in enumerate(cols):  # sides are at most the ranges: a mixed-radix number
        key = key * (flat.ranges[k] + 1) + sub[:, j]
    _, first, back = np.unique(key, return_index=True, return_inverse=True)
    U = np.ones((first.size, T.shape[1]), np.int64)
    U[:, cols] = sub[first]
    return [(k, share[back.reshape(-1)]) for k, share in _shares(flat, t, U)]


def _shares(flat: FlatContraction, t: FlatTensor, T: np.ndarray
            ) -> list[tuple[int, np.ndarray]]:
    n = T.shape[0]
    outs = set(flat.out_indices)
    order = load_order(t)
    started: list[int] = []  # slots, by the index that opened them
    base: dict[int, int] = {}
    span: dict[int, np.ndarray] = {}
    open_: dict[int, np.ndarray] = {}
    member: dict[int, np.ndarray] = {}
    for k in order:
        s = abs(t.strides[k])
        ext = T[:, k].astype(np.int64) if k in outs else np.full(n, flat.ranges[k], np.int64)
        joined = np.zeros(n, bool)
        slot = np.full(n, k, np.int64)
        for j in started:
            q, rem = divmod(s, base[j])
            if rem:
                continue
            join = open_[j] & ~joined & (span[j] >= q)
            span[j] = np.where(join, span[j] + q * (ext - 1), span[j])
            slot = np.where(join, j, slot)
            joined |= join
        started.append(k)
        base[k] = s
        span[k] = np.where(joined, 0, ext)
        open_[k] = ~joined
        member[k] = slot
    shares = []
    for k in order:
        if k not in outs:
            continue
        E = np.zeros(n, np.int64)
        q = np.zeros(n, np.int64)
        for j in started:
            here = member[k] == j
            E = np.where(here, span[j], E)
            q = np.where(here, abs(t.strides[k]) // base[j], q)
        shift = T[:, k].astype(np.int64) * q
        shares.append((k, np.clip((E - shift) / np.maximum(E, 1), 0.0, 1.0)))
    return shares


@functools.lru_cache(maxsize=4096)
def windowed(flat: FlatContraction, t: FlatTensor) -> bool:
    """Whether some output index of t moves its reads by less than a reduction index's
    window spans (x in `x + i` with i < 3; not m in a matmul's A[m, k]): the only way two
    work-items' panels can overlap."""
    outs = flat.out_indices
    for k in outs:
        sk = abs(t.strides[k])
        for r in flat.reduce_indices:
            sr = abs(t.strides[r])
            if sk and sr and sk % sr == 0 and (flat.ranges[r] - 1) * sr >= sk:
                return True
    return False


def reread_factors(flat: FlatContraction, t: FlatTensor, T: np.ndarray, G: np.ndarray,
                   outs: list[int], group_bytes: np.ndarray,
                   caches: tuple[int, ...]) -> list[np.ndarray]:
    """For each cache size in `caches`: the part of a work-item's panel of t that such a
    cache does not already hold from a neighbouring work-item (per row of tiles T; 1 = all
    of it is new).  `G`: the work-groups along each index (rows x indices); `outs`: the
    output indices in the order the groups run, fastest first; `group_bytes`: what one
    work-item reads in all."""
    n = T.shape[0]
    new = [np.ones(n) for _ in caches]
    for k, share in neighbour_shares(flat, t, T):
        if not share.any():
            continue
        apart = np.ones(n, np.int64)  # work-items from one to its neighbour along k
        for o in outs:
            if o == k:
                break
            apart = apart * G[:, o]
        reach = apart * group_bytes
        for i, size in enumerate(caches):
            held = (G[:, k] > 1) & (reach <= size)
            new[i] = new[i] * np.where(held, 1.0 - share, 1.0)
    return new
