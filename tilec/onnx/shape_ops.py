"""ONNX shape, indexing and conversion operators -> `tilec.graph.ops_index` (and `ops`).

Shape, Size, ConstantOfShape and Range (and any of these ops on known operands) are computed
when the model is loaded (`fold`); the converters here handle the operands only known when the
model runs: Gather -> Tile's `gather`, Slice / Expand / Pad -> `=` contractions, Cast -> Tile's
conversions, and so on.  Operands that decide shapes (axes, starts, pads, repeats) must be
known at load time (`STATIC_OPERANDS`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..graph import ops
from ..graph import ops_index as oi
from ..graph.builder import Value
from .converters import Converter, NodeContext

# ONNX TensorProto element type -> the graph's type (64-bit values run in 32 bits).
GRAPH_DTYPES = {1: "float32", 2: "int32", 3: "int32", 4: "int32", 5: "int32", 6: "int32",
                7: "int32", 9: "bool", 10: "float16", 11: "float32", 12: "int32", 13: "int32"}


def _ints(a: Any) -> list[int]:
    return [int(v) for v in np.asarray(a).reshape(-1)]


def _axes(c: NodeContext, since: int, index: int = 1) -> list[int] | None:
    """An `axes` attribute before opset `since`, the operand `index` from it on."""
    if c.opset >= since:
        given = c.static(index, "axes")
        return None if given is None else _ints(given)
    a = c.attr("axes")
    return None if a is None else [int(v) for v in a]


def _known(c: NodeContext, i: int, what: str) -> np.ndarray:
    v = c.static(i, what)
    if v is None:
        raise c.fail(f"the {what} is required")
    return np.asarray(v)


def _shape(c: NodeContext) -> list[Value]:  # folded at load; here only when not known
    x = c.need(0)
    end = c.attr("end")
    dims = np.asarray(x.shape, np.int64)[int(c.attr("start", 0)):None if end is None else end]
    return [c.g.constant(dims)]


def _size(c: NodeContext) -> list[Value]:
    return [c.g.constant(np.asarray(math.prod(c.need(0).shape), np.int64))]


def _gather(c: NodeContext) -> list[Value]:
    x, i = c.need(0), c.need(1)
    if i.dtype != "int32":
        raise c.fail(f"indices of type {i.dtype} are not supported (int32 or int64)")
    ax = c.attr("axis", 0)
    n = x.shape[ax % max(x.ndim, 1)] if x.ndim else 0
    return [oi.gather(x, oi.wrap_negative(i, n), ax)]


def _gather_elements(c: NodeContext) -> list[Value]:
    x, i = c.need(0), c.need(1)
    if i.dtype != "int32":
        raise c.fail(f"indices of type {i.dtype} are not supported (int32 or int64)")
    return [oi.gather_elements(x, i, c.attr("axis", 0))]


def _squeeze(c: NodeContext) -> list[Value]:
    x = c.need(0)
    axes = _axes(c, 13)
    if axes is None:
        drop = {k for k, n in enumerate(x.shape) if n == 1}
    else:
        drop = {a % x.ndim for a in axes}
        bad = [a for a in drop if x.shape[a] != 1]
        if bad:
            raise c.fail(f"axis {bad[0]} of {list(x.shape)} is not of size 1")
    return [ops.reshape(x, [n for k, n in enumerate(x.shape) if k not in drop])]


def _unsqueeze(c: NodeContext) -> list[Value]:
    x = c.need(0)
    axes = _axes(c, 13)
    if axes is None:
        raise c.fail("the axes are required")
    r = x.ndim + len(axes)
    put = {a % r for a in axes}
    if len(put) != len(axes):
        raise c.fail(f"axes {axes} repeat an axis")
    dims = iter(x.shape)
    return [ops.reshape(x, [1 if k in put else next(dims) for k in range(r)])]


def _cast_to(c: NodeContext, x: Value, to: int) -> Value:
    if to not in GRAPH_DTYPES:
        from onnx import TensorProto

        raise c.fail(f"casting to {TensorProto.DataType.Name(to)} is not supported")
    return oi.cast(x, GRAPH_DTYPES[to])


def _cast(c: NodeContext) -> list[Value]:
    return [_cast_to(c, c.need(0), int(c.attr("to")))]


def _cast_like(c: NodeContext) -> list[Value]:
    return [oi.cast(c.need(0), c.need(1).dtype)]


def _slice(c: NodeContext) -> list[Value]:
    x = c.need(0)
    if c.opset < 10:
        starts, ends = _ints(c.attr("starts")), _ints(c.attr("ends"))
        axes = c.attr("axes")
        steps = None
    else:
        starts, ends = _ints(_known(c, 1, "starts")), _ints(_known(c, 2, "ends"))
        axes = c.static(3, "axes")
        steps = c.static(4, "steps")
    axes = list(range(len(starts))) if axes is None else _ints(axes)
    steps = [1] * len(starts) if steps is None else _ints(steps)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise c.fail("starts, ends, axes and steps need the same length")
    return [oi.strided_slice(x, starts, ends, steps, axes)]


def _expand(c: NodeContext) -> list[Value]:
    return [oi.expand(c.need(0), _ints(_known(c, 1, "shape")))]


def _tile(c: NodeContext) -> list[Value]:
    return [oi.tile(c.need(0), _ints(_known(c, 1, "repeats")))]


def _constant_of_shape(c: NodeContext) -> list[Value]:
    from onnx import numpy_helper

    shape = _ints(_known(c, 0, "shape"))
    value = c.attrs.get("value")
    fill = np.zeros(1, np.float32) if value is None else numpy_helper.to_array(value)
    return [c.g.constant(np.full(shape, fill.reshape(-1)[0], fill.dtype))]


def _range(c: NodeContext) -> list[Value]:
    start, limit, delta = (_known(c, k, w) for k, w in enumerate(("start", "limit", "delta")))
    return [c.g.constant(np.arange(start.item(), limit.item(), delta.item(),
                                   dtype=start.dtype))]


def _split(c: NodeContext) -> list[Value]:
    x = c.need(0)
    ax = c.attr("axis", 0) % x.ndim
    n = x.shape[ax]
    outs = len(c.node.output)
    sizes = c.attr("split") if c.opset < 13 else c.static(1, "split")
    if sizes is not None and len(np.asarray(sizes).reshape(-1)):
        parts = _ints(sizes)
    elif c.attr("num_outputs") is not None:
        k = int(c.attr("num_outputs"))
        chunk = -(-n // k)
        parts = [min(chunk, n - j * chunk) for j in range(k)]
    else:
        if n % outs:
            raise c.fail(f"{n} does not split into {outs} equal parts")
        parts = [n // outs] * outs
    if sum(parts) != n or len(parts) != outs:
        raise c.fail(f"split sizes {parts} do not cover {n} in {outs} parts")
    res, at = [], 0
    for p in parts:
        res.append(oi.strided_slice(x, [at], [at + p], [1], [ax]))
        at += p
    return res


def _pad(c: NodeContext) -> list[Value]:
    x = c.need(0)
    mode = c.attr("mode", "constant")
    if mode not in ("constant", "reflect", "edge"):
        raise c.unsupported("mode", mode)
    if c.opset < 11:
        pads = _ints(c.attr("pads") if c.opset >= 2 else c.attr("paddings"))
        value: Any = c.attr("value", 0.0)
    else:
        pads = _ints(_known(c, 1, "pads"))
        v = c.static(2, "constant value")
        value = 0 if v is None or np.asarray(v).size == 0 else np.asarray(v).reshape(-1)[0]
        axes = c.static(3, "axes")
        if axes is not None:
            full = [0] * (2 * x.ndim)
            ax = [a % x.ndim for a in _ints(axes)]
            for k, a in enumerate(ax):
                full[a], full[x.ndim + a] = pads[k], pads[len(ax) + k]
            pads = full
    return [oi.pad(x, pads, mode, value.item() if isinstance(value, np.generic) else value)]


def _arg(kind: str) -> Converter:
    def convert(c: NodeContext) -> list[Value]:
        return [oi.arg_reduce(c.need(0), kind, c.attr("axis", 0),
                              bool(c.attr("keepdims", 1)),
                              bool(c.attr("select_last_index", 0)))]
    return convert


def _depth_to_space(c: NodeContext) -> list[Value]:
    return [oi.depth_to_space(c.need(0), c.attr("blocksize"), c.attr("mode", "DCR"))]


SHAPE_CONVERTERS: dict[str, Converter] = {
    "Shape": _shape, "Size": _size, "Gather": _gather, "GatherElements": _gather_elements,
    "Squeeze": _squeeze, "Unsqueeze": _unsqueeze, "Cast": _cast, "CastLike": _cast_like,
    "Slice": _slice, "Expand": _expand, "Tile": _tile, "ConstantOfShape": _constant_of_shape,
    "Range": _range, "Split": _split, "Pad": _pad, "ArgMax": _arg("max"),
    "ArgMin": _arg("min"), "DepthToSpace": _depth_to_space,
    "SpaceToDepth": lambda c: [oi.space_to_depth(c.need(0), c.attr("blocksize"),
                                                 c.attr("mode", "DCR"))],
}

SHAPE_STATIC_OPERANDS = {("Squeeze", 1), ("Unsqueeze", 1), ("Slice", 1), ("Slice", 2),
                         ("Slice", 3), ("Slice", 4), ("Expand", 1), ("Tile", 1),
                         ("ConstantOfShape", 0), ("Range", 0), ("Range", 1), ("Range", 2),
                         ("Split", 1), ("Pad", 1), ("Pad", 2), ("Pad", 3)}
