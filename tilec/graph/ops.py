"""The op library of the graph frontend.  Each function checks its operands, infers the result's
shape and adds one node; `tilec.lower` writes every node as Tile, so every op goes through the
same compiler.  Layouts: "NCHW" (weights O, I/groups, kernel...) or "NHWC" (weights kernel...,
I/groups, O); any number of spatial dimensions.

Long (over 500 lines) because it is the op library: one short function per op, each with its
own checks; splitting by op family would scatter the shared broadcasting and layout helpers."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..errors import TileError
from .core import GraphBase, Value, register_operators

# Unary calls Tile computes in floating point (`ops_math` adds the rest of its functions).
FLOAT_OPS = frozenset({"sigmoid", "tanh", "sqrt", "exp", "log", "erf", "sin", "cos", "pow"})
# Comparisons and logic (`ops_math`): their results are bool.
BOOL_OPS = frozenset({"eq", "ne", "lt", "gt", "le", "ge", "not", "and", "or"})
ELEMENTWISE = frozenset({"add", "sub", "mul", "div", "neg", "relu", "relu6", "leaky_relu",
                         "sigmoid", "tanh", "clip", "sqrt", "exp", "fused", "log", "erf",
                         "sin", "cos", "abs", "pow", "min", "max", "where", "floor",
                         "ceil"}) | BOOL_OPS
ACTIVATIONS = frozenset({"relu", "relu6", "leaky_relu", "sigmoid", "tanh", "clip"})


def _graph(*xs: object) -> GraphBase:
    for x in xs:
        if isinstance(x, Value):
            return x.graph
    raise TileError("an op needs at least one graph value among its operands")


def _value(g: GraphBase, x: object, like: str) -> Value:
    if isinstance(x, Value):
        return x
    if isinstance(x, bool | int | float | np.number | np.ndarray):
        return g.constant(np.asarray(x), dtype=like)
    raise TileError(f"expected a graph value or a number, got {type(x).__name__}")


def _axis(axis: int, rank: int, what: str) -> int:
    if not -rank <= axis < max(rank, 1):
        raise TileError(f"{what}: axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def _ints(v: int | Sequence[int] | None, n: int, what: str, default: int = 1) -> tuple[int, ...]:
    if v is None:
        return (default,) * n
    if isinstance(v, int | np.integer):
        return (int(v),) * n
    out = tuple(int(x) for x in v)
    if len(out) != n:
        raise TileError(f"{what}: expected {n} values, got {list(out)}")
    return out


# elementwise --------------------------------------------------------------------------------------

def _elementwise(op: str, xs: Sequence[object], **attrs: object) -> Value:
    g = _graph(*xs)
    like = next(x.dtype for x in xs if isinstance(x, Value))
    vals = [_value(g, x, like) for x in xs]
    try:
        shape = tuple(int(d) for d in np.broadcast_shapes(*(v.shape for v in vals)))
    except ValueError:
        shapes = " and ".join(str(list(v.shape)) for v in vals)
        raise TileError(f"{op}: operand shapes {shapes} do not broadcast") from None
    dtypes = {v.dtype for v in vals}
    dtype = max(dtypes, key=("bool", "int32", "float16", "float32").index)
    if op in FLOAT_OPS and dtype not in ("float16", "float32"):
        raise TileError(f"{op} needs a floating-point operand, not {dtype}")
    return g.add_node(op, vals, shape, "bool" if op in BOOL_OPS else dtype, **attrs)


def add(a: object, b: object) -> Value:
    return _elementwise("add", [a, b])


def sub(a: object, b: object) -> Value:
    return _elementwise("sub", [a, b])


def mul(a: object, b: object) -> Value:
    return _elementwise("mul", [a, b])


def div(a: object, b: object) -> Value:
    return _elementwise("div", [a, b])


def neg(x: Value) -> Value:
    return _elementwise("neg", [x])


def relu(x: Value) -> Value:
    return _elementwise("relu", [x])


def relu6(x: Value) -> Value:
    return _elementwise("relu6", [x])


def leaky_relu(x: Value, alpha: float = 0.01) -> Value:
    return _elementwise("leaky_relu", [x], alpha=float(alpha))


def sigmoid(x: Value) -> Value:
    return _elementwise("sigmoid", [x])


def tanh(x: Value) -> Value:
    return _elementwise("tanh", [x])


def sqrt(x: Value) -> Value:
    return _elementwise("sqrt", [x])


def exp(x: Value) -> Value:
    return _elementwise("exp", [x])


def clip(x: Value, min: object = None, max: object = None) -> Value:
    """Bounds are numbers (written into the kernel) or graph values (read at run time); a
    scalar constant counts as a number."""
    operands: list[object] = [x]
    attrs: dict[str, object] = {}
    for key, b in (("min", min), ("max", max)):
        if isinstance(b, Value) and b.graph.is_constant(b.name) and b.shape == ():
            b = b.graph.constants[b.name].item()
        if isinstance(b, Value):
            operands.append(b)
            attrs[key] = "input"
        elif b is not None:
            attrs[key] = float(b) if x.dtype in ("float16", "float32") else int(b)
    return _elementwise("clip", operands, **attrs)


def identity(x: Value) -> Value:
    return x.graph.add_node("copy", [x], x.shape, x.dtype)


# contractions -------------------------------------------------------------------------------------

def resolve_pads(padding: object, spatial: Sequence[int], kernel: Sequence[int],
                 strides: Sequence[int], dilations: Sequence[int]) -> tuple[int, ...]:
    """Pads as (begin..., end...) from an int, per-dimension ints, begin+end lists, or "same"
    (= "same_upper", extra padding at the end), "same_lower" and "valid"."""
    r = len(spatial)
    if isinstance(padding, str):
        mode = padding.lower()
        if mode == "valid":
            return (0,) * (2 * r)
        if mode not in ("same", "same_upper", "same_lower"):
            raise TileError(f"padding {padding!r}: expected a number, a list, 'same', "
                            "'same_upper', 'same_lower' or 'valid'")
        begin, end = [], []
        for n, k, s, d in zip(spatial, kernel, strides, dilations, strict=True):
            out = -(-n // s)
            total = max(0, (out - 1) * s + (k - 1) * d + 1 - n)
            small = total // 2
            begin.append(total - small if mode == "same_lower" else small)
            end.append(small if mode == "same_lower" else total - small)
        return tuple(begin + end)
    if isinstance(padding, int | np.integer):
        return (int(padding),) * (2 * r)
    pads = tuple(int(p) for p in padding)  # type: ignore[union-attr]
    if len(pads) == r:
        return pads + pads
    if len(pads) != 2 * r:
        raise TileError(f"padding {list(pads)}: expected {r} or {2 * r} values")
    if any(p < 0 for p in pads):
        raise TileError(f"padding {list(pads)}: negative pads are not supported")
    return pads


def window_output(n: int, k: int, s: int, d: int, begin: int, end: int,
                  ceil_mode: bool = False) -> int:
    """Output size of a sliding window; with `ceil_mode` a last partial window is kept when it
    starts inside the input or the begin padding (ONNX and PyTorch)."""
    span = n + begin + end - (k - 1) * d - 1
    if span < 0:
        raise TileError(f"the window ({k} with dilation {d}) is larger than the padded input "
                        f"({n} + {begin} + {end})")
    out = span // s + 1
    if ceil_mode:
        out = -(-span // s) + 1
        if (out - 1) * s >= n + begin:
            out -= 1
    return out


def _layout(layout: str) -> bool:
    if layout not in ("NCHW", "NHWC"):
        raise TileError(f"layout {layout!r}: expected 'NCHW' or 'NHWC'")
    return layout == "NHWC"


def conv(x: Value, w: Value, bias: Value | None = None, *,
         strides: int | Sequence[int] | None = None, padding: object = 0,
         dilations: int | Sequence[int] | None = None, groups: int = 1,
         layout: str = "NCHW") -> Value:
    """Convolution over any number of spatial dimensions (cross-correlation, as in ONNX)."""
    nhwc = _layout(layout)
    r = x.ndim - 2
    if r < 1 or w.ndim != x.ndim:
        raise TileError(f"conv: input {list(x.shape)} and weights {list(w.shape)} need the "
                        "same rank, at least 3")
    spatial = x.shape[1:-1] if nhwc else x.shape[2:]
    kernel = w.shape[:-2] if nhwc else w.shape[2:]
    ci, cig, co = (x.shape[-1], w.shape[-2], w.shape[-1]) if nhwc else \
        (x.shape[1], w.shape[1], w.shape[0])
    if groups < 1 or ci % groups or co % groups or cig * groups != ci:
        raise TileError(f"conv: {ci} input channels, weights {list(w.shape)} and groups="
                        f"{groups} do not agree (weights need {ci // max(groups, 1)} input "
                        "channels per group, and the output channels must divide by groups)")
    s = _ints(strides, r, "conv strides")
    d = _ints(dilations, r, "conv dilations")
    pads = resolve_pads(padding, spatial, kernel, s, d)
    out_sp = [window_output(n, k, st, dl, pads[i], pads[r + i])
              for i, (n, k, st, dl) in enumerate(zip(spatial, kernel, s, d, strict=True))]
    shape = (x.shape[0], *out_sp, co) if nhwc else (x.shape[0], co, *out_sp)
    inputs = [x, w]
    if bias is not None:
        if bias.shape != (co,):
            raise TileError(f"conv: the bias has shape {list(bias.shape)}, expected [{co}]")
        inputs.append(bias)
    return x.graph.add_node("conv", inputs, shape, x.dtype, strides=s, dilations=d,
                            pads=pads, groups=int(groups), layout=layout, activation=None)


def conv_transpose(x: Value, w: Value, bias: Value | None = None, *,
                   strides: int | Sequence[int] | None = None,
                   pads: int | Sequence[int] = 0,
                   output_padding: int | Sequence[int] | None = None,
                   dilations: int | Sequence[int] | None = None, groups: int = 1) -> Value:
    """Transposed convolution (ONNX ConvTranspose), NCHW with weights [CI, CO/groups, kernel..]:
    out[x] = sum over k, ci of in[(x + pad_begin - dilation * k) / stride] * w[ci, co, k] where
    that index is an integer.  Output size per spatial dimension: (X - 1) * stride +
    dilation * (K - 1) + 1 - pad_begin - pad_end + output_padding.  Pads may be negative (an
    output larger than the natural one gets zeros at the edges)."""
    r = x.ndim - 2
    if r < 1 or w.ndim != x.ndim:
        raise TileError(f"conv_transpose: input {list(x.shape)} and weights {list(w.shape)} "
                        "need the same rank, at least 3")
    ci, cog = x.shape[1], w.shape[1]
    if groups < 1 or w.shape[0] != ci or ci % groups:
        raise TileError(f"conv_transpose: {ci} input channels, weights {list(w.shape)} and "
                        f"groups={groups} do not agree (weights need {ci} input channels, "
                        "which must divide by groups)")
    co = cog * groups
    s = _ints(strides, r, "conv_transpose strides")
    d = _ints(dilations, r, "conv_transpose dilations")
    op = _ints(output_padding if output_padding is not None else 0, r,
               "conv_transpose output_padding")
    p = (int(pads),) * (2 * r) if isinstance(pads, int | np.integer) else \
        tuple(int(v) for v in pads)  # type: ignore[union-attr]
    if len(p) == r:
        p = p + p
    if len(p) != 2 * r:
        raise TileError(f"conv_transpose pads {list(p)}: expected {r} or {2 * r} values")
    if any(o < 0 or (o >= st and o >= dl) for o, st, dl in zip(op, s, d, strict=True)):
        raise TileError(f"conv_transpose: output_padding {list(op)} must be non-negative and "
                        f"smaller than the stride {list(s)} or the dilation {list(d)}")
    out_sp = [(n - 1) * s[i] + d[i] * (k - 1) + 1 - p[i] - p[r + i] + op[i]
              for i, (n, k) in enumerate(zip(x.shape[2:], w.shape[2:], strict=True))]
    if any(o <= 0 for o in out_sp):
        raise TileError(f"conv_transpose: the output size {out_sp} is not positive")
    inputs = [x, w]
    if bias is not None:
        if bias.shape != (co,):
            raise TileError(f"conv_transpose: the bias has shape {list(bias.shape)}, "
                            f"expected [{co}]")
        inputs.append(bias)
    return x.graph.add_node("conv_transpose", inputs, (x.shape[0], co, *out_sp), x.dtype,
                            strides=s, dilations=d, pads=p, groups=int(groups),
                            activation=None)


def upsample_nearest(x: Value, factors: Sequence[int]) -> Value:
    """Nearest-neighbour upsampling by an integer factor per dimension (each element
    repeated): out[.., f * i + j, ..] = x[.., i, ..] for j < f."""
    f = tuple(int(v) for v in factors)
    if len(f) != x.ndim or any(v < 1 for v in f):
        raise TileError(f"upsample_nearest: factors {list(f)} must be {x.ndim} positive "
                        "integers")
    if all(v == 1 for v in f):
        return identity(x)
    return x.graph.add_node("upsample", [x], [n * v for n, v in zip(x.shape, f, strict=True)],
                            x.dtype, factors=f)


def conv2d(x: Value, w: Value, bias: Value | None = None, *,
           stride: int | Sequence[int] = 1, padding: object = 0,
           dilation: int | Sequence[int] = 1, groups: int = 1, layout: str = "NCHW") -> Value:
    """2-D convolution.  Depthwise: groups = input channels."""
    if x.ndim != 4:
        raise TileError(f"conv2d: expected a 4-D input, got {list(x.shape)}")
    return conv(x, w, bias, strides=stride, padding=padding, dilations=dilation,
                groups=groups, layout=layout)


def matmul(a: Value, b: Value) -> Value:
    """numpy's matmul: batch dimensions broadcast; a 1-D operand is a vector."""
    if a.ndim == 0 or b.ndim == 0:
        raise TileError("matmul: operands must have at least one dimension")
    ka = a.shape[-1]
    kb = b.shape[-2] if b.ndim > 1 else b.shape[0]
    if ka != kb:
        raise TileError(f"matmul: shapes {list(a.shape)} and {list(b.shape)} do not agree "
                        f"({ka} != {kb})")
    try:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise TileError(f"matmul: batch dimensions of {list(a.shape)} and {list(b.shape)} "
                        "do not broadcast") from None
    shape = tuple(batch) + ((a.shape[-2],) if a.ndim > 1 else ()) + \
        ((b.shape[-1],) if b.ndim > 1 else ())
    return a.graph.add_node("matmul", [a, b], shape, a.dtype, activation=None)


