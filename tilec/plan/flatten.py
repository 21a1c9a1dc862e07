"""Flatten one contraction: exact integer bounds of every index variable, per-tensor stride
tables with constant offsets, the constraints the index box does not imply, and PlaidML's fusion
of output indices that always move together.

An index point's original values are `min + k` for the zero-based flat indices `k`; the set of
points is exactly the flat box intersected with the kept constraints.  That holds because the box
contains every integer point of the constraint polytope (its bounds are at least as tight as the
rational LP's, rounded in, and never cut an integer point), and a half-constraint is only dropped
when every box point satisfies it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from fractions import Fraction

from ..errors import Source, Span, TileCheckError
from ..lang import ir
from .flat import FlatConstraint, FlatContraction, FlatTensor

# A half-constraint over the original variables: sum(coef * var) <= rhs, integer and reduced.
Half = tuple[tuple[tuple[str, int], ...], int]

# The coverage witness search gives up (answers "not covered") beyond this many candidates.
_WITNESS_LIMIT = 4096


def flatten(op: ir.Contraction, tensors: Mapping[str, ir.Tensor], *,
            broadcast_shapes: Sequence[tuple[int, ...]] = (),
            source: Source | None = None,
            placed: Mapping[str, tuple[int, ...]] | None = None,
            placed_operands: Sequence[tuple[tuple[int, ...], tuple[int, ...]]] = ()
            ) -> FlatContraction:
    """The flat form of `op`.

    `broadcast_shapes` are the shapes of post-op operands that `operand_strides` will later be
    asked about: fusing two output indices is skipped where it would make such a read non-affine.
    `placed` gives the element strides of tensors that live in a larger buffer
    (`plan.placement`) and `placed_operands` the (shape, strides) of such post-op operands and
    results, read or written at the output element: fusion keeps those addresses affine too.  The
    tensors' tables here stay row-major (`with_storage` addresses them in their buffers).
    `source`, when given, makes errors show the statement's line with a caret.
    """
    accesses = [(op.output, op.out_idx, op.span)] + [(a.tensor, a.idx, a.span or op.span)
                                                     for a in op.inputs]
    halves: list[Half] = []
    for name, idx, span in accesses:
        shape = tensors[name].shape
        if len(idx) != len(shape):
            raise _error(op, f"{name} has rank {len(shape)} but is accessed with {len(idx)} "
                             "indices", source, span)
        for p, size in zip(idx, shape, strict=True):
            if any(c.denominator != 1 for _, c in p.terms) or p.const.denominator != 1:
                raise _error(op, f"the index polynomial {p} of {name} has fractional "
                                 "coefficients; that needs defract (not supported yet)",
                             source, span)
            halves += _halves(op, p, size, source, span)
    for c in op.constraints:
        halves += _halves(op, c.poly, c.bound, source, c.span or op.span)

    bounds = _bounds(op, halves, source)
    mins = {v: lo for v, (lo, _) in bounds.items()}
    ranges = {v: hi - lo + 1 for v, (lo, hi) in bounds.items()}
    live = [v for v in op.indices if ranges[v] > 1]

    tables = [_table(idx, _rowmajor(tensors[name].shape), mins) for name, idx, _ in accesses]
    kept = _kept(op, halves, mins, ranges, live, source)
    covered = _covered(op.out_idx, tensors[op.output].shape, mins, ranges, live, kept)

    out_shape = tensors[op.output].shape
    extra = [_table(op.out_idx, _broadcast_weights(s, out_shape), mins) for s in broadcast_shapes]
    extra += [_table(idx, placed[name], mins) for name, idx, _ in accesses
              if placed and name in placed]
    extra += [_table(op.out_idx, _broadcast_weights(s, out_shape, st), mins)
              for s, st in placed_operands]
    entries = _fuse(live, ranges, [t[0] for t in tables], [t[0] for t in extra], kept)

    names = tuple(sorted(entries))
    flat_tensors = tuple(
        FlatTensor(name, tuple(entries[n][2][i] for n in names), tables[i][1],
                   tensors[name].dtype, tensors[name].size)
        for i, (name, _, _) in enumerate(accesses))
    constraints = tuple(FlatConstraint(tuple(coeffs.get(n, 0) for n in names), rhs)
                        for coeffs, rhs in kept)
    return FlatContraction(
        names=names,
        ranges=tuple(entries[n][0] for n in names),
        tensors=flat_tensors,
        constraints=constraints,
        agg=op.agg,
        comb=op.comb,
        mins=tuple(mins[n] if n in mins else 0 for n in names),
        fused=tuple((n, entries[n][1]) for n in names if len(entries[n][1]) > 1),
        output_covered=covered,
        text=op.text,
        index_bounds=tuple((v, mins[v], ranges[v]) for v in op.indices),
    )


def _error(op: ir.Contraction, message: str, source: Source | None,
           span: Span | None = None) -> TileCheckError:
    span = span or op.span
    where = f" (line {span.line}, column {span.col})" if span is not None and source is None else ""
    stmt = op.text or f"the contraction that writes {op.output}"
    return TileCheckError(f"{message} in `{stmt}`{where}", source=source, span=span)


def _reduce(coeffs: Mapping[str, Fraction | int], rhs: Fraction | int) -> Half:
    """sum(coeffs) <= rhs with integer coefficients sharing no factor; flooring the right side
    is exact because the left side is an integer at every integer point."""
    if rhs.denominator == 1 and all(c.denominator == 1 for c in coeffs.values()):
        # Integers throughout (nearly every index of a model): the same result without
        # Fraction arithmetic, a third of a model's flattening time.
        nums = {k: c.numerator for k, c in coeffs.items() if c != 0}
        g = math.gcd(*nums.values()) if nums else 1
        return (tuple(sorted((k, c // g) for k, c in nums.items())), rhs.numerator // g)
    den = math.lcm(*(c.denominator for c in coeffs.values()), 1)
    ints = {k: int(c * den) for k, c in coeffs.items() if c != 0}
    g = math.gcd(*ints.values()) if ints else 1
    return (tuple(sorted((k, c // g) for k, c in ints.items())), math.floor(rhs * den / g))


def _halves(op: ir.Contraction, p: ir.Poly, bound: int, source: Source | None,
            span: Span | None) -> list[Half]:
    # `p < bound` is taken literally at integer points, so a fractional p is scaled by the lcm of
    # its denominators first (den*p is an integer there): den*p <= den*bound - 1.
    den = math.lcm(*(c.denominator for _, c in p.terms), p.const.denominator)
    if den == 1:  # integer coefficients: the same halves in integer arithmetic
        const = p.const.numerator
        lower = _reduce({k: -c.numerator for k, c in p.terms}, const)
        upper = _reduce({k: c.numerator for k, c in p.terms}, bound - 1 - const)
    else:
        lower = _reduce({k: -c for k, c in p.terms}, p.const)
        upper = _reduce({k: c * den for k, c in p.terms},
                        Fraction(den * bound - 1) - p.const * den)
    if p.is_constant:
        if not (lower[1] >= 0 and upper[1] >= 0):
            raise _error(op, f"the constant index {p} is outside 0 .. {bound - 1}", source, span)
        return []
    return [lower, upper]


def _bounds(op: ir.Contraction, halves: list[Half],
            source: Source | None) -> dict[str, tuple[int, int]]:
    """Integer (min, max) of every index.  Variables linked by no constraint are bounded
    separately, so most indices need no elimination at all."""
    parent = {v: v for v in op.indices}

    def root(v: str) -> str:
        while parent[v] != v:
            v = parent[v]
        return v

    for coeffs, _ in halves:
        for (a, _), (b, _) in itertools.pairwise(coeffs):
            parent[root(a)] = root(b)
    groups: dict[str, list[str]] = {}
    for v in op.indices:
        groups.setdefault(root(v), []).append(v)

    empty = "has an empty range: no integer value satisfies every access and constraint"
    out: dict[str, tuple[int, int]] = {}
    for group in groups.values():
        rows = [h for h in halves if h[0] and root(h[0][0][0]) == root(group[0])]
        for v in group:
            lo: int | None = None
            hi: int | None = None
            projected = _project(rows, v)
            if projected is None:
                raise _error(op, f"index '{v}' {empty}", source)
            for ((_, a),), r in projected:  # reduced rows on v alone: a is 1 or -1
                if a > 0:
                    hi = r if hi is None else min(hi, r)
                else:
                    lo = -r if lo is None else max(lo, -r)
            if lo is None or hi is None:
                raise _error(op, f"index '{v}' is unbounded: no access or constraint limits it",
                             source)
            if hi < lo:
                raise _error(op, f"index '{v}' {empty}", source)
            out[v] = (lo, hi)
    return out


def _project(rows: list[Half], keep: str) -> list[Half] | None:
    """Fourier-Motzkin elimination of every variable but `keep`; None when the rows conflict.

    Every combined row is reduced to integer coefficients with its right side floored, which
    keeps every integer point and is at least as tight as the rational LP bound.  (sympy 1.14's
    simplex was tried first and called some feasible systems empty.)  Parallel rows collapse to
    the tightest, which keeps the row count small for index systems."""
    cur: dict[tuple[tuple[str, int], ...], int] = {}
    for coeffs, rhs in rows:
        cur[coeffs] = min(rhs, cur.get(coeffs, rhs))
    while True:
        names = {u for coeffs in cur for u, _ in coeffs} - {keep}
        if not names:
            return list(cur.items())
        # Eliminating the variable with the fewest (positive, negative) pairs first keeps the
        # row count down.
        ups = {w: 0 for w in names}
        downs = dict(ups)
        for coeffs in cur:
            for w, c in coeffs:
                if w in names:
                    (ups if c > 0 else downs)[w] += 1
        u = min(sorted(names), key=lambda w: ups[w] * downs[w])
        pos, neg, nxt = [], [], {}
        for coeffs, rhs in cur.items():
            c = dict(coeffs).get(u, 0)
            if c > 0:
                pos.append((coeffs, rhs, c))
            elif c < 0:
                neg.append((coeffs, rhs, -c))
            else:
                nxt[coeffs] = rhs
        for (cp, rp, a), (cn, rn, b) in itertools.product(pos, neg):
            sum_: dict[str, Fraction] = {}
            for w, c in cp:
                sum_[w] = sum_.get(w, Fraction(0)) + b * c
            for w, c in cn:
                sum_[w] = sum_.get(w, Fraction(0)) + a * c
            coeffs, rhs = _reduce(sum_, Fraction(b * rp + a * rn))
            if not coeffs:
                if rhs < 0:
                    return None
                continue
            nxt[coeffs] = min(rhs, nxt.get(coeffs, rhs))
        cur = nxt


def _rowmajor(shape: tuple[int, ...]) -> tuple[int, ...]:
    return ir.Tensor("", shape).strides


def _broadcast_weights(shape: tuple[int, ...], out_shape: tuple[int, ...],
                       strides: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """Per output dim, the element stride of a numpy-broadcast operand (0 where it repeats);
    `strides` are the operand's own (row-major when not given)."""
    lead = len(out_shape) - len(shape)
    if lead < 0 or any(s not in (1, o) for s, o in zip(shape, out_shape[lead:], strict=True)):
        raise ValueError(f"shape {shape} does not broadcast to the output shape {out_shape}")
    strides = _rowmajor(shape) if strides is None else strides
    return (0,) * lead + tuple(0 if s == 1 else st for s, st in zip(shape, strides, strict=True))


