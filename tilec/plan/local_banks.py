"""Local-memory wavefronts of a GPU contraction kernel, counted from its schedule.

Local memory is split into 32 banks of 4 bytes; one pass (a wavefront) serves at most one
4-byte word of each bank, so a warp's read takes as many passes as the most distinct words any
one bank is asked for (a broadcast of one word is one pass; 32 threads reading float4s side by
side, 128 distinct words, are four).  The time model charges these passes at the calibrated
local-memory bandwidth (a pass moves at most 128 bytes).

Counted here for every warp of a work-group, as the code generator lays the threads out
(`codegen.contraction`: the output's lowest-stride index fastest across neighbouring
work-items, each thread's accumulator points at h + a x threads, in runs of RUN, or as vectors
of W lanes): the register tile's reads of one reduction step, and the staging copies' stores of
one reduction tile.  Two tiles that differ only in which index is larger (64x128 against
128x64) read and write their local tiles in different patterns; this is what tells them apart.

Also here, shared with the code generator: whether a staged tile's copy stays inside its
tensor and how many elements each copy instruction moves (`staging_copy`)."""

from __future__ import annotations

import functools
import itertools

import numpy as np

from .flat import FlatContraction
from .gpu_form import RUN, run_step
from .schedule import Schedule, Staged

BANKS = 32
WARP = 32
PASS_BYTES = 4 * BANKS  # what one pass can move


def passes(words: np.ndarray) -> int:
    """Passes for one instruction of every warp: `words` (warps x words a warp touches) are
    4-byte local addresses; a warp's passes are the most distinct words of any one bank."""
    w = np.sort(words, axis=1)
    new = np.ones(w.shape, bool)
    new[:, 1:] = w[:, 1:] != w[:, :-1]
    warp = np.repeat(np.arange(w.shape[0]), w.shape[1]).reshape(w.shape)
    counts = np.bincount((warp * BANKS + w % BANKS)[new], minlength=w.shape[0] * BANKS)
    return int(counts.reshape(w.shape[0], BANKS).max(axis=1).sum())


def copy_width(st: Staged, t, safe: bool, W: int, tile: tuple[int, ...],
               flat: FlatContraction) -> int:
    """Elements each copy instruction of the staging moves: a vector of W when the
    tensor's unit-stride run is a whole number of vectors and every vector the tile reads
    starts on a multiple of W (then one aligned global load moves W elements), else 1.
    A tile that reaches past the tensor's ends (`copy_safe`) is copied in vectors too where
    every lane of a vector passes or fails its tests together: the tensor a whole number of
    vectors long (a vector lies inside it or outside it) and no constraint of `flat` on the
    indices the vector's lanes walk (a padding test is the same for the whole vector)."""
    if W <= 1 or t.dtype not in ("float32", "int32") or not st.merged:
        return 1
    if not safe and (t.size % W or not st.parts or any(
            c.coeffs[k] for c in flat.constraints for k, _ in st.parts[0])):
        return 1
    rng, gs, _, _ = st.merged[0]
    if gs != 1 or rng % W or any(z for *_, z in st.merged) or t.offset % W:
        return 1
    if any(m[1] % W for m in st.merged[1:]):
        return 1
    # The tile's origin: each index moves it by stride x a multiple of its tile size.
    for k, stride in enumerate(t.strides):
        if stride % W and tile[k] % W:
            return 1
    return W


