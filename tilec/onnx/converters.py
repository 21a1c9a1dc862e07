"""ONNX operators -> `tilec.ops` calls.  One converter per op type; each reads the node's
attributes with ONNX's defaults for the model's opset and returns the node's output values."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import TileError
from ..graph import ops, ops_index
from ..graph.builder import Graph, Value
from ..graph.ops_extra import batchnorm_training, max_pool_with_indices


class NodeContext:
    """One ONNX node being converted: its operands, attributes and opset."""

    def __init__(self, graph: Graph, env: dict[str, Value], node: Any, opset: int):
        from onnx import helper

        self.g = graph
        self.env = env
        self.node = node
        self.opset = opset
        self.attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        # ONNX name -> value known at load time, in the model's type (`fold`)
        self.known: dict[str, np.ndarray] = {}

    @property
    def where(self) -> str:
        return f"ONNX node {self.node.name or self.node.output[0]!r} ({self.node.op_type})"

    def fail(self, message: str) -> TileError:
        return TileError(f"{self.where}: {message}")

    def attr(self, name: str, default: Any = None) -> Any:
        v = self.attrs.get(name, default)
        return v.decode() if isinstance(v, bytes) else v

    def input(self, i: int) -> Value | None:
        """Operand i, or None when it is absent (missing or named "")."""
        if i >= len(self.node.input) or not self.node.input[i]:
            return None
        name = self.node.input[i]
        if name not in self.env:
            raise self.fail(f"operand {name!r} is not defined")
        return self.env[name]

    def need(self, i: int) -> Value:
        v = self.input(i)
        if v is None:
            raise self.fail(f"operand {i} is required")
        return v

    def static(self, i: int, what: str) -> np.ndarray | None:
        """A constant operand's value (shapes, axes): it decides the program's shape."""
        v = self.input(i)
        if v is None:
            return None
        if self.node.input[i] in self.known:
            return self.known[self.node.input[i]]
        if not self.g.is_constant(v.name):
            raise self.fail(f"the {what} must be a constant (an initializer, a Constant node, "
                            "or an input whose value is given when the model is run)")
        return self.g.constants[v.name]

    def unsupported(self, attr: str, value: Any) -> TileError:
        return self.fail(f"attribute {attr}={value!r} is not supported")


Converter = Callable[[NodeContext], list[Value]]


def _unary(fn: Callable[[Value], Value]) -> Converter:
    return lambda c: [fn(c.need(0))]


def _binary(fn: Callable[[Value, Value], Value]) -> Converter:
    def convert(c: NodeContext) -> list[Value]:
        a, b = c.need(0), c.need(1)
        axis = c.attr("axis")
        if c.opset < 7 and c.attr("broadcast", 0) and axis is not None:
            # Legacy broadcasting: b's dimensions line up with a's starting at `axis`.
            ax = axis % a.ndim
            trail = a.ndim - ax - b.ndim
            if trail > 0:
                b = ops.reshape(b, b.shape + (1,) * trail)
        return [fn(a, b)]
    return convert


def _window(c: NodeContext, x: Value, kernel: tuple[int, ...]) -> dict[str, Any]:
    r = x.ndim - 2
    auto_pad = c.attr("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER", "VALID"):
        padding: Any = auto_pad.lower()
    elif auto_pad == "NOTSET":
        padding = tuple(c.attr("pads", [0] * (2 * r)))
    else:
        raise c.unsupported("auto_pad", auto_pad)
    strides = tuple(c.attr("strides", [1] * r))
    dilations = tuple(c.attr("dilations", [1] * r))
    if len(kernel) != r:
        raise c.fail(f"kernel_shape {list(kernel)} does not match a rank-{x.ndim} input")
    return {"strides": strides, "padding": padding, "dilations": dilations}


def _conv(c: NodeContext) -> list[Value]:
    x, w, b = c.need(0), c.need(1), c.input(2)
    kernel = tuple(c.attr("kernel_shape", w.shape[2:]))
    if kernel != w.shape[2:]:
        raise c.fail(f"kernel_shape {list(kernel)} differs from the weights {list(w.shape)}")
    return [ops.conv(x, w, b, groups=c.attr("group", 1), **_window(c, x, kernel))]


def _conv_transpose(c: NodeContext) -> list[Value]:
    x, w, b = c.need(0), c.need(1), c.input(2)
    r = x.ndim - 2
    kernel = tuple(c.attr("kernel_shape", w.shape[2:]))
    if kernel != w.shape[2:]:
        raise c.fail(f"kernel_shape {list(kernel)} differs from the weights {list(w.shape)}")
    strides = tuple(c.attr("strides", [1] * r))
    dilations = tuple(c.attr("dilations", [1] * r))
    out_pad = tuple(c.attr("output_padding", [0] * r))
    auto_pad = c.attr("auto_pad", "NOTSET")
    if auto_pad not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        raise c.unsupported("auto_pad", auto_pad)
    if not len(strides) == len(dilations) == len(out_pad) == r:
        raise c.fail(f"strides, dilations and output_padding need {r} values each")
    out_shape = c.attr("output_shape")
    if out_shape is not None:
        out_shape = list(out_shape)[-r:]  # may include the batch and channel dimensions
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out_shape = [n * s for n, s in zip(x.shape[2:], strides, strict=True)]
    if out_shape is not None:
        if len(out_shape) != r:
            raise c.fail(f"output_shape {list(c.attr('output_shape'))} does not match a "
                         f"rank-{x.ndim} input")
        # The total padding that gives output_shape; SAME_UPPER puts the odd one at the end.
        begin, end = [], []
        for i in range(r):
            total = (strides[i] * (x.shape[2 + i] - 1) + out_pad[i]
                     + (kernel[i] - 1) * dilations[i] + 1 - out_shape[i])
            small = total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else total - small)
            end.append(total - small if auto_pad == "SAME_UPPER" else small)
        pads = tuple(begin + end)
    elif auto_pad == "VALID":
        pads = (0,) * (2 * r)
    else:
        pads = tuple(c.attr("pads", [0] * (2 * r)))
    return [ops.conv_transpose(x, w, b, strides=strides, pads=pads, output_padding=out_pad,
                               dilations=dilations, groups=c.attr("group", 1))]


def _integer_factors(c: NodeContext, x: Value, scales: Any, sizes: Any,
                     axes: Any) -> list[int]:
    """Per-dimension integer upsampling factors from Resize/Upsample's scales or sizes."""
    axes = list(range(x.ndim)) if axes is None else [int(a) % x.ndim for a in axes]
    factors = [1] * x.ndim
    if scales is not None and np.asarray(scales).size:
        vals = [float(v) for v in np.asarray(scales).reshape(-1)]
        if len(vals) != len(axes):
            raise c.fail(f"scales {vals} do not match axes {axes}")
        for a, v in zip(axes, vals, strict=True):
            if v < 1 or v != int(v):
                raise c.fail(f"scales {vals}: only integer upsampling factors (>= 1) are "
                             "supported (an integer-factor nearest repeat)")
            factors[a] = int(v)
    elif sizes is not None:
        vals = [int(v) for v in np.asarray(sizes).reshape(-1)]
        if len(vals) != len(axes):
            raise c.fail(f"sizes {vals} do not match axes {axes}")
        for a, v in zip(axes, vals, strict=True):
            if v < x.shape[a] or v % x.shape[a]:
                raise c.fail(f"sizes {vals}: only integer multiples of the input shape "
                             f"{list(x.shape)} are supported (an integer-factor nearest "
                             "repeat)")
            factors[a] = v // x.shape[a]
    else:
        raise c.fail("either scales or sizes is required")
    return factors


