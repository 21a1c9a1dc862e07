"""ONNX Einsum (opset 12 on) -> `tilec.graph.ops_einsum.einsum`: the equation as the spec
writes it (implicit or explicit output, '...', repeated labels, any number of operands, spaces
ignored).  Two operands become one Tile contraction; more are contracted a pair at a time."""

from __future__ import annotations

from ..errors import TileError
from ..graph import ops_einsum
from ..graph.builder import Value
from .converters import Converter, NodeContext
from .elementwise import _since


def _einsum(c: NodeContext) -> list[Value]:
    equation = c.attr("equation")
    if equation is None:
        raise c.fail("the attribute equation is required")
    xs = [c.need(i) for i in range(len(c.node.input))]
    if not xs:
        raise c.fail("at least one operand is required")
    if any(x.dtype == "bool" for x in xs):
        raise c.fail("Einsum of bool operands is not supported (only numeric ones)")
    try:
        return [ops_einsum.einsum(equation, *xs)]
    except TileError as e:  # name the attribute the problem is in
        raise c.fail(f"attribute equation: {e.message}") from None

EINSUM_CONVERTERS: dict[str, Converter] = {"Einsum": _since(12, _einsum)}

__all__ = ["EINSUM_CONVERTERS"]
