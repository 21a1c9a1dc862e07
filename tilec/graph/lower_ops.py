"""The Tile text of each graph op (see `tilec.lower`).  Index variables: n batch, co/ci
channels, g group, x<i> output positions, k<i> kernel offsets, i<j> generic dimensions."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from .core import Node
from .emit import Emitter, affine, ew_text, lit
from .lower_attention import ATTENTION_EMITTERS
from .lower_index import INDEX_EMITTERS
from .ops import ELEMENTWISE
from .ops_einsum import EINSUM_EMITTERS


def _idx(xs: Sequence[str]) -> str:
    return ", ".join(xs)


def _dims(shape: Sequence[int]) -> str:
    return ", ".join(str(s) for s in shape)


def _out(name: str, idx: Sequence[str], shape: Sequence[int]) -> str:
    return f"{name}[{_idx(idx)} : {_dims(shape)}]" if idx else f"{name}[]"


def _target(em: Emitter, node: Node, epilogue: bool) -> str:
    return em.temp(f"{node.output}_acc") if epilogue else em.define(node)


def _elementwise(em: Emitter, node: Node) -> None:
    args = [em.operand(v) for v in node.inputs]
    em.stmt(f"{em.define(node)} = {ew_text(node.op, args, node.attrs, node.dtype)};")


def _conv(em: Emitter, node: Node) -> None:
    x, w = node.inputs[:2]
    xs, ws = em.shape(x), em.shape(w)
    nhwc = node.get("layout") == "NHWC"
    # The input may be held in the other layout (`channels_last` reads a model's NCHW input
    # into an NHWC convolution as it is).
    in_nhwc = node.get("input_layout", node.get("layout")) == "NHWC"
    r = len(xs) - 2
    s, d, p = node.get("strides"), node.get("dilations"), node.get("pads")
    groups = int(node.get("groups"))  # type: ignore[arg-type]
    co = node.shape[-1] if nhwc else node.shape[1]
    cig = ws[-2] if nhwc else ws[1]
    cog = co // groups
    sp = [f"x{i}" for i in range(r)]
    ks = [f"k{i}" for i in range(r)]
    pos = [affine({sp[i]: s[i], ks[i]: d[i]}, -p[i]) for i in range(r)]  # type: ignore[index]
    cons: list[str] = []
    if groups == 1:
        oc, ic, wc = "co", "ci", "ci"
    else:
        # Grouped: output channel g*COG + co reads input channels g*CIG + ci.  Nothing else
        # bounds co and ci, hence the constraints.
        oc = "g" if cog == 1 else affine({"g": cog, "co": 1})
        ic = "g" if cig == 1 else affine({"g": cig, "ci": 1})
        wc = "0" if cig == 1 else "ci"
        cons = [f"g < {groups}"] + ([f"co < {cog}"] if cog > 1 else []) + \
            ([f"ci < {cig}"] if cig > 1 else [])
    out_idx = ["n", *sp, oc] if nhwc else ["n", oc, *sp]
    x_idx = ["n", *pos, ic] if in_nhwc else ["n", ic, *pos]
    w_idx = [*ks, wc, oc] if nhwc else [oc, wc, *ks]
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    # The bias view first: the epilogue must follow the contraction to be fused into it.
    b = None if bias is None else em.view(bias, (co,) if nhwc else (co,) + (1,) * r)
    target = _target(em, node, bias is not None or node.get("activation") is not None)
    X, W = em.ref(x), em.ref(w)
    em.stmt(f"{_out(target, out_idx, node.shape)} = +({X}[{_idx(x_idx)}] * {W}[{_idx(w_idx)}])"
            + "".join(f", {c}" for c in cons) + ";")
    em.finish(node, target, target if b is None else f"{target} + {b}")


def _conv_transpose(em: Emitter, node: Node) -> None:
    """NCHW, weights [CI, CO/groups, kernel..]: out[n, co, x] = sum of
    in[n, ci, (x + pad_begin - dilation*k) / stride] * w[ci, co, k]; the division keeps only
    the integer points (tilec's defract rewrite)."""
    x, w = node.inputs[:2]
    ws = em.shape(w)
    r = len(ws) - 2
    s, d, p = node.get("strides"), node.get("dilations"), node.get("pads")
    groups = int(node.get("groups"))  # type: ignore[arg-type]
    cog, cig = ws[1], ws[0] // groups
    co = node.shape[1]
    sp = [f"x{i}" for i in range(r)]
    ks = [f"k{i}" for i in range(r)]
    pos = []
    for i in range(r):
        a = affine({sp[i]: 1, ks[i]: -d[i]}, p[i])  # type: ignore[index]
        pos.append(a if s[i] == 1 else f"({a}) / {s[i]}")  # type: ignore[index]
    cons: list[str] = []
    if groups == 1:
        oc, ic, wo = "co", "ci", "co"
    else:
        oc = "g" if cog == 1 else affine({"g": cog, "co": 1})
        ic = "g" if cig == 1 else affine({"g": cig, "ci": 1})
        wo = "0" if cog == 1 else "co"
        cons = [f"g < {groups}"] + ([f"co < {cog}"] if cog > 1 else []) + \
            ([f"ci < {cig}"] if cig > 1 else [])
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    b = None if bias is None else em.view(bias, (co,) + (1,) * r)
    target = _target(em, node, bias is not None or node.get("activation") is not None)
    X, W = em.ref(x), em.ref(w)
    em.stmt(f"{_out(target, ['n', oc, *sp], node.shape)} = "
            f"+({X}[{_idx(['n', ic, *pos])}] * {W}[{_idx([ic, wo, *ks])}])"
            + "".join(f", {c}" for c in cons) + ";")
    em.finish(node, target, target if b is None else f"{target} + {b}")


def _upsample(em: Emitter, node: Node) -> None:
    f = node.get("factors")
    iv = [f"i{k}" for k in range(len(node.shape))]
    o_idx = [v if f[k] == 1 else affine({v: f[k], f"j{k}": 1})  # type: ignore[index]
             for k, v in enumerate(iv)]
    cons = [f"j{k} < {n}" for k, n in enumerate(f) if n > 1]  # type: ignore[union-attr]
    em.stmt(f"{_out(em.define(node), o_idx, node.shape)} = =({em.ref(node.inputs[0])}"
            f"[{_idx(iv)}])" + "".join(f", {c}" for c in cons) + ";")


def _matmul(em: Emitter, node: Node) -> None:
    a, b = node.inputs[:2]
    # An operand read through a reshape (`tilec.views`) has the shape it is seen with.
    sa = tuple(node.get("view_a") or em.shape(a))  # type: ignore[arg-type]
    sb = tuple(node.get("view_b") or em.shape(b))  # type: ignore[arg-type]
    rows, cols = len(sa) > 1, len(sb) > 1
    batch = node.shape[:len(node.shape) - rows - cols]
    bv = [f"b{i}" for i in range(len(batch))]

    def batch_idx(shape: Sequence[int]) -> list[str]:
        off = len(batch) - len(shape)
        # A size-1 batch dimension broadcasts: it is read at 0 for every output index.
        return ["0" if n == 1 and batch[off + i] != 1 else bv[off + i]
                for i, n in enumerate(shape)]

    a_idx = batch_idx(sa[:-2]) + (["m", "k"] if rows else ["k"])
    b_idx = batch_idx(sb[:-2]) + (["k", "n"] if cols else ["k"])
    o_idx = bv + (["m"] if rows else []) + (["n"] if cols else [])
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    target = _target(em, node, bias is not None or node.get("activation") is not None)
    A, B, sub = _product_accesses(em, node, a_idx, b_idx)
    em.stmt(f"{_out(target, [sub.get(v, v) for v in o_idx], node.shape)} = +({A} * {B});")
    em.finish(node, target, target if bias is None else f"{target} + {em.operand(bias)}")


def _product_accesses(em: Emitter, node: Node, a_idx: Sequence[str], b_idx: Sequence[str]
                      ) -> tuple[str, str, dict[str, str]]:
    """The two operands' access texts; an operand seen through a reshape (`tilec.views`) reads
    its source with digit polynomials, which replace its index variables everywhere."""
    from .views import view_access

    texts: list[str | None] = [None, None]
    sub: dict[str, str] = {}
    for k, idx in enumerate((a_idx, b_idx)):
        if node.get(("view_a", "view_b")[k]):
            texts[k], sub = view_access(em, node, k, idx, "rq"[k])
    for k, idx in enumerate((a_idx, b_idx)):
        if texts[k] is None:
            texts[k] = f"{em.ref(node.inputs[k])}[{_idx([sub.get(v, v) for v in idx])}]"
    return str(texts[0]), str(texts[1]), sub


def _gemm(em: Emitter, node: Node) -> None:
    alpha, beta = float(node.get("alpha")), float(node.get("beta"))  # type: ignore[arg-type]
    c = node.inputs[2] if len(node.inputs) > 2 else None
    epilogue = alpha != 1 or c is not None or node.get("activation") is not None
    target = _target(em, node, epilogue)
    a_idx = ["k", "m"] if node.get("trans_a") else ["m", "k"]
    b_idx = ["n", "k"] if node.get("trans_b") else ["k", "n"]
    A, B, sub = _product_accesses(em, node, a_idx, b_idx)
    em.stmt(f"{_out(target, [sub.get(v, v) for v in ('m', 'n')], node.shape)} = "
            f"+({A} * {B});")
    expr = target if alpha == 1 else f"{lit(alpha, node.dtype)} * {target}"
    if c is not None:
        cc = em.operand(c)
        expr += f" + {cc}" if beta == 1 else f" + {lit(beta, node.dtype)} * {cc}"
    em.finish(node, target, expr)


def _batchnorm(em: Emitter, node: Node) -> None:
    x, scale, bias, mean, var = node.inputs
    ax = int(node.get("axis"))  # type: ignore[arg-type]
    c = node.shape[ax]
    pshape = (c,) + (1,) * (len(node.shape) - ax - 1)
    S, B, M, V = (em.view(p, pshape) for p in (scale, bias, mean, var))
    eps = lit(node.get("epsilon"), node.dtype)  # type: ignore[arg-type]
    em.stmt(f"{em.define(node)} = ({em.ref(x)} - {M}) * ({S} / sqrt({V} + {eps})) + {B};")


def pool_counts(spatial: Sequence[int], out: Sequence[int], kernel: Sequence[int],
                strides: Sequence[int], dilations: Sequence[int], pads: Sequence[int],
                include_pad: bool) -> np.ndarray:
    """How many window elements each average divides by (per output position)."""
    r = len(spatial)
    total = np.ones((), np.int64)
    for i in range(r):
        pos = (np.arange(out[i])[:, None] * strides[i] + np.arange(kernel[i])[None, :]
               * dilations[i] - pads[i])
        hi = spatial[i] + (pads[r + i] if include_pad else 0)
        lo = -pads[i] if include_pad else 0
        counts = ((pos >= lo) & (pos < hi)).sum(axis=1)
        total = np.multiply.outer(total, counts)
    return total


def _pool(em: Emitter, node: Node) -> None:
    x = node.inputs[0]
    xs = em.shape(x)
    nhwc = node.get("layout") == "NHWC"
    r = len(xs) - 2
    k, s, d, p = (node.get(a) for a in ("kernel", "strides", "dilations", "pads"))
    sp = [f"x{i}" for i in range(r)]
    ks = [f"k{i}" for i in range(r)]
    pos = [affine({sp[i]: s[i], ks[i]: d[i]}, -p[i]) for i in range(r)]  # type: ignore[index]
    out_idx = ["n", *sp, "c"] if nhwc else ["n", "c", *sp]
    x_idx = ["n", *pos, "c"] if nhwc else ["n", "c", *pos]
    avg = node.op == "avg_pool"
    target = _target(em, node, avg)
    cons = "".join(f", {ks[i]} < {k[i]}" for i in range(r))  # type: ignore[index]
    em.stmt(f"{_out(target, out_idx, node.shape)} = "
            f"{'+' if avg else '>'}({em.ref(x)}[{_idx(x_idx)}]){cons};")
    if not avg:
        return
    spatial = xs[1:-1] if nhwc else xs[2:]
    out_sp = node.shape[1:-1] if nhwc else node.shape[2:]
    counts = pool_counts(spatial, out_sp, k, s, d, p,  # type: ignore[arg-type]
                         bool(node.get("count_include_pad")))
    if (counts == counts.flat[0]).all():
        div = lit(int(counts.flat[0]), node.dtype) if node.dtype == "int32" else \
            lit(float(counts.flat[0]), node.dtype)
    else:
        div = em.constant(counts.reshape(counts.shape + ((1,) if nhwc else ())),
                          f"{node.output}_count", node.dtype)
    em.stmt(f"{em.define(node)} = {target} / {div};")


def _pool_indices(em: Emitter, node: Node) -> None:
    """ONNX MaxPool's Indices: a max contraction over the window of `R[pos] = total - flat(pos)`
    restricted (Tile's `a == b ? c`, 0 otherwise) to the positions that hold the maximum, so the
    largest R is the first maximum in row-major order; index = total - that.  Column-major
    (storage_order 1) rewrites the spatial digits of the row-major index elementwise."""
    x, y = node.inputs
    xs = em.shape(x)
    r = len(xs) - 2
    k, s, d, p = (node.get(a) for a in ("kernel", "strides", "dilations", "pads"))
    sp = [f"x{i}" for i in range(r)]
    ks = [f"k{i}" for i in range(r)]
    pos = [affine({sp[i]: s[i], ks[i]: d[i]}, -p[i]) for i in range(r)]  # type: ignore[index]
    out_idx, x_idx = ["n", "c", *sp], ["n", "c", *pos]
    total = math.prod(xs)
    rank = em.constant((total - np.arange(total, dtype=np.int64)).reshape(xs),
                       f"{node.output}_rank", "int32")
    first = em.temp(f"{node.output}_first")
    cons = "".join(f", {ks[i]} < {k[i]}" for i in range(r))  # type: ignore[index]
    em.stmt(f"{_out(first, out_idx, node.shape)} = >({em.ref(x)}[{_idx(x_idx)}] == "
            f"{em.ref(y)}[{_idx(out_idx)}] ? {rank}[{_idx(x_idx)}]){cons};")
    if not node.get("storage_order"):
        em.stmt(f"{em.define(node)} = {total} - {first};")
        return
    flat = em.temp(f"{node.output}_rowmajor")
    em.stmt(f"{flat} = {total} - {first};")
    spatial = xs[2:]
    size = math.prod(spatial)
    terms = [f"{flat} / {size} * {size}"]  # (n * C + c) * H * W
    for i in range(r):
        place, col = math.prod(spatial[i + 1:]), math.prod(spatial[:i])
        q = f"({flat} / {place})"
        digit = f"({q} - {q} / {spatial[i]} * {spatial[i]})"
        terms.append(digit if col == 1 else f"{digit} * {col}")
    em.stmt(f"{em.define(node)} = {' + '.join(terms)};")


def _reduce(em: Emitter, node: Node) -> None:
    x = node.inputs[0]
    xs = em.shape(x)
    axes = tuple(node.get("axes"))  # type: ignore[arg-type]
    keep = node.get("keepdims")
    kind = node.get("kind")
    iv = [f"i{j}" for j in range(len(xs))]
    o_idx = ["0" if j in axes else iv[j] for j in range(len(xs)) if keep or j not in axes]
    target = _target(em, node, kind == "mean")
    agg = {"sum": "+", "mean": "+", "max": ">", "min": "<", "prod": "*"}[str(kind)]
    em.stmt(f"{_out(target, o_idx, node.shape)} = {agg}({em.ref(x)}[{_idx(iv)}]);")
    if kind == "mean":
        count = math.prod(xs[j] for j in axes)
        em.stmt(f"{em.define(node)} = {target} / {lit(count, node.dtype)};")


def _softmax(em: Emitter, node: Node) -> None:
    """softmax and log_softmax: one row reduction chain (`tilec.plan.rows`)."""
    x = node.inputs[0]
    xs = em.shape(x)
    axes = tuple(node.get("axes"))  # type: ignore[arg-type]
    iv = [f"i{j}" for j in range(len(xs))]
    r_idx = ["0" if j in axes else iv[j] for j in range(len(xs))]
    r_shape = [1 if j in axes else n for j, n in enumerate(xs)]
    X = em.ref(x)
    M, E, S = (em.temp(f"{node.output}_{t}") for t in ("max", "exp", "sum"))
    # Subtracting the maximum keeps exp from overflowing.
    em.stmt(f"{_out(M, r_idx, r_shape)} = >({X}[{_idx(iv)}]);")
    em.stmt(f"{E} = exp({X} - {M});")
    em.stmt(f"{_out(S, r_idx, r_shape)} = +({E}[{_idx(iv)}]);")
    if node.op == "log_softmax":  # x - max - log(sum): exact where exp(x - max) underflows
        em.stmt(f"{em.define(node)} = {X} - {M} - log({S});")
    else:
        em.stmt(f"{em.define(node)} = {E} / {S};")


def _reshape(em: Emitter, node: Node) -> None:
    x = node.inputs[0]
    em.reshape(em.ref(x), em.shape(x), em.define(node), node.shape)


def _transpose(em: Emitter, node: Node) -> None:
    x = node.inputs[0]
    perm = tuple(node.get("perm"))  # type: ignore[arg-type]
    iv = [f"i{j}" for j in range(len(perm))]
    em.stmt(f"{_out(em.define(node), [iv[p] for p in perm], node.shape)} = "
            f"=({em.ref(x)}[{_idx(iv)}]);")


def _concat(em: Emitter, node: Node) -> None:
    ax = int(node.get("axis"))  # type: ignore[arg-type]
    iv = [f"i{j}" for j in range(len(node.shape))]
    prev, off = None, 0
    # One copy per operand, each into the previous result (`default`), the last into the output.
    for k, v in enumerate(node.inputs):
        last = k == len(node.inputs) - 1
        target = em.define(node) if last else em.temp(f"{node.output}_part{k}")
        o_idx = list(iv)
        o_idx[ax] = affine({iv[ax]: 1}, off)
        default = f" default {prev}" if prev else ""
        em.stmt(f"{_out(target, o_idx, node.shape)} = =({em.ref(v)}[{_idx(iv)}]){default};")
        prev, off = target, off + em.shape(v)[ax]


def _copy(em: Emitter, node: Node) -> None:
    em.stmt(f"{em.define(node)} = {em.ref(node.inputs[0])};")


EMITTERS: dict[str, Callable[[Emitter, Node], None]] = {
    **{op: _elementwise for op in ELEMENTWISE},
    "conv": _conv, "conv_transpose": _conv_transpose, "upsample": _upsample,
    "matmul": _matmul, "gemm": _gemm, "batchnorm": _batchnorm,
    "max_pool": _pool, "avg_pool": _pool, "max_pool_indices": _pool_indices,
    "reduce": _reduce, "softmax": _softmax, "log_softmax": _softmax,
    "reshape": _reshape, "transpose": _transpose, "concat": _concat, "copy": _copy,
    **INDEX_EMITTERS, **EINSUM_EMITTERS, **ATTENTION_EMITTERS,
}
