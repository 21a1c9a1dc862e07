"""Elementwise math, comparisons, logic and selection for the graph frontend, on top of
`tilec.ops`' elementwise node (numpy broadcasting; each op is one Tile function or operator,
so chains fuse into one statement):

- math: `log`, `erf`, `sin`, `cos`, `abs`, `floor`, `ceil`, `pow`, `minimum`, `maximum`,
  `reciprocal`;
- comparisons (`equal`, `not_equal`, `less`, `greater`, `less_equal`, `greater_equal`) and
  logic (`logical_not`, `logical_and`, `logical_or`): bool results, Tile's `==` .. `&&`;
- `where(cond, a, b)`: Tile's `cond ? a : b`, cond bool;
- activations composed of those: `hard_sigmoid`, `hard_swish`, `softplus`, `elu`, `selu`,
  `mish`, `gelu` (exact or tanh approximation), `prelu`."""

from __future__ import annotations

import math

import numpy as np

from ..errors import TileError
from . import ops
from .core import Value
from .ops import _elementwise

_FLOATS = ("float16", "float32")


def _float(op: str, x: Value) -> None:
    if x.dtype not in _FLOATS:
        raise TileError(f"{op} needs a floating-point operand, not {x.dtype}")


# math ---------------------------------------------------------------------------------------------

def log(x: Value) -> Value:
    return _elementwise("log", [x])


def erf(x: Value) -> Value:
    return _elementwise("erf", [x])


def sin(x: Value) -> Value:
    return _elementwise("sin", [x])


def cos(x: Value) -> Value:
    return _elementwise("cos", [x])


def floor(x: Value) -> Value:
    """The largest integer not above x (integers unchanged)."""
    return _elementwise("floor", [x])


def ceil(x: Value) -> Value:
    """The smallest integer not below x (integers unchanged)."""
    return _elementwise("ceil", [x])


def abs(x: Value) -> Value:
    return _elementwise("abs", [x])


def pow(x: object, y: object) -> Value:
    return _elementwise("pow", [x, y])


def minimum(a: object, b: object) -> Value:
    return _elementwise("min", [a, b])


def maximum(a: object, b: object) -> Value:
    return _elementwise("max", [a, b])


def reciprocal(x: Value) -> Value:
    _float("reciprocal", x)
    return ops.div(1.0, x)


# comparisons and logic ----------------------------------------------------------------------------

def equal(a: object, b: object) -> Value:
    return _elementwise("eq", [a, b])


def not_equal(a: object, b: object) -> Value:
    return _elementwise("ne", [a, b])


def less(a: object, b: object) -> Value:
    return _elementwise("lt", [a, b])


def greater(a: object, b: object) -> Value:
    return _elementwise("gt", [a, b])


def less_equal(a: object, b: object) -> Value:
    return _elementwise("le", [a, b])


def greater_equal(a: object, b: object) -> Value:
    return _elementwise("ge", [a, b])


def _bools(op: str, *xs: Value) -> None:
    for x in xs:
        if x.dtype != "bool":
            raise TileError(f"{op} needs bool operands, not {x.dtype}")


def logical_not(x: Value) -> Value:
    _bools("logical_not", x)
    return _elementwise("not", [x])


def logical_and(a: Value, b: Value) -> Value:
    _bools("logical_and", a, b)
    return _elementwise("and", [a, b])


def logical_or(a: Value, b: Value) -> Value:
    _bools("logical_or", a, b)
    return _elementwise("or", [a, b])


def where(cond: Value, a: object, b: object) -> Value:
    """a where cond holds, b elsewhere (all three broadcast)."""
    _bools("where", cond)
    if isinstance(a, Value) and isinstance(b, Value) and a.dtype != b.dtype:
        raise TileError(f"where: the two branches differ in type ({a.dtype} and {b.dtype})")
    return _elementwise("where", [cond, a, b])


# activations --------------------------------------------------------------------------------------

def hard_sigmoid(x: Value, alpha: float = 0.2, beta: float = 0.5) -> Value:
    """max(0, min(1, alpha * x + beta))."""
    _float("hard_sigmoid", x)
    return ops.clip(x * float(alpha) + float(beta), 0.0, 1.0)


def hard_swish(x: Value) -> Value:
    """x * hard_sigmoid(x) with alpha 1/6, beta 0.5."""
    return x * hard_sigmoid(x, 1.0 / 6.0, 0.5)


def softplus(x: Value) -> Value:
    """log(1 + exp(x)), written max(x, 0) + log(1 + exp(-|x|)) so exp cannot overflow."""
    _float("softplus", x)
    return maximum(x, 0.0) + log(ops.exp(-abs(x)) + 1.0)


def elu(x: Value, alpha: float = 1.0) -> Value:
    """alpha * (exp(x) - 1) where x < 0, x elsewhere."""
    _float("elu", x)
    return where(less(x, 0.0), (ops.exp(x) - 1.0) * float(alpha), x)


def selu(x: Value, alpha: float = 1.67326319217681884765625,
         gamma: float = 1.05070102214813232421875) -> Value:
    """gamma * (alpha * exp(x) - alpha) where x <= 0, gamma * x elsewhere."""
    _float("selu", x)
    return where(less_equal(x, 0.0), ops.exp(x) * float(alpha) - float(alpha), x) * float(gamma)


def mish(x: Value) -> Value:
    """x * tanh(softplus(x))."""
    return x * ops.tanh(softplus(x))


def gelu(x: Value, approximate: str = "none") -> Value:
    """x * Phi(x): 0.5 * x * (1 + erf(x / sqrt(2))), or with approximate="tanh"
    0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))."""
    _float("gelu", x)
    if approximate == "none":
        inner = erf(x * (1.0 / math.sqrt(2.0)))
    elif approximate == "tanh":
        inner = ops.tanh((x + x * x * x * 0.044715) * math.sqrt(2.0 / math.pi))
    else:
        raise TileError(f"gelu: approximate={approximate!r}, expected 'none' or 'tanh'")
    return x * 0.5 * (inner + 1.0)


def prelu(x: Value, slope: Value) -> Value:
    """slope * x where x < 0, x elsewhere; slope broadcasts to x (one way: the result has x's
    shape)."""
    _float("prelu", x)
    try:
        fits = tuple(np.broadcast_shapes(slope.shape, x.shape)) == x.shape
    except ValueError:
        fits = False
    if not fits:
        raise TileError(f"prelu: the slope {list(slope.shape)} does not broadcast to the input "
                        f"{list(x.shape)}")
    return where(less(x, 0.0), x * slope, x)


__all__ = ["abs", "ceil", "cos", "elu", "equal", "erf", "floor", "gelu", "greater",
           "greater_equal",
           "hard_sigmoid", "hard_swish", "less", "less_equal", "log", "logical_and",
           "logical_not", "logical_or", "maximum", "minimum", "mish", "not_equal", "pow",
           "prelu", "reciprocal", "selu", "sin", "softplus", "where"]