def _resize(c: NodeContext) -> list[Value]:
    x = c.need(0)
    mode = c.attr("mode", "nearest")
    if mode != "nearest":
        raise c.unsupported("mode", mode)
    if c.opset < 11:  # Resize-10: X, scales; nearest is floor(x / scale)
        return [ops.upsample_nearest(x, _integer_factors(c, x, c.static(1, "scales"), None,
                                                         None))]
    ctm = c.attr("coordinate_transformation_mode", "half_pixel")
    nearest = c.attr("nearest_mode", "round_prefer_floor")
    # With an integer factor f, output x = f*q + j (j < f) maps to q exactly when:
    #   asymmetric: floor(x / f); half_pixel: round((x + 0.5) / f - 0.5), which lies strictly
    #   within half a step of q, so either rounding preference gives q.
    ok = ((ctm == "asymmetric" and nearest == "floor")
          or (ctm == "half_pixel" and nearest in ("round_prefer_floor", "round_prefer_ceil")))
    if not ok:
        if ctm in ("asymmetric", "half_pixel"):
            bad = f"nearest_mode={nearest!r} is not supported with " \
                f"coordinate_transformation_mode={ctm!r}"
        else:
            bad = f"coordinate_transformation_mode={ctm!r} is not supported"
        raise c.fail(f"attribute {bad} (nearest resizing by an integer factor needs "
                     "asymmetric with nearest_mode 'floor', or half_pixel with a "
                     "round_prefer_* mode)")
    if c.attr("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise c.unsupported("keep_aspect_ratio_policy", c.attr("keep_aspect_ratio_policy"))
    if c.attr("antialias", 0):
        raise c.unsupported("antialias", c.attr("antialias"))
    scales = c.static(2, "scales")
    sizes = c.static(3, "sizes")
    return [ops.upsample_nearest(x, _integer_factors(c, x, scales, sizes, c.attr("axes")))]


def _upsample(c: NodeContext) -> list[Value]:
    x = c.need(0)
    mode = c.attr("mode", "nearest")
    if mode != "nearest":
        raise c.unsupported("mode", mode)
    scales = c.attr("scales") if c.opset < 9 else c.static(1, "scales")
    return [ops.upsample_nearest(x, _integer_factors(c, x, scales, None, None))]


def _pool(kind: str) -> Converter:
    def convert(c: NodeContext) -> list[Value]:
        x = c.need(0)
        kernel = tuple(c.attr("kernel_shape"))
        w = _window(c, x, kernel)
        indices = len(c.node.output) > 1 and bool(c.node.output[1])
        if indices:  # only MaxPool has a second output
            order = c.attr("storage_order", 0)
            if order not in (0, 1):
                raise c.unsupported("storage_order", order)
            # int32 in the graph; returned as the int64 ONNX declares (outputs are cast back).
            return list(max_pool_with_indices(
                x, kernel, strides=w["strides"], padding=w["padding"],
                dilations=w["dilations"], ceil_mode=bool(c.attr("ceil_mode", 0)),
                storage_order=order))
        # storage_order only changes the Indices output.
        return [ops.pool(x, kind, kernel, strides=w["strides"], padding=w["padding"],
                         dilations=w["dilations"], ceil_mode=bool(c.attr("ceil_mode", 0)),
                         count_include_pad=bool(c.attr("count_include_pad", 0)))]
    return convert


def _gemm(c: NodeContext) -> list[Value]:
    return [ops.gemm(c.need(0), c.need(1), c.input(2), alpha=c.attr("alpha", 1.0),
                     beta=c.attr("beta", 1.0), trans_a=bool(c.attr("transA", 0)),
                     trans_b=bool(c.attr("transB", 0)))]


def _batchnorm(c: NodeContext) -> list[Value]:
    training = c.attr("training_mode", 0)
    extra = len([o for o in c.node.output[1:] if o]) > 0
    if training and c.opset < 14:
        raise c.fail("training_mode exists from opset 14 on")
    if extra and not training:
        if c.opset < 14:
            raise c.fail("the training outputs of BatchNormalization before opset 14 (running "
                         "and saved statistics) are not supported; opset 14's training_mode "
                         "is")
        raise c.fail("the running statistics outputs need training_mode=1")
    if c.opset < 9 and not c.attr("spatial", 1):
        raise c.unsupported("spatial", 0)
    x = c.need(0)
    eps = c.attr("epsilon", 1e-5)
    if training:
        return list(batchnorm_training(x, c.need(1), c.need(2), c.need(3), c.need(4),
                                       epsilon=eps, momentum=c.attr("momentum", 0.9)))
    return [ops.batchnorm(x, c.need(1), c.need(2), c.need(3), c.need(4),
                          epsilon=eps, axis=1 if x.ndim > 1 else 0)]


def _clip(c: NodeContext) -> list[Value]:
    x = c.need(0)
    if c.opset < 11:
        lo, hi = c.attr("min"), c.attr("max")
        lo = None if lo is None or lo <= -3.4e38 else lo
        hi = None if hi is None or hi >= 3.4e38 else hi
        return [ops.clip(x, lo, hi)]
    return [ops.clip(x, c.input(1), c.input(2))]


def _softmax(c: NodeContext) -> list[Value]:
    x = c.need(0)
    if c.opset < 13:  # the input is seen as 2-D: [dims before axis] x [axis and after]
        axis = c.attr("axis", 1) % max(x.ndim, 1)
        return [ops.softmax(x, axes=tuple(range(axis, x.ndim)))]
    return [ops.softmax(x, c.attr("axis", -1))]


def _reshape(c: NodeContext) -> list[Value]:
    x = c.need(0)
    shape = c.static(1, "target shape") if c.opset >= 5 else np.asarray(c.attr("shape"))
    if shape is None:
        raise c.fail("the target shape is missing")
    dims = [int(s) for s in np.asarray(shape).reshape(-1)]
    if not c.attr("allowzero", 0):  # 0 keeps the input's size in that position
        dims = [x.shape[i] if s == 0 and i < x.ndim else s for i, s in enumerate(dims)]
    # With allowzero a 0 is a size: the result is empty (`tilec.empty`).
    return [ops.reshape(x, dims)]


def _flatten(c: NodeContext) -> list[Value]:
    x = c.need(0)
    axis = c.attr("axis", 1)
    axis = axis + x.ndim if axis < 0 else axis
    return [ops.reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))]


