"""Scaled dot-product attention for the graph frontend: `attention(q, k, v, mask=None,
causal=False, scale=None)`, softmax(q . k^T * scale + mask) . v over the last two axes, the
leading axes (batch, heads) shared by q, k and v.

One node, lowered (`lower_attention`) to the chain the compiler runs as one attention kernel
(`tilec.plan.attention`): the score product, the scale, the mask, the causal condition, the
softmax over the keys and the value product.  The scores are never stored.

- `mask`: broadcasts to the scores [..., Tq, Tk]; a float mask is added to the scores (0 keeps,
  -inf removes), a bool mask keeps the scores where it is true (torch's convention for
  `attn_mask` in both cases).
- `causal`: query i sees keys j <= i (the upper-left triangle, as torch's `is_causal`, also
  when Tq != Tk).  A row with no key left gives NaN, as softmax of all -inf does.
- `scale`: 1 / sqrt(D) by default."""

from __future__ import annotations

import math

from ..errors import TileError
from .core import Value

_FLOATS = ("float16", "float32")


def attention(q: Value, k: Value, v: Value, mask: Value | None = None, *,
              causal: bool = False, scale: float | None = None) -> Value:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dtype not in _FLOATS:
            raise TileError(f"attention: {name} must be floating-point, not {x.dtype}")
        if x.ndim < 2:
            raise TileError(f"attention: {name} of shape {list(x.shape)} needs at least two "
                            "axes (rows, features)")
    if not q.ndim == k.ndim == v.ndim:
        raise TileError(f"attention: q, k and v must have the same rank, not {q.ndim}, "
                        f"{k.ndim} and {v.ndim}")
    lead = q.shape[:-2]
    if k.shape[:-2] != lead or v.shape[:-2] != lead:
        raise TileError(f"attention: the leading axes of q {list(q.shape)}, k "
                        f"{list(k.shape)} and v {list(v.shape)} must agree")
    if k.shape[-1] != q.shape[-1]:
        raise TileError(f"attention: q's feature size {q.shape[-1]} differs from k's "
                        f"{k.shape[-1]} (dimension {q.ndim - 1})")
    if v.shape[-2] != k.shape[-2]:
        raise TileError(f"attention: k has {k.shape[-2]} keys but v {v.shape[-2]} rows "
                        f"(dimension {v.ndim - 2})")
    scores = (*lead, q.shape[-2], k.shape[-2])
    inputs = [q, k, v]
    if mask is not None:
        ok = mask.ndim <= len(scores) and all(
            a in (1, b) for a, b in zip(reversed(mask.shape), reversed(scores), strict=False))
        if not ok:
            raise TileError(f"attention: the mask of shape {list(mask.shape)} does not "
                            f"broadcast to the scores {list(scores)}")
        if mask.dtype not in (*_FLOATS, "bool"):
            raise TileError(f"attention: the mask must be float or bool, not {mask.dtype}")
        inputs.append(mask)
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if not math.isfinite(s):
        raise TileError(f"attention: the scale {scale} is not finite")
    shape = (*lead, q.shape[-2], v.shape[-1])
    dtype = "float16" if all(x.dtype == "float16" for x in (q, k, v)) else "float32"
    return q.graph.add_node("attention", inputs, shape, dtype, causal=bool(causal), scale=s)


__all__ = ["attention"]
