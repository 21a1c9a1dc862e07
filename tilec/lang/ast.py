"""The syntax tree of a Tile program, as written, with source spans.  `check` gives it meaning."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import Source, Span


@dataclass(frozen=True)
class Node:
    span: Span = field(compare=False, kw_only=True)


# Expressions (index polynomials, sizes and elementwise bodies share one syntax) -----------------

@dataclass(frozen=True)
class Num(Node):
    value: int | float
    is_float: bool


@dataclass(frozen=True)
class Name(Node):
    id: str


@dataclass(frozen=True)
class Unary(Node):
    op: str  # neg, not, bitnot
    operand: Expr


@dataclass(frozen=True)
class Binary(Node):
    op: str  # an ir.BINARY_OPS name
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Select(Node):
    cond: Expr
    then: Expr
    other: Expr


@dataclass(frozen=True)
class Call(Node):
    fn: str
    args: tuple[Expr, ...]


Expr = Num | Name | Unary | Binary | Select | Call


# Statements -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Dim(Node):
    """A dimension of an input: a size symbol or a fixed size."""

    name: str | None
    size: int | None = None


@dataclass(frozen=True)
class Input(Node):
    name: str
    dims: tuple[Dim, ...]
    # Declared without a dimension list (`function (I) -> ...`): PlaidML's "any shape".  The
    # shape comes from the arrays given; with none, a scalar.  `I[]` is always a scalar.
    any_shape: bool = False


@dataclass(frozen=True)
class OutputName(Node):
    name: str


@dataclass(frozen=True)
class Attribute(Node):
    name: str
    args: tuple[Expr, ...]


@dataclass(frozen=True)
class TensorRef(Node):
    name: str
    idx: tuple[Expr, ...]


@dataclass(frozen=True)
class Constraint(Node):
    poly: Expr
    bound: Expr


@dataclass(frozen=True)
class Contraction(Node):
    output: TensorRef
    sizes: tuple[Expr, ...] | None  # None when the output sizes are left to inference
    agg: str
    comb: str | None
    operands: tuple[TensorRef, ...]
    constraints: tuple[Constraint, ...]
    no_defract: bool
    default: Name | None
    attributes: tuple[Attribute, ...] = ()
    text: str = ""


@dataclass(frozen=True)
class Assignment(Node):
    name: str
    expr: Expr
    attributes: tuple[Attribute, ...] = ()
    text: str = ""


Statement = Contraction | Assignment


@dataclass(frozen=True)
class Function(Node):
    inputs: tuple[Input, ...]
    outputs: tuple[OutputName, ...]
    stmts: tuple[Statement, ...]
    source: Source = field(compare=False, default=Source(""))
