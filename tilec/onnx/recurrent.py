"""ONNX's recurrent layers -> `tilec.graph.ops_rnn`: RNN, GRU and LSTM (opsets 7, 14 and 22:
the same computation; `layout` exists from opset 14 and is refused before it), every input (X,
W, R, B, sequence_lens, initial_h, initial_c, P) and attribute (direction, hidden_size,
activations with activation_alpha / activation_beta, clip, input_forget,
linear_before_reset, layout), the outputs Y, Y_h and Y_c in any subset.  Each layer is unrolled
over the sequence, its input projection one matrix product for all the steps.

Opset 1's forms (RNN's and GRU's `output_sequence`, and LSTM's before opset 7) are refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import TileError
from ..graph import ops_rnn
from ..graph.builder import Value
from .converters import Converter, NodeContext


def _common(c: NodeContext, kind: str) -> dict[str, Any]:
    """The attributes every recurrent layer has, checked."""
    if c.opset < 7:
        raise c.fail(f"{c.node.op_type} of opset {c.opset} is not supported (opset 7 on)")
    x = c.need(0)
    if x.dtype not in ("float16", "float32"):
        raise c.fail(f"{c.node.op_type} of a {x.dtype} input is not supported (only "
                     "floating-point ones)")
    layout = c.attr("layout", 0)
    if layout and c.opset < 14:
        raise c.fail(f"attribute layout exists from opset 14 on (the model imports opset "
                     f"{c.opset})")
    if layout not in (0, 1):
        raise c.unsupported("layout", layout)
    direction = c.attr("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise c.unsupported("direction", direction)
    names = [n.decode() if isinstance(n, bytes) else n for n in c.attr("activations", [])]
    dirs = 2 if direction == "bidirectional" else 1
    try:
        ops_rnn.activations(kind, dirs, names, c.attr("activation_alpha"),
                            c.attr("activation_beta"))
    except TileError as e:  # name the attribute
        raise c.fail(f"attribute activations={names!r}: {e.message}") from None
    clip = c.attr("clip")
    if clip is not None and not clip > 0:
        raise c.fail(f"attribute clip={clip!r} must be positive")
    return {"hidden_size": c.attr("hidden_size"), "direction": direction, "layout": layout,
            "activations": names or None,
            "activation_alpha": c.attr("activation_alpha"),
            "activation_beta": c.attr("activation_beta"), "clip": clip}


def _layer(kind: str, fn: Callable[..., tuple[Value, ...]], operands: int,
           **extra: tuple[str, Any]) -> Converter:
    """A converter: operands 0..operands-1 by position (absent ones None), the common
    attributes and `extra` attributes (keyword -> (ONNX name, default))."""
    def convert(c: NodeContext) -> list[Value]:
        attrs = _common(c, kind)
        for key, (name, default) in extra.items():
            attrs[key] = bool(c.attr(name, default))
        if kind in ("rnn", "gru") and c.attr("output_sequence") is not None:
            raise c.fail("attribute output_sequence (opset 1) is not supported")
        args = [c.need(0), c.need(1), c.need(2)] + [c.input(i) for i in range(3, operands)]
        hidden = attrs["hidden_size"]
        if hidden is not None and hidden != args[2].shape[-1]:
            raise c.fail(f"attribute hidden_size={hidden} differs from R's shape "
                         f"{list(args[2].shape)}")
        outs = list(fn(*args, **attrs))
        if len(c.node.output) > len(outs):
            raise c.fail(f"{len(c.node.output)} outputs; {c.node.op_type} has {len(outs)}")
        return outs[:len(c.node.output)]
    return convert


RECURRENT_CONVERTERS: dict[str, Converter] = {
    "RNN": _layer("rnn", ops_rnn.rnn, 6),
    "GRU": _layer("gru", ops_rnn.gru, 6, linear_before_reset=("linear_before_reset", 0)),
    "LSTM": _layer("lstm", ops_rnn.lstm, 8, input_forget=("input_forget", 0)),
}

__all__ = ["RECURRENT_CONVERTERS"]
