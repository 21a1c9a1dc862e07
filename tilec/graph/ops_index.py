"""Indexing, conversion and layout ops for the graph frontend, on top of `tilec.ops`:

- `cast`: Tile's `as_float` / `as_int` / `as_bool`;
- `gather` (rows of V picked by an int32 index tensor: Tile's `gather`, any axis through
  transposes), `gather_elements` (a `gather` from the flattened operand);
- `slice` (static starts and steps per axis, negative steps too: one `=` contraction),
  `expand` (numpy broadcasting both ways: one `=` contraction), `tile`, `pad` (constant:
  a copy into a `default` tensor; reflect and edge: a `gather` from the flattened operand with
  a constant index map), `depth_to_space` / `space_to_depth` (reshape, transpose, reshape);
- `reduce_min`, `reduce_prod`, `reduce_l2`, and `arg_max` / `arg_min` (a max contraction over
  `X == max ? rank`, as max pooling's indices)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..errors import TileError
from . import ops, ops_math
from .core import Value
from .ops import _axis

DTYPES = ("bool", "int32", "float16", "float32")


def cast(x: Value, dtype: str) -> Value:
    if dtype not in DTYPES:
        raise TileError(f"cast: element type {dtype!r}, expected one of {', '.join(DTYPES)}")
    if dtype == x.dtype:
        return ops.identity(x)
    return x.graph.add_node("cast", [x], x.shape, dtype)


def _int_index(i: Value, what: str) -> Value:
    if i.dtype != "int32":
        raise TileError(f"{what}: indices must be integers, not {i.dtype}")
    return i


def wrap_negative(i: Value, n: int) -> Value:
    """Indices in [-n, n) as [0, n): a negative one counts from the end."""
    g = i.graph
    if g.is_constant(i.name):
        a = g.constants[i.name]
        return g.constant(np.where(a < 0, a + n, a).astype(np.int32))
    return ops_math.where(ops_math.less(i, 0), i + n, i)


def gather(v: Value, i: Value, axis: int = 0) -> Value:
    """out[a..., i..., b...] = v[a..., I[i...], b...] along `axis` (indices in range; Tile
    clamps the others)."""
    _int_index(i, "gather")
    ax = _axis(axis, v.ndim, "gather")
    if v.ndim == 0:
        raise TileError("gather: the operand needs at least one dimension")
    picked = _constant_slice(v, i, ax)
    if picked is not None:
        return picked
    if ax:
        perm = (ax, *range(ax), *range(ax + 1, v.ndim))
        v = ops.transpose(v, perm)
    out = v.graph.add_node("gather", [v, i], i.shape + v.shape[1:], v.dtype)
    if ax:
        r = i.ndim
        back = (*range(r, r + ax), *range(r), *range(r + ax, out.ndim))
        out = ops.transpose(out, back)
    return out


def _constant_slice(v: Value, i: Value, ax: int) -> Value | None:
    """`gather` by a constant index that picks a regular slice: one index (torch's q / k / v
    split of a fused projection: `qkv[0]`, `qkv[1]`, `qkv[2]`) or a run of indices a fixed
    positive step apart, all in range.  A slice is a copy contraction, which the copies
    around it compose with (`plan.copies`) and a product may read in place; Tile's `gather`
    is a kernel of its own (25-35 us for each of a transformer layer's splits on a 2-core
    CPU).  None: a general gather."""
    g = v.graph
    if not g.is_constant(i.name) or i.ndim > 1:
        return None
    idx = np.asarray(g.constants[i.name]).astype(np.int64).reshape(-1)
    n = v.shape[ax]
    if idx.size == 0 or idx.min() < 0 or idx.max() >= n:
        return None
    step = int(idx[1] - idx[0]) if idx.size > 1 else 1
    if step < 1 or np.any(np.diff(idx) != step):
        return None
    first = int(idx[0])
    part = strided_slice(v, [first], [first + step * (idx.size - 1) + 1], [step], [ax])
    if i.ndim == 0:
        return ops.reshape(part, v.shape[:ax] + v.shape[ax + 1:])
    return part


def take_flat(x: Value, index: np.ndarray) -> Value:
    """out[p] = x.flat[index[p]] for a constant index map (any shape)."""
    flat = ops.reshape(x, (math.prod(x.shape),)) if x.ndim != 1 else x
    idx = x.graph.constant(np.asarray(index, np.int32))
    return x.graph.add_node("gather", [flat, idx], idx.shape, x.dtype)


def gather_elements(x: Value, i: Value, axis: int = 0) -> Value:
    """out[p] = x[p with its `axis` coordinate replaced by I[p]] (ONNX GatherElements)."""
    _int_index(i, "gather_elements")
    ax = _axis(axis, x.ndim, "gather_elements")
    if i.ndim != x.ndim:
        raise TileError(f"gather_elements: indices {list(i.shape)} and data {list(x.shape)} "
                        "need the same rank")
    strides = [math.prod(x.shape[k + 1:]) for k in range(x.ndim)]
    grids = np.indices(i.shape, dtype=np.int64)
    base = sum(grids[k] * strides[k] for k in range(x.ndim) if k != ax)
    flat = ops.reshape(x, (math.prod(x.shape),)) if x.ndim != 1 else x
    idx = wrap_negative(i, x.shape[ax])
    pos = idx * strides[ax] + x.graph.constant(np.asarray(base, np.int32)) if x.ndim > 1 \
        else idx
    return x.graph.add_node("gather", [flat, pos], i.shape, x.dtype)


def slice_range(n: int, start: int, end: int, step: int) -> tuple[int, int]:
    """(first index, count) of ONNX / numpy slicing along a dimension of size n."""
    if step == 0:
        raise TileError("slice: a step must not be 0")
    first, stop, st = slice(start, end, step).indices(n)
    return first, len(range(first, stop, st))


def strided_slice(x: Value, starts: Sequence[int], ends: Sequence[int],
                  steps: Sequence[int], axes: Sequence[int]) -> Value:
    """ONNX / numpy slicing (clamped bounds, negative steps) along `axes`."""
    begin = [0] * x.ndim
    step = [1] * x.ndim
    shape = list(x.shape)
    seen = set()
    for s, e, st, a in zip(starts, ends, steps, axes, strict=True):
        ax = _axis(int(a), x.ndim, "slice")
        if ax in seen:
            raise TileError(f"slice: axis {a} is given twice")
        seen.add(ax)
        begin[ax], shape[ax] = slice_range(x.shape[ax], int(s), int(e), int(st))
        step[ax] = int(st)
    if tuple(shape) == x.shape and all(s == 1 for s in step):
        return ops.identity(x)
    return x.graph.add_node("slice", [x], shape, x.dtype, starts=tuple(begin),
                            steps=tuple(step))


def expand(x: Value, shape: Sequence[int]) -> Value:
    """x broadcast with `shape` (numpy's rule: the result may be larger than `shape`)."""
    try:
        out = tuple(int(d) for d in np.broadcast_shapes(x.shape, tuple(int(s) for s in shape)))
    except ValueError:
        raise TileError(f"expand: {list(x.shape)} and {list(shape)} do not broadcast") from None
    if out == x.shape:
        return ops.identity(x)
    return x.graph.add_node("broadcast", [x], out, x.dtype)


def tile(x: Value, repeats: Sequence[int]) -> Value:
    reps = [int(r) for r in repeats]
    if len(reps) != x.ndim or any(r < 0 for r in reps):
        raise TileError(f"tile: repeats {reps} must be {x.ndim} non-negative integers")
    if all(r == 1 for r in reps):
        return ops.identity(x)
    lifted = ops.reshape(x, [d for n in x.shape for d in (1, n)])
    wide = expand(lifted, [d for r, n in zip(reps, x.shape, strict=True) for d in (r, n)])
    return ops.reshape(wide, [r * n for r, n in zip(reps, x.shape, strict=True)])


def _pad_index(n: int, lo: int, hi: int, mode: str) -> np.ndarray:
    p = np.arange(-lo, n + hi)
    if mode == "edge":
        return np.clip(p, 0, n - 1)
    if n == 1:
        return np.zeros_like(p)
    period = 2 * (n - 1)
    q = np.mod(p, period)
    return np.where(q < n, q, period - q)


def pad(x: Value, pads: Sequence[int], mode: str = "constant", value: object = 0) -> Value:
    """pads = (begin..., end...) per axis; negative pads crop."""
    r = x.ndim
    p = [int(v) for v in pads]
    if len(p) != 2 * r:
        raise TileError(f"pad: {len(p)} pads for rank {r}, expected {2 * r}")
    if mode not in ("constant", "reflect", "edge"):
        raise TileError(f"pad: mode {mode!r}, expected 'constant', 'reflect' or 'edge'")
    if any(v < 0 for v in p):  # crop first
        x = strided_slice(x, [max(0, -v) for v in p[:r]],
                  [n - max(0, -v) for n, v in zip(x.shape, p[r:], strict=True)],
                  [1] * r, range(r))
        p = [max(0, v) for v in p]
    if not any(p):
        return ops.identity(x)
    shape = [n + p[k] + p[r + k] for k, n in enumerate(x.shape)]
    if mode == "constant":
        return x.graph.add_node("pad", [x], shape, x.dtype, begin=tuple(p[:r]),
                                value=float(value) if x.dtype.startswith("float")  # type: ignore
                                else int(value))  # type: ignore[call-overload]
    for k, n in enumerate(x.shape):
        if n == 0 or (mode == "reflect" and max(p[k], p[r + k]) >= n and n > 1):
            raise TileError(f"pad: {mode} padding of {p[k]}, {p[r + k]} does not fit a "
                            f"dimension of size {n}")
    grids = np.ix_(*[_pad_index(n, p[k], p[r + k], mode) for k, n in enumerate(x.shape)])
    strides = [math.prod(x.shape[k + 1:]) for k in range(r)]
    flat = sum(gk * s for gk, s in zip(grids, strides, strict=True))
    return take_flat(x, np.broadcast_to(flat, shape))


def depth_to_space(x: Value, block: int, mode: str = "DCR") -> Value:
    n, c, h, w = x.shape
    b = int(block)
    if c % (b * b):
        raise TileError(f"depth_to_space: {c} channels do not divide by {b}*{b}")
    if mode == "DCR":
        t = ops.transpose(ops.reshape(x, (n, b, b, c // (b * b), h, w)), (0, 3, 4, 1, 5, 2))
    elif mode == "CRD":
        t = ops.transpose(ops.reshape(x, (n, c // (b * b), b, b, h, w)), (0, 1, 4, 2, 5, 3))
    else:
        raise TileError(f"depth_to_space: mode {mode!r}, expected 'DCR' or 'CRD'")
    return ops.reshape(t, (n, c // (b * b), h * b, w * b))


def space_to_depth(x: Value, block: int, mode: str = "DCR") -> Value:
    n, c, h, w = x.shape
    b = int(block)
    if h % b or w % b:
        raise TileError(f"space_to_depth: {h}x{w} does not divide by the block {b}")
    if mode not in ("DCR", "CRD"):
        raise TileError(f"space_to_depth: mode {mode!r}, expected 'DCR' or 'CRD'")
    perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    t = ops.transpose(ops.reshape(x, (n, c, h // b, b, w // b, b)), perm)
    return ops.reshape(t, (n, c * b * b, h // b, w // b))


def reduce_min(x: Value, axes: int | Sequence[int] | None = None, keepdims: bool = False
               ) -> Value:
    return ops._reduce("min", x, axes, keepdims)


def reduce_prod(x: Value, axes: int | Sequence[int] | None = None, keepdims: bool = False
                ) -> Value:
    return ops._reduce("prod", x, axes, keepdims)


def reduce_l2(x: Value, axes: int | Sequence[int] | None = None, keepdims: bool = False
              ) -> Value:
    if x.dtype not in ("float16", "float32"):
        raise TileError(f"reduce_l2 needs a floating-point operand, not {x.dtype}")
    return ops.sqrt(ops.reduce_sum(x * x, axes, keepdims))


def arg_reduce(x: Value, kind: str, axis: int = 0, keepdims: bool = True,
               select_last: bool = False) -> Value:
    """The int32 index of the maximum ("max") or minimum ("min") along `axis`: the first one
    (or with `select_last` the last one) where several are equal."""
    if kind not in ("max", "min"):
        raise TileError(f"arg_reduce: kind {kind!r}, expected 'max' or 'min'")
    ax = _axis(axis, x.ndim, f"arg{kind}")
    best = ops._reduce(kind, x, (ax,), True)
    shape = tuple(1 if k == ax else n for k, n in enumerate(x.shape))
    out = x.graph.add_node("arg", [x, best], shape, "int32", axis=ax,
                           last=bool(select_last))
    return out if keepdims else ops.reshape(out, x.shape[:ax] + x.shape[ax + 1:])


__all__ = ["arg_reduce", "cast", "depth_to_space", "expand", "gather", "gather_elements",
           "pad", "reduce_l2", "reduce_min", "reduce_prod", "slice_range", "space_to_depth",
           "strided_slice", "take_flat", "tile", "wrap_negative"]
