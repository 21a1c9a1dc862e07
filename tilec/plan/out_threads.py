"""Threads per output index of a tile: how a work-group's threads divide the register
tile (`schedule.make_schedule` and, to price it, `predict`)."""

from __future__ import annotations

import itertools

from .flat import FlatContraction
from .gpu_form import RUN, RunChoice


def split_threads(flat: FlatContraction, tile: tuple[int, ...], budget: int,
                  vec_index: int | None, lanes: int,
                  run: RunChoice | None = None) -> list[int]:
    """Threads per output index (powers of two dividing each index's units).

    Most threads first (they hide latency); then the least repeated work where threads do not
    divide a tile evenly; then the split whose register tile needs the fewest operand loads
    per FMA (a square-ish tile: for a matmul 8x8 beats 32x2); then more
    threads on the output's lowest-stride index, so neighbouring threads store neighbouring
    elements.  With `run`, that input's points along the run index are read RUN at a time
    where a thread's points there are whole runs."""
    outs = sorted(flat.out_indices, key=lambda k: abs(flat.output.strides[k]))
    units = [tile[k] // lanes if k == vec_index else tile[k] for k in outs]
    options = [_pow2s(u, budget) for u in units]
    useful = 1
    for u in units:
        useful *= u
    # Per input, the positions (in `outs`) of the output indices it reads, and where its
    # points along the run index are read RUN at a time.
    reads = [[(j, run is not None and run.input == i and run.index == k)
              for j, k in enumerate(outs) if t_in.strides[k] != 0]
             for i, t_in in enumerate(flat.inputs)]
    # Only the combinations with the most threads within the budget can win (the key's first
    # term), so only they are weighed further.
    combos = []
    most = 0
    for combo in itertools.product(*options):
        total = 1
        for t in combo:
            total *= t
        if most <= total <= budget:
            if total > most:
                most, combos = total, []
            combos.append(combo)
    best, best_key = None, None
    for combo in combos:
        acc = [-(-u // t) for u, t in zip(units, combo, strict=True)]
        fmas = 1
        for a in acc:
            fmas *= a
        loads = 0
        for pairs in reads:
            n = 1
            for j, whole_runs in pairs:
                n *= acc[j] // RUN if whole_runs and acc[j] % RUN == 0 else acc[j]
            loads += n
        waste = round(most * fmas / useful, 3)
        key = (-most, waste, loads / fmas, -(combo[0] if combo else 1))
        if best_key is None or key < best_key:
            best, best_key = combo, key
    th = [1] * len(tile)
    for k, t in zip(outs, best or (), strict=False):
        th[k] = t
    return th


def _pow2s(n: int, cap: int) -> list[int]:
    """Powers of two up to cap and up to the first one reaching n (an odd tile of 7 may
    take 8 threads, one of which repeats a point)."""
    out, t = [], 1
    while t <= cap:
        out.append(t)
        if t >= n:
            break
        t *= 2
    return out


__all__ = ["split_threads"]
