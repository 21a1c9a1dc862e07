"""ONNX's normalisations and LogSoftmax -> `tilec.graph.ops_norm` calls: LayerNormalization
(opset 17; its Mean and InvStdDev outputs too), RMSNormalization (opset 23),
InstanceNormalization, GroupNormalization (opset 18: scale and bias per group; opset 21: per
channel) and LogSoftmax (before opset 13 the input is seen as 2-D, [dims before axis] x [axis
and after], axis 1 by default; from 13 on one axis, -1 by default, as `converters`' Softmax).
Each lowers to one row reduction chain (`tilec.plan.rows`); GroupNormalization adds the two
copies that see [N, C, ..] as [N, G, C/G, ..] and back."""

from __future__ import annotations

from ..graph import ops_norm
from ..graph.builder import Value
from .converters import Converter, NodeContext
from .elementwise import _since

# TensorProto element types: FLOAT, FLOAT16.
_STASH = {1: "float32", 10: "float16"}


def _floats(c: NodeContext, x: Value) -> None:
    if x.dtype not in ("float16", "float32"):
        raise c.fail(f"{c.node.op_type} of a {x.dtype} input is not supported (only "
                     "floating-point ones)")


def _stash(c: NodeContext, x: Value) -> None:
    """stash_type: the precision of the statistics.  tilec computes float16 in float (only
    the tensors that reach memory are rounded), so FLOAT (1, the default) and the input's own
    type both hold; any other type is refused."""
    st = c.attr("stash_type", 1)
    if _STASH.get(st) not in ("float32", x.dtype):
        raise c.unsupported("stash_type", st)


def _layer_norm(c: NodeContext) -> list[Value]:
    x = c.need(0)
    _floats(c, x)
    _stash(c, x)
    y, mean, inv = ops_norm.layer_norm_stats(x, c.need(1), c.input(2), c.attr("axis", -1),
                                             c.attr("epsilon", 1e-5))
    return [y, mean, inv][:len(c.node.output)]  # Mean and InvStdDev are optional


def _rms_norm(c: NodeContext) -> list[Value]:
    x = c.need(0)
    _floats(c, x)
    _stash(c, x)
    return [ops_norm.rms_norm(x, c.need(1), c.attr("axis", -1), c.attr("epsilon", 1e-5))]


def _instance_norm(c: NodeContext) -> list[Value]:
    x = c.need(0)
    _floats(c, x)
    return [ops_norm.instance_norm(x, c.need(1), c.need(2), c.attr("epsilon", 1e-5))]


def _group_norm(c: NodeContext) -> list[Value]:
    x = c.need(0)
    _floats(c, x)
    _stash(c, x)
    groups = c.attr("num_groups")
    if groups is None:
        raise c.fail("the attribute num_groups is required")
    if x.ndim < 2:
        raise c.fail(f"expected an input [N, C, ...], got {list(x.shape)}")
    s, b = c.need(1), c.need(2)
    # Opset 18 has one scale and bias per group, opset 21 one per channel.
    want = (groups,) if c.opset < 21 else (x.shape[1],)
    for name, p in (("scale", s), ("bias", b)):
        if p.shape != want:
            raise c.fail(f"{name} has shape {list(p.shape)}; opset {c.opset} expects "
                         f"{list(want)}")
    return [ops_norm.group_norm(x, s, b, groups, c.attr("epsilon", 1e-5))]


def _log_softmax(c: NodeContext) -> list[Value]:
    x = c.need(0)
    _floats(c, x)
    if c.opset < 13:
        axis = c.attr("axis", 1) % max(x.ndim, 1)
        return [ops_norm.log_softmax(x, axes=tuple(range(axis, x.ndim)))]
    return [ops_norm.log_softmax(x, c.attr("axis", -1))]


NORM_CONVERTERS: dict[str, Converter] = {
    "LayerNormalization": _since(17, _layer_norm),
    "RMSNormalization": _since(23, _rms_norm),
    "InstanceNormalization": _instance_norm,
    "GroupNormalization": _since(18, _group_norm),
    "LogSoftmax": _log_softmax,
}

__all__ = ["NORM_CONVERTERS"]
