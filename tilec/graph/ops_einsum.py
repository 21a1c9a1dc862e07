"""Einstein summation for the graph frontend: `einsum(equation, *values)` with numpy's and
ONNX's equation language (implicit output, explicit `->`, `...` for broadcast dimensions, a
label repeated on one operand for a diagonal), lowered to Tile contractions.

Tile's contractions are einsums with named indices, so the lowering is direct:

- two operands are ONE contraction, `O[i, k : I, K] = +(A[i, j] * B[j, k])`, whatever the
  labels' order, so a batched matmul, an outer product or a transposed product each become one
  tiled contraction kernel with no copies around it;
- one operand is a copy (`=`, a transposition or a diagonal, `A[i, i]`) or a sum (`+`);
- three or more operands are contracted a pair at a time, always the pair whose result is
  smallest (a greedy order, as opt_einsum's), each pair keeping only the labels that the output
  or another remaining operand still needs.

A size-1 dimension broadcasts against the same label's larger size (numpy's rule): it is read
at 0.  An operand with no elements makes the result zeros (a sum over nothing)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import TileError
from . import ops
from .core import Node, Value
from .emit import Emitter

_ELLIPSIS = "..."


@dataclass(frozen=True)
class Spec:
    """A parsed equation: each operand's label per axis, the output's labels, each label's
    size (the largest among the operands: size 1 broadcasts).  Ellipsis dimensions have the
    labels "...0", "...1", .. counted from the left of the widest ellipsis."""

    operands: tuple[tuple[str, ...], ...]
    output: tuple[str, ...]
    sizes: Mapping[str, int]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.sizes[x] for x in self.output)


def _tokens(term: str, equation: str) -> list[str]:
    """A term's labels: letters, and "..." as one token (at most once)."""
    out: list[str] = []
    rest = term
    while rest:
        if rest.startswith(_ELLIPSIS):
            if _ELLIPSIS in out:
                raise TileError(f"einsum {equation!r}: '...' appears twice in the term "
                                f"{term!r}")
            out.append(_ELLIPSIS)
            rest = rest[3:]
        elif rest[0].isascii() and rest[0].isalpha():
            out.append(rest[0])
            rest = rest[1:]
        else:
            raise TileError(f"einsum {equation!r}: {rest[0]!r} is not a label (labels are "
                            "letters a-z, A-Z, and '...')")
    return out


def parse(equation: str, shapes: Sequence[Sequence[int]]) -> Spec:
    """The labels of `equation` for operands of `shapes` (spaces are ignored)."""
    eq = "".join(equation.split())
    if eq.count("->") > 1:
        raise TileError(f"einsum {equation!r}: more than one '->'")
    lhs, arrow, rhs = eq.partition("->")
    terms = [_tokens(t, equation) for t in lhs.split(",")]
    if len(terms) != len(shapes):
        raise TileError(f"einsum {equation!r}: {len(terms)} operand terms for {len(shapes)} "
                        "operands")
    widths = []
    for k, (term, shape) in enumerate(zip(terms, shapes, strict=True)):
        letters = len(term) - term.count(_ELLIPSIS)
        width = len(shape) - letters
        if width < 0 or (width and _ELLIPSIS not in term):
            raise TileError(f"einsum {equation!r}: operand {k} has shape {list(shape)}, but "
                            f"its term {''.join(term)!r} names {letters} dimensions")
        widths.append(width if _ELLIPSIS in term else 0)
    ell = max(widths, default=0)
    operands = []
    for term, width in zip(terms, widths, strict=True):
        labels: list[str] = []
        for t in term:
            labels += [f"...{ell - width + j}" for j in range(width)] if t == _ELLIPSIS else [t]
        operands.append(tuple(labels))
    sizes: dict[str, int] = {}
    for k, (labels, shape) in enumerate(zip(operands, shapes, strict=True)):
        for x, n in zip(labels, shape, strict=True):
            m = sizes.setdefault(x, int(n))
            if m != n and 1 not in (m, n):
                what = "a '...' dimension" if x.startswith(_ELLIPSIS) else f"label {x!r}"
                raise TileError(f"einsum {equation!r}: {what} has size {m} and size {n} "
                                f"(operand {k}); sizes must agree or be 1")
            sizes[x] = max(m, int(n))
    dots = tuple(f"...{j}" for j in range(ell))
    if arrow:
        out = _tokens(rhs, equation)
        letters = [t for t in out if t != _ELLIPSIS]
        if len(set(letters)) != len(letters):
            raise TileError(f"einsum {equation!r}: the output repeats a label")
        unknown = [t for t in letters if t not in sizes]
        if unknown:
            raise TileError(f"einsum {equation!r}: output label {unknown[0]!r} is not on any "
                            "operand")
        if ell and _ELLIPSIS not in out:
            # numpy refuses this too: summing the broadcast dimensions away is not implied.
            raise TileError(f"einsum {equation!r}: the operands have '...' dimensions but the "
                            "output does not say where they go")
        output: list[str] = []
        for t in out:
            output += list(dots) if t == _ELLIPSIS else [t]
    else:
        # Implicit output: the broadcast dimensions, then the labels used once, sorted.
        counts: dict[str, int] = {}
        for labels in operands:
            for x in labels:
                counts[x] = counts.get(x, 0) + 1
        output = list(dots) + sorted(x for x, c in counts.items()
                                     if c == 1 and not x.startswith(_ELLIPSIS))
    return Spec(tuple(operands), tuple(output), sizes)


