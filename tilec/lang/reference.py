"""The numpy interpreter of `ir.Program`: the oracle every kernel and every test is compared with.

Contractions run on a vectorised fast path where each index polynomial keeps a single free index
once a few small "coupling" indices are fixed (einsum / broadcast reductions per assignment),
and otherwise on a generic chunked enumeration of the index box (see `reference_paths`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal

import numpy as np

from ..errors import TileCheckError
from . import ir
from .builtins import prng_values
from .reference_copy import strided_copy
from .reference_paths import (
    acc_dtype,
    fast,
    generic,
    identity,
    index_bounds,
    plan_fast,
)

__all__ = ["NP_DTYPES", "evaluate_program", "evaluate_contraction", "evaluate_expr",
           "index_bounds"]

NP_DTYPES: dict[str, type[np.generic]] = {
    "float32": np.float32, "float16": np.float16, "int32": np.int32, "bool": np.bool_,
    "int8": np.int8, "uint8": np.uint8, "int16": np.int16, "uint16": np.uint16,
    "uint32": np.uint32,
}

Path = Literal["auto", "fast", "generic"]


def evaluate_program(program: ir.Program, arrays: Mapping[str, np.ndarray],
                     *, path: Path = "auto") -> dict[str, np.ndarray]:
    """Every output of `program`, in order, for the given input arrays.  `path` forces the
    contraction strategy (tests compare "fast" with "generic"; "fast" still falls back where
    it does not apply)."""
    env: dict[str, np.ndarray] = {}
    for name in program.inputs:
        env[name] = _check_input(program.tensors[name], arrays)
    for op in program.ops:
        env[op.output] = evaluate_op(op, program.tensors, env, path=path)
    missing = [n for n in program.outputs if n not in env]
    if missing:
        raise TileCheckError(f"output {missing[0]} is never written")
    return {n: env[n] for n in program.outputs}


def evaluate_op(op: ir.Statement, tensors: Mapping[str, ir.Tensor], env: Mapping[str, np.ndarray],
                *, path: Path = "auto") -> np.ndarray:
    """One statement's value (its output tensor's array) from the arrays in `env`."""
    if isinstance(op, ir.Contraction):
        return evaluate_contraction(op, tensors, env, path=path)
    t = tensors[op.output]
    return np.broadcast_to(_cast(evaluate_expr(op.expr, env), t.dtype), t.shape).copy()


def _check_input(t: ir.Tensor, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    if t.name not in arrays:
        raise TileCheckError(f"no array given for input {t.name}")
    arr = np.asarray(arrays[t.name])
    if arr.ndim != len(t.shape):
        raise TileCheckError(f"input {t.name} has rank {arr.ndim}, expected {len(t.shape)} "
                             f"(shape {list(t.shape)})")
    for d, (got, want) in enumerate(zip(arr.shape, t.shape, strict=True)):
        if got != want:
            raise TileCheckError(f"input {t.name}: dimension {d} has size {got}, "
                                 f"expected {want}")
    return _cast(arr, t.dtype)


def _cast(arr: np.ndarray, dtype: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(arr).astype(NP_DTYPES[dtype], copy=False)


# Contractions ------------------------------------------------------------------------------------

def evaluate_contraction(op: ir.Contraction, tensors: Mapping[str, ir.Tensor],
                         env: Mapping[str, np.ndarray], *, path: Path = "auto") -> np.ndarray:
    out = tensors[op.output]
    for name in [a.tensor for a in op.inputs] + ([op.default] if op.default else []):
        if name not in env:
            raise TileCheckError(f"{name} is read before it is written", span=op.span)
    bounds = index_bounds(op, tensors)
    if path != "generic":
        view = strided_copy(op, tensors, env, bounds)
        if view is not None:
            return np.array(_cast(view, out.dtype), order="C")
    dt = acc_dtype(op, tensors)
    acc = np.full(out.shape, identity(op.agg, dt), dtype=dt)
    covered = np.zeros(out.shape, dtype=bool)
    if all(lo <= hi for lo, hi in bounds.values()):
        plan = plan_fast(op, tensors, bounds) if path != "generic" else None
        with np.errstate(over="ignore", invalid="ignore"):
            if plan is not None:
                fast(op, tensors, env, bounds, plan, acc, covered)
            else:
                generic(op, tensors, env, bounds, acc, covered)
    if op.default is not None:
        base = _cast(env[op.default], out.dtype)
        if base.shape != out.shape:
            raise TileCheckError(f"default {op.default} has shape {list(base.shape)}, expected "
                                 f"{list(out.shape)} like {op.output}", span=op.span)
    else:
        base = np.zeros(out.shape, dtype=NP_DTYPES[out.dtype])
    return np.where(covered, _cast(acc, out.dtype), base)


# Elementwise -------------------------------------------------------------------------------------

_F64 = np.float64


def evaluate_expr(e: ir.Expr, env: Mapping[str, np.ndarray]) -> np.ndarray:
    """Value of an elementwise expression, broadcast numpy-style, in the expression's dtype."""
    if isinstance(e, ir.Ref):
        if e.name not in env:
            raise TileCheckError(f"{e.name} is read before it is written")
        return env[e.name]
    if isinstance(e, ir.Const):
        return np.asarray(e.value, dtype=NP_DTYPES[e.dtype])
    if e.op in ir.EID_OPS:
        return _positional(e, [evaluate_expr(a, env) for a in e.args])
    with np.errstate(all="ignore"):
        return _cast(_apply(e, [evaluate_expr(a, env) for a in e.args]), e.dtype)