def gemm(a: Value, b: Value, c: Value | None = None, *, alpha: float = 1.0, beta: float = 1.0,
         trans_a: bool = False, trans_b: bool = False) -> Value:
    """alpha * op(a) @ op(b) + beta * c, with c broadcast to the result (ONNX Gemm)."""
    if a.ndim != 2 or b.ndim != 2:
        raise TileError(f"gemm: expected 2-D operands, got {list(a.shape)} and {list(b.shape)}")
    m, k = a.shape[::-1] if trans_a else a.shape
    k2, n = b.shape[::-1] if trans_b else b.shape
    if k != k2:
        raise TileError(f"gemm: inner sizes differ ({k} and {k2})")
    inputs = [a, b]
    if c is not None and beta != 0:
        try:
            if tuple(np.broadcast_shapes(c.shape, (m, n))) != (m, n):
                raise ValueError
        except ValueError:
            raise TileError(f"gemm: c of shape {list(c.shape)} does not broadcast to "
                            f"[{m}, {n}]") from None
        inputs.append(c)
    return a.graph.add_node("gemm", inputs, (m, n), a.dtype, alpha=float(alpha),
                            beta=float(beta), trans_a=bool(trans_a), trans_b=bool(trans_b),
                            activation=None)


def batchnorm(x: Value, scale: Value, bias: Value, mean: Value, var: Value, *,
              epsilon: float = 1e-5, axis: int = 1) -> Value:
    """Inference batch normalisation over the channel `axis` (1 for NCHW, -1 for NHWC)."""
    ax = _axis(axis, x.ndim, "batchnorm")
    c = x.shape[ax]
    for name, p in (("scale", scale), ("bias", bias), ("mean", mean), ("var", var)):
        if p.shape != (c,):
            raise TileError(f"batchnorm: {name} has shape {list(p.shape)}, expected [{c}]")
    return x.graph.add_node("batchnorm", [x, scale, bias, mean, var], x.shape, x.dtype,
                            epsilon=float(epsilon), axis=ax)