def copy_safe(flat: FlatContraction, tile: tuple[int, ...], t) -> bool:
    """Whether every tile's copy of tensor t stays inside it (then no bounds test): the tiles
    divide the ranges and no offset the tiles form falls outside the buffer."""
    counts = [-(-r // x) for r, x in zip(flat.ranges, tile, strict=True)]
    if any(c * x != r for c, x, r in zip(counts, tile, flat.ranges, strict=True)):
        return False
    lo = hi = t.offset
    for k, s in enumerate(t.strides):
        top = counts[k] * tile[k] - 1
        lo += min(0, s * top)
        hi += max(0, s * top)
    return lo >= 0 and hi < t.size


def staging_copy(s: Schedule, i: int) -> tuple[bool, int]:
    """(bounds-safe, elements a copy instruction moves) for staged input i."""
    t = s.flat.inputs[i]
    safe = copy_safe(s.flat, s.tile, t)
    st = s.staged[i]
    return safe, (copy_width(st, t, safe, s.vec, s.tile, s.flat) if st is not None
                   else 1)


def _thread_coords(s: Schedule) -> dict[int, np.ndarray] | None:
    """Every work-item's position along each output index, by local id (None: a split
    reduction, whose rank takes some of the work-item's digits)."""
    if s.split > 1:
        return None
    f = s.flat
    lid = np.arange(s.wg_threads)
    out = {}
    for k in sorted(f.out_indices, key=lambda k: abs(f.output.strides[k])):
        out[k] = lid % s.threads[k]
        lid = lid // s.threads[k]
    return out


def _rel(s: Schedule, k: int, a: int, h: np.ndarray) -> np.ndarray:
    """Accumulator point a of output index k for threads at h (tile-relative)."""
    lanes = s.vec if k == s.vec_index else 1
    if s.run is not None and k == s.run.index:
        rel = h * RUN + run_step(a, s.threads[k])
    else:
        rel = (h + a * s.threads[k]) * lanes
    if s.ragged(k):
        rel = np.minimum(rel, s.tile[k] - lanes)
    return rel


def _reads(s: Schedule) -> list[tuple[int, tuple[int, ...], int, int]]:
    """A step's local reads by one thread: (input, accumulator point, lanes, lane step)."""
    f = s.flat
    outs = list(f.out_indices)
    acc = s.acc_counts()
    out = []
    seen = set()
    for point in itertools.product(*(range(acc[k]) for k in outs)):
        for i, t in enumerate(f.inputs):
            c = point
            st = s.staged[i] if s.staged else None
            if st is None:
                continue
            run = s.run is not None and i == s.run.input
            if run:  # one vector read a run: its first point stands for the others
                pos = outs.index(s.run.index)
                c = c[:pos] + (c[pos] - c[pos] % RUN,) + c[pos + 1:]
            key = (i, tuple(a for k, a in zip(outs, c, strict=True) if t.strides[k] != 0))
            if key in seen:
                continue
            seen.add(key)
            if run:
                out.append((i, c, RUN, 1))
            elif s.vec > 1 and s.vec_index is not None and t.strides[s.vec_index] != 0 \
                    and not s.dot:
                step = st.local_strides[s.vec_index]
                if step == 1:
                    out.append((i, c, s.vec, 1))
                else:  # one scalar read a lane
                    out.extend((i, c, 1, 0) for _ in range(s.vec))
            else:
                out.append((i, c, 1, 0))
    return out


def _warps(x: np.ndarray) -> np.ndarray:
    """Per-work-item values (lanes last) grouped by warp: (warps, WARP x lanes); a last,
    partial warp is padded with its own first work-item's words (no extra distinct word)."""
    n = x.shape[0]
    full = -(-n // WARP) * WARP
    if full != n:
        x = np.concatenate([x, np.repeat(x[-1:], full - n, axis=0)])
    return x.reshape(full // WARP, -1)


@functools.lru_cache(maxsize=1 << 14)
def wavefronts(s: Schedule) -> tuple[float, float] | None:
    """(passes of a reduction step's reads, passes of a reduction tile's copy stores) of a
    whole work-group; None where the layout is not modelled (a split reduction, or nothing
    staged)."""
    if not s.staged or all(st is None for st in s.staged):
        return None
    h = _thread_coords(s)
    if h is None:
        return None
    outs = list(s.flat.out_indices)
    # Every instruction's warps are counted in one `passes` call per width (the counts add
    # up row by row): a call per instruction was most of a search's time.
    reads: dict[int, list[np.ndarray]] = {}
    for i, c, lanes, step in _reads(s):
        st = s.staged[i]
        addr = np.full(s.wg_threads, st.local_base, np.int64)
        for k, a in zip(outs, c, strict=True):
            if st.local_strides[k]:
                addr = addr + st.local_strides[k] * _rel(s, k, a, h[k])
        reads.setdefault(lanes, []).append(
            _warps(addr[:, None] + np.arange(lanes) * max(step, 1)))
    read = sum(passes(np.concatenate(rows)) for rows in reads.values())
    stores: dict[tuple[int, int], list[np.ndarray]] = {}  # (width, times) -> warps
    T = s.wg_threads
    for i, st in enumerate(s.staged):
        if st is None or not st.merged:
            continue
        _, vw = staging_copy(s, i)
        elems = 1
        for m in st.merged:
            elems *= m[0]
        ls0 = st.merged[0][2]
        whole = ls0 == 1 and all(m[2] % vw == 0 for m in st.merged[1:]) and \
            st.local_base % vw == 0
        for copy in range(-(-elems // (T * vw))):
            e = (np.arange(T) + copy * T) * vw
            e = e[e < elems]
            addr, rest = np.zeros_like(e), e
            for rng, _, ls, _ in st.merged:
                addr = addr + ls * (rest % rng)
                rest = rest // rng
            if whole:  # one vector store
                stores.setdefault((vw, 1), []).append(_warps(addr[:, None] + np.arange(vw)))
            else:  # a scalar store a lane
                stores.setdefault((1, vw), []).append(_warps(addr[:, None]))
    store = sum(times * passes(np.concatenate(rows)) for (_, times), rows in stores.items())
    return float(read), float(store)
