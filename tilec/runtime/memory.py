"""Device memory planning: intermediate tensors share buffers from a pool by liveness.

Kernels run in order on one in-order queue, so a temporary's buffer can take a later temporary
as soon as the last kernel reading it has been enqueued (MNN's buffer pool, seed 002).  Program
inputs and outputs keep their own buffers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..codegen.contraction import KernelSource


@dataclass(frozen=True)
class MemoryPlan:
    slot_of: Mapping[str, int]  # temporary tensor -> pool slot
    slot_bytes: tuple[int, ...]  # size of each pool slot
    own_bytes: int  # inputs and outputs, which keep their buffers
    unshared_bytes: int  # what every tensor in its own buffer would take

    @property
    def peak_bytes(self) -> int:
        return self.own_bytes + sum(self.slot_bytes)

    def describe(self) -> str:
        return (f"device memory: {self.peak_bytes} bytes with buffer reuse, "
                f"{self.unshared_bytes} without ({len(self.slot_of)} temporaries in "
                f"{len(self.slot_bytes)} pooled buffers)")


def plan_memory(sources: Sequence[KernelSource], sizes: Mapping[str, int],
                keep: set[str]) -> MemoryPlan:
    """Assign every tensor of `sizes` not in `keep` (inputs and outputs) to a pool slot."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, s in enumerate(sources):
        for a in s.args:
            if a.tensor in keep or a.tensor not in sizes:
                continue
            if a.role == "out":
                first.setdefault(a.tensor, i)
            last[a.tensor] = i
    slot_bytes: list[int] = []
    free: list[int] = []
    slot_of: dict[str, int] = {}
    for i in range(len(sources)):
        for name in [n for n, f in first.items() if f == i]:
            need = sizes[name]
            fitting = [k for k in free if slot_bytes[k] >= need]
            if fitting:
                k = min(fitting, key=lambda k: slot_bytes[k])
            elif free:
                k = max(free, key=lambda k: slot_bytes[k])
                slot_bytes[k] = need
            else:
                k = len(slot_bytes)
                slot_bytes.append(need)
            if k in free:
                free.remove(k)
            slot_of[name] = k
        # Freed only after the kernel: it may read one temporary while writing another.
        for name in [n for n, f in last.items() if f == i and n in slot_of]:
            free.append(slot_of[name])
    own = sum(b for n, b in sizes.items() if n not in slot_of)
    return MemoryPlan(slot_of, tuple(slot_bytes), own, sum(sizes.values()))