def _reduce(kind: str, axes_input_since: int) -> Converter:
    fn = {"sum": ops.reduce_sum, "mean": ops.reduce_mean, "max": ops.reduce_max,
          "min": ops_index.reduce_min, "prod": ops_index.reduce_prod,
          "l2": ops_index.reduce_l2}[kind]

    def convert(c: NodeContext) -> list[Value]:
        x = c.need(0)
        if c.opset >= axes_input_since:
            given = c.static(1, "axes")
            axes = None if given is None else [int(a) for a in np.asarray(given).reshape(-1)]
        else:
            axes = c.attr("axes")
        keep = bool(c.attr("keepdims", 1))
        if not axes:
            if c.attr("noop_with_empty_axes", 0):
                return [ops.identity(x)]
            axes = list(range(x.ndim))
        return [fn(x, axes, keep)]
    return convert


def _constant(c: NodeContext) -> list[Value]:
    from onnx import numpy_helper

    a = c.attrs
    if "value" in a:
        arr = numpy_helper.to_array(a["value"])
    elif "value_float" in a:
        arr = np.asarray(a["value_float"], np.float32)
    elif "value_floats" in a:
        arr = np.asarray(a["value_floats"], np.float32)
    elif "value_int" in a:
        arr = np.asarray(a["value_int"], np.int64)
    elif "value_ints" in a:
        arr = np.asarray(a["value_ints"], np.int64)
    else:
        raise c.unsupported(next(iter(a), "value"), "(not a numeric tensor)")
    if arr.dtype.kind not in "biuf":
        raise c.fail(f"constants of type {arr.dtype} are not supported")
    return [c.g.constant(arr, c.node.output[0])]


