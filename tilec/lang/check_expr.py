"""Typed expressions of an elementwise statement: each operand's dtype and shape, the result
type of operators and calls (literals do not widen tensors), broadcasting (`TypedExprs`, a
part of `check._Checker`, whose symbol tables it reads)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import ast, ir
from .builtins import CONVERSION_WIDTHS, INLINE, NATIVE


class TypedExprs:
    """Expressions typed and shaped (mixed into `check._Checker`)."""

    def expr(self, e: ast.Expr) -> tuple[ir.Expr, bool]:
        """The typed expression and whether its type is weak (built only from literals)."""
        if isinstance(e, ast.Num):
            if not e.is_float:
                self._int_literal(e)
            return ir.Const(e.value, "float32" if e.is_float else "int32"), True
        if isinstance(e, ast.Name):
            if e.id in self.prngs:
                raise self.err(f"{e.id!r} is a random-number draw (prng_step); read it through "
                               f"prng_value({e.id}) or prng_state({e.id})", e.span)
            if e.id in self.tensors:
                t = self.tensors[e.id]
                return ir.Ref(t.name, t.dtype, t.shape), False
            if e.id in self.sizes:
                return ir.Const(self.sizes[e.id], "int32"), True
            raise self.err(f"unknown name {e.id!r}" + self._known(), e.span)
        if isinstance(e, ast.Unary):
            x, weak = self.expr(e.operand)
            if e.op == "not":
                dt = "bool"
            elif e.op == "bitnot":
                self._need_int(x, e, "~")
                dt = x.dtype
            else:
                dt = "int32" if x.dtype == "bool" else x.dtype
            return ir.Op(e.op, (x,), dt, _shape(x)), weak
        if isinstance(e, ast.Binary):
            return self._binary(e)
        if isinstance(e, ast.Select):
            c, _ = self.expr(e.cond)
            (a, wa), (b, wb) = self.expr(e.then), self.expr(e.other)
            dt = _join((a, wa), (b, wb))
            return ir.Op("select", (c, a, b), dt, self._broadcast(e, c, a, b)), wa and wb
        if isinstance(e, ast.Call):
            return self._call(e)
        raise self.err("unsupported expression", e.span)

    def _need_int(self, x: ir.Expr, e: ast.Expr, sym: str) -> None:
        if x.dtype in ir.FLOAT_DTYPES:
            raise self.err(f"'{sym}' needs integer operands, not {x.dtype}", e.span)

    def _binary(self, e: ast.Binary) -> tuple[ir.Expr, bool]:
        (a, wa), (b, wb) = self.expr(e.left), self.expr(e.right)
        shape = self._broadcast(e, a, b)
        if e.op in ir.COMPARISONS:
            dt = "bool"
        elif e.op in _BITWISE:
            self._need_int(a, e, _BITWISE[e.op])
            self._need_int(b, e, _BITWISE[e.op])
            dt = _join((a, wa), (b, wb))
        else:
            dt = _join((a, wa), (b, wb))
            if dt == "bool":
                dt = "int32"
        return ir.Op(e.op, (a, b), dt, shape), wa and wb

    def _call(self, e: ast.Call) -> tuple[ir.Expr, bool]:
        if e.fn in INLINE:
            t = self.tensors[self.inline(e, None, f"{e.fn}(...)")]
            return ir.Ref(t.name, t.dtype, t.shape), False
        if e.fn in NATIVE or e.fn in CONVERSION_WIDTHS:
            return self.native(e)
        if e.fn.startswith("assert_"):
            return ir.Const(int(self.assertion(e)), "int32"), True
        if e.fn == "broadcast" and self.is_size_expr(e):
            return ir.Const(self.size(e), "int32"), True
        if e.fn not in ir.CALLS:
            known = sorted(set(ir.CALLS) | set(INLINE) | set(NATIVE)
                           | set(CONVERSION_WIDTHS))
            raise self.err(f"unknown function {e.fn!r} (expected one of "
                           f"{', '.join(known)})", e.span)
        arity = ir.CALLS[e.fn]
        if len(e.args) != arity:
            raise self.err(f"{e.fn} takes {arity} argument{'s' if arity > 1 else ''}, "
                           f"{len(e.args)} given", e.span)
        args = [self.expr(x) for x in e.args]
        exprs = tuple(x for x, _ in args)
        shape = self._broadcast(e, *exprs)
        dt = _join(*args)
        if e.fn in ir.FLOAT_CALLS and dt not in ir.FLOAT_DTYPES:
            dt = "float32"
        if dt == "bool":
            dt = "int32"
        return ir.Op(e.fn, exprs, dt, shape), all(w for _, w in args)

    def _broadcast(self, e: ast.Expr, *xs: ir.Expr) -> tuple[int, ...]:
        shapes = [_shape(x) for x in xs]
        try:
            return tuple(int(d) for d in np.broadcast_shapes(*shapes))
        except ValueError:
            desc = " and ".join(_shape_text(s) for s in shapes)
            raise self.err(f"operand shapes {desc} do not broadcast (trailing dimensions "
                           "must be equal or 1)", e.span) from None


_BITWISE = {"bitand": "&", "bitor": "|", "bitxor": "^", "shl": "<<", "shr": ">>"}


def _shape(x: ir.Expr) -> tuple[int, ...]:
    return () if isinstance(x, ir.Const) else x.shape


def _join(*typed: tuple[ir.Expr, bool]) -> str:
    """Result type: literals do not widen tensors, but a float literal makes an int float."""
    strong = [x.dtype for x, weak in typed if not weak]
    weak = [x.dtype for x, w in typed if w]
    if not strong:
        return ir.promote(*weak)
    dt = ir.promote(*strong)
    if dt not in ir.FLOAT_DTYPES and any(w in ir.FLOAT_DTYPES for w in weak):
        return "float32"
    return dt


def _shape_text(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"