# pooling and reductions ---------------------------------------------------------------------------

def pool(x: Value, kind: str, kernel: Sequence[int], *, strides: Sequence[int] | None = None,
         padding: object = 0, dilations: Sequence[int] | None = None, ceil_mode: bool = False,
         count_include_pad: bool = False, layout: str = "NCHW") -> Value:
    """"max" or "avg" pooling over every spatial dimension.  Padding never wins a max; an
    average divides by the elements inside the input (or inside input and padding with
    `count_include_pad`)."""
    if kind not in ("max", "avg"):
        raise TileError(f"pool: kind {kind!r}, expected 'max' or 'avg'")
    nhwc = _layout(layout)
    r = x.ndim - 2
    if r < 1:
        raise TileError(f"pool: expected at least 3 dimensions, got {list(x.shape)}")
    spatial = x.shape[1:-1] if nhwc else x.shape[2:]
    k = _ints(kernel, r, "pool kernel")
    s = _ints(strides, r, "pool strides") if strides is not None else k
    d = _ints(dilations, r, "pool dilations")
    pads = resolve_pads(padding, spatial, k, s, d)
    out_sp = [window_output(n, kk, st, dl, pads[i], pads[r + i], ceil_mode)
              for i, (n, kk, st, dl) in enumerate(zip(spatial, k, s, d, strict=True))]
    shape = (x.shape[0], *out_sp, x.shape[-1]) if nhwc else (*x.shape[:2], *out_sp)
    return x.graph.add_node(f"{kind}_pool", [x], shape, x.dtype, kernel=k, strides=s, pads=pads,
                            dilations=d, layout=layout,
                            count_include_pad=bool(count_include_pad) if kind == "avg" else None)


