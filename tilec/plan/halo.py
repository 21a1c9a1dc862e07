"""Padded reads without bounds tests: a tensor that a convolution reads with zero padding is
written inside a larger buffer whose border holds zeros, and the convolution reads that buffer.

A padded convolution in Tile reads its input out of bounds, and Tile skips those points:

    O[n, co, x, y : ...] = +(X[n, ci, x + i - 1, y + j - 1] * W[co, ci, i, j]);

The skipped points are constraints (`x + i - 1 >= 0`, ...) that every kernel tests: the
CPU code splits each window position into an interior and an edge path (masked loads), which
doubles the kernel's code and, where the image is small (7x7, 14x14), sends most of the work
through the edge path.  When X is computed by the program (not an input or output), it can
be written inside `X_halo`, one or more elements larger on each padded side, whose border
nobody writes and which holds zeros (the runtime fills it; `Halo`).  The convolution then
reads `X_halo[n, ci, x + i, y + j]`: each point it did not skip before reads a zero there, and
a zero adds nothing to a sum of products, so the result is the same and no constraint is left.

Only sums (`+`) of one operand or of products (`*`) are rewritten, and only where the rewritten
statement's index ranges are those of the original (the border adds points inside the same box,
never a longer loop).  A tensor's producer writes it through the storage, as a concatenation's
operands are (`placement`); its other readers read it there.  The same blocks apply: inputs,
outputs, tensors already placed, tensors read as a `default` or at other elements than their own,
and tensors a row-major kernel touches (`blocked`) keep their own buffers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..errors import TileError
from ..lang import ir
from .flatten import flatten
from .placement import Storage, fresh_name, readers

# A border wider than this on one side is not worth its memory (a 7x7 stem's is 3).
MAX_PAD = 4
# Nor a padded buffer this many times the tensor (tiny images with wide windows).
MAX_GROWTH = 3.0
# Rows start on a multiple of this many elements (32 bytes of float32) where that makes a
# row at most ALIGN_GROWTH times longer (`_aligned`).
ALIGN = 8
ALIGN_GROWTH = 1.5


@dataclass(frozen=True)
class Halo:
    """`root`'s buffer holds `tensor` at `lo` from its origin along each axis; every other
    element (the border) holds `fill` before any kernel runs and is never written."""

    root: str
    tensor: str
    lo: tuple[int, ...]
    hi: tuple[int, ...]
    fill: float = 0.0

    def storage(self, shape: tuple[int, ...]) -> Storage:
        padded = ir.Tensor(self.root, shape)
        return Storage(self.root, sum(a * s for a, s in zip(self.lo, padded.strides,
                                                            strict=True)), padded.strides)


def _pads(access: ir.Access, shape: tuple[int, ...],
          bounds: Mapping[str, tuple[int, int]]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """How far the access reaches below 0 and past the end of each axis over the index box."""
    lo, hi = [], []
    for p, n in zip(access.idx, shape, strict=True):
        small = big = p.const
        for name, c in p.terms:
            a, b = bounds[name]
            small += c * (a if c > 0 else b)
            big += c * (b if c > 0 else a)
        lo.append(max(0, -int(small)))
        hi.append(max(0, int(big) - (n - 1)))
    return tuple(lo), tuple(hi)


def _box(op: ir.Contraction, tensors: Mapping[str, ir.Tensor]) -> dict[str, tuple[int, int]]:
    f = flatten(op, tensors)
    return {v: (lo, lo + r - 1) for v, lo, r in f.index_bounds}


def _summing(op: ir.Statement, name: str) -> bool:
    """A sum over points to which a zero operand adds nothing, reading `name` once."""
    return (isinstance(op, ir.Contraction) and op.agg == "+" and op.comb in (None, "*")
            and op.default is None
            and sum(a.tensor == name for a in op.inputs) == 1
            and all(p.const.denominator == 1 and all(c.denominator == 1 for _, c in p.terms)
                    for a in op.inputs for p in a.idx))


def pad_reads(program: ir.Program, storage: Mapping[str, Storage],
              blocked: Iterable[str] = ()) -> tuple[ir.Program, dict[str, Storage],
                                                    tuple[Halo, ...]]:
    """`program` with its zero-padded reads of computed tensors turned into reads of a
    bordered buffer (see the module docstring), the storage with those tensors placed in it,
    and the borders the runtime fills."""
    blocked = set(blocked) | set(program.inputs) | set(program.outputs)
    roots = {s.root for s in storage.values()}
    tensors = dict(program.tensors)
    ops = list(program.ops)
    who_reads = readers(program)
    producers: dict[str, list[int]] = {}
    for i, op in enumerate(ops):
        producers.setdefault(op.output, []).append(i)
    storage = dict(storage)
    halos = []
    for name, t in program.tensors.items():
        if name in blocked or name in storage or name in roots or not t.shape or \
                t.dtype not in ("float32", "float16"):
            continue
        made = producers.get(name, [])
        if len(made) != 1:
            continue
        maker = ops[made[0]]
        if isinstance(maker, ir.Contraction) and maker.default is not None:
            continue
        if any(how not in ("access", "ref") for _, how in who_reads[name]):
            continue
        # Each summing reader that reads past the tensor's ends, with its reach.
        wants = {}
        for i, how in who_reads[name]:
            op = ops[i]
            if how != "access" or not _summing(op, name):
                continue
            access = next(a for a in op.inputs if a.tensor == name)
            try:
                box = _box(op, tensors)
            except TileError:  # a statement flatten refuses stays as written
                continue
            lo, hi = _pads(access, t.shape, box)
            if any(lo) or any(hi):
                wants[i] = (box, lo, hi)
        if not wants:
            continue
        lo = tuple(max(w[1][d] for w in wants.values()) for d in range(len(t.shape)))
        hi = tuple(max(w[2][d] for w in wants.values()) for d in range(len(t.shape)))
        if max(lo + hi) > MAX_PAD:
            continue
        lo, hi = _aligned(t, lo, hi)
        shape = tuple(n + a + b for n, a, b in zip(t.shape, lo, hi, strict=True))
        padded = ir.Tensor(fresh_name(f"{name}_halo", tensors), shape, t.dtype)
        if padded.size > MAX_GROWTH * t.size:
            continue
        tensors[padded.name] = padded
        rewritten = {}
        for i, (box, _, _) in wants.items():
            new = _read_padded(ops[i], name, padded.name, lo)
            # The border adds points inside the same index box, never more iterations.
            if _box(new, tensors) == box:
                rewritten[i] = new
        if not rewritten:
            del tensors[padded.name]
            continue
        for i, new in rewritten.items():
            ops[i] = new
        halo = Halo(padded.name, name, lo, hi)
        storage[name] = halo.storage(shape)
        halos.append(halo)
    if not halos:
        return program, storage, ()
    return (dataclasses.replace(program, ops=tuple(ops), tensors=tensors), storage,
            tuple(halos))


def _aligned(t: ir.Tensor, lo: tuple[int, ...], hi: tuple[int, ...]
             ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Borders with the last axis widened so that every row of the tensor starts on a
    vector boundary (ALIGN elements): its producer's vector stores and the reader's vector
    loads then split no more cache lines than they did in the tensor's own buffer."""
    if not t.shape or not (lo[-1] or hi[-1]):
        return lo, hi
    first = -(-lo[-1] // ALIGN) * ALIGN
    row = -(-(first + t.shape[-1] + hi[-1]) // ALIGN) * ALIGN
    if row > ALIGN_GROWTH * (lo[-1] + t.shape[-1] + hi[-1]):
        return lo, hi
    return lo[:-1] + (first,), hi[:-1] + (row - first - t.shape[-1],)


def _read_padded(op: ir.Contraction, name: str, padded: str, lo: tuple[int, ...]
                 ) -> ir.Contraction:
    inputs = tuple(
        dataclasses.replace(a, tensor=padded, idx=tuple(
            ir.Poly.make(dict(p.terms), p.const + s) for p, s in zip(a.idx, lo, strict=True)))
        if a.tensor == name else a for a in op.inputs)
    return dataclasses.replace(op, inputs=inputs)


__all__ = ["Halo", "pad_reads"]
