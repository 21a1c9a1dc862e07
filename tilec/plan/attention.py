"""Attention in one kernel: a product of two tensors (the scores), elementwise statements on
the scores (scale, mask), a softmax over the scores' last axis, and a product of the softmax
with a third tensor that sums over that axis, run without the scores ever reaching memory.

    A[b, h, i, j] = +(Q[b, h, i, d] * K[b, h, j, d]);      the score product
    X = A * 0.125;  ...                                     score statements (shape of A)
    M[b, h, i, 0] = >(X[b, h, i, j]);  W = exp(X - M);      the softmax over j
    Z[b, h, i, 0] = +(W[b, h, i, j]);  P = W / Z;
    O[b, h, i, e] = +(P[b, h, i, j] * V[b, h, j, e]);       the value product

Found by analysing the statements, not their names or text.  The key axis j is the last axis of
the score product's output and is read by the first operand's partner (K) and by V; the
*query* indices (i) are the score output's other indices that neither K nor V reads; the
*batch* indices (b, h) the ones they do read.  A work-group takes a block of query rows of one
batch and streams K and V through it in blocks of keys with the online softmax (a running
maximum and a sum rescaled when the maximum grows), which is exact: exp(x - m') =
exp(x - m) * exp(m - m').  That identity is why the softmax is matched by its algebra (a max,
exp of the difference, a sum, the quotient) while everything before it is general: the score
statements may read any tensor that broadcasts to the scores and the element's coordinates
(`index`), so additive masks, boolean masks through a select, ALiBi-style biases and causal
conditions all fit.  A causal condition (the score kept where j <= i + c, else -inf) also
bounds the key loop: blocks that are all masked are never visited."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ..lang import ir
from ..lang.reference import evaluate_expr
from .copies import plain_indices

# Floats a work-item keeps of its Q row and output row in registers (`codegen.attention`).
# Past this the chain runs as separate kernels: spilled rows would be slower than the scores
# going through memory.
MAX_ROW = 256


@dataclass(frozen=True)
class Access:
    """A tensor read with one plain index per axis (`Q[b, h, i, d]`)."""
    tensor: str
    names: tuple[str, ...]


@dataclass(frozen=True)
class AttentionKernel:
    qk: ir.Contraction
    ops: tuple[ir.Statement, ...]  # score statements, then max, exp, sum, quotient
    pv: ir.Contraction
    q: Access
    k: Access
    v: Access
    out: Access  # the value product's output
    key: str  # the key index (j)
    depth: tuple[str, ...]  # the score product's summed indices (d)
    query: tuple[str, ...]  # score indices neither K nor V reads (i), slowest first
    batch: tuple[str, ...]  # score indices K or V reads (b, h), slowest first
    values: tuple[str, ...]  # the output's indices that are V's own (e)
    ranges: tuple[tuple[str, int], ...]  # every index's range
    scores: tuple[str, ...]  # the score statements' outputs, in order
    maximum: str  # M
    exps: str  # W
    total: str  # Z
    probs: str  # P
    source: str  # the tensor the maximum reads (X, or the scores A themselves)
    causal: tuple[Fraction, Fraction] | None  # kept where key <= a * query[-1] + c: (a, c)
    writes: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"attention_{self.pv.output}"

    @property
    def produces(self) -> tuple[str, ...]:
        return (self.qk.output,) + tuple(op.output for op in self.ops) + (self.pv.output,)

    @property
    def full(self) -> tuple[int, ...]:
        return self.shape_of(self.qk.out_idx)

    def range(self, name: str) -> int:
        return dict(self.ranges)[name]

    def shape_of(self, idx) -> tuple[int, ...]:
        return tuple(self.range(p.terms[0][0]) for p in idx)

    @property
    def statements(self) -> tuple[ir.Statement, ...]:
        """Every statement the kernel computes, in program order."""
        return (self.qk, *self.ops, self.pv)

    def reads(self) -> set[str]:
        names = {self.q.tensor, self.k.tensor, self.v.tensor}
        for op in self.ops:
            if isinstance(op, ir.Elementwise):
                names |= set(ir.expr_refs(op.expr))
        return names - set(self.produces)

    def score_names(self) -> tuple[str, ...]:
        """The score product's output indices, in its axis order."""
        return tuple(p.terms[0][0] for p in self.qk.out_idx)


