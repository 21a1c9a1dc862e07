"""The numpy reference's path for copies: a copy that reads its input at affine offsets of
the output's own indices is one strided view of the input (`strided_copy`), where the general
paths (`reference_paths`) enumerate its points.  Binding a model's weights computes the
filters relaid in panels on the host this way."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from . import ir


def strided_copy(op: ir.Contraction, tensors: Mapping[str, ir.Tensor],
                 arrays: Mapping[str, np.ndarray],
                 bounds: Mapping[str, tuple[int, int]]) -> np.ndarray | None:
    """A copy that reads its input at affine offsets of the output's own indices (a
    transpose, a filter relaid in panels, a slice) as one strided view of the input, copied
    once (the caller casts it); None where that is not the copy (constraints, a default, an
    output index that is not one plain index over its whole axis, a read outside the
    input).  Filters relaid in panels when a model's weights are bound took most of a warm
    load through the general paths."""
    if op.agg != "=" or op.comb is not None or len(op.inputs) != 1 or op.constraints \
            or op.default is not None:
        return None
    out = tensors[op.output]
    names = []
    for p, n in zip(op.out_idx, out.shape, strict=True):
        if len(p.terms) != 1 or p.terms[0][1] != 1 or p.const != 0:
            return None
        name = p.terms[0][0]
        if name in names or tuple(bounds.get(name, (0, -1))) != (0, n - 1):
            return None
        names.append(name)
    acc = op.inputs[0]
    src = np.asarray(arrays[acc.tensor])
    shape = tensors[acc.tensor].shape
    if src.shape != tuple(shape):
        return None
    found = ir.access_strides(acc.idx, tuple(shape), src.strides,
                              {k: tuple(bounds[k]) for k in names})
    if found is None:
        return None
    strides = found[0]
    if src.size == 0:
        return None
    # A view starting at the element the output's first element reads.
    start = src[tuple(slice(int(p.const), int(p.const) + 1) for p in acc.idx)]
    return np.lib.stride_tricks.as_strided(start, shape=tuple(out.shape),
                                           strides=tuple(strides[k] for k in names),
                                           writeable=False)


__all__ = ["strided_copy"]
