"""Normalisations and log-softmax for the graph frontend, on top of `tilec.ops`:

- `layer_norm` (ONNX LayerNormalization), `layer_norm_stats` (also its Mean and InvStdDev),
  `rms_norm`, `instance_norm` (ONNX InstanceNormalization), `group_norm` (ONNX
  GroupNormalization);
- `log_softmax`: one node, lowered like softmax (`lower_ops`).

Each normalisation is written so that its Tile text is one *row reduction chain* (see
`tilec.plan.rows`): a keep-dims reduction over the normalised axes first, then elementwise
statements of the full or of the reduced shape and a second reduction over the same axes.
The compiler runs such a chain as one kernel, each row read once:

    S = +(X); M = S / n; D = X - M; D2 = D * D; Q = +(D2); V = Q / n;
    Y = D * (1 / sqrt(V + eps)) * scale + bias

The variance is the population one, computed in two passes (the mean first), as ONNX's
function bodies define it.  Scale and bias operands are reshaped *before* the chain: a reshape
of a non-constant is a copy, and a copy between the chain's statements would cut it."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import TileError
from . import ops
from .core import Value
from .ops import _axis

_FLOATS = ("float16", "float32")


def _check(what: str, x: Value) -> None:
    if x.dtype not in _FLOATS:
        raise TileError(f"{what} needs a floating-point input, not {x.dtype}")


def _fits(what: str, name: str, p: Value | None, shape: tuple[int, ...]) -> None:
    """`p` broadcasts to `shape` one way (the result keeps `shape`)."""
    if p is None:
        return
    ok = len(p.shape) <= len(shape) and all(
        a in (1, b) for a, b in zip(reversed(p.shape), reversed(shape), strict=False))
    if not ok:
        raise TileError(f"{what}: {name} of shape {list(p.shape)} does not broadcast to the "
                        f"input {list(shape)}")


def _affine(y: Value, scale: Value | None, bias: Value | None) -> Value:
    if scale is not None:
        y = y * scale
    if bias is not None:
        y = y + bias
    return y


def moments(x: Value, axes: Sequence[int], epsilon: float) -> tuple[Value, Value, Value]:
    """(x - mean, mean, 1 / sqrt(var + epsilon)) over `axes`, the last two with those axes
    kept as size 1: the head of a row reduction chain."""
    axes = tuple(axes)
    m = ops.reduce_mean(x, axes, keepdims=True)
    d = x - m
    v = ops.reduce_mean(d * d, axes, keepdims=True)
    inv = ops.div(1.0, ops.sqrt(v + float(epsilon)))
    return d, m, inv


def _trailing(what: str, x: Value, axis: int) -> tuple[int, ...]:
    if x.ndim == 0:
        raise TileError(f"{what}: the input is a scalar; there is nothing to normalise")
    ax = _axis(axis, x.ndim, what)
    return tuple(range(ax, x.ndim))


def layer_norm_stats(x: Value, scale: Value | None = None, bias: Value | None = None,
                     axis: int = -1, epsilon: float = 1e-5) -> tuple[Value, Value, Value]:
    """(Y, Mean, InvStdDev) of ONNX LayerNormalization (opset 17): normalise over the axes
    `axis`..rank-1; Mean and InvStdDev have those axes as size 1; scale and bias broadcast to
    x (numpy's rules, one way)."""
    _check("layer_norm", x)
    axes = _trailing("layer_norm", x, axis)
    _fits("layer_norm", "scale", scale, x.shape)
    _fits("layer_norm", "bias", bias, x.shape)
    d, m, inv = moments(x, axes, epsilon)
    return _affine(d * inv, scale, bias), m, inv


def layer_norm(x: Value, scale: Value | None = None, bias: Value | None = None,
               axis: int = -1, epsilon: float = 1e-5) -> Value:
    """(x - mean) / sqrt(var + epsilon) * scale + bias over the axes `axis`..rank-1."""
    return layer_norm_stats(x, scale, bias, axis, epsilon)[0]


def rms_norm(x: Value, scale: Value | None = None, axis: int = -1,
             epsilon: float = 1e-6) -> Value:
    """x / sqrt(mean(x^2) + epsilon) * scale over the axes `axis`..rank-1 (one row kernel:
    the square is computed in the row's walk)."""
    _check("rms_norm", x)
    axes = _trailing("rms_norm", x, axis)
    _fits("rms_norm", "scale", scale, x.shape)
    q = ops.reduce_mean(x * x, axes, keepdims=True)
    inv = ops.div(1.0, ops.sqrt(q + float(epsilon)))
    return _affine(x * inv, scale, None)


def _channel_param(what: str, name: str, p: Value | None, shape: tuple[int, ...]
                   ) -> Value | None:
    """A per-channel vector [C] seen as `shape` ([C, 1, ..] or [G, C/G, 1, ..])."""
    if p is None:
        return None
    c = 1
    for n in shape:
        c *= n
    if p.shape != (c,) and p.shape != tuple(shape):
        raise TileError(f"{what}: {name} has shape {list(p.shape)}, expected [{c}]")
    return ops.reshape(p, shape)


def instance_norm(x: Value, scale: Value | None = None, bias: Value | None = None,
                  epsilon: float = 1e-5) -> Value:
    """ONNX InstanceNormalization: x is [N, C, D1, ..]; each (n, c) is normalised over the
    spatial axes, then scaled and shifted per channel (scale and bias [C])."""
    _check("instance_norm", x)
    if x.ndim < 3:
        raise TileError(f"instance_norm: expected [N, C, D1, ...], got {list(x.shape)}")
    pshape = (x.shape[1],) + (1,) * (x.ndim - 2)
    s = _channel_param("instance_norm", "scale", scale, pshape)
    b = _channel_param("instance_norm", "bias", bias, pshape)
    d, _, inv = moments(x, tuple(range(2, x.ndim)), epsilon)
    return _affine(d * inv, s, b)


def group_norm(x: Value, scale: Value | None, bias: Value | None, groups: int,
               epsilon: float = 1e-5) -> Value:
    """Group normalisation of x [N, C, D1, ..]: the channels in `groups` groups of C/groups,
    each (n, group) normalised over its channels and the spatial axes, then scaled and shifted
    per channel (scale and bias [C], ONNX opset 21) or per group ([groups], ONNX opset 18).

    x is seen as [N, G, C/G, D1, ..] (a copy), normalised over its last axes, and seen as
    [N, C, D1, ..] again (another copy)."""
    _check("group_norm", x)
    if x.ndim < 2:
        raise TileError(f"group_norm: expected [N, C, ...], got {list(x.shape)}")
    n, c, spatial = x.shape[0], x.shape[1], tuple(x.shape[2:])
    g = int(groups)
    if g < 1 or c % g:
        raise TileError(f"group_norm: {g} groups do not divide {c} channels")
    ones = (1,) * len(spatial)
    params = []
    for name, p in (("scale", scale), ("bias", bias)):
        if p is not None and p.shape == (g,) and g != c:
            params.append(ops.reshape(p, (g, 1) + ones))  # one value per group
        else:
            params.append(_channel_param("group_norm", name, p, (g, c // g) + ones))
    xg = ops.reshape(x, (n, g, c // g) + spatial)
    d, _, inv = moments(xg, tuple(range(2, xg.ndim)), epsilon)
    return ops.reshape(_affine(d * inv, *params), x.shape)


def log_softmax(x: Value, axis: int = -1, *, axes: Sequence[int] | None = None) -> Value:
    """log(softmax(x)) over `axis` (or over several `axes` together, as ONNX before opset 13),
    as x - max - log(sum(exp(x - max)))."""
    ax = tuple(sorted({_axis(a, x.ndim, "log_softmax")
                       for a in (axes if axes is not None else (axis,))}))
    _check("log_softmax", x)
    return x.graph.add_node("log_softmax", [x], x.shape, x.dtype, axes=ax)


__all__ = ["group_norm", "instance_norm", "layer_norm", "layer_norm_stats", "log_softmax",
           "moments", "rms_norm"]