CONVERTERS: dict[str, Converter] = {
    "Conv": _conv,
    "ConvTranspose": _conv_transpose,
    "Resize": _resize,
    "Upsample": _upsample,
    "Gemm": _gemm,
    "MatMul": lambda c: [ops.matmul(c.need(0), c.need(1))],
    "BatchNormalization": _batchnorm,
    "Relu": _unary(ops.relu),
    "Sigmoid": _unary(ops.sigmoid),
    "Tanh": _unary(ops.tanh),
    "LeakyRelu": lambda c: [ops.leaky_relu(c.need(0), c.attr("alpha", 0.01))],
    "Clip": _clip,
    "Add": _binary(ops.add),
    "Sub": _binary(ops.sub),
    "Mul": _binary(ops.mul),
    "Div": _binary(ops.div),
    "MaxPool": _pool("max"),
    "AveragePool": _pool("avg"),
    "GlobalAveragePool": lambda c: [ops.global_avg_pool(c.need(0))],
    "Softmax": _softmax,
    "Reshape": _reshape,
    "Flatten": _flatten,
    "Transpose": lambda c: [ops.transpose(c.need(0), c.attr("perm"))],
    "Concat": lambda c: [ops.concat([c.need(i) for i in range(len(c.node.input))],
                                    c.attr("axis", 0))],
    "ReduceSum": _reduce("sum", 13),
    "ReduceMean": _reduce("mean", 18),
    "ReduceMax": _reduce("max", 18),
    "ReduceMin": _reduce("min", 18),
    "ReduceProd": _reduce("prod", 18),
    "ReduceL2": _reduce("l2", 18),
    "Identity": lambda c: [c.need(0)],
    "Constant": _constant,
}

# Operands that fix the program's shape: they must be known when the graph is built.
STATIC_OPERANDS = {("Reshape", 1), ("ReduceSum", 1), ("ReduceMean", 1), ("ReduceMax", 1),
                   ("ReduceMin", 1), ("ReduceProd", 1), ("ReduceL2", 1),
                   ("Resize", 1), ("Resize", 2), ("Resize", 3), ("Upsample", 1)}
