"""Scaled dot-product attention for the graph frontend: `attention(q, k, v, mask=None, *,
causal=False, scale=None, ...)`, softmax(q . k^T * scale + mask) . v over the last two axes.

One node, lowered (`lower_attention`) to the chain the compiler runs as one attention kernel
(`tilec.plan.attention`): the score product, the scale, the soft cap, the mask, the causal and
window conditions, the softmax over the keys and the value product.  The scores are never
stored.  `attention_scores` gives the scores themselves at a chosen stage (a second node: the
attention node stays fusable).

Shapes: q [..., Hq, Tq, D], k [..., Hkv, Tk, D], v [..., Hkv, Tk, E] -> [..., Hq, Tq, E].  The
leading axes are shared; with Hkv < Hq (grouped-query attention, Hq a multiple of Hkv) query
head h reads key/value head h // (Hq / Hkv).  Inputs of rank 2 ([T, D]) have no heads.

- `mask`: broadcasts to the scores [..., Hq, Tq, Tk]; a float mask is added to the scores
  (0 keeps, -inf removes), a bool mask keeps the scores where it is true (torch's convention
  for `attn_mask` in both cases).
- `causal`: query i sees keys j <= i + offset.  `offset` 0 is the upper-left triangle (torch's
  `is_causal`, also when Tq != Tk); an int places query i at key position i + offset (after
  `offset` cached keys); "end" aligns the last query with the last key (Tk - Tq, or
  lengths[b] - Tq with `lengths`: the lower-right triangle).
- `window`: (left, right): query i sees keys i + offset - left <= j <= i + offset + right;
  None (or -1) leaves a side open.
- `lengths`: int [B] (B the first axis): keys j >= lengths[b] are masked (padded caches).
- `softcap`: c > 0 maps the scaled scores to c * tanh(s / c) before the mask (Gemma's cap).
- `scale`: 1 / sqrt(D) by default.
- `empty_rows`: what a query row with no key left gives: "nan" (softmax of all -inf, torch's
  result) or "zero" (ONNX's).  Zeroing costs a reduction over the mask's conditions and a
  select on the output, emitted only when a row can be empty (a mask, lengths, or causal /
  window bounds that leave a row without keys).

Float16 inputs are computed in float32 (scores, softmax and products) and rounded once."""

from __future__ import annotations

import math

import numpy as np

from ..errors import TileError
from .core import Value

_FLOATS = ("float16", "float32")
STAGES = ("scores", "biased", "probs")


def _check(q: Value, k: Value, v: Value | None, mask: Value | None, lengths: Value | None,
           offset: object, window: tuple[int | None, int | None] | None,
           softcap: float | None, empty_rows: str, scale: float | None) -> dict[str, object]:
    """The operands' shapes checked, and the node's attributes."""
    named = [("q", q), ("k", k)] + ([("v", v)] if v is not None else [])
    for name, x in named:
        if x.dtype not in _FLOATS:
            raise TileError(f"attention: {name} must be floating-point, not {x.dtype}")
        if x.ndim < 2:
            raise TileError(f"attention: {name} of shape {list(x.shape)} needs at least two "
                            "axes (rows, features)")
    if not all(x.ndim == q.ndim for _, x in named):
        ranks = " and ".join(str(x.ndim) for _, x in named)
        raise TileError(f"attention: q, k and v must have the same rank, not {ranks}")
    shapes = ", ".join(f"{n} {list(x.shape)}" for n, x in named)
    if q.ndim >= 3:
        hq, hkv = q.shape[-3], k.shape[-3]
        if k.shape[:-3] != q.shape[:-3] or any(
                x.shape[:-2] != k.shape[:-2] for _, x in named[2:]):
            raise TileError(f"attention: the leading axes of {shapes} must agree")
        if hkv == 0 or hq % hkv:
            raise TileError(f"attention: q's {hq} heads are not a multiple of k's {hkv} "
                            f"(dimension {q.ndim - 3}; {shapes})")
    elif any(x.shape[:-2] != q.shape[:-2] for _, x in named):
        raise TileError(f"attention: the leading axes of {shapes} must agree")
    if k.shape[-1] != q.shape[-1]:
        raise TileError(f"attention: q's feature size {q.shape[-1]} differs from k's "
                        f"{k.shape[-1]} (dimension {q.ndim - 1})")
    if v is not None and v.shape[-2] != k.shape[-2]:
        raise TileError(f"attention: k has {k.shape[-2]} keys but v {v.shape[-2]} rows "
                        f"(dimension {v.ndim - 2})")
    scores = (*q.shape[:-1], k.shape[-2])
    if mask is not None:
        ok = mask.ndim <= len(scores) and all(
            a in (1, b) for a, b in zip(reversed(mask.shape), reversed(scores), strict=False))
        if not ok:
            raise TileError(f"attention: the mask of shape {list(mask.shape)} does not "
                            f"broadcast to the scores {list(scores)}")
        if mask.dtype not in (*_FLOATS, "bool"):
            raise TileError(f"attention: the mask must be float or bool, not {mask.dtype}")
    if lengths is not None:
        if q.ndim < 3 or lengths.shape != q.shape[:1]:
            raise TileError(f"attention: lengths of shape {list(lengths.shape)} must hold one "
                            f"count per batch, [{q.shape[0]}], for inputs with a batch axis "
                            f"(q {list(q.shape)})")
        if lengths.dtype != "int32":
            raise TileError(f"attention: lengths must be integers, not {lengths.dtype}")
    if not (isinstance(offset, int) or offset == "end"):
        raise TileError(f"attention: offset {offset!r}, expected an int or 'end'")
    left, right = window or (None, None)
    bounds = tuple(-1 if b is None else int(b) for b in (left, right))
    if any(b < -1 for b in bounds):
        raise TileError(f"attention: window {window} has a negative bound (-1 or None: open)")
    cap = None if softcap is None or softcap <= 0 else float(softcap)
    if cap is not None and not math.isfinite(cap):
        raise TileError(f"attention: the soft cap {softcap} is not finite")
    if empty_rows not in ("nan", "zero"):
        raise TileError(f"attention: empty_rows {empty_rows!r}, expected 'nan' or 'zero'")
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if not math.isfinite(s):
        raise TileError(f"attention: the scale {scale} is not finite")
    return {"scale": s, "softcap": cap, "offset": offset, "window": bounds,
            "empty_rows": empty_rows, "mask": mask is not None, "lengths": lengths is not None}