def max_pool2d(x: Value, kernel: int | Sequence[int], stride: int | Sequence[int] | None = None,
               padding: object = 0, dilation: int | Sequence[int] = 1, ceil_mode: bool = False,
               layout: str = "NCHW") -> Value:
    return pool(x, "max", _ints(kernel, 2, "kernel"),
                strides=None if stride is None else _ints(stride, 2, "stride"),
                padding=padding, dilations=_ints(dilation, 2, "dilation"),
                ceil_mode=ceil_mode, layout=layout)


def avg_pool2d(x: Value, kernel: int | Sequence[int], stride: int | Sequence[int] | None = None,
               padding: object = 0, ceil_mode: bool = False, count_include_pad: bool = False,
               layout: str = "NCHW") -> Value:
    return pool(x, "avg", _ints(kernel, 2, "kernel"),
                strides=None if stride is None else _ints(stride, 2, "stride"),
                padding=padding, ceil_mode=ceil_mode, count_include_pad=count_include_pad,
                layout=layout)


def _spatial_axes(x: Value, layout: str) -> tuple[int, ...]:
    return tuple(range(1, x.ndim - 1)) if _layout(layout) else tuple(range(2, x.ndim))


def global_avg_pool(x: Value, layout: str = "NCHW") -> Value:
    return reduce_mean(x, _spatial_axes(x, layout), keepdims=True)


