"""Graph ops with more than one result, built on `tilec.ops`:

- `batchnorm_training`: batch normalisation with the batch's own statistics (ONNX
  BatchNormalization, training_mode=1, opset 14+), and the updated running statistics.
- `max_pool_with_indices`: max pooling and, per output element, the flattened index of the
  input element that won (ONNX MaxPool's optional Indices output)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..errors import TileError
from . import ops
from .core import Value


def batchnorm_training(x: Value, scale: Value, bias: Value, mean: Value, var: Value, *,
                       epsilon: float = 1e-5, momentum: float = 0.9, axis: int = 1
                       ) -> tuple[Value, Value, Value]:
    """(Y, running_mean, running_var) as ONNX's BatchNormalization in training mode defines
    them (opset 15):

        current_mean = ReduceMean(X, every axis but the channel axis)
        current_var  = ReduceMean((X - current_mean)^2, same axes)     (biased: divides by N)
        Y = (X - current_mean) / sqrt(current_var + epsilon) * scale + B
        running_mean = input_mean * momentum + current_mean * (1 - momentum)
        running_var  = input_var * momentum + current_var * (1 - momentum)

    The variance is the population (biased) one for both Y and running_var, as in ONNX's
    reference implementation (numpy's `var`).  It is computed in two passes (the mean first),
    not as E[x^2] - E[x]^2, which loses precision in float32."""
    if x.ndim < 2:
        raise TileError(f"batchnorm (training): the input {list(x.shape)} needs a batch and a "
                        "channel dimension")
    ax = axis % x.ndim
    c = x.shape[ax]
    for name, p in (("scale", scale), ("bias", bias), ("mean", mean), ("var", var)):
        if p.shape != (c,):
            raise TileError(f"batchnorm: {name} has shape {list(p.shape)}, expected [{c}]")
    if x.dtype not in ("float16", "float32"):
        raise TileError(f"batchnorm needs a floating-point input, not {x.dtype}")
    axes = tuple(i for i in range(x.ndim) if i != ax)
    m = ops.reduce_mean(x, axes, keepdims=True)  # [1, C, 1, ...]
    d = x - m
    v = ops.reduce_mean(d * d, axes, keepdims=True)
    pshape = m.shape
    s = ops.reshape(scale, pshape) if pshape != (c,) else scale
    b = ops.reshape(bias, pshape) if pshape != (c,) else bias
    y = d * (s / ops.sqrt(v + float(epsilon))) + b
    keep = float(momentum)
    m_c = ops.reshape(m, (c,)) if pshape != (c,) else m
    v_c = ops.reshape(v, (c,)) if pshape != (c,) else v
    running_mean = mean * keep + m_c * (1.0 - keep)
    running_var = var * keep + v_c * (1.0 - keep)
    return y, running_mean, running_var


def max_pool_with_indices(x: Value, kernel: Sequence[int], *,
                          strides: Sequence[int] | None = None, padding: object = 0,
                          dilations: Sequence[int] | None = None, ceil_mode: bool = False,
                          storage_order: int = 0) -> tuple[Value, Value]:
    """NCHW max pooling and its Indices (ONNX MaxPool): for each output element, the index
    into the flattened input of the element that is the maximum, the first one in the window's
    row-major order when several are equal.  With `storage_order` 1 the spatial part of the
    index is column-major: for [N, C, H, W], (n * C + c) * H * W + h + w * H.

    The indices are int32 in the graph (tilec's integer type), so the input must have fewer
    than 2^31 elements; the ONNX importer returns them as int64, as ONNX declares them."""
    if storage_order not in (0, 1):
        raise TileError(f"max_pool: storage_order {storage_order}, expected 0 or 1")
    total = math.prod(x.shape)
    if total >= 2 ** 31 - 1:
        raise TileError(f"max_pool indices: the input {list(x.shape)} has {total} elements; "
                        "int32 indices need fewer than 2^31")
    g = x.graph
    y = ops.pool(x, "max", kernel, strides=strides, padding=padding, dilations=dilations,
                 ceil_mode=ceil_mode)
    node = g.nodes[-1]
    if node.output != y.name:
        raise TileError("internal: the max pool node is not the last one")
    attrs = {k: node.get(k) for k in ("kernel", "strides", "pads", "dilations")}
    idx = g.add_node("max_pool_indices", [x, y], y.shape, "int32", **attrs,
                     storage_order=int(storage_order))
    return y, idx


__all__ = ["batchnorm_training", "max_pool_with_indices"]