def _contract(values: Sequence[Value], labels: Sequence[tuple[str, ...]],
              output: tuple[str, ...], equation: str) -> Value:
    """One einsum node: `values` (1 or 2) with their axes' labels -> `output`."""
    sizes: dict[str, int] = {}
    for v, ls in zip(values, labels, strict=True):
        for x, n in zip(ls, v.shape, strict=True):
            sizes[x] = max(sizes.get(x, 1), n)
    shape = tuple(sizes[x] for x in output)
    if len(values) == 1 and labels[0] == output:
        return ops.identity(values[0])
    # Tile index names by first appearance; a broadcast (size 1) axis is read at 0.
    order = dict.fromkeys([*output, *(x for ls in labels for x in ls)])
    names = {x: f"i{k}" for k, x in enumerate(order)}
    subs = tuple(tuple("0" if n == 1 and sizes[x] > 1 else names[x]
                       for x, n in zip(ls, v.shape, strict=True))
                 for v, ls in zip(values, labels, strict=True))
    return values[0].graph.add_node("einsum", list(values), shape, values[0].dtype,
                                    subscripts=subs, output=tuple(names[x] for x in output),
                                    equation=equation)


def _pair_order(labels: list[tuple[str, ...]], output: tuple[str, ...],
                sizes: Mapping[str, int]) -> tuple[int, int, tuple[str, ...]]:
    """The pair of operands to contract next (the smallest result, then the fewest
    multiply-adds) and the labels its result keeps."""
    best: tuple[tuple[int, int], int, int, tuple[str, ...]] | None = None
    for i in range(len(labels)):
        for j in range(i + 1, len(labels)):
            rest = set(output).union(*(ls for k, ls in enumerate(labels) if k not in (i, j)))
            both = tuple(dict.fromkeys(labels[i] + labels[j]))
            keep = tuple(x for x in both if x in rest)
            cost = (math.prod(sizes[x] for x in keep), math.prod(sizes[x] for x in both))
            if best is None or cost < best[0]:
                best = (cost, i, j, keep)
    assert best is not None
    return best[1], best[2], best[3]


def einsum(equation: str, *values: Value) -> Value:
    """numpy.einsum / ONNX Einsum over graph values (any number, at least one)."""
    if not values:
        raise TileError(f"einsum {equation!r}: no operands")
    if not all(isinstance(v, Value) for v in values):
        raise TileError(f"einsum {equation!r}: operands must be graph values")
    dtypes = {v.dtype for v in values}
    if len(dtypes) > 1 or "bool" in dtypes:
        raise TileError(f"einsum {equation!r}: operands must share one numeric type, got "
                        f"{', '.join(sorted(dtypes))}")
    spec = parse(equation, [v.shape for v in values])
    g, dtype = values[0].graph, values[0].dtype
    if any(math.prod(v.shape) == 0 for v in values):
        return g.constant(np.zeros(spec.shape), dtype=dtype)  # sums over nothing
    vals, labels = list(values), list(spec.operands)
    while len(vals) > 2:
        i, j, keep = _pair_order(labels, spec.output, spec.sizes)
        merged = _contract([vals[i], vals[j]], [labels[i], labels[j]], keep, equation)
        vals = [v for k, v in enumerate(vals) if k not in (i, j)] + [merged]
        labels = [ls for k, ls in enumerate(labels) if k not in (i, j)] + [keep]
    return _contract(vals, labels, spec.output, equation)


# lowering -----------------------------------------------------------------------------------------

def _emit(em: Emitter, node: Node) -> None:
    subs: Sequence[Sequence[str]] = node.get("subscripts")  # type: ignore[assignment]
    out: Sequence[str] = node.get("output")  # type: ignore[assignment]
    reads = [f"{em.ref(v)}[{', '.join(s)}]" for v, s in zip(node.inputs, subs, strict=True)]
    used = {x for s in subs for x in s if x != "0"}
    # A single operand with nothing summed is a copy (each output element written once).
    agg = "=" if len(reads) == 1 and used <= set(out) else "+"
    dims = ", ".join(str(n) for n in node.shape)
    target = f"{em.define(node)}[{', '.join(out)} : {dims}]" if out else f"{em.define(node)}[]"
    em.stmt(f"{target} = {agg}({' * '.join(reads)});")


EINSUM_EMITTERS: dict[str, Callable[[Emitter, Node], None]] = {"einsum": _emit}

__all__ = ["EINSUM_EMITTERS", "Spec", "einsum", "parse"]
