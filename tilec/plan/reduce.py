"""The reduce rewrite: one index variable per output dimension.

A contraction whose output polynomial sums several variables (`O[2*x + k] = +(I[x] * K[k])`)
has several index points per output element, so a kernel cannot give each element one thread.
Reduce changes the basis of the index space: every such output dimension gets a fresh variable
equal to its polynomial, the basis is completed with the remaining variables (smallest range
first, so each thread loops over the short ones), and the inverse is substituted everywhere.
The inverse is rational (`x = o/2 - k/2`): the old variables must stay integral, which the
defract rewrite (`defract.py`) then enforces over the integer lattice.

An output dimension that runs backwards (`O[N - 1 - i]`) gets a fresh variable too, `o = -i`,
because the kernel layout needs positive output strides.

Also here: the substitution and rendering helpers both rewrites share."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction

from ..errors import Source, TileCheckError
from ..lang import ir
from ..lang.bounds import propagate


@dataclass(frozen=True)
class Step:
    """One rewrite: the contraction after it, and how each old variable is written over the
    new ones.  `integral` are polynomials over the new variables that must take integer values
    (the old variables, where the change of basis is not unimodular); the next step honours
    them, so a Step's `op` alone is only the final answer once `integral` is empty."""

    name: str  # "reduce" or "defract"
    op: ir.Contraction
    subst: tuple[tuple[str, ir.Poly], ...]
    added: tuple[ir.Constraint, ...] = ()
    integral: tuple[ir.Poly, ...] = ()
    notes: tuple[str, ...] = field(default=(), compare=False)


def substitute(p: ir.Poly, mapping: Mapping[str, ir.Poly]) -> ir.Poly:
    """Simultaneous substitution (new names may equal old ones)."""
    out = ir.Poly.constant(p.const)
    for v, c in p.terms:
        out = out + mapping.get(v, ir.Poly.index(v)).scale(c)
    return out


def rewrite_op(op: ir.Contraction, mapping: Mapping[str, ir.Poly],
               added: Sequence[ir.Constraint] = ()) -> ir.Contraction:
    """`op` with every polynomial substituted; the statement's text and span are kept because
    the rewritten contraction still computes that statement."""
    out_idx = tuple(substitute(p, mapping) for p in op.out_idx)
    inputs = tuple(replace(a, idx=tuple(substitute(p, mapping) for p in a.idx))
                   for a in op.inputs)
    cons = tuple(replace(c, poly=substitute(c.poly, mapping)) for c in op.constraints)
    cons += tuple(added)
    names = {v for p in out_idx for v in p.indices}
    names |= {v for a in inputs for p in a.idx for v in p.indices}
    names |= {v for c in cons for v in c.poly.indices}
    return replace(op, out_idx=out_idx, inputs=inputs, constraints=cons,
                   indices=tuple(sorted(names)))


def fresh(base: str, taken: set[str]) -> str:
    """`base`, or `base` with a letter appended, that no variable uses yet (and reserve it)."""
    name, k = base, 0
    while name in taken:
        name = f"{base}{'abcdefghijklmnopqrstuvwxyz'[k % 26]}{k // 26 or ''}"
        k += 1
    taken.add(name)
    return name


def is_integral(p: ir.Poly) -> bool:
    return p.const.denominator == 1 and all(c.denominator == 1 for _, c in p.terms)


def needs_reduce(op: ir.Contraction) -> bool:
    """Some output dimension sums several variables, or runs backwards (`O[N - 1 - i]`: the
    layout needs positive output strides, and a fresh `o = -i` gives one)."""
    return any(len(p.terms) > 1 or any(c < 0 for _, c in p.terms) for p in op.out_idx)


