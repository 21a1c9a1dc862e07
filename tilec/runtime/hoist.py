"""Which kernels a call may skip: those whose results follow from the bound inputs alone
(`hoistable`), run once where the inputs are bound (`launch.Launcher.bind`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def hoistable(kernels: Sequence[Any], bound: set[str]) -> tuple[set[str], set[str]]:
    """The kernels (`launch.KernelInfo`s, in launch order) whose results follow from the
    `bound` inputs alone, so that one run at bind time serves every call, and the bound
    inputs they read.  A kernel qualifies when every tensor it touches is a bound input no
    kernel writes, or is written by qualifying kernels only: a tensor that a per-call kernel
    also writes (an accumulation into it, an update in place) keeps all of its writers per
    call."""
    if not bound:
        return set(), set()
    writers: dict[str, set[str]] = {}
    for k in kernels:
        for t in k.writes:
            writers.setdefault(t, set()).add(k.name)
    chosen = {k.name for k in kernels}
    while True:
        ready = {t for t in bound if t not in writers} | {
            t for t, ws in writers.items() if t not in bound and ws <= chosen}
        keep = {k.name for k in kernels if k.name in chosen and set(k.args) <= ready}
        if keep == chosen:
            break
        chosen = keep
    deps = {t for k in kernels if k.name in chosen for t in k.args if t in bound}
    return chosen, deps
