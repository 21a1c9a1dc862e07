"""Addressing tensors that live inside another tensor's buffer (`plan.placement`): a kernel's
arguments are the buffers (the root tensors), and a placed tensor's element is found through
its storage's offset and strides, written as constants in the kernel's index expressions."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..lang import ir
from ..plan.placement import Storage
from .kernel_text import KernelArg, row_major_strides


def kernel_args(reads: Iterable[str], writes: Iterable[str], program: ir.Program,
                storage: Mapping[str, Storage]) -> list[KernelArg]:
    """One argument per buffer, inputs first: a buffer that the kernel both reads (one
    tensor placed in it) and writes (another) is one argument, written."""
    def root(n: str) -> str:
        return storage[n].root if n in storage else n

    outs = list(dict.fromkeys(root(n) for n in writes))
    ins = [r for r in dict.fromkeys(root(n) for n in reads) if r not in outs]
    t = program.tensors
    return ([KernelArg(n, "in", t[n].dtype, t[n].size) for n in ins]
            + [KernelArg(n, "out", t[n].dtype, t[n].size) for n in outs])


def element_offset(out_shape: tuple[int, ...], strides: tuple[int, ...], base: int) -> str:
    """Offset of the element a work-item `gid` (a flat, row-major element of `out_shape`)
    reads or writes, for a tensor with element strides `strides` along the output's
    dimensions (0 where it is broadcast) starting at `base`.  Neighbouring dimensions that
    stay contiguous in the tensor are one coordinate, so a tensor that is one run of its
    buffer costs an add: `base + gid`."""
    dims = [(n, s) for n, s in zip(out_shape, strides, strict=True) if n > 1]
    # Runs of dimensions, innermost first: [extent, stride of the run's last dimension].
    runs: list[list[int]] = []
    for n, s in reversed(dims):
        if runs and (s == runs[-1][1] * runs[-1][0] if s else runs[-1][1] == 0):
            runs[-1][0] *= n
            continue
        runs.append([n, s])
    terms, below = [], 1
    for k, (n, s) in enumerate(runs):
        if s:
            coord = f"gid / {below}" if below > 1 else "gid"
            if k < len(runs) - 1:
                coord = f"({coord}) % {n}" if below > 1 else f"gid % {n}"
            terms.append(coord if s == 1 else f"({coord}) * {s}")
        below *= n
    if base:
        terms.insert(0, str(base))
    return " + ".join(terms) if terms else "0"


def operand_offset(shape: tuple[int, ...], out_shape: tuple[int, ...], s: Storage) -> str:
    """`element_offset` of a tensor of `shape` (numpy-broadcast to `out_shape`) kept at `s`."""
    lead = len(out_shape) - len(shape)
    strides = (0,) * lead + tuple(0 if n == 1 else st
                                  for n, st in zip(shape, s.strides, strict=True))
    return element_offset(out_shape, strides, s.offset)


__all__ = ["element_offset", "kernel_args", "operand_offset", "row_major_strides"]