def attention(q: Value, k: Value, v: Value, mask: Value | None = None, *,
              causal: bool = False, scale: float | None = None, softcap: float | None = None,
              offset: int | str = 0, window: tuple[int | None, int | None] | None = None,
              lengths: Value | None = None, empty_rows: str = "nan") -> Value:
    """softmax(q . k^T * scale [capped, masked]) . v; see the module's docstring."""
    attrs = _check(q, k, v, mask, lengths, offset, window, softcap, empty_rows, scale)
    inputs = [x for x in (q, k, v, mask, lengths) if x is not None]
    shape = (*q.shape[:-1], v.shape[-1])
    dtype = "float16" if all(x.dtype == "float16" for x in (q, k, v)) else "float32"
    return q.graph.add_node("attention", inputs, shape, dtype, causal=bool(causal), **attrs)


def attention_scores(q: Value, k: Value, mask: Value | None = None, *, stage: str = "scores",
                     causal: bool = False, scale: float | None = None,
                     softcap: float | None = None, offset: int | str = 0,
                     window: tuple[int | None, int | None] | None = None,
                     lengths: Value | None = None, empty_rows: str = "nan") -> Value:
    """The scores [..., Hq, Tq, Tk] of `attention` with the same arguments, at a stage:
    "scores" (scaled and capped), "biased" (the mask added, removed keys -inf) or "probs"
    (the softmax).  A separate node, so the attention itself still runs as one kernel."""
    if stage not in STAGES:
        raise TileError(f"attention_scores: stage {stage!r}, expected one of {STAGES}")
    attrs = _check(q, k, None, mask, lengths, offset, window, softcap, empty_rows, scale)
    inputs = [x for x in (q, k, mask, lengths) if x is not None]
    shape = (*q.shape[:-1], k.shape[-2])
    dtype = "float16" if q.dtype == k.dtype == "float16" else "float32"
    return q.graph.add_node("attention_scores", inputs, shape, dtype, causal=bool(causal),
                            stage=stage, **attrs)


def static_keep(tq: int, tk: int, causal: bool, offset: int,
                window: tuple[int, int]) -> np.ndarray:
    """[tq, tk]: which keys the causal and window conditions keep with a fixed offset."""
    i = np.arange(tq).reshape(tq, 1) + offset
    j = np.arange(tk).reshape(1, tk)
    keep = np.ones((tq, tk), bool)
    if causal:
        keep &= j <= i
    left, right = window
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    return keep


__all__ = ["STAGES", "attention", "attention_scores", "static_keep"]