def _product(op: ir.Statement) -> tuple[Access, Access, tuple[str, ...]] | None:
    """A plain sum of products `O[..] = +(A[..] * B[..])`: both accesses and O's indices."""
    if not isinstance(op, ir.Contraction) or op.agg != "+" or op.comb != "*":
        return None
    if len(op.inputs) != 2 or op.constraints or op.default or op.no_defract:
        return None
    out = plain_indices(op.out_idx)
    a, b = (plain_indices(x.idx) for x in op.inputs)
    if out is None or a is None or b is None:
        return None
    return Access(op.inputs[0].tensor, a), Access(op.inputs[1].tensor, b), out


def _ranges(op: ir.Contraction, tensors) -> dict[str, int] | None:
    """Each index's range, from the shapes it indexes (all of them must agree)."""
    out: dict[str, int] = {}
    sites = [(op.out_idx, tensors[op.output].shape)] + \
        [(x.idx, tensors[x.tensor].shape) for x in op.inputs]
    for idx, shape in sites:
        for p, n in zip(idx, shape, strict=True):
            name = p.terms[0][0]
            if out.setdefault(name, n) != n:
                return None
    return out


def _is_ref(e: ir.Expr, name: str) -> bool:
    return isinstance(e, ir.Ref) and e.name == name


def _keep_dims(op: ir.Statement, agg: str, src: str, rank: int) -> bool:
    """`M[a, b, .., 0] = agg(src[a, b, .., j])`: a reduction over the last axis of a tensor
    of `rank` axes, read with plain indices, keeping the others in place (index names are
    each statement's own: only positions are compared)."""
    if not isinstance(op, ir.Contraction) or op.agg != agg or op.comb is not None:
        return False
    if len(op.inputs) != 1 or op.constraints or op.default or op.inputs[0].tensor != src:
        return False
    names = plain_indices(op.inputs[0].idx)
    if names is None or len(names) != rank or len(op.out_idx) != rank:
        return False
    *rows, last = op.out_idx
    return (last.is_constant and last.const == 0 and
            all(len(p.terms) == 1 and p.terms[0] == (n, 1) and p.const == 0
                for p, n in zip(rows, names, strict=False)))


def find(program: ir.Program) -> dict[int, tuple[int, AttentionKernel]]:
    """Start statement index -> (end index, exclusive; the kernel without writes)."""
    out: dict[int, tuple[int, AttentionKernel]] = {}
    k = 0
    while k < len(program.ops):
        found = _match(program, k)
        if found is None:
            k += 1
            continue
        out[k] = found
        k = found[0]
    return out