def _table(idx: Sequence[ir.Poly], weights: Sequence[int],
           mins: Mapping[str, int]) -> tuple[dict[str, int], int]:
    """Stride of every index variable and the offset at the flat origin, for a tensor read at
    `idx` whose dims have element strides `weights`."""
    # Integers where the polynomial's coefficients are (Fractions cost a model's flattening
    # a tenth of its time); a fractional one makes its sums Fractions, exact as before.
    strides: dict[str, Fraction | int] = {v: 0 for v in mins}
    offset: Fraction | int = 0
    for p, w in zip(idx, weights, strict=True):
        offset += _plain(p.const) * w
        for v, c in p.terms:
            strides[v] += _plain(c) * w
    offset += sum(s * mins[v] for v, s in strides.items())
    return {v: int(s) for v, s in strides.items()}, int(offset)


def _plain(c: Fraction) -> Fraction | int:
    return c.numerator if c.denominator == 1 else c


def _kept(op: ir.Contraction, halves: list[Half], mins: Mapping[str, int],
          ranges: Mapping[str, int], live: list[str],
          source: Source | None) -> list[tuple[dict[str, int], int]]:
    """The half-constraints the box does not imply, over the flat indices, merged by direction."""
    merged: dict[tuple[tuple[str, int], ...], int] = {}
    for coeffs, rhs in halves:
        # The folded (single-valued) indices are constant, so they only move the right side.
        shifted = rhs - sum(c * mins[v] for v, c in coeffs)
        key, rhs2 = _reduce({v: Fraction(c) for v, c in coeffs if v in live}, Fraction(shifted))
        top = sum(c * (ranges[v] - 1) for v, c in key if c > 0)
        low = sum(c * (ranges[v] - 1) for v, c in key if c < 0)
        if low > rhs2:
            raise _error(op, "no index point satisfies every access and constraint", source)
        if top <= rhs2:
            continue
        merged[key] = min(rhs2, merged.get(key, rhs2))
    return [(dict(k), r) for k, r in merged.items()]


