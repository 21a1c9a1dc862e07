"""The checked program: tensors with concrete shapes, contractions with exact affine index
polynomials, and elementwise statements.  Every later stage reads these types."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from ..errors import Source, Span

# Storage types, narrowest first; an operation's result takes the widest of its operands (an
# unsigned type over the signed one of its width, as C does).  64-bit types are left out: the
# embedded OpenCL profile (mobile GPUs) has no 64-bit integers and few devices have doubles.
DTYPES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "float16", "float32")
FLOAT_DTYPES = ("float16", "float32")
INT_DTYPES = ("int8", "uint8", "int16", "uint16", "int32", "uint32")
UNSIGNED_DTYPES = ("uint8", "uint16", "uint32")
DTYPE_BYTES = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4,
               "uint32": 4, "float16": 2, "float32": 4}

AGGREGATIONS = ("+", "*", ">", "<", "=")
COMBINATIONS = ("*", "+", "==", "?")  # "?" is the 3-operand form (A == B ? C)


def promote(*dtypes: str) -> str:
    return max(dtypes, key=DTYPES.index)


@dataclass(frozen=True)
class Poly:
    """An affine polynomial sum(coef * index) + const with exact rational coefficients."""

    terms: tuple[tuple[str, Fraction], ...] = ()
    const: Fraction = Fraction(0)

    @staticmethod
    def make(terms: Mapping[str, Fraction | int], const: Fraction | int = 0) -> Poly:
        kept = tuple(sorted((k, Fraction(v)) for k, v in terms.items() if v != 0))
        return Poly(kept, Fraction(const))

    @staticmethod
    def index(name: str) -> Poly:
        return Poly(((name, Fraction(1)),), Fraction(0))

    @staticmethod
    def constant(value: Fraction | int) -> Poly:
        return Poly((), Fraction(value))

    @property
    def coeffs(self) -> dict[str, Fraction]:
        return dict(self.terms)

    @property
    def indices(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.terms)

    def coef(self, name: str) -> Fraction:
        return self.coeffs.get(name, Fraction(0))

    @property
    def is_constant(self) -> bool:
        return not self.terms

    def __add__(self, other: Poly) -> Poly:
        c = self.coeffs
        for k, v in other.terms:
            c[k] = c.get(k, Fraction(0)) + v
        return Poly.make(c, self.const + other.const)

    def __neg__(self) -> Poly:
        return self.scale(-1)

    def __sub__(self, other: Poly) -> Poly:
        return self + (-other)

    def scale(self, factor: Fraction | int) -> Poly:
        f = Fraction(factor)
        return Poly.make({k: v * f for k, v in self.terms}, self.const * f)

    def substitute(self, name: str, value: Poly) -> Poly:
        coef = self.coef(name)
        if coef == 0:
            return self
        rest = Poly.make({k: v for k, v in self.terms if k != name}, self.const)
        return rest + value.scale(coef)

    def evaluate(self, env: Mapping[str, object]):
        """Value at `env` (ints, Fractions or numpy arrays of index values)."""
        total: object = self.const
        for k, v in self.terms:
            total = total + v * env[k]
        return total

    def __str__(self) -> str:
        parts: list[str] = []
        for k, v in self.terms:
            mag = abs(v)
            s = k if mag == 1 else (f"{mag.numerator}*{k}" if mag.denominator == 1
                                    else f"{mag.numerator}*{k}/{mag.denominator}")
            parts.append(("-" if v < 0 else "+") + s)
        if self.const != 0 or not parts:
            c = self.const
            mag = abs(c)
            s = str(mag.numerator) if mag.denominator == 1 else f"{mag.numerator}/{mag.denominator}"
            parts.append(("-" if c < 0 else "+") + s)
        text = " ".join(p[0] + " " + p[1:] for p in parts)
        text = text[2:] if text.startswith("+ ") else "-" + text[2:]
        return text


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def strides(self) -> tuple[int, ...]:
        """Row-major strides in elements."""
        out = []
        s = 1
        for d in reversed(self.shape):
            out.append(s)
            s *= d
        return tuple(reversed(out))


@dataclass(frozen=True)
class Access:
    tensor: str
    idx: tuple[Poly, ...]
    span: Span | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Constraint:
    """0 <= poly < bound (the Tile form `poly < bound`)."""

    poly: Poly
    bound: int
    span: Span | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Contraction:
    output: str
    out_idx: tuple[Poly, ...]
    agg: str
    comb: str | None  # None when there is a single operand
    inputs: tuple[Access, ...]
    constraints: tuple[Constraint, ...]
    indices: tuple[str, ...]  # every index variable, sorted by name
    no_defract: bool = False
    default: str | None = None
    text: str = ""
    span: Span | None = field(default=None, compare=False)

    @property
    def tensors(self) -> tuple[str, ...]:
        return (self.output,) + tuple(a.tensor for a in self.inputs)


# Elementwise expressions -------------------------------------------------------------------------

UNARY_OPS = ("neg", "not", "bitnot")
BINARY_OPS = ("add", "sub", "mul", "div", "eq", "ne", "lt", "gt", "le", "ge", "and", "or",
              "bitand", "bitor", "bitxor", "shl", "shr")
CALLS = {  # name -> arity
    "exp": 1, "log": 1, "sqrt": 1, "tanh": 1, "sigmoid": 1, "abs": 1, "relu": 1, "floor": 1,
    "ceil": 1, "min": 2, "max": 2, "pow": 2,
    # PlaidML's trigonometric and rounding builtins (round: halves away from zero, as OpenCL's)
    "sin": 1, "cos": 1, "tan": 1, "asin": 1, "acos": 1, "atan": 1, "sinh": 1, "cosh": 1,
    "round": 1, "erf": 1,
}
# Calls computed in floating point whatever their operands (integers become float32).
FLOAT_CALLS = ("exp", "log", "sqrt", "tanh", "sigmoid", "pow", "sin", "cos", "tan", "asin",
               "acos", "atan", "sinh", "cosh", "erf")
COMPARISONS = ("eq", "ne", "lt", "gt", "le", "ge", "and", "or", "not")
# Conversions (`as_float(X, 16)`): the second argument is the bit width, a Const.
CONVERSIONS = ("as_float", "as_int", "as_uint")
# Nodes whose value depends on the element's position in their own shape (the flat element
# number, "eid"), not only on their operands' values there: `index` (the coordinate along an
# axis, args (Const axis,)), `shape` (args: the sizes as Consts), `reshape` (args (Ref X,):
# X's element eid), `gather` (args (Ref V, Ref I): V's row I[...] ), `scatter` (args (Ref V,
# Ref I): the sum of V's rows whose index is this row), `prng` (args (Ref S,): a random value
# from state S) and `prng_state` (args (Ref S, Const count): S with its counter advanced).
EID_OPS = ("index", "shape", "reshape", "gather", "scatter", "prng", "prng_state")
# Of those, the ones that read their Ref operands at other elements than their own: these
# operands must be in memory (not computed in the same kernel).
GATHER_OPS = ("reshape", "gather", "scatter", "prng", "prng_state")


@dataclass(frozen=True)
class Ref:
    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Const:
    value: int | float
    dtype: str  # "int32" or "float32"; literals do not widen a tensor's type


@dataclass(frozen=True)
class Op:
    op: str  # a UNARY_OPS, BINARY_OPS or CALLS name, or "select"
    args: tuple[Expr, ...]
    dtype: str
    shape: tuple[int, ...]


Expr = Ref | Const | Op


def access_strides(idx: tuple[Poly, ...], shape: tuple[int, ...], strides: tuple[int, ...],
                   ranges: dict[str, tuple[int, int]]) -> tuple[dict[str, int], int] | None:
    """An affine access as strides: for each index of `ranges` (inclusive lo, hi), how far
    one step of it moves in a tensor of `strides` (elements or bytes), and the offset of the
    access's constants; None where a coefficient is not an integer, an index is not in
    `ranges`, or the access leaves `shape` somewhere in the box."""
    step = dict.fromkeys(ranges, 0)
    offset = 0
    for p, n, st in zip(idx, shape, strides, strict=True):
        if p.const.denominator != 1 or any(c.denominator != 1 or k not in step
                                           for k, c in p.terms):
            return None
        lo = hi = int(p.const)
        for k, c in p.terms:
            a, b = int(c) * ranges[k][0], int(c) * ranges[k][1]
            lo, hi = lo + min(a, b), hi + max(a, b)
            step[k] += int(c) * st
        if lo < 0 or hi > n - 1:
            return None
        offset += int(p.const) * st
    return step, offset


def broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether a tensor of `shape` broadcasts to `target` one way (numpy's rules, right-aligned;
    the result keeps `target`)."""
    return len(shape) <= len(target) and all(
        a in (1, b) for a, b in zip(reversed(shape), reversed(target), strict=False))