def writes_apart(op: ir.Contraction, tensors: Mapping[str, ir.Tensor]) -> bool:
    """Whether each index point writes an output element of its own as the statement is
    written, inside the output: every output dimension's terms are mixed radix (positive
    integer coefficients, each larger than what the smaller terms span), no variable appears
    in two dimensions, and every polynomial is integral.  Such an output needs no change of
    basis: its flat strides address it directly (a reshape that merges dimensions,
    `R[4*i + j : 12] = =(X[i, j])`, is then a plain copy).  The reduce rewrite would make each
    element's thread search the lattice of old points for its one point: 9 nested loops with
    constraints for a reshape of 7 dimensions into one, 20 s where a copy takes microseconds."""
    # Every polynomial integral: a fractional one (in a constraint too) is a floor division
    # that the interval bounds below would take as exact.
    if any(not is_integral(p) for p in op.out_idx) or \
            any(not is_integral(p) for a in op.inputs for p in a.idx) or \
            any(not is_integral(c.poly) for c in op.constraints):
        return False
    rows = [(p, 0, size - 1) for a in op.inputs
            for p, size in zip(a.idx, tensors[a.tensor].shape, strict=True)]
    rows += [(c.poly, 0, c.bound - 1) for c in op.constraints]
    box = propagate(rows, op.indices)
    seen: set[str] = set()
    for p, size in zip(op.out_idx, tensors[op.output].shape, strict=True):
        terms = sorted((int(c), v) for v, c in p.terms)
        if any(c <= 0 for c, _ in terms) or seen & {v for _, v in terms}:
            return False
        seen |= {v for _, v in terms}
        lo = hi = int(p.const)
        for c, v in terms:
            a, b = box[v]
            if not (math.isfinite(a) and math.isfinite(b)) or a > b or c <= hi - lo:
                return False
            lo, hi = lo + c * int(a), hi + c * int(b)
        if lo < 0 or hi > size - 1:
            return False
    return True