def global_max_pool(x: Value, layout: str = "NCHW") -> Value:
    return reduce_max(x, _spatial_axes(x, layout), keepdims=True)


def _reduce(kind: str, x: Value, axes: int | Sequence[int] | None, keepdims: bool) -> Value:
    if axes is None:
        ax = tuple(range(x.ndim))
    else:
        ax = tuple(sorted({_axis(a, x.ndim, f"reduce_{kind}")
                           for a in ((axes,) if isinstance(axes, int) else axes)}))
    if not ax:
        return identity(x)
    shape = tuple(1 if i in ax else s for i, s in enumerate(x.shape) if keepdims or i not in ax)
    return x.graph.add_node("reduce", [x], shape, x.dtype, kind=kind, axes=ax,
                            keepdims=bool(keepdims))


def reduce_sum(x: Value, axes: int | Sequence[int] | None = None, keepdims: bool = False
               ) -> Value:
    return _reduce("sum", x, axes, keepdims)


def reduce_mean(x: Value, axes: int | Sequence[int] | None = None, keepdims: bool = False
                ) -> Value:
    return _reduce("mean", x, axes, keepdims)


def reduce_max(x: Value, axes: int | Sequence[int] | None = None, keepdims: bool = False
               ) -> Value:
    return _reduce("max", x, axes, keepdims)