def has_eid_op(e: Expr) -> bool:
    return isinstance(e, Op) and (e.op in EID_OPS or any(has_eid_op(a) for a in e.args))


def gathered(e: Expr) -> set[str]:
    """Tensors an expression reads away from its own element (see GATHER_OPS)."""
    if not isinstance(e, Op):
        return set()
    out = {a.name for a in e.args if isinstance(a, Ref)} if e.op in GATHER_OPS else set()
    for a in e.args:
        out |= gathered(a)
    return out


def expr_refs(e: Expr) -> tuple[str, ...]:
    """Tensor names an expression reads, in first-use order, without repeats."""
    seen: dict[str, None] = {}

    def walk(x: Expr) -> None:
        if isinstance(x, Ref):
            seen.setdefault(x.name)
        elif isinstance(x, Op):
            for a in x.args:
                walk(a)

    walk(e)
    return tuple(seen)


@dataclass(frozen=True)
class Elementwise:
    output: str
    expr: Expr
    text: str = ""
    span: Span | None = field(default=None, compare=False)


Statement = Contraction | Elementwise


@dataclass(frozen=True)
class Program:
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    tensors: Mapping[str, Tensor]
    ops: tuple[Statement, ...]
    source: Source = field(default_factory=lambda: Source(""), compare=False)
    # 0-d integer inputs used as sizes, with the value they were compiled for.
    fixed: Mapping[str, int] = field(default_factory=dict, compare=False)

    def tensor(self, name: str) -> Tensor:
        return self.tensors[name]

    def producer(self, name: str) -> Statement | None:
        for op in self.ops:
            if op.output == name:
                return op
        return None

    def consumers(self, name: str) -> tuple[Statement, ...]:
        out = []
        for op in self.ops:
            reads = ([a.tensor for a in op.inputs] + ([op.default] if op.default else [])
                     if isinstance(op, Contraction) else list(expr_refs(op.expr)))
            if name in reads:
                out.append(op)
        return tuple(out)
