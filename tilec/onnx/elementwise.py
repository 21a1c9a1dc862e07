"""ONNX's elementwise operators beyond the arithmetic of `converters`: activations
(HardSigmoid, HardSwish, Gelu, Softplus, Elu, Selu, Mish, PRelu), math (Erf, Pow, Exp, Log,
Sqrt, Sin, Cos, Reciprocal, Neg, Abs), comparisons and logic (bool results), Where, and the
variadic Sum / Max / Min / Mean.  Each becomes `tilec.ops` / `tilec.graph.ops_math` calls, with
ONNX's attribute defaults; an op is refused in a model whose opset predates it."""

from __future__ import annotations

from collections.abc import Callable

from ..graph import ops, ops_math
from ..graph.builder import Value
from .converters import Converter, NodeContext, _binary, _unary


def _since(version: int, convert: Converter) -> Converter:
    """An op that ONNX's default domain has from opset `version` on."""
    def checked(c: NodeContext) -> list[Value]:
        if c.opset < version:
            raise c.fail(f"{c.node.op_type} exists from opset {version} on (the model imports "
                         f"opset {c.opset})")
        return convert(c)
    return checked


def _floats(c: NodeContext, *xs: Value) -> None:
    for x in xs:
        if x.dtype not in ("float16", "float32"):
            kind = "bool" if x.dtype == "bool" else "integer"
            raise c.fail(f"{c.node.op_type} of {kind} operands is not supported (only "
                         "floating-point ones)")


def _variadic(fn: Callable[[Value, Value], Value], mean: bool = False) -> Converter:
    """Sum, Max, Min, Mean: the operands broadcast together (numpy's rules, opset 8 on; earlier
    opsets require equal shapes, which broadcast trivially)."""
    def convert(c: NodeContext) -> list[Value]:
        xs = [c.need(i) for i in range(len(c.node.input))]
        if not xs:
            raise c.fail("at least one operand is required")
        if mean:
            _floats(c, *xs)
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        if mean and len(xs) > 1:
            out = ops.div(out, float(len(xs)))
        return [out]
    return convert


def _gelu(c: NodeContext) -> list[Value]:
    approximate = c.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise c.fail(f"attribute approximate={approximate!r} is not valid (expected 'none' or "
                     "'tanh')")
    return [ops_math.gelu(c.need(0), approximate)]


def _pow(c: NodeContext) -> list[Value]:
    _floats(c, c.need(0))  # an integer base needs an exact integer result
    return _binary(ops_math.pow)(c)


def _prelu(c: NodeContext) -> list[Value]:
    x, slope = c.need(0), c.need(1)
    _floats(c, x, slope)
    if c.opset < 7 and slope.ndim == 1 and x.ndim > 2 and slope.shape[0] == x.shape[1] > 1:
        # Before opset 7 a 1-D slope holds one value per channel (dimension 1), not per
        # element of the last dimension.
        slope = ops.reshape(slope, slope.shape + (1,) * (x.ndim - 2))
    return [ops_math.prelu(x, slope)]


def _float_unary(fn: Callable[[Value], Value]) -> Converter:
    def convert(c: NodeContext) -> list[Value]:
        x = c.need(0)
        _floats(c, x)
        return [fn(x)]
    return convert


def _where(c: NodeContext) -> list[Value]:
    cond, a, b = c.need(0), c.need(1), c.need(2)
    if cond.dtype != "bool":
        raise c.fail(f"the condition must be bool, not {cond.dtype}")
    return [ops_math.where(cond, a, b)]


def _logical(fn: Callable[..., Value]) -> Converter:
    def convert(c: NodeContext) -> list[Value]:
        xs = [c.need(i) for i in range(len(c.node.input))]
        bad = [x.dtype for x in xs if x.dtype != "bool"]
        if bad:
            raise c.fail(f"operands must be bool, not {bad[0]}")
        return _binary(fn)(c) if len(xs) == 2 else [fn(*xs)]
    return convert


ELEMENTWISE_CONVERTERS: dict[str, Converter] = {
    "HardSigmoid": lambda c: [ops_math.hard_sigmoid(c.need(0), c.attr("alpha", 0.2),
                                                    c.attr("beta", 0.5))],
    "HardSwish": _since(14, _float_unary(ops_math.hard_swish)),
    "Erf": _since(9, _float_unary(ops_math.erf)),
    "Gelu": _since(20, _gelu),
    "Softplus": _float_unary(ops_math.softplus),
    "Elu": lambda c: [ops_math.elu(c.need(0), c.attr("alpha", 1.0))],
    "Selu": lambda c: [ops_math.selu(c.need(0), c.attr("alpha", 1.67326319217681884765625),
                                     c.attr("gamma", 1.05070102214813232421875))],
    "Mish": _since(18, _float_unary(ops_math.mish)),
    "PRelu": _prelu,
    "Pow": _pow,
    "Exp": _float_unary(ops.exp),
    "Log": _float_unary(ops_math.log),
    "Sqrt": _float_unary(ops.sqrt),
    "Sin": _since(7, _float_unary(ops_math.sin)),
    "Cos": _since(7, _float_unary(ops_math.cos)),
    "Reciprocal": _float_unary(ops_math.reciprocal),
    "Neg": _unary(ops.neg),
    "Abs": _unary(ops_math.abs),
    "Where": _since(9, _where),
    "Equal": _binary(ops_math.equal),
    "Less": _binary(ops_math.less),
    "Greater": _binary(ops_math.greater),
    "LessOrEqual": _since(12, _binary(ops_math.less_equal)),
    "GreaterOrEqual": _since(12, _binary(ops_math.greater_equal)),
    "Not": _logical(ops_math.logical_not),
    "And": _logical(ops_math.logical_and),
    "Or": _logical(ops_math.logical_or),
    "Sum": _variadic(ops.add),
    "Max": _variadic(ops_math.maximum),
    "Min": _variadic(ops_math.minimum),
    "Mean": _variadic(ops.add, mean=True),
}


__all__ = ["ELEMENTWISE_CONVERTERS"]