def _match(program: ir.Program, start: int) -> tuple[int, AttentionKernel] | None:
    ops, tensors = program.ops, program.tensors
    qk = ops[start]
    prod = _product(qk)
    if prod is None:
        return None
    a, b, score = prod
    ranges = _ranges(qk, tensors)  # type: ignore[arg-type]
    if ranges is None or len(score) < 2:
        return None
    key = score[-1]
    if key in a.names and key not in b.names:
        q, kk = b, a
    elif key in b.names and key not in a.names:
        q, kk = a, b
    else:
        return None
    full = tensors[qk.output].shape
    if tensors[qk.output].dtype != "float32" or ranges[key] < 2:
        return None
    # Score statements: full-shape elementwise statements on the scores.
    names = {qk.output}
    pos = start + 1
    scores: list[str] = []
    while pos < len(ops) and isinstance(ops[pos], ir.Elementwise):
        op = ops[pos]
        if tensors[op.output].shape != full or ir.gathered(op.expr) or \
                any(isinstance(e, ir.Op) and e.op in ir.EID_OPS and e.op != "index"
                    for e in _nodes(op.expr)) or \
                not all(r in names or ir.broadcasts_to(tensors[r].shape, full)
                        for r in ir.expr_refs(op.expr)):
            return None
        names.add(op.output)
        scores.append(op.output)
        pos += 1
    if pos + 5 > len(ops):
        return None
    mx, ex, sm, pr, pv = ops[pos:pos + 5]
    src = scores[-1] if scores else qk.output
    if tensors[src].dtype != "float32":
        return None
    if not _keep_dims(mx, ">", src, len(score)):
        return None
    # W = exp(X - M)
    if not (isinstance(ex, ir.Elementwise) and isinstance(ex.expr, ir.Op) and
            ex.expr.op == "exp" and isinstance(ex.expr.args[0], ir.Op) and
            ex.expr.args[0].op == "sub" and _is_ref(ex.expr.args[0].args[0], src) and
            _is_ref(ex.expr.args[0].args[1], mx.output)):
        return None
    if not _keep_dims(sm, "+", ex.output, len(score)):
        return None
    # P = W / Z
    if not (isinstance(pr, ir.Elementwise) and isinstance(pr.expr, ir.Op) and
            pr.expr.op == "div" and _is_ref(pr.expr.args[0], ex.output) and
            _is_ref(pr.expr.args[1], sm.output)):
        return None
    if any(tensors[n].dtype != "float32" for n in (mx.output, ex.output, sm.output, pr.output)):
        return None
    prod2 = _product(pv)
    if prod2 is None or tensors[pv.output].dtype != "float32":
        return None
    c, d, out_names = prod2
    p_acc, v = (c, d) if c.tensor == pr.output else (d, c)
    if p_acc.tensor != pr.output or v.tensor == pr.output or len(p_acc.names) != len(score):
        return None
    r2 = _ranges(pv, tensors)  # type: ignore[arg-type]
    if r2 is None:
        return None
    # The value product's index names in the score product's terms: P's by position, the
    # others (V's own) kept apart from them.
    rename = dict(zip(p_acc.names, score, strict=True))
    for n in (*v.names, *out_names):
        if n not in rename:
            fresh = n
            while fresh in score or fresh in rename.values() or fresh in q.names + kk.names:
                fresh = "v_" + fresh
            rename[n] = fresh
    v = Access(v.tensor, tuple(rename[n] for n in v.names))
    out_names = tuple(rename[n] for n in out_names)
    r2 = {rename[n]: r for n, r in r2.items()}
    if key not in v.names or key in out_names:
        return None
    rows = score[:-1]
    values = tuple(n for n in out_names if n not in rows)
    if set(out_names) != set(rows) | set(values) or not values or \
            set(v.names) - set(values) - set(rows) != {key}:
        return None
    if any(n in ranges and r2[n] != ranges[n] for n in r2) or set(values) & set(ranges):
        return None
    depth = tuple(n for n in q.names if n not in score)
    if set(kk.names) - set(score) != set(depth) or not depth:
        return None
    used = set(kk.names) | set(v.names)
    query = tuple(n for n in rows if n not in used)
    batch = tuple(n for n in rows if n in used)
    if not query:
        return None
    # Nothing of the chain but the value product's output may be needed elsewhere.
    inner = {qk.output, *scores, mx.output, ex.output, sm.output, pr.output}
    later = set(program.outputs)
    for op in ops[pos + 5:]:
        later |= _reads(op)
    if inner & later:
        return None
    allr = {**ranges, **r2}
    if np.prod([allr[n] for n in depth]) + np.prod([allr[n] for n in values]) > MAX_ROW:
        return None
    kernel = AttentionKernel(
        qk, tuple(ops[start + 1:pos + 4]), pv, q, kk, v, Access(pv.output, out_names), key,
        depth, query, batch, values, tuple(sorted(allr.items())), tuple(scores), mx.output,
        ex.output, sm.output, pr.output, src, _causal(program, scores, score, query))
    return pos + 5, kernel


