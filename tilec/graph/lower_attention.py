"""The Tile text of the attention nodes (`ops_attention`): the chain `tilec.plan.attention`
recognises and runs as one kernel.

    S[b, h, i, j : B, H, Tq, Tk] = +(Q[b, h, i, d] * K[b, h, j, d]);
    X = S * 0.125;  X1 = 2.0 * tanh(X / 2.0);  X2 = X1 + Mask;
    X3 = index(X2, 2) + 3 >= index(X2, 3) ? X2 : -1e39;          causal, 3 keys before
    M[b, h, i, 0 : B, H, Tq, 1] = >(X3[b, h, i, j]);  W = exp(X3 - M);
    Z[b, h, i, 0 : B, H, Tq, 1] = +(W[b, h, i, j]);  P = W / Z;
    O[b, h, i, e : B, H, Tq, E] = +(P[b, h, i, j] * V[b, h, j, e]);

-1e39 is past float32's range: Tile reads it as -inf (the removed scores' value).  Every index
is plain (one name an axis), which the kernel needs: grouped-query attention sees Q as
[B, Hkv, G, Tq, D] (a reshape, not `h / G` arithmetic), so K and V are read by the kv head
alone, and the output is reshaped back.  Float16 operands are cast to float32 first.

Empty rows set to zero (`empty_rows="zero"`) add, after the chain, the rows that keep a key:
the conditions on small index constants ([Tq, 1] and [1, Tk]) and the mask, a max over the
keys, and a select on the output."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .core import Node
from .emit import Emitter, dims_text, lit
from .ops_attention import static_keep

NEG_INF = "-1e39"


@dataclass
class _Chain:
    """One attention node being written: its operands' Tile names and the score space."""
    em: Emitter
    node: Node
    names: list[str]  # score-space index names: leading..., [h, g,] i, j
    dims: list[int]  # their sizes
    mask_value: str | None = None  # the mask's graph value
    mask: str | None = None  # its Tile name in the score space
    lengths: str | None = None  # the key counts' Tile name in the score space

    @property
    def rank(self) -> int:
        return len(self.dims)

    def temp(self, what: str) -> str:
        return self.em.temp(f"{self.node.output}_{what}")


def _operand(em: Emitter, value: str, shape: tuple[int, ...] | None, wide: bool) -> str:
    """`value` seen with `shape` (a reshape) and cast to float32 when `wide`."""
    name = em.view(value, shape) if shape else em.ref(value)
    if wide and em.graph.type(value).dtype == "float16":
        cast = em.temp(f"{value}_f32")
        em.stmt(f"{cast} = as_float({name}, 32);")
        return cast
    return name


