"""Reshapes read in place: a Flatten / Reshape feeding a matrix product costs no copy.

A reshape is a copy contraction of its own (`tilec.lower`), one more kernel and one more buffer.
When a 2-D gemm or matmul reads the reshape of a computed tensor, the pass `reshape_views`
makes the product read the reshape's *source* directly: the node keeps the source as its
operand and records the shape it is seen with (`view_a` / `view_b`).  Lowering writes the
source's access with the polynomials of the two shapes' common mixed-radix refinement and
substitutes the operand's index variables by theirs everywhere else.  The common case is the
classifier head, global pool -> Flatten -> Gemm, [N, C, 1, 1] read as [N, C]:

    g[r1, n : N, O] = +(p[r1, r0, 0, 0] * w[n, r0]);

The reshape node is then dead and goes (dead-node elimination); the kernel count drops by one
and the copy's buffer is not allocated.  Only reshapes that drop or add dimensions of size 1
are read in place (`_view_fits` says why: merged dimensions become several index variables,
which the compiler handles much more slowly than the copy); one operand per product is viewed
(a second view would have to agree with the first on the shared index).  A reshape of a
constant is already free (the executable binds the reshaped array)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from .core import GraphBase, Node
from .emit import Emitter, refinement


def _two_d_product(n: Node, g: GraphBase) -> bool:
    return n.op == "gemm" or (n.op == "matmul" and
                              all(len(g.type(i).shape) == 2 for i in n.inputs[:2]))


def _view_fits(src: Sequence[int], dst: Sequence[int]) -> bool:
    """A common refinement exists and every dimension the product sees is one digit of it
    (the reshape only drops or adds dimensions of size 1).  Where a dimension is several digits
    the compiler gets several indices it does not merge well: measured on PoCL, a gemm reading
    [8, 256, 7, 7] as [8, 12544] was 1.2 to 6 times slower, and a matmul reading [16, 64, 256]
    as [1024, 256] 30 times slower, than the copy plus a plain product."""
    found = refinement(src, dst)
    return found is not None and all(re.fullmatch(r"\w+", p) for p in found[2])


def reshape_views(g: GraphBase) -> GraphBase:
    """Products read the source of a reshaped operand in place (see the module)."""
    producers = {n.output: n for n in g.nodes}
    out = g.derive()
    for n in g.nodes:
        if _two_d_product(n, g) and not n.get("view_a") and not n.get("view_b"):
            for k in (0, 1):
                r = producers.get(n.inputs[k])
                if r is None or r.op != "reshape" or g.is_constant(r.inputs[0]):
                    continue
                if n.inputs[1 - k] == n.inputs[k]:  # both operands: one view cannot serve
                    continue
                if not _view_fits(g.type(r.inputs[0]).shape, r.shape):
                    continue
                inputs = list(n.inputs)
                inputs[k] = r.inputs[0]
                n = Node(n.op, tuple(inputs), n.output, n.type,
                         {**n.attrs, ("view_a", "view_b")[k]: tuple(r.shape)})
                break
        out.append(n)
    return out


def view_access(em: Emitter, node: Node, k: int, idx: Sequence[str], prefix: str
                ) -> tuple[str, dict[str, str]]:
    """Operand k's access text with index variables `idx` (one per dimension of the shape the
    product sees), and the substitution {variable: polynomial} for the other accesses."""
    value = node.inputs[k]
    shape = node.get(("view_a", "view_b")[k])
    if not shape:
        return f"{em.ref(value)}[{', '.join(idx)}]", {}
    found = refinement(em.shape(value), shape, prefix)  # type: ignore[arg-type]
    if found is None:
        raise AssertionError(f"internal: no refinement for the view of {value}")
    _, sp, dp = found
    return f"{em.ref(value)}[{', '.join(sp)}]", dict(zip(idx, dp, strict=True))


__all__ = ["reshape_views", "view_access"]
