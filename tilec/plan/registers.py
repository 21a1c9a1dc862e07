"""A search's top tiles predicted again with the registers the device's compiler gave their
kernels, and put in the new order.

On a GPU a work-item's registers decide how many work-groups a compute unit holds, and with
them how much latency the time model sees covered.  The model estimates them (`predict`:
accumulators + 2 x reads + 32), but NVIDIA's compiler gave tiles with the same accumulators,
reads and copies anything from 127 to 209 registers: on the H200's seed conv at N=32 the
model's first choice compiled to 147 (one 256-thread group an SM, 4.06 ms) where tiles of 128
held two (3.09-3.51 ms).  Where a driver says what it allocated (`runtime.registers`), code
generation writes the kernels of a long kernel's top tiles, asks, and `reranked` predicts them
again with the counts.  Counting costs a build of the candidates (a 3x3 convolution's 16: 6 s on
the H200's driver, kept in the cache after), worth it for long kernels only (`MIN_SECONDS`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from .cost import score_many
from .predict import explain_line, predict_many

if TYPE_CHECKING:
    from .search import TiledPlan

# Tiles whose kernels are counted: the top 8 of the H200's seed conv at N=32 all compiled past
# 128 registers; the 9th to 16th hold tiles that keep two groups an SM.
QUERY_TILES = 16
# A kernel predicted shorter than this keeps the estimate: its candidates' build (0.4 s a
# convolution kernel on the H200) is more than a short kernel can win back.
MIN_SECONDS = 500e-6


def worth_counting(plan: TiledPlan) -> bool:
    """Whether a search's outcome is one the compiler's counts may re-order: GPU tiles ranked
    by predicted time, the first predicted to take at least `MIN_SECONDS`."""
    return (plan.ranked_by_time and plan.hw is not None and plan.hw.kind == "gpu"
            and bool(plan.predicted) and len(plan.top) > 1
            and plan.predicted[0][0] >= MIN_SECONDS)


def _predicted(plan: TiledPlan, registers: Sequence[int | None]) -> dict[str, np.ndarray]:
    if len(registers) != len(plan.top):
        raise ValueError(f"{len(registers)} register counts for {len(plan.top)} tiles")
    if plan.hw is None:
        raise ValueError("a plan without a hardware model cannot be predicted again")
    tiles = np.asarray([t for t, _ in plan.top], np.int64)
    stats = score_many(plan.flat, tiles, plan.hw, plan.post_ops, plan.dtype)
    counts = np.asarray([r or 0 for r in registers], np.float64)
    return predict_many(plan.flat, tiles, plan.hw, stats, plan.dtype, registers=counts)


def counted_enough(plan: TiledPlan, registers: Sequence[int | None], done: int) -> bool:
    """Whether the first `done` tiles' counts settle the choice: the best of them is
    predicted no slower than any tile not counted yet.  The estimate has been below the
    compiler's count on every tile measured (104 against 127-209 on the H200's convolutions,
    within a unit of it on its matrix products), so a tile's estimated time is taken as the
    best its count can make it: counting stops as soon as a counted tile beats every
    estimate left (a matrix product whose first tile keeps its two groups: one build)."""
    if done >= len(plan.top):
        return True
    times = _predicted(plan, registers)["time"]
    return bool(times[:done].min() <= times[done:].min())


def reranked(plan: TiledPlan, registers: Sequence[int | None], keep: int) -> TiledPlan:
    """`plan` with its top tiles predicted again, each with the registers its kernel was
    given (`registers[i]` for `plan.top[i]`; None or 0: not known, the estimate stays), put in
    order of the new predictions (ties keep the search's order), the first `keep` kept."""
    pred = _predicted(plan, registers)
    order = np.argsort(pred["time"], kind="stable")[:max(1, keep)]
    top = tuple(plan.top[i] for i in order)
    predicted = tuple((float(pred["time"][i]), explain_line(pred, int(i))) for i in order)
    return replace(plan, tile=top[0][0], cost=top[0][1], top=top, predicted=predicted)


__all__ = ["MIN_SECONDS", "QUERY_TILES", "counted_enough", "reranked", "worth_counting"]