def _grouped(shape: tuple[int, ...], hq: int, hkv: int, axis: int) -> tuple[int, ...]:
    """`shape` (rank of the scores, head axis `axis` of size 1 or hq) split to [hkv, G]."""
    h = shape[axis]
    split = (hkv, hq // hkv) if h == hq else (1, 1)
    return shape[:axis] + split + shape[axis + 1:]


def _begin(em: Emitter, node: Node, with_v: bool) -> tuple[_Chain, str, str | None, list[str]]:
    """Operands and the score product; returns the chain, S, V's name and V's index names."""
    ins = list(node.inputs)
    q, k = ins[0], ins[1]
    v = ins[2] if with_v else None
    rest = ins[3 if with_v else 2:]
    mask = rest.pop(0) if node.get("mask") else None
    lengths = rest.pop(0) if node.get("lengths") else None
    qs, ks = em.shape(q), em.shape(k)
    r = len(qs)
    hq = qs[-3] if r >= 3 else 1
    hkv = ks[-3] if r >= 3 else 1
    g = hq // hkv
    lead = [f"b{n}" for n in range(r - 3 if g > 1 else r - 2)]
    if g > 1:
        names, dims = [*lead, "h", "g", "i", "j"], [*qs[:-3], hkv, g, qs[-2], ks[-2]]
        qidx, kidx = [*lead, "h", "g", "i", "d"], [*lead, "h", "j", "d"]
        qshape: tuple[int, ...] | None = (*qs[:-3], hkv, g, qs[-2], qs[-1])
    else:
        names, dims = [*lead, "i", "j"], [*qs[:-2], qs[-2], ks[-2]]
        qidx, kidx, qshape = [*lead, "i", "d"], [*lead, "j", "d"], None
    ch = _Chain(em, node, names, dims, mask)
    Q = _operand(em, q, qshape, True)
    K = _operand(em, k, None, True)
    V = _operand(em, v, None, True) if v is not None else None
    vidx = [*kidx[:-2], "j", "e"]
    if mask is not None:
        ms = em.shape(mask)
        mshape = None
        if g > 1 and len(ms) >= 3:  # the mask has a head axis: split it as Q's
            full = (1,) * (r - len(ms)) + ms
            mshape = _grouped(full, hq, hkv, r - 3)
        ch.mask = _operand(em, mask, mshape, em.graph.type(mask).dtype == "float16")
    if lengths is not None:
        ch.lengths = em.view(lengths, (qs[0],) + (1,) * (ch.rank - 1))
    S = ch.temp("scores")
    em.stmt(f"{S}[{', '.join(names)} : {dims_text(dims)}] = +({Q}[{', '.join(qidx)}] * "
            f"{K}[{', '.join(kidx)}]);")
    return ch, S, V, vidx


def _offset(ch: _Chain, lengths: str | None) -> str:
    """Where query 0 sits among the keys, as Tile text (an int, or Lengths - Tq)."""
    off = ch.node.get("offset")
    tq, tk = ch.dims[-2], ch.dims[-1]
    if off == "end":
        return f"({lengths} - {tq})" if lengths else lit(tk - tq, "int32")
    return lit(off, "int32")  # type: ignore[arg-type]


def _score_statements(ch: _Chain, S: str, stage: str) -> str:
    """Scale, soft cap (stage "scores" stops here), mask, causal, window, lengths."""
    em, node = ch.em, ch.node
    cur = S

    def step(what: str, expr: str) -> None:
        nonlocal cur
        name = ch.temp(what)
        em.stmt(f"{name} = {expr.format(x=cur)};")
        cur = name

    step("scaled", f"{{x}} * {lit(node.get('scale'), 'float32')}")  # type: ignore[arg-type]
    cap = node.get("softcap")
    if cap is not None:
        c = lit(cap, "float32")  # type: ignore[arg-type]
        step("capped", f"{c} * tanh({{x}} / {c})")
    if stage == "scores":
        return cur
    if ch.mask_value is not None:
        if em.graph.type(ch.mask_value).dtype == "bool":
            step("masked", f"{ch.mask} ? {{x}} : {NEG_INF}")
        else:
            step("masked", f"{{x}} + {ch.mask}")
    # The query's key position and the key's, conditions in the form `query + c >= key`
    # that `plan.attention` takes as a bound on the key loop.
    kj = f"index({{x}}, {ch.rank - 1})"
    pos = f"index({{x}}, {ch.rank - 2})"
    off = _offset(ch, ch.lengths)
    if off != "0":
        pos += f" + {off}"
    if node.get("causal"):
        step("causal", f"{pos} >= {kj} ? {{x}} : {NEG_INF}")
    left, right = node.get("window")  # type: ignore[misc]
    if left >= 0:
        step("left", f"{kj} + {left} >= {pos} ? {{x}} : {NEG_INF}")
    if right >= 0:
        step("right", f"{pos} + {right} >= {kj} ? {{x}} : {NEG_INF}")
    if ch.lengths is not None:
        step("padded", f"{kj} < {ch.lengths} ? {{x}} : {NEG_INF}")
    return cur


def _softmax(ch: _Chain, X: str) -> str:
    em = ch.em
    rows = ", ".join(ch.names[:-1])
    at = ", ".join(ch.names)
    rdims = dims_text([*ch.dims[:-1], 1])
    M, W, Z, P = (ch.temp(t) for t in ("max", "exp", "sum", "probs"))
    em.stmt(f"{M}[{rows}, 0 : {rdims}] = >({X}[{at}]);")
    em.stmt(f"{W} = exp({X} - {M});")
    em.stmt(f"{Z}[{rows}, 0 : {rdims}] = +({W}[{at}]);")
    em.stmt(f"{P} = {W} / {Z};")
    return P


def _rows_can_be_empty(ch: _Chain) -> bool:
    """Whether a query row may keep no key (decided now when only fixed bounds remove keys)."""
    node = ch.node
    if node.get("empty_rows") != "zero":
        return False
    if ch.mask_value is not None or ch.lengths is not None:
        return True
    tq, tk = ch.dims[-2], ch.dims[-1]
    off = node.get("offset")
    fixed = tk - tq if off == "end" else int(off)  # type: ignore[call-overload]
    keep = static_keep(tq, tk, bool(node.get("causal")), fixed,
                       node.get("window"))  # type: ignore[arg-type]
    return not keep.any(axis=1).all()


def _row_keep(ch: _Chain) -> str:
    """[..., Tq or 1, 1], nonzero where a query row keeps a key."""
    em, node = ch.em, ch.node
    tq, tk = ch.dims[-2], ch.dims[-1]
    causal, (left, right) = bool(node.get("causal")), node.get("window")  # type: ignore[misc]
    structural = causal or left >= 0 or right >= 0
    terms, shapes = [], []
    if ch.mask_value is not None:  # read as it is: the rows are the output's, not grouped
        m = em.ref(ch.mask_value)
        bool_mask = em.graph.type(ch.mask_value).dtype == "bool"
        terms.append(m if bool_mask else f"({m} > {NEG_INF})")
        shapes.append(em.shape(ch.mask_value))
    if structural or ch.lengths is not None:
        iq = em.constant(np.arange(tq, dtype=np.int32).reshape(tq, 1), "query_pos", "int32")
        jk = em.constant(np.arange(tk, dtype=np.int32).reshape(1, tk), "key_pos", "int32")
        shapes.append((tq, tk) if structural else (1, tk))
        L = None
        if ch.lengths is not None:  # seen with the rank of the output, not of the scores
            lshape = (ch.dims[0],) + (1,) * (len(node.shape) - 1)
            L = em.view(node.inputs[-1], lshape)
            terms.append(f"({jk} < {L})")
            shapes.append(lshape)
        off = _offset(ch, L)
        if causal:
            terms.append(f"({jk} <= {iq} + {off})")
        if left >= 0:
            terms.append(f"({jk} + {left} >= {iq} + {off})")
        if right >= 0:
            terms.append(f"({iq} + {off} + {right} >= {jk})")
    shape = tuple(int(d) for d in np.broadcast_shapes(*shapes))
    keep, rows = ch.temp("keep"), ch.temp("row_keeps")
    em.stmt(f"{keep} = {' && '.join(terms)} ? 1.0 : 0.0;")
    idx = [f"r{n}" for n in range(len(shape))]
    em.stmt(f"{rows}[{', '.join(idx[:-1] + ['0'])} : {dims_text(shape[:-1] + (1,))}] = "
            f">({keep}[{', '.join(idx)}]);")
    return rows


def _finish(ch: _Chain, result: str, shape: list[int], rows: bool) -> None:
    """The grouped heads merged back, float16 restored, empty rows zeroed; the last of these
    writes the node's output."""
    em, node = ch.em, ch.node
    steps: list[Callable[[str, str], None]] = []
    out_shape = node.shape
    if tuple(shape) != out_shape:
        steps.append(lambda s, d: em.reshape(s, shape, d, out_shape))
    if node.dtype == "float16":
        steps.append(lambda s, d: em.stmt(f"{d} = as_float({s}, 16);"))
    if rows and _rows_can_be_empty(ch):
        keep = _row_keep(ch)
        zero = lit(0, node.dtype)
        steps.append(lambda s, d: em.stmt(f"{d} = {keep} > 0.0 ? {s} : {zero};"))
    if not steps:
        steps.append(lambda s, d: em.stmt(f"{d} = {s};"))
    cur = result
    for n, fn in enumerate(steps):
        dst = em.define(node) if n == len(steps) - 1 else ch.temp(f"out{n}")
        fn(cur, dst)
        cur = dst


def _attention(em: Emitter, node: Node) -> None:
    ch, S, V, vidx = _begin(em, node, with_v=True)
    X = _score_statements(ch, S, "probs")
    P = _softmax(ch, X)
    e = em.shape(node.inputs[2])[-1]
    rows = ch.names[:-1]
    odims = [*ch.dims[:-1], e]
    out = ch.temp("values") if (tuple(odims) != node.shape or node.dtype == "float16" or
                                _rows_can_be_empty(ch)) else em.define(node)
    em.stmt(f"{out}[{', '.join(rows)}, e : {dims_text(odims)}] = +({P}[{', '.join(ch.names)}]"
            f" * {V}[{', '.join(vidx)}]);")
    if out != em.define(node):
        _finish(ch, out, odims, rows=True)


def _attention_scores(em: Emitter, node: Node) -> None:
    ch, S, _, _ = _begin(em, node, with_v=False)
    stage = str(node.get("stage"))
    X = _score_statements(ch, S, stage)
    if stage == "probs":
        X = _softmax(ch, X)
    _finish(ch, X, ch.dims, rows=stage == "probs")  # only probabilities have empty rows


ATTENTION_EMITTERS: dict[str, Callable[[Emitter, Node], None]] = {
    "attention": _attention, "attention_scores": _attention_scores}
