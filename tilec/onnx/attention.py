"""ONNX's Attention (opsets 23, 24 and 25) -> `tilec.graph.ops_attention.attention`, which runs
as one attention kernel where the device fuses it.

Inputs Q, K, V are [B, H, S, D], or [B, S, H * D] with the q_num_heads / kv_num_heads
attributes (seen as 4-D and Y turned back).  past_key / past_value are concatenated before K
and V (and are the present_key / present_value outputs).  attn_mask (bool: true keeps; float:
added) broadcasts to [B, Hq, Tq, Tk]; a mask with fewer keys than Tk leaves the rest out, as
ONNX pads it.  is_causal keeps key j for query i when j <= i + offset, where offset is the
past length, or nonpad_kv_seqlen[b] - Tq (opset 24, a padded external cache), or 0.  The window
sizes (opset 25) bound the keys around the same position.  GQA (fewer kv heads) is the graph
op's own.  A query row left without keys gives zeros (the reference's guard), not NaN.

The optional qk_matmul_output is a second node with the scores at the mode's stage (0 and 1:
after the scale and soft cap; 2: with the mask's bias added; 3: the softmax); the attention
itself is still fused.  softmax_precision is accepted for every floating type: the softmax
runs in float32, at least as precise as float16 and bfloat16, and what float64 models run in."""

from __future__ import annotations

import numpy as np

from ..graph import ops
from ..graph.builder import Value
from ..graph.ops_attention import attention, attention_scores
from .converters import Converter, NodeContext
from .elementwise import _since

# qk_matmul_output_mode -> attention_scores' stage (the reference's: mode 1 holds the soft
# capped scores, which is what mode 0 holds too).
_STAGES = {0: "scores", 1: "scores", 2: "biased", 3: "probs"}
# softmax_precision: FLOAT, FLOAT16, DOUBLE, BFLOAT16.
_PRECISIONS = (1, 10, 11, 16)


def _to_4d(c: NodeContext, x: Value, heads: int, what: str) -> Value:
    """[B, S, H * D] -> [B, H, S, D]."""
    b, s, hidden = x.shape
    if heads <= 0 or hidden % heads:
        raise c.fail(f"{what}'s hidden size {hidden} is not a multiple of its "
                     f"{heads} heads")
    return ops.transpose(ops.reshape(x, (b, s, heads, hidden // heads)), (0, 2, 1, 3))


def _heads(c: NodeContext, q: Value, k: Value, v: Value) -> tuple[Value, Value, Value]:
    qh, kvh = c.attr("q_num_heads"), c.attr("kv_num_heads")
    if q.ndim == 3:
        if qh is None or kvh is None:
            raise c.fail("3-D inputs need the attributes q_num_heads and kv_num_heads")
        return (_to_4d(c, q, qh, "Q"), _to_4d(c, k, kvh, "K"), _to_4d(c, v, kvh, "V"))
    if c.opset >= 25 and (qh is not None or kvh is not None):
        raise c.fail("q_num_heads and kv_num_heads must not be given for 4-D inputs")
    for attr, n, x in (("q_num_heads", qh, q), ("kv_num_heads", kvh, k)):
        if n is not None and n != x.shape[1]:
            raise c.fail(f"attribute {attr}={n} differs from the input's {x.shape[1]} heads")
    return q, k, v


def _mask(c: NodeContext, mask: Value | None, keys: int) -> Value | None:
    """The mask with as many keys as K: ONNX pads a shorter one with -inf (False)."""
    if mask is None:
        return None
    if mask.ndim == 0 or mask.ndim > 4:
        raise c.fail(f"attn_mask of shape {list(mask.shape)}: expected 1 to 4 axes")
    have = mask.shape[-1]
    if have > keys:
        raise c.fail(f"attn_mask has {have} keys, more than the {keys} of K (with the past)")
    if have == keys:
        return mask
    shape = (*mask.shape[:-1], keys - have)
    if mask.dtype == "bool":
        fill = c.g.constant(np.zeros(shape, bool))
    else:
        fill = c.g.constant(np.full(shape, -np.inf, np.float32), dtype=mask.dtype)
    return ops.concat([mask, fill], axis=-1)


def _attention(c: NodeContext) -> list[Value]:
    q, k, v = c.need(0), c.need(1), c.need(2)
    for name, x in (("Q", q), ("K", k), ("V", v)):
        if x.dtype not in ("float16", "float32"):
            raise c.fail(f"{name} must be floating-point, not {x.dtype}")
        if x.ndim not in (3, 4) or x.ndim != q.ndim:
            raise c.fail(f"Q, K and V must all be 3-D or all 4-D, not {q.ndim}, {k.ndim} "
                         f"and {v.ndim}")
    q, k, v = _heads(c, q, k, v)
    past_k, past_v = c.input(4), c.input(5)
    if (past_k is None) != (past_v is None):
        raise c.fail("past_key and past_value must be given together")
    lengths = c.input(6)
    if lengths is not None and past_k is not None:
        raise c.fail("nonpad_kv_seqlen cannot be combined with past_key / past_value")
    past = 0
    if past_k is not None and past_v is not None:
        for name, p, x in (("past_key", past_k, k), ("past_value", past_v, v)):
            if p.ndim != 4 or p.shape[:2] != x.shape[:2] or p.shape[3] != x.shape[3]:
                raise c.fail(f"{name} of shape {list(p.shape)} does not continue "
                             f"{list(x.shape)} (expected [B, H, past, D])")
        past = past_k.shape[2]
        k, v = ops.concat([past_k, k], axis=2), ops.concat([past_v, v], axis=2)
    mode = c.attr("qk_matmul_output_mode", 0)
    if mode not in _STAGES:
        raise c.unsupported("qk_matmul_output_mode", mode)
    precision = c.attr("softmax_precision")
    if precision is not None and precision not in _PRECISIONS:
        raise c.unsupported("softmax_precision", precision)
    left, right = c.attr("left_window_size", -1), c.attr("right_window_size", -1)
    for attr, w in (("left_window_size", left), ("right_window_size", right)):
        if w < -1:
            raise c.unsupported(attr, w)
    if lengths is not None and lengths.dtype != "int32":
        raise c.fail(f"nonpad_kv_seqlen must be integers, not {lengths.dtype}")
    args = {"causal": bool(c.attr("is_causal", 0)), "scale": c.attr("scale"),
            "softcap": c.attr("softcap", 0.0) or None, "window": (left, right),
            "offset": past if past_k is not None else "end" if lengths is not None else 0,
            "lengths": lengths, "empty_rows": "zero"}
    mask = _mask(c, c.input(3), k.shape[2])
    y = attention(q, k, v, mask, **args)  # type: ignore[arg-type]
    if c.input(0).ndim == 3:  # type: ignore[union-attr]
        b, h, s, e = y.shape
        y = ops.reshape(ops.transpose(y, (0, 2, 1, 3)), (b, s, h * e))
    outs = [y, k, v]
    if len(c.node.output) > 3 and c.node.output[3]:
        outs.append(attention_scores(q, k, mask, stage=_STAGES[mode],
                                     **args))  # type: ignore[arg-type]
    return outs[:len(c.node.output)]


ATTENTION_CONVERTERS: dict[str, Converter] = {"Attention": _since(23, _attention)}

__all__ = ["ATTENTION_CONVERTERS"]
