"""Row-fused kernels: a chain of reductions over the same axes and the elementwise statements
around them, in one kernel where each row is owned by one work-group (or one work-item on a
CPU).  Softmax (`M = max; E = exp(X - M); S = sum E; Y = E / S`), log-softmax, layer and RMS
normalisation and the normalisations over other axes are such chains; the intermediate
tensors (E above) never reach memory, and the row's reductions run back to back.

Found by analysing index spaces, not by matching statement text: a *row reduction* is a
single-operand contraction (+ > < *) that reads a tensor of shape F through one distinct index
per axis and writes each kept axis with its own index and each reduced axis as `0` of size 1
(the keep-dims form that broadcasts back over F).  A group starts at a row reduction (with the
full-shape elementwise statements just before it) and takes the statements that follow while
each is another row reduction over the same F and axes, an elementwise statement of shape F
(the "full" statements) or of the reduced shape (the "row" statements), reading
only the group's tensors and tensors that broadcast to its shape.  A
group is kept when a full statement reads a reduction's result: the row comes back, which is
what a separate contraction kernel would have to read from memory again."""

from __future__ import annotations

from dataclasses import dataclass

from ..lang import ir


@dataclass(frozen=True)
class RowKernel:
    ops: tuple[ir.Statement, ...]  # row reductions and elementwise statements, in order
    full: tuple[int, ...]  # F: the shape the rows are cut from
    axes: tuple[int, ...]  # the reduced axes of F (a row runs over them)
    writes: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"rows_{self.ops[-1].output}"

    @property
    def produces(self) -> tuple[str, ...]:
        return tuple(o.output for o in self.ops)

    @property
    def reduced(self) -> tuple[int, ...]:
        """The shape of the reductions' results: F with the row axes 1."""
        return tuple(1 if d in self.axes else n for d, n in enumerate(self.full))

    @property
    def rows(self) -> int:
        out = 1
        for d, n in enumerate(self.full):
            out *= 1 if d in self.axes else n
        return out

    @property
    def length(self) -> int:
        out = 1
        for d in self.axes:
            out *= self.full[d]
        return out

    def reads(self) -> set[str]:
        names: set[str] = set()
        for op in self.ops:
            if isinstance(op, ir.Contraction):
                names.add(op.inputs[0].tensor)
            else:
                names |= set(ir.expr_refs(op.expr))
        return names - set(self.produces)


def row_reduction(op: ir.Statement, tensors) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(F, reduced axes) when `op` is a row reduction (see the module's docstring)."""
    if not isinstance(op, ir.Contraction) or op.comb is not None or len(op.inputs) != 1:
        return None
    if op.constraints or op.default or op.agg not in ("+", ">", "<", "*") or op.no_defract:
        return None
    acc = op.inputs[0]
    full = tensors[acc.tensor].shape
    out = tensors[op.output].shape
    if len(out) != len(full) or not full:
        return None
    names = []
    for p in acc.idx:
        if len(p.terms) != 1 or p.terms[0][1] != 1 or p.const != 0:
            return None
        names.append(p.terms[0][0])
    if len(set(names)) != len(names):
        return None
    axes = []
    for d, (p, n) in enumerate(zip(op.out_idx, full, strict=True)):
        if p == acc.idx[d] and out[d] == n:
            continue
        if p.is_constant and p.const == 0 and out[d] == 1:
            axes.append(d)
            continue
        return None
    if not any(full[d] > 1 for d in axes):
        return None
    return full, tuple(axes)


def _leading(op: ir.Statement, tensors, full: tuple[int, ...]) -> bool:
    return (isinstance(op, ir.Elementwise) and tensors[op.output].shape == full
            and not ir.has_eid_op(op.expr)
            and all(ir.broadcasts_to(tensors[n].shape, full) for n in ir.expr_refs(op.expr)))


def find_groups(program: ir.Program) -> dict[int, tuple[int, RowKernel]]:
    """Start statement index -> (end index, exclusive; the kernel without writes)."""
    tensors = program.tensors
    ops = program.ops
    out: dict[int, tuple[int, RowKernel]] = {}
    k = 0
    while k < len(ops):
        first = row_reduction(ops[k], tensors)
        if first is None:
            k += 1
            continue
        full, axes = first
        reduced = tuple(1 if d in axes else n for d, n in enumerate(full))
        rows_names = {ops[k].output}
        full_names: set[str] = set()
        returns = False  # a full statement reads a reduction's result
        end = k + 1
        for op in ops[k + 1:]:
            if isinstance(op, ir.Contraction):
                r = row_reduction(op, tensors)
                src = op.inputs[0].tensor
                if r != (full, axes) or src in rows_names:
                    break
                rows_names.add(op.output)
            else:
                shape = tensors[op.output].shape
                refs = ir.expr_refs(op.expr)
                if ir.has_eid_op(op.expr):
                    break
                if shape == full:
                    if not all(n in rows_names or n in full_names
                               or ir.broadcasts_to(tensors[n].shape, full) for n in refs):
                        break
                    returns |= any(n in rows_names for n in refs)
                    full_names.add(op.output)
                elif shape == reduced:
                    if not all(n in rows_names or (n not in full_names and ir.broadcasts_to(
                            tensors[n].shape, reduced)) for n in refs):
                        break
                    rows_names.add(op.output)
                else:
                    break
            end += 1
        if returns:
            # Full-shape elementwise statements just before the first reduction (RMS norm's
            # X2 = X * X) join too: the walks compute them instead of reading them.
            start = k
            done = max(out.values(), key=lambda v: v[0])[0] if out else 0
            while start - 1 >= done and _leading(ops[start - 1], tensors, full):
                start -= 1
            out[start] = (end, RowKernel(tuple(ops[start:end]), full, axes, ()))
            k = end
        else:
            k += 1
    return out
