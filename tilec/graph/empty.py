"""Tensors with no elements, handled at graph level (Tile kernels need positive sizes).

A tensor with a zero in its shape holds nothing, so it needs no kernel: `eliminate_empty`
rewrites a graph so that no node reads or writes one.

- A node whose result has no elements becomes an empty constant (its operands are then dead).
- A node whose result has elements but which reads an empty operand is rewritten:
  a reduction over an empty set of elements is the reduction's identity broadcast to the result
  (sum 0, max -inf for floats / the smallest value for integers / False for bool, mean NaN as
  numpy and ONNX's reference give 0 / 0); a concatenation drops its empty operands; a
  contraction whose summed dimension is empty (matmul or gemm with K = 0, a convolution with no
  input channels) is zeros plus its bias (gemm: beta * C).  Any other such node is a TileError.
- Graph inputs may be empty: they are not inputs of the Tile program (the caller still passes
  them, and their shapes are checked).  Empty graph outputs are made on the host (`lower`
  records their shapes and types; `GraphExecutable` returns fresh empty arrays).

`tilec.lower` applies this to every graph it writes, so `Graph.compile`, `evaluate` and
`to_tile` accept empty tensors with or without the passes; a graph without empty tensors is
returned unchanged."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..errors import TileError
from . import ops
from .core import GraphBase, Node, TensorType, constant_array

NP_DTYPES = {"float32": np.float32, "float16": np.float16, "int32": np.int32, "bool": np.bool_}


def is_empty(shape: Sequence[int]) -> bool:
    return math.prod(shape) == 0


def empty_array(t: TensorType) -> np.ndarray:
    return np.zeros(t.shape, NP_DTYPES[t.dtype])


def has_empty(g: GraphBase) -> bool:
    return any(is_empty(g.type(v).shape) for v in
               [*g.inputs, *g.constants, *(n.output for n in g.nodes)])


def reduction_identity(kind: str, dtype: str) -> object:
    """The value of a reduction over no elements."""
    if kind == "sum":
        return False if dtype == "bool" else 0
    if kind == "max":
        if dtype == "bool":
            return False
        if dtype == "int32":
            return np.iinfo(np.int32).min
        return -np.inf
    if kind == "min":
        if dtype == "bool":
            return True
        return np.iinfo(np.int32).max if dtype == "int32" else np.inf
    if kind == "prod":
        return True if dtype == "bool" else 1
    if kind == "mean":
        if dtype in ("float16", "float32"):
            return np.nan
        raise TileError(f"the mean of no elements is undefined for {dtype}")
    raise TileError(f"internal: unknown reduction {kind!r}")


def eliminate_empty(g: GraphBase) -> GraphBase:
    """`g` with no node reading or writing an empty tensor (see the module's description)."""
    if not has_empty(g):
        return g
    out = g.derive()
    for n in g.nodes:
        if is_empty(n.shape):
            _set_constant(out, n.output, empty_array(n.type), n.type)
            continue
        empties = [i for i in n.inputs if is_empty(out.type(i).shape)]
        if not empties:
            out.append(n)
            continue
        _rewrite(out, n, empties[0])
    return out.prune()


def _set_constant(g: GraphBase, name: str, array: np.ndarray, t: TensorType) -> None:
    g.constants[name] = constant_array(array, t.dtype)
    g._types[name] = t


def _fail(n: Node, operand: str, g: GraphBase) -> TileError:
    return TileError(f"{n.op} node {n.output}: operand {operand} has no elements (shape "
                     f"{list(g.type(operand).shape)}) but its result {list(n.shape)} would "
                     "have some; this op does not support that")


def _rewrite(out: GraphBase, n: Node, empty: str) -> None:
    """`n` (non-empty result, an empty operand) written into `out` under its own name."""
    if n.op == "reduce":
        try:
            fill = reduction_identity(str(n.get("kind")), n.dtype)
        except TileError as e:
            raise TileError(f"reduce node {n.output}: {e.message} (operand {empty} has no "
                            "elements)") from None
        _set_constant(out, n.output, np.full(n.shape, fill, NP_DTYPES[n.dtype]), n.type)
        return
    if n.op == "concat":
        kept = tuple(i for i in n.inputs if not is_empty(out.type(i).shape))
        if len(kept) == 1:
            out.append(Node("copy", kept, n.output, n.type))
        else:
            out.append(Node("concat", kept, n.output, n.type, n.attrs))
        return
    if n.op in ("matmul", "gemm", "conv", "conv_transpose") and n.inputs.index(empty) < 2:
        # The summed dimension is empty (otherwise the result would be empty too): zeros,
        # plus the bias, then the fused activation if the passes put one there.
        zeros = np.zeros(n.shape, NP_DTYPES[n.dtype])
        act = n.get("activation")
        if len(n.inputs) < 3 and act is None:
            _set_constant(out, n.output, zeros, n.type)
            return
        v = out.constant(zeros, f"{n.output}_zeros", n.dtype)
        if len(n.inputs) > 2:
            bias = out.value(n.inputs[2])
            if n.op == "gemm" and float(n.get("beta")) != 1:  # type: ignore[arg-type]
                bias = ops.mul(bias, float(n.get("beta")))  # type: ignore[arg-type]
            elif n.op in ("conv", "conv_transpose") and n.get("layout") != "NHWC":
                bias = ops.reshape(bias, bias.shape + (1,) * (len(n.shape) - 2))
            v = ops.add(v, bias)
        if act is not None:
            v = getattr(ops, str(act))(v, **dict(n.get("act_attrs") or ()))  # type: ignore
        if v.name in out.constants:
            _set_constant(out, n.output, out.constants[v.name], n.type)
        else:
            out.retarget(v, n.output)
        return
    raise _fail(n, empty, out)


def empty_outputs(g: GraphBase) -> dict[str, TensorType]:
    """The outputs of `g` that have no elements."""
    return {k: g.type(v) for k, v in g.outputs.items() if is_empty(g.type(v).shape)}


__all__ = ["eliminate_empty", "empty_array", "empty_outputs", "has_empty", "is_empty",
           "reduction_identity"]