def _nodes(e: ir.Expr):
    yield e
    if isinstance(e, ir.Op):
        for a in e.args:
            yield from _nodes(a)


def _reads(op: ir.Statement) -> set[str]:
    if isinstance(op, ir.Contraction):
        return {x.tensor for x in op.inputs} | ({op.default} if op.default else set())
    return set(ir.expr_refs(op.expr))


# The causal bound ---------------------------------------------------------------------------
def _linear(e: ir.Expr, axes: dict[int, str]) -> dict[str, Fraction] | None:
    """`e` as a linear form over the score axes' coordinates (`index(X, axis)`) and a
    constant ("" key), or None."""
    if isinstance(e, ir.Const) and isinstance(e.value, int):
        return {"": Fraction(e.value)}
    if not isinstance(e, ir.Op):
        return None
    if e.op == "index":
        axis = int(e.args[0].value)  # type: ignore[union-attr]
        # A coordinate of a broadcast shape is the score coordinate of the same axis (from
        # the right) where that shape is not 1 there.
        d = len(axes) - len(e.shape) + axis
        return {axes[d]: Fraction(1)} if e.shape[axis] > 1 and d in axes else None
    if e.op in ("add", "sub"):
        x, y = (_linear(a, axes) for a in e.args)
        if x is None or y is None:
            return None
        sign = 1 if e.op == "add" else -1
        out = dict(x)
        for n, c in y.items():
            out[n] = out.get(n, Fraction(0)) + sign * c
        return out
    if e.op == "neg":
        x = _linear(e.args[0], axes)
        return None if x is None else {n: -c for n, c in x.items()}
    return None


def _minus_inf(e: ir.Expr) -> bool:
    if ir.expr_refs(e) or ir.has_eid_op(e):
        return False
    with np.errstate(all="ignore"):
        v = evaluate_expr(e, {})
    return bool(np.all(np.isneginf(v)))


def _causal(program: ir.Program, scores: list[str], score: tuple[str, ...],
            query: tuple[str, ...]) -> tuple[Fraction, Fraction] | None:
    """(a, c) when a score statement keeps the score only where key <= a * query + c and
    gives -inf elsewhere (`X = i + c >= j ? A : -inf`): the key loop of a block of query rows
    can stop after the largest such key.  The query index is the last (fastest) of the query
    indices (grouped-query attention has the group before it)."""
    stmt = {op.output: op for op in program.ops if isinstance(op, ir.Elementwise)}
    axes = dict(enumerate(score))
    key, qi = score[-1], query[-1]
    for name in scores:
        e = stmt[name].expr
        if not (isinstance(e, ir.Op) and e.op == "select"):
            continue
        cond, keep, other = e.args
        if isinstance(cond, ir.Ref) and cond.name in stmt:  # a mask computed just before
            cond = stmt[cond.name].expr
        if not _minus_inf(other):
            if not _minus_inf(keep) or not isinstance(cond, ir.Op):
                continue
            cond = ir.Op({"lt": "ge", "le": "gt", "gt": "le", "ge": "lt"}.get(cond.op, ""),
                         cond.args, cond.dtype, cond.shape)
        if not isinstance(cond, ir.Op) or cond.op not in ("ge", "gt", "le", "lt"):
            continue
        lhs, rhs = (_linear(x, axes) for x in cond.args)
        if lhs is None or rhs is None:
            continue
        # Keep where f >= 0 (or > 0), f = lhs - rhs (ge/gt) or rhs - lhs (le/lt).
        sign = 1 if cond.op in ("ge", "gt") else -1
        f = {n: sign * (lhs.get(n, Fraction(0)) - rhs.get(n, Fraction(0)))
             for n in set(lhs) | set(rhs)}
        if set(f) - {key, qi, ""} or f.get(key, 0) != -1:
            continue
        # key <= a * query + c (for a strict condition too: a bound, not the mask itself)
        return f.get(qi, Fraction(0)), f.get("", Fraction(0))
    return None