def _positional(e: ir.Op, args: list[np.ndarray]) -> np.ndarray:
    """The ops whose value depends on the element's position (ir.EID_OPS)."""
    shape, dt = e.shape, NP_DTYPES[e.dtype]
    if e.op == "index":
        axis = int(args[0])
        view = [1] * len(shape)
        view[axis] = shape[axis]
        return np.broadcast_to(np.arange(shape[axis]).reshape(view), shape).astype(dt)
    if e.op == "shape":
        return np.array([int(a) for a in args], dtype=dt)
    if e.op == "reshape":
        return np.asarray(args[0]).reshape(shape).astype(dt)
    if e.op == "gather":
        v, i = args
        return v[_rows(i, v.shape[0])].astype(dt)
    if e.op == "scatter":
        v, i = args
        work = np.float64 if _is_float(e.dtype) else np.int64
        out = np.zeros(shape, dtype=work)
        np.add.at(out, _rows(i, shape[0]).reshape(-1),
                  v.astype(work).reshape((-1,) + tuple(shape[1:])))
        return _cast(out, e.dtype)
    if e.op == "prng":
        return prng_values(args[0], shape)
    if e.op == "prng_state":
        s, count = args
        flat = np.asarray(s).astype(np.int64).reshape(-1).copy()
        flat[1] = (flat[1] + int(count)) % 2**32
        return _cast(flat.astype(np.uint32), e.dtype).reshape(shape)
    raise TileCheckError(f"unknown positional operation {e.op!r}")


def _rows(index: np.ndarray, n: int) -> np.ndarray:
    # Rows named by an index tensor: truncated toward zero and clamped into [0, n), as the
    # kernels do (PlaidML clamps too), so that a bad index never reads outside the tensor.
    with np.errstate(all="ignore"):
        return np.clip(np.trunc(np.asarray(index, np.float64)), 0, n - 1).astype(np.int64)


def _is_float(dtype: str) -> bool:
    return dtype in ir.FLOAT_DTYPES


def _work(x: np.ndarray, dtype: str) -> np.ndarray:
    """Convert an operand to the op's type the way C would, then widen for the arithmetic:
    float64 for floats (each op is then rounded once, on the cast back), int64 for integers."""
    return _cast(x, dtype).astype(_F64 if _is_float(dtype) else np.int64)


def _truthy(x: np.ndarray) -> np.ndarray:
    return np.asarray(x) != 0


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    safe = np.where(b == 0, 1, b)
    q = np.abs(a) // np.abs(safe)
    return np.where(b == 0, 0, np.where((a < 0) != (safe < 0), -q, q))


