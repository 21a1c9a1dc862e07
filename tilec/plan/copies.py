"""Chains of copies composed into one: `T[..] = =(X[..]); O[..] = =(T[..])` becomes one copy
from X to O when T is read by nothing else, or only by copies that each compose with it (a
fused projection's q / k / v split: one copy read by three slices becomes three copies of X;
each slice reads its own third, so nothing is read twice).

Layout ops are copies in Tile (a transpose, a reshape, a squeeze, a slice), and exported models
chain them: an attention block reshapes, transposes and reshapes again around every product
(torch's multi-head attention: eight such copies a layer).  Each is a kernel that reads and
writes the whole tensor.  Two copies compose into an affine one when one side of the tensor
between them is *plain* (one distinct index per axis, as a transpose writes and a split reads):

- T written plainly, `T[a, b] = =(X[p(a, b)])`: O reads X at p with a, b replaced by the
  polynomials O read T at;
- T read plainly, `O[f(a, b)] = =(T[a, b])`: O is written at f with a, b replaced by the
  polynomials T was written at.

The composed statement keeps the bounds of T: constraints `0 <= q < n` for each axis of T
(polynomial q, size n), so it touches exactly the elements the two copies did; elements of O
that neither wrote stay 0, as before.  Repeated until no pair is left.  Statements with a
default, constraints on the first copy of a plainly written T, or a T the program returns are
left alone, and so is the first part of a concatenation (the copy a `default` chain starts
from, which `placement` reads as written)."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

from ..lang import ir


def _copy(op: ir.Statement) -> bool:
    return (isinstance(op, ir.Contraction) and op.agg == "=" and op.comb is None
            and len(op.inputs) == 1 and op.default is None and not op.no_defract)


def plain_indices(idx: tuple[ir.Poly, ...]) -> tuple[str, ...] | None:
    """The index names of an access with one distinct index per axis (`T[a, b, c]`), or
    None."""
    names = []
    for p in idx:
        if len(p.terms) != 1 or p.terms[0][1] != 1 or p.const != 0:
            return None
        names.append(p.terms[0][0])
    return tuple(names) if len(set(names)) == len(names) else None


def _subst(p: ir.Poly, env: dict[str, ir.Poly]) -> ir.Poly:
    """All of `env` at once (its values may use the names it replaces)."""
    terms: dict[str, Fraction] = {}
    const = p.const
    for name, c in p.terms:
        if name in env:
            q = env[name]
            const += c * q.const
            for n2, c2 in q.terms:
                terms[n2] = terms.get(n2, Fraction(0)) + c * c2
        else:
            terms[name] = terms.get(name, Fraction(0)) + c
    return ir.Poly.make(terms, const)


def statement_text(op: ir.Contraction, dims: tuple[int, ...]) -> str:
    """Tile text of a contraction a pass made (what its kernel's comment shows)."""
    def idx(ps):
        return ", ".join(str(p) for p in ps)

    reads = f" {op.comb} ".join(f"{a.tensor}[{idx(a.idx)}]" for a in op.inputs)
    cons = "".join(f", {c.poly} < {c.bound}" for c in op.constraints)
    head = f"{op.output}[{idx(op.out_idx)} : {', '.join(map(str, dims))}]" if op.out_idx \
        else f"{op.output}[]"
    return f"{head} = {op.agg}({reads}){cons}"


def _fresh(names: set[str], taken: set[str]) -> dict[str, ir.Poly]:
    out, k = {}, 0
    for n in sorted(names):
        new = f"{n}_{k}"
        while new in taken:
            k += 1
            new = f"{n}_{k}"
        taken.add(new)
        out[n] = ir.Poly.index(new)
    return out


def _bounds(polys: tuple[ir.Poly, ...], shape: tuple[int, ...], out_idx: tuple[ir.Poly, ...],
            out_shape: tuple[int, ...]) -> list[ir.Constraint]:
    """`0 <= q < n` for each axis polynomial q of T, except where q is an index the output
    also takes plainly along an axis no longer than n (its range is bounded there already)."""
    bounded = {p.terms[0][0]: m for p, m in zip(out_idx, out_shape, strict=True)
               if len(p.terms) == 1 and p.terms[0][1] == 1 and p.const == 0}
    out = []
    for p, n in zip(polys, shape, strict=True):
        if p.is_constant:
            continue
        if len(p.terms) == 1 and p.terms[0][1] == 1 and p.const == 0 and \
                bounded.get(p.terms[0][0], n + 1) <= n:
            continue
        out.append(ir.Constraint(p, n))
    return out


def _compose(first: ir.Contraction, second: ir.Contraction, shape: tuple[int, ...],
             out_shape: tuple[int, ...]) -> ir.Contraction | None:
    """`second` reading `first`'s output, as one copy, or None."""
    taken = set(second.indices)
    # First's index names apart from second's.
    rename = _fresh(set(first.indices), taken)
    w = tuple(_subst(p, rename) for p in first.out_idx)
    r = tuple(_subst(p, rename) for p in first.inputs[0].idx)
    c1 = [ir.Constraint(_subst(c.poly, rename), c.bound) for c in first.constraints]
    g = second.inputs[0].idx
    # Axes where second reads T at the constant first wrote it at (a size-1 axis, the 0 of
    # `T[0, c, 0, 0]` written and read back) carry no index: the rest must be plain.
    axes = [k for k, (a, b) in enumerate(zip(w, g, strict=True))
            if not (a.is_constant and b.is_constant and a == b)]
    wk, gk = tuple(w[k] for k in axes), tuple(g[k] for k in axes)
    plain_w = plain_indices(wk)
    if plain_w is not None and not c1 and set(p for q in r for p, _ in q.terms) <= set(plain_w):
        env = dict(zip(plain_w, gk, strict=True))
        inputs = (ir.Access(first.inputs[0].tensor, tuple(_subst(p, env) for p in r)),)
        out_idx = second.out_idx
        cons = list(second.constraints) + _bounds(g, shape, out_idx, out_shape)
    else:
        plain_g = plain_indices(gk)
        if plain_g is None:
            return None
        env = dict(zip(plain_g, wk, strict=True))
        out_idx = tuple(_subst(p, env) for p in second.out_idx)
        inputs = (ir.Access(first.inputs[0].tensor, r),)
        cons = c1 + [ir.Constraint(_subst(c.poly, env), c.bound)
                     for c in second.constraints] + _bounds(w, shape, out_idx, out_shape)
    used = {n for p in (*out_idx, *inputs[0].idx) for n, _ in p.terms}
    used |= {n for c in cons for n, _ in c.poly.terms}
    return dataclasses.replace(second, out_idx=out_idx, inputs=inputs,
                               constraints=tuple(dict.fromkeys(cons)),
                               indices=tuple(sorted(used)))


def _write_through(first: ir.Contraction, second: ir.Contraction,
                   tensors: dict[str, ir.Tensor]) -> ir.Contraction | None:
    """`first`, a contraction that is not a copy, writing each element straight where
    `second`, a copy that reads all of first's output T once and plainly, puts it (attention's
    value product, whose heads a transpose and a reshape put side by side: one kernel fewer a
    layer); None where that does not hold.  Only where first's fastest output index steps
    the new output's last axis by one (its stores keep their memory order), and never for a
    product whose operand is packed (`no_defract`) or that has a `default`."""
    t, o = first.output, second.output
    if first.default is not None or first.no_defract or \
            tensors[t].size != tensors[o].size or tensors[t].dtype != tensors[o].dtype:
        return None
    rename = _fresh(set(second.indices), set(first.indices))
    g = tuple(_subst(p, rename) for p in second.inputs[0].idx)
    out = tuple(_subst(p, rename) for p in second.out_idx)
    c2 = [ir.Constraint(_subst(c.poly, rename), c.bound) for c in second.constraints]
    w = first.out_idx
    # Axes read at the constant they were written at, or at 0 where T has size 1, carry no
    # index of second's.
    axes = [k for k, (a, b, n) in enumerate(zip(w, g, tensors[t].shape, strict=True))
            if not (b.is_constant and ((a.is_constant and a == b) or (n == 1 and b.const == 0)))]
    plain_g = plain_indices(tuple(g[k] for k in axes))
    last = plain_indices(w[-1:]) if w else None
    if plain_g is None or last is None:
        return None
    used = {n for p in (*out, *(c.poly for c in c2)) for n, _ in p.terms}
    if not used <= set(plain_g):
        return None
    env = dict(zip(plain_g, (w[k] for k in axes), strict=True))
    out_idx = tuple(_subst(p, env) for p in out)
    if not out_idx or out_idx[-1].coef(last[0]) != 1:
        return None
    # first's indices keep the ranges T's axes gave them (those its operands do not bound
    # already), and second's constraints hold, in first's indices.
    cons = [*first.constraints, *(ir.Constraint(_subst(c.poly, env), c.bound) for c in c2),
            *(ir.Constraint(p, n) for p, n in zip(w, tensors[t].shape, strict=True)
              if not p.is_constant)]
    cons = [c for c in dict.fromkeys(cons) if not _implied(c, first, tensors)]
    return dataclasses.replace(first, output=o, out_idx=out_idx, constraints=tuple(cons))


def _implied(c: ir.Constraint, op: ir.Contraction, tensors: dict[str, ir.Tensor]) -> bool:
    """Whether `0 <= c.poly < c.bound` holds wherever `op`'s operands are read in range: the
    polynomial is one index that an operand reads plainly along an axis no longer."""
    name = plain_indices((c.poly,))
    if name is None:
        return False
    return any(len(p.terms) == 1 and p.terms[0] == (name[0], 1) and p.const == 0 and n <= c.bound
               for a in op.inputs for p, n in zip(a.idx, tensors[a.tensor].shape, strict=True))


def _reads(op: ir.Statement) -> list[str]:
    if isinstance(op, ir.Contraction):
        return [a.tensor for a in op.inputs] + ([op.default] if op.default else [])
    return list(ir.expr_refs(op.expr))


def compose_copies(program: ir.Program, into_products: bool = False) -> ir.Program:
    """One pass in program order: a composed copy keeps its place, so a chain folds into it
    link by link.  A copy read by several copies (a fused projection's q / k / v split, each
    part a slice) composes into each of them where every one composes, and goes: each part
    then reads the source once.  Then, only with `into_products` (no attention kernel to
    match), a product writes where the one copy reading its output puts it
    (`_write_through`); and always, copies that only move axes of size 1 are read through by
    the contractions reading them (`_moves_of_unit_axes`).  Linear in the statements but for
    those few moves: it runs on every plan."""
    ops: list[ir.Statement | None] = list(program.ops)
    tensors = dict(program.tensors)
    keep = set(program.inputs) | set(program.outputs)
    producer = {op.output: i for i, op in enumerate(ops)}
    readers: dict[str, list[int]] = {}  # tensor -> the statements that read it
    defaults: set[str] = set()  # concatenation parts (`default` operands)
    for k, op in enumerate(program.ops):
        for name in set(_reads(op)):
            readers.setdefault(name, []).append(k)
        if isinstance(op, ir.Contraction) and op.default:
            defaults.add(op.default)

    def composable(first: ir.Statement | None, t: str, k: int) -> bool:
        second = ops[k]
        return (first is not None and t not in keep and _copy(first) and _copy(second)
                and second.inputs[0].tensor == t  # type: ignore[union-attr]
                # a concatenation's first part: left to `placement` as it is
                and second.output not in defaults  # type: ignore[union-attr]
                # a copy may convert; two conversions are not one
                and tensors[first.inputs[0].tensor].dtype == tensors[t].dtype  # type: ignore
                == tensors[second.output].dtype)  # type: ignore[union-attr]

    for j in range(len(ops)):
        while _copy(ops[j]):  # type: ignore[arg-type]
            t = ops[j].inputs[0].tensor  # type: ignore[union-attr]
            i = producer.get(t)
            first = ops[i] if i is not None else None
            todo = readers.get(t, [])
            if not todo or not all(composable(first, t, k) for k in todo):
                break
            made = [_compose(first, ops[k], tensors[t].shape,  # type: ignore[arg-type]
                             tensors[ops[k].output].shape) for k in todo]  # type: ignore
            if any(new is None for new in made):
                break
            for k, new in zip(todo, made, strict=True):
                ops[k] = dataclasses.replace(new, text=statement_text(
                    new, tensors[new.output].shape))  # type: ignore[union-attr]
            ops[i] = None  # type: ignore[index]
            del tensors[t]
            src = first.inputs[0].tensor  # type: ignore[union-attr]
            readers[src] = [k for k in readers.get(src, []) if k != i] + todo
            del readers[t]
    # Then products write where the one copy reading their output puts it (chains composed
    # first: a transpose and a reshape after a product are one copy by now).
    for j in range(len(ops) if into_products else 0):
        second = ops[j]
        if not _copy(second):  # type: ignore[arg-type]
            continue
        t = second.inputs[0].tensor  # type: ignore[union-attr]
        i = producer.get(t)
        first = ops[i] if i is not None else None
        if not isinstance(first, ir.Contraction) or _copy(first) or t in keep or \
                readers.get(t) != [j] or second.output in defaults:  # type: ignore[union-attr]
            continue
        new = _write_through(first, second, tensors)  # type: ignore[arg-type]
        if new is not None:
            ops[j] = dataclasses.replace(new, text=statement_text(new, tensors[new.output].shape))
            ops[i] = None  # type: ignore[index]
            del tensors[t]
    kept = tuple(op for op in ops if op is not None)
    if len(kept) != len(program.ops):
        program = dataclasses.replace(program, ops=kept, tensors=tensors)
    return _moves_of_unit_axes(program)


def _unit_axis_move(op: ir.Statement, tensors: dict[str, ir.Tensor]
                    ) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """For a copy that only moves axes of size 1 (`T[i1, i0, i2] = =(X[i0, i1, i2])` with
    i0 of range 1: a batch-first layout read sequence-first at batch 1), the index names T is
    written at and X read at; None for any other statement.  Such a T holds X's elements in
    X's memory order."""
    if not _copy(op) or op.constraints or tensors[op.output].dtype != \
            tensors[op.inputs[0].tensor].dtype:  # type: ignore[union-attr]
        return None
    w, r = plain_indices(op.out_idx), plain_indices(op.inputs[0].idx)  # type: ignore
    if w is None or r is None or sorted(w) != sorted(r):
        return None
    size = dict(zip(w, tensors[op.output].shape, strict=True))
    if size != dict(zip(r, tensors[op.inputs[0].tensor].shape, strict=True)) or \
            [n for n in w if size[n] != 1] != [n for n in r if size[n] != 1]:
        return None
    return w, r


def _moves_of_unit_axes(program: ir.Program) -> ir.Program:
    """Copies that only move axes of size 1 (`_unit_axis_move`) go where every reader is a
    contraction: each reads the copy's source instead, the same elements in the same memory
    order (each index keeps its range), so its kernel is the same one but for the buffer.
    Elementwise readers need the copy's shape and keep it.  One per layer of an exported
    batch-first transformer at batch 1."""
    tensors = dict(program.tensors)
    keep = set(program.inputs) | set(program.outputs)
    ops: list[ir.Statement | None] = list(program.ops)
    for i in range(len(ops)):
        op = ops[i]  # as readers before it left it
        move = None if op is None else _unit_axis_move(op, tensors)
        if move is None or op.output in keep:  # type: ignore[union-attr]
            continue
        t, x = op.output, op.inputs[0].tensor  # type: ignore[union-attr]
        at = [k for k, o in enumerate(ops) if o is not None and t in _reads(o)]
        if not at or not all(isinstance(ops[k], ir.Contraction) and ops[k].default != t
                             for k in at):  # type: ignore[union-attr]
            continue
        written, read = move
        for k in at:
            reader = ops[k]
            inputs = []
            for a in reader.inputs:  # type: ignore[union-attr]
                if a.tensor == t:  # the reader's polynomial of each of T's axes, on X's
                    at_axis = dict(zip(written, a.idx, strict=True))
                    a = ir.Access(x, tuple(at_axis[n] for n in read), a.span)
                inputs.append(a)
            new = dataclasses.replace(reader, inputs=tuple(inputs))  # type: ignore[arg-type]
            ops[k] = dataclasses.replace(new, text=statement_text(new, tensors[new.output].shape))
        ops[i] = None
        del tensors[t]
    kept = tuple(o for o in ops if o is not None)
    if len(kept) == len(program.ops):
        return program
    return dataclasses.replace(program, ops=kept, tensors=tensors)
