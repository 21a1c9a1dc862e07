"""ONNX's Mod, Trilu, Floor and Ceil -> graph ops.  They fold at load time when their
operands are known (`fold`: shape arithmetic such as a transformer's `position % period`, a
causal mask made by Trilu of a constant); the converters here take the operands computed at
run time.

- Mod: either sign rule (fmod=0: the divisor's sign, as Python's %; fmod=1: the dividend's,
  as C's fmod).  Integers: a zero divisor gives 0 (the reference's and the kernels' integer
  division by 0), where ONNX leaves it undefined.  Floats: a - b * trunc(a / b) in float32,
  exact except where a / b rounds onto an integer it is not (then the result is off by b).
- Trilu: the kept triangle (upper: column - row >= k; lower: column - row <= k) of the last
  two axes; k must be known when the model is loaded.  The mask is a constant of the last two
  axes' shape, so the kernel is one select."""

from __future__ import annotations

import numpy as np

from ..graph import ops, ops_math
from ..graph.builder import Value
from .converters import Converter, NodeContext
from .fold import graph_constant


def _mod(c: NodeContext) -> list[Value]:
    a, b = c.need(0), c.need(1)
    fmod = int(c.attr("fmod", 0))
    if fmod not in (0, 1):
        raise c.unsupported("fmod", fmod)
    if a.dtype != b.dtype:
        raise c.fail(f"the operands differ in type ({a.dtype} and {b.dtype})")
    if a.dtype in ("float16", "float32"):
        q = ops.div(a, b)
        trunc = ops_math.where(ops_math.less(q, 0.0), ops_math.ceil(q), ops_math.floor(q))
        # b * 0 is NaN for an infinite b, where a itself is the remainder (C's fmod).
        whole = ops_math.where(ops_math.equal(trunc, 0.0), 0.0, ops.mul(b, trunc))
        r = ops.sub(a, whole)
        return [r if fmod == 1 else _divisor_sign(r, b, 0.0)]
    if a.dtype != "int32":
        raise c.fail(f"Mod of {a.dtype} tensors is not supported")
    r = ops.sub(a, ops.mul(b, ops.div(a, b)))  # C's remainder: the dividend's sign
    return [r if fmod == 1 else _divisor_sign(r, b, 0)]


def _divisor_sign(r: Value, b: Value, zero: float | int) -> Value:
    """A remainder with the dividend's sign -> the divisor's: a nonzero one whose sign
    differs from b's moves by b."""
    fix = ops_math.logical_and(ops_math.not_equal(r, zero), ops_math.not_equal(
        ops_math.less(r, zero), ops_math.less(b, zero)))
    return ops_math.where(fix, ops.add(r, b), r)


def _trilu(c: NodeContext) -> list[Value]:
    x = c.need(0)
    if x.ndim < 2:
        raise c.fail(f"the input has {x.ndim} axes; Trilu needs at least 2")
    known = c.static(1, "diagonal offset k")
    k = 0 if known is None else int(np.asarray(known).reshape(()))
    rows, cols = x.shape[-2:]
    offset = np.arange(cols)[None, :] - np.arange(rows)[:, None]
    keep = offset >= k if int(c.attr("upper", 1)) else offset <= k
    mask = graph_constant(c.g, keep, f"{c.node.output[0]}_triangle")
    zero = graph_constant(c.g, np.zeros((), np.dtype(x.dtype)), f"{c.node.output[0]}_zero")
    return [ops_math.where(mask, x, zero)]


def _float_unary(fn):
    def convert(c: NodeContext) -> list[Value]:
        x = c.need(0)
        if x.dtype not in ("float16", "float32"):
            raise c.fail(f"{c.node.op_type} of a {x.dtype} input is not supported")
        return [fn(x)]
    return convert


ARITH_CONVERTERS: dict[str, Converter] = {"Mod": _mod, "Trilu": _trilu,
                                          "Floor": _float_unary(ops_math.floor),
                                          "Ceil": _float_unary(ops_math.ceil)}
# Operands whose value decides the program (`OnnxExecutable` compiles once per value).
ARITH_STATIC_OPERANDS = {("Trilu", 1)}