def softmax(x: Value, axis: int = -1, *, axes: Sequence[int] | None = None) -> Value:
    """Softmax over `axis` (or over several `axes` together, as ONNX before opset 13)."""
    ax = tuple(sorted({_axis(a, x.ndim, "softmax") for a in (axes if axes is not None
                                                             else (axis,))}))
    if x.dtype not in ("float16", "float32"):
        raise TileError(f"softmax needs a floating-point operand, not {x.dtype}")
    return x.graph.add_node("softmax", [x], x.shape, x.dtype, axes=ax)


# layout -------------------------------------------------------------------------------------------

def reshape(x: Value, shape: Sequence[int]) -> Value:
    """Row-major reshape; one size may be -1 (sizes may be 0 when x has no elements)."""
    dims = [int(s) for s in shape]
    total = math.prod(x.shape)
    if dims.count(-1) > 1 or any(s < -1 for s in dims):
        raise TileError(f"reshape to {dims}: sizes must not be negative, with at most one -1")
    if -1 in dims:
        rest = math.prod(s for s in dims if s != -1)
        if rest == 0:
            raise TileError(f"reshape {list(x.shape)} to {dims}: -1 is ambiguous next to a "
                            "zero size")
        if total % rest:
            raise TileError(f"reshape {list(x.shape)} to {dims}: {total} elements do not "
                            f"divide into {rest}")
        dims[dims.index(-1)] = total // rest
    if math.prod(dims) != total:
        raise TileError(f"reshape {list(x.shape)} to {dims}: {total} elements, not "
                        f"{math.prod(dims)}")
    if tuple(dims) == x.shape:
        return identity(x)
    return x.graph.add_node("reshape", [x], dims, x.dtype)


def flatten(x: Value, axis: int = 1) -> Value:
    ax = axis + x.ndim if axis < 0 else axis
    if not 0 <= ax <= x.ndim:
        raise TileError(f"flatten: axis {axis} is out of range for rank {x.ndim}")
    return reshape(x, (math.prod(x.shape[:ax]), math.prod(x.shape[ax:])))


def transpose(x: Value, perm: Sequence[int] | None = None) -> Value:
    p = tuple(range(x.ndim))[::-1] if perm is None else tuple(int(i) for i in perm)
    if sorted(p) != list(range(x.ndim)):
        raise TileError(f"transpose: {list(p)} is not a permutation of {x.ndim} axes")
    if p == tuple(range(x.ndim)):
        return identity(x)
    return x.graph.add_node("transpose", [x], tuple(x.shape[i] for i in p), x.dtype, perm=p)


def concat(values: Sequence[Value], axis: int = 0) -> Value:
    if not values:
        raise TileError("concat: no operands")
    first = values[0]
    ax = _axis(axis, first.ndim, "concat")
    for v in values[1:]:
        if v.ndim != first.ndim or any(a != b for i, (a, b) in
                                       enumerate(zip(v.shape, first.shape, strict=True))
                                       if i != ax):
            raise TileError(f"concat: shapes {list(first.shape)} and {list(v.shape)} differ "
                            f"outside axis {ax}")
    if len(values) == 1:
        return identity(first)
    shape = list(first.shape)
    shape[ax] = sum(v.shape[ax] for v in values)
    dtype = max((v.dtype for v in values), key=("bool", "int32", "float16", "float32").index)
    return first.graph.add_node("concat", list(values), shape, dtype, axis=ax)


# Value's arithmetic operators are these functions.
register_operators(add=add, sub=sub, mul=mul, div=div, neg=neg)

__all__ = ["ACTIVATIONS", "BOOL_OPS", "ELEMENTWISE", "FLOAT_OPS", "add", "avg_pool2d",
           "batchnorm", "clip", "concat", "conv", "conv2d", "conv_transpose", "div", "exp",
           "flatten", "gemm", "global_avg_pool", "global_max_pool", "identity", "leaky_relu",
           "matmul", "max_pool2d", "mul", "neg", "pool", "reduce_max", "reduce_mean",
           "reduce_sum", "relu", "relu6", "reshape", "resolve_pads", "sigmoid", "softmax", "sqrt",
           "sub", "tanh", "transpose", "upsample_nearest", "window_output"]