def _primitive(p: ir.Poly) -> dict[str, int]:
    """The linear part of p as coprime integers with their signs: p = g * row + const, g > 0."""
    den = math.lcm(*(c.denominator for _, c in p.terms))
    ints = {v: int(c * den) for v, c in p.terms}
    g = math.gcd(*ints.values())
    return {v: c // g for v, c in ints.items()}


def reduce(op: ir.Contraction, tensors: Mapping[str, ir.Tensor], *,
           source: Source | None = None) -> Step | None:
    """The reduce step for `op`, or None when every output dimension is a lone variable with a
    positive coefficient (or a constant).  Raises TileCheckError when an index has no bound."""
    if not needs_reduce(op) or writes_apart(op, tensors):
        return None
    import sympy  # only here: most programs need no rewrite, and sympy is slow to import

    width = _widths(op, tensors, source)
    taken = set(op.indices)
    rows: list[dict[str, int]] = []  # the new variables' definitions, as rows over op.indices
    names: list[str] = []
    notes: list[str] = []

    def independent(row: Mapping[str, int]) -> bool:
        m = sympy.Matrix([[r.get(v, 0) for v in op.indices] for r in [*rows, row]])
        return m.rank() == len(rows) + 1

    for d, p in enumerate(op.out_idx):
        if p.is_constant:
            continue
        row = _primitive(p)
        if not independent(row):
            continue
        if len(row) == 1 and next(iter(row.values())) == 1:
            names.append(next(iter(row)))  # a lone variable keeps its name
        else:
            name = fresh(f"{op.output.lower()}{d}", taken)
            names.append(name)
            notes.append(f"{name} = {ir.Poly.make(row)}")
        rows.append(row)
    # The remaining variables that complete the basis keep their names; taking the shortest
    # ranges first makes them the loops of each output element's thread.
    by_range = sorted(op.indices, key=lambda v: (width[v], v))
    for v in by_range:
        if len(rows) == len(op.indices):
            break
        if independent({v: 1}):
            rows.append({v: 1})
            names.append(v)
    m = sympy.Matrix([[r.get(v, 0) for v in op.indices] for r in rows])
    inv = m.inv()
    mapping = {}
    for i, v in enumerate(op.indices):
        terms = {names[j]: _fraction(inv[i, j]) for j in range(len(names))}
        mapping[v] = ir.Poly.make(terms)
    unimodular = abs(m.det()) == 1
    integral = () if unimodular else tuple(
        q for v, q in mapping.items() if not is_integral(q))
    new = rewrite_op(op, mapping)
    subst = tuple((v, q) for v, q in mapping.items() if q != ir.Poly.index(v))
    return Step("reduce", new, subst, (), integral, tuple(notes))


def _widths(op: ir.Contraction, tensors: Mapping[str, ir.Tensor],
            source: Source | None) -> dict[str, float]:
    """A sound interval width of every variable (the order that completes the basis)."""
    rows = [(p, 0, size - 1) for p, size in zip(op.out_idx, tensors[op.output].shape,
                                                 strict=True)]
    rows += [(p, 0, size - 1) for a in op.inputs
             for p, size in zip(a.idx, tensors[a.tensor].shape, strict=True)]
    rows += [(c.poly, 0, c.bound - 1) for c in op.constraints]
    box = propagate(rows, op.indices)
    if all(lo <= hi for lo, hi in box.values()):  # an empty system is flatten's to report
        for v, (lo, hi) in box.items():
            if not (math.isfinite(lo) and math.isfinite(hi)):
                stmt = op.text or f"the contraction that writes {op.output}"
                raise TileCheckError(f"index '{v}' is unbounded: no access or constraint "
                                     f"limits it in `{stmt}`", source=source, span=op.span)
    return {v: float(hi - lo) for v, (lo, hi) in box.items()}


def _fraction(x) -> Fraction:  # noqa: ANN001 - a sympy Rational
    return Fraction(int(x.p), int(x.q))


# Rendering -----------------------------------------------------------------------------------

def fmt(p: ir.Poly) -> str:
    """A polynomial over one common denominator, `(x - k + 1)/2`, as Tile users write it."""
    den = math.lcm(*(c.denominator for _, c in p.terms), p.const.denominator)
    if den == 1:
        return str(p)
    top = str(p.scale(den))
    return f"{top}/{den}" if len(p.terms) + (p.const != 0) == 1 \
        else f"({top})/{den}"


def render(op: ir.Contraction, tensors: Mapping[str, ir.Tensor]) -> str:
    """The contraction as Tile text."""
    shape = tensors[op.output].shape
    idx = ", ".join(map(fmt, op.out_idx))
    sizes = " : " + ", ".join(map(str, shape)) if shape else ""
    refs = [f"{a.tensor}[{', '.join(map(fmt, a.idx))}]" for a in op.inputs]
    if op.comb == "?":
        body = f"{refs[0]} == {refs[1]} ? {refs[2]}"
    else:
        body = f" {op.comb} ".join(refs) if op.comb is not None else refs[0]
    cons = "".join(f", {fmt(c.poly)} < {c.bound}" for c in op.constraints)
    tail = (" no_defract" if op.no_defract else "") + \
        (f" default {op.default}" if op.default else "")
    return f"{op.output}[{idx}{sizes}] = {op.agg}({body}){cons}{tail}"


def table(op: ir.Contraction, tensors: Mapping[str, ir.Tensor]) -> list[str]:
    """Index polynomials per access, one dimension per column, then the constraints."""
    rows = [(op.output, op.out_idx)] + [(a.tensor, a.idx) for a in op.inputs]
    cells = {k: [fmt(p) for p in idx] for k, (_, idx) in enumerate(rows)}
    width = max((len(c) for row in cells.values() for c in row), default=1)
    lines = [f"{name:>8} | " + " | ".join(f"{c:<{width}}" for c in cells[k])
             + f"   {list(tensors[name].shape)}" for k, (name, _) in enumerate(rows)]
    lines += [f"{'':>8}   0 <= {fmt(c.poly)} < {c.bound}" for c in op.constraints]
    return lines


def describe_steps(original: ir.Contraction, steps: Sequence[Step],
                   tensors: Mapping[str, ir.Tensor]) -> str:
    """What `tilec explain` shows: the index table before and after each rewrite."""
    lines = ["as written:", *table(original, tensors)]
    for s in steps:
        what = {"reduce": "reduce (one variable per output dimension)",
                "defract": "defract (only integral index points)"}[s.name]
        lines.append(f"after {what}:")
        lines += [f"{'':>11}{n}" for n in s.notes]
        lines += [f"{'':>11}{v} = {fmt(q)}" for v, q in s.subst]
        if s.integral:
            lines.append(f"{'':>11}kept integral by defract: "
                         + ", ".join(fmt(q) for q in s.integral))
        lines += table(s.op, tensors)
    if steps:
        lines.append("as Tile: " + render(steps[-1].op, tensors))
    return "\n".join(lines)