def _covered(out_idx: Sequence[ir.Poly], out_shape: tuple[int, ...], mins: Mapping[str, int],
             ranges: Mapping[str, int], live: list[str],
             kept: list[tuple[dict[str, int], int]]) -> bool:
    """Sound test that every output element is written: each output dim is ±one distinct index
    that sweeps exactly [0, dim), and one fixed choice of the other indices satisfies the kept
    constraints for every output point (the conv's halo constraints pass with i = 1)."""
    outs: list[str] = []
    for p, size in zip(out_idx, out_shape, strict=True):
        if p.is_constant:
            if size != 1:
                return False
            continue
        if len(p.terms) != 1:
            return False
        v, c = p.terms[0]
        if abs(c) != 1 or v in outs:
            return False
        ends = {p.const + c * mins[v], p.const + c * (mins[v] + ranges[v] - 1)}
        if ends != {0, size - 1} or ranges[v] != size:
            return False
        outs.append(v)
    # Indices that no kept constraint mentions can take any value of their (non-empty) box.
    rest = [v for v in live if v not in outs and any(v in coeffs for coeffs, _ in kept)]
    # For all output points: sum(c_r * r) <= rhs - max over the output box of sum(c_o * o).
    need: list[tuple[dict[str, int], int]] = []
    for coeffs, rhs in kept:
        worst = sum(max(0, c * (ranges[v] - 1)) for v, c in coeffs.items() if v in outs)
        need.append(({v: c for v, c in coeffs.items() if v in rest}, rhs - worst))
    box = {v: [0, ranges[v] - 1] for v in rest}
    for _ in range(len(rest) * len(need) + 1):
        for coeffs, rhs in need:
            for v, c in coeffs.items():
                others = sum(min(d * box[u][0], d * box[u][1])
                             for u, d in coeffs.items() if u != v)
                if c > 0:
                    box[v][1] = min(box[v][1], (rhs - others) // c)
                else:
                    box[v][0] = max(box[v][0], -((rhs - others) // -c))
        if any(lo > hi for lo, hi in box.values()):
            return False
    if math.prod(hi - lo + 1 for lo, hi in box.values()) > _WITNESS_LIMIT:
        return False
    axes = [range(box[v][0], box[v][1] + 1) for v in rest]
    return any(all(sum(c * point[rest.index(v)] for v, c in coeffs.items()) <= rhs
                   for coeffs, rhs in need)
               for point in itertools.product(*axes))


def _fuse(live: list[str], ranges: Mapping[str, int], tables: list[dict[str, int]],
          extra: list[dict[str, int]], kept: list[tuple[dict[str, int], int]],
          ) -> dict[str, tuple[int, tuple[str, ...], list[int]]]:
    """name -> (range, original names major first, strides per tensor) after PlaidML's
    SimplifyFlat: a and b fuse when stride_a == range_b * stride_b in every tensor (and in every
    broadcast post-op operand), both are output indices and no kept constraint mentions them."""
    constrained = {v for coeffs, _ in kept for v in coeffs}
    every = tables + extra
    entries = {v: (ranges[v], (v,), [t[v] for t in every]) for v in live}
    changed = True
    while changed:
        changed = False
        for a, b in itertools.permutations(sorted(entries), 2):
            ra, la, sa = entries[a]
            rb, lb, sb = entries[b]
            if a in constrained or b in constrained or sa[0] == 0 or sb[0] == 0:
                continue
            name = f"{a}_{b}"
            if name in entries or name in ranges:
                continue
            if all(x == rb * y for x, y in zip(sa, sb, strict=True)):
                del entries[a], entries[b]
                entries[name] = (ra * rb, la + lb, sb)
                changed = True
                break
    return {n: (r, leaves, s[:len(tables)]) for n, (r, leaves, s) in entries.items()}


def operand_strides(out_idx: tuple[ir.Poly, ...], flat: FlatContraction, shape: tuple[int, ...],
                    out_shape: tuple[int, ...], strides: tuple[int, ...] | None = None
                    ) -> tuple[tuple[int, ...], int]:
    """Strides (per flat index) and offset of a tensor of `shape`, numpy-broadcast against the
    output (`out_shape`) and read at the output element that each contraction point writes.
    `strides`: the tensor's element strides where it lives in a larger buffer.

    Raises ValueError when the shape does not broadcast, or when a fused index would need a
    non-affine read (pass the shape to `flatten(broadcast_shapes=...)` to keep such indices apart).
    """
    return access_table(out_idx, flat, _broadcast_weights(shape, out_shape, strides))


def access_table(idx: Sequence[ir.Poly], flat: FlatContraction,
                 weights: Sequence[int]) -> tuple[tuple[int, ...], int]:
    """Strides (per flat index) and offset of an access at `idx` to a tensor whose dims have
    element strides `weights`, over the flat indices of `flat`."""
    info = {v: (lo, r) for v, lo, r in flat.index_bounds}
    strides, offset = _table(idx, weights, {v: lo for v, (lo, _) in info.items()})
    leaves = dict(flat.fused)
    out = []
    for name in flat.names:
        parts = leaves.get(name, (name,))
        for hi, lo in itertools.pairwise(parts):
            if strides[hi] != info[lo][1] * strides[lo]:
                raise ValueError(f"an access with element strides {tuple(weights)} cannot be "
                                 f"read over the fused index {name}; flatten with its strides")
        out.append(strides[parts[-1]])
    return tuple(out), offset


def with_storage(flat: FlatContraction, op: ir.Contraction, tensors: Mapping[str, ir.Tensor],
                 placed: Mapping[str, tuple[str, int, tuple[int, ...]]]) -> FlatContraction:
    """`flat` with the tensors that live in a larger buffer addressed there: `placed` maps a
    tensor to (root tensor, element offset of its origin, element strides), and its table
    becomes the root's, with the offset a constant of the table (flatten with `placed` first,
    so the fused indices stay affine)."""
    idxs = [op.out_idx] + [a.idx for a in op.inputs]
    out = []
    for t, idx in zip(flat.tensors, idxs, strict=True):
        if t.name not in placed:
            out.append(t)
            continue
        root, base, weights = placed[t.name]
        strides, offset = access_table(idx, flat, weights)
        out.append(FlatTensor(root, strides, base + offset, t.dtype, tensors[root].size))
    return replace(flat, tensors=tuple(out))


def describe(flat: FlatContraction) -> str:
    """The stride table and the kept constraints, for `tilec explain`; a lower and an upper half
    of the same form are shown together as `0 <= expr < bound`, like the Tile source."""
    lines = [flat.table()]
    for name, parts in flat.fused:
        lines.append(f"{name} fuses {', '.join(parts)} (row-major, the last moves fastest)")
    cons = list(flat.constraints)
    used = [False] * len(cons)
    for i, c in enumerate(cons):
        if used[i]:
            continue
        used[i] = True
        neg = tuple(-x for x in c.coeffs)
        j = next((j for j in range(i + 1, len(cons))
                  if not used[j] and cons[j].coeffs == neg), None)
        if j is None:
            lines.append(flat.constraint_text(c))
            continue
        used[j] = True
        up, down = (c, cons[j]) if next(x for x in c.coeffs if x) > 0 else (cons[j], c)
        lo = -down.rhs  # lo <= expr <= up.rhs
        expr = ir.Poly.make(dict(zip(flat.names, up.coeffs, strict=True)), -lo)
        lines.append(f"0 <= {expr} < {up.rhs - lo + 1}")
    if not flat.output_covered:
        lines.append("output not provably covered: it is initialised before the contraction")
    return "\n".join(lines)
