"""A contraction's post-ops over a whole vector of output elements at once.

Each accumulator's W lanes are W output elements along the vector index.  The post-ops
(bias, activation, residual add) run on whole vectors: an operand that does not move along
the vector index is one broadcast value, one that moves at unit stride a vector read, any
other a vector gathered lane by lane; results are stored as a vector where the output holds
the lanes at unit stride, lane by lane otherwise (an NCHW convolution's output channels).
Done lane by lane instead, as the general `finish` does, a first convolution's 27
multiply-adds per element met about as many instructions of epilogue (scalar extracts,
loads, adds, stores)."""

from __future__ import annotations

from . import clexpr
from .kernel_text import LANES, buf


def applies(c) -> bool:
    """Whether contraction `c`'s post-ops can run on its vectors: float values and
    `clexpr.vector_safe` expressions."""
    k_, p = c.kernel, c.program
    return clexpr.COMPUTE[c.dtype] == "float" and all(
        clexpr.vector_safe(po.expr) and clexpr.COMPUTE[p.tensors[po.output].dtype] == "float"
        for po in k_.post_ops)


def finish(c, j: int) -> list[str]:
    """Accumulator j's vector: post-ops and stores, in place of `finish` for each lane (the
    epilogue has declared `o`, the output offset of the vector's first element)."""
    k_, W = c.kernel, c.W
    vtype = f"{c.ctype}{W}"
    lines = ["{", f"const {vtype} v = a_{j};"]
    names = {k_.op.output: "v"}

    def ref(name: str) -> str:
        if name in names:
            return names[name]
        into, at = c.at_output(name, j, None, elem="o")
        return operand(c, into, at, c.program.tensors[name].dtype, c.operand(name)[0][c.v], W)

    post_ops(c, lines, ref, W, names)
    for w in k_.writes:
        dtype = c.program.tensors[w].dtype
        if w == k_.op.output:
            (into, at), step = (c.flat.output.name, "o"), c.flat.output.strides[c.v]
        else:
            (into, at), step = c.at_output(w, j, None, elem="o"), c.operand(w)[0][c.v]
        if step == 1:
            aligned = at == "o" and c.vector_aligned(0)  # laid out as the output
            lines.append(clexpr.store(buf(into), at, names[w], dtype, W, aligned=aligned,
                                      unaligned=not aligned and c.unaligned(dtype)))
        else:  # lanes apart (or one element: the last lane's value is the one kept)
            lines += [clexpr.store(buf(into), f"{at} + {lane * step}",
                                   f"{names[w]}.s{LANES[lane]}", dtype)
                      for lane in (range(W) if step else [W - 1])]
    lines.append("}")
    return lines


def operand(c, into: str, at: str, dtype: str, step: int, width: int) -> str:
    """A post-op operand as a `width`-vector of consecutive output elements, which lie `step`
    apart in its buffer `into` from offset `at`: one value broadcast (0), a vector read (1),
    or gathered element by element."""
    vtype = f"{c.ctype}{width}"
    if step == 0:
        return f"(({vtype})({clexpr.load(buf(into), at, dtype)}))"
    if step == 1:
        return clexpr.load(buf(into), at, dtype, width, unaligned=c.unaligned(dtype, width))
    items = ", ".join(clexpr.load(buf(into), f"{at} + {i * step}", dtype) for i in range(width))
    return f"(({vtype})({items}))"


def post_ops(c, lines: list[str], ref, width: int, names: dict[str, str]) -> None:
    """The kernel's post-ops on `width`-vectors, appended to `lines`; `names` gains each
    result's variable."""
    vtype = f"{c.ctype}{width}"
    for po in c.kernel.post_ops:
        var = f"v_{po.output}"
        text = clexpr.expr(po.expr, ref, width=width, bind=c.binder(lines, vtype, var))
        lines.append(f"const {vtype} {var} = {text};")
        names[po.output] = var