_CMP = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "gt": np.greater,
        "le": np.less_equal, "ge": np.greater_equal}
def _round_half_away(x: np.ndarray) -> np.ndarray:
    # OpenCL's round() and PlaidML's: halves go away from zero (numpy's round goes to even).
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


_FLOAT_CALLS = {"exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh,
                "floor": np.floor, "ceil": np.ceil, "sin": np.sin, "cos": np.cos, "tan": np.tan,
                "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh,
                "cosh": np.cosh, "round": _round_half_away,
                "erf": np.vectorize(math.erf, otypes=[np.float64])}
_BITS = {"bitand": np.bitwise_and, "bitor": np.bitwise_or, "bitxor": np.bitwise_xor,
         "shl": np.left_shift, "shr": np.right_shift}


def _apply(e: ir.Op, args: list[np.ndarray]) -> np.ndarray:
    name, dt = e.op, e.dtype
    if name in _CMP:
        # Compare in the operands' common type, not in the boolean result type.
        common = ir.promote(*(_dtype_name(a) for a in args))
        return _CMP[name](_work(args[0], common), _work(args[1], common))
    if name == "and":
        return _truthy(args[0]) & _truthy(args[1])
    if name == "or":
        return _truthy(args[0]) | _truthy(args[1])
    if name == "not" or (name == "bitnot" and dt == "bool"):
        return ~_truthy(args[0])
    if name == "select":
        return np.where(_truthy(args[0]), _work(args[1], dt), _work(args[2], dt))
    if name == "as_float":
        return _cast(args[0], dt)
    if name in ("as_int", "as_uint"):
        # Truncation toward zero, then wrap-around into the target width (C's conversions).
        return np.trunc(args[0].astype(_F64)).astype(np.int64)
    if name in _FLOAT_CALLS:
        return _FLOAT_CALLS[name](_work(args[0], dt).astype(_F64))
    if name == "sigmoid":
        x = _work(args[0], dt).astype(_F64)
        return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow for large |x|, unlike 1/(1+exp(-x))
    if name == "pow":
        return np.power(_work(args[0], dt).astype(_F64), _work(args[1], dt).astype(_F64))
    xs = [_work(a, dt) for a in args]
    if name == "neg":
        return -xs[0]
    if name == "bitnot":
        return ~xs[0] if not _is_float(dt) else -xs[0] - 1
    if name == "abs":
        return np.abs(xs[0])
    if name == "relu":
        return np.maximum(xs[0], 0)
    if name in ("min", "max"):
        return (np.minimum if name == "min" else np.maximum)(xs[0], xs[1])
    if name == "add":
        return xs[0] + xs[1]
    if name == "sub":
        return xs[0] - xs[1]
    if name == "mul":
        return xs[0] * xs[1]
    if name == "div":
        return xs[0] / xs[1] if _is_float(dt) else _int_div(xs[0], xs[1])
    if name in _BITS:
        # C leaves shifts by 32 or more undefined; mask like most hardware does.
        b = xs[1] & 31 if name in ("shl", "shr") else xs[1]
        work = np.int32 if dt == "bool" else NP_DTYPES[dt]
        return _BITS[name](_cast(xs[0], dt).astype(work), b.astype(work))
    raise TileCheckError(f"unknown elementwise operation {name!r}")


def _dtype_name(a: np.ndarray) -> str:
    kind = np.asarray(a).dtype
    if kind.name in ir.DTYPES:
        return kind.name
    return "float32" if kind.kind == "f" else "int32"


def random_array(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Random test data: never zeros, never all-equal."""
    if dtype in ir.UNSIGNED_DTYPES:
        return rng.integers(1, 17, size=shape).astype(NP_DTYPES[dtype])
    if dtype in ir.INT_DTYPES:
        return rng.integers(-8, 9, size=shape).astype(NP_DTYPES[dtype])
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    return rng.uniform(-1.0, 1.0, size=shape).astype(dtype)
