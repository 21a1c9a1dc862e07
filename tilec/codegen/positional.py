"""OpenCL C for the expression nodes whose value depends on the element's position
(`ir.EID_OPS`: index, shape, reshape, gather, scatter, prng, prng_state) in an elementwise
kernel.  Each node is computed at its own flat element number `eid`: the kernel's `gid` when the
node has the kernel's shape, else its broadcast offset.  Operands read away from the element
are in global memory (the fusion pass sees to it)."""

from __future__ import annotations

import math
from collections.abc import Callable

from ..lang import ir
from . import clexpr
from .kernel_text import buf, row_major_strides


def row_of(index: str, dtype: str, rows: int) -> str:
    """An index value as a row number: truncated toward zero and clamped into [0, rows) (a bad
    index never reads outside the tensor; the reference does the same)."""
    last = rows - 1
    if dtype in ir.FLOAT_DTYPES:
        return f"((int)clamp({index}, 0.0f, {float(last)!r}f))"
    if dtype in ir.UNSIGNED_DTYPES:
        return f"((int)min((uint)({index}), {last}u))"
    return f"clamp({index}, 0, {last})"


_MIX = ("{v} ^= {v} >> 16; {v} *= 0x7feb352du; {v} ^= {v} >> 15; {v} *= 0x846ca68bu; "
        "{v} ^= {v} >> 16;")


class Positional:
    """The `positional` callback of `clexpr.expr` for one elementwise kernel; statements a
    node needs before the expression (scatter's loop, the generator's mixing) go to `lines`."""

    def __init__(self, shape: tuple[int, ...], program: ir.Program,
                 offset: Callable[[tuple[int, ...], tuple[int, ...]], str]):
        self.shape = shape
        self.program = program
        self.offset = offset
        self.lines: list[str] = []
        self.count = 0

    def _load(self, ref: ir.Expr, at: str) -> str:
        assert isinstance(ref, ir.Ref)
        return clexpr.load(buf(ref.name), at, self.program.tensors[ref.name].dtype)

    def _var(self, stem: str) -> str:
        self.count += 1
        return f"{stem}{self.count}"

    def __call__(self, x: ir.Op, consts: list[str]) -> str:
        eid = self.offset(x.shape, self.shape)
        eid = eid if eid in ("gid", "0") else f"({eid})"
        return getattr(self, f"_{x.op}")(x, eid)

    def _index(self, x: ir.Op, eid: str) -> str:
        axis = int(x.args[0].value)  # type: ignore[union-attr]
        stride = row_major_strides(x.shape)[axis]
        coord = eid if stride == 1 else f"{eid} / {stride}"
        return coord if axis == 0 else f"(({coord}) % {x.shape[axis]})"

    def _shape(self, x: ir.Op, eid: str) -> str:
        dims = [int(a.value) for a in x.args]  # type: ignore[union-attr]
        text = str(dims[-1])
        for k in range(len(dims) - 2, -1, -1):
            text = f"({eid} == {k} ? {dims[k]} : {text})"
        return text

    def _reshape(self, x: ir.Op, eid: str) -> str:
        return self._load(x.args[0], eid)

    def _gather(self, x: ir.Op, eid: str) -> str:
        v, i = x.args
        assert isinstance(v, ir.Ref) and isinstance(i, ir.Ref)
        inner = math.prod(v.shape[1:])
        row = row_of(self._load(i, eid if inner == 1 else f"{eid} / {inner}"), i.dtype,
                     v.shape[0])
        at = row if inner == 1 else f"{row} * {inner} + {eid} % {inner}"
        return self._load(v, at)

    def _scatter(self, x: ir.Op, eid: str) -> str:
        v, i = x.args
        assert isinstance(v, ir.Ref) and isinstance(i, ir.Ref)
        inner = math.prod(x.shape[1:])
        acc, q = self._var("sc"), self._var("q")
        ctype = clexpr.COMPUTE[x.dtype]
        row = eid if inner == 1 else f"{eid} / {inner}"
        value = self._load(v, q if inner == 1 else f"{q} * {inner} + {eid} % {inner}")
        self.lines += [
            f"{ctype} {acc} = {clexpr.literal(0, x.dtype)};  /* scatter: rows whose index "
            "is this row */",
            f"for (int {q} = 0; {q} < {math.prod(i.shape)}; ++{q}) {{",
            f"    if ({row_of(self._load(i, q), i.dtype, x.shape[0])} == {row}) "
            f"{acc} += {value};",
            "}"]
        return acc

    def _prng(self, x: ir.Op, eid: str) -> str:
        s = x.args[0]
        h = self._var("rng")
        self.lines += [
            f"uint {h} = (uint)({self._load(s, '1')}) + (uint)({eid});  /* counter + element */",
            _MIX.format(v=h),
            f"{h} ^= (uint)({self._load(s, '0')});  /* key */",
            _MIX.format(v=h)]
        return f"((float)({h} >> 8) * (1.0f / 16777216.0f))"

    def _prng_state(self, x: ir.Op, eid: str) -> str:
        s, count = x.args
        assert isinstance(count, ir.Const)
        old = self._load(s, eid)
        c = clexpr.COMPUTE[x.dtype]
        bumped = f"(({c})((uint)({old}) + {int(count.value) % 2**32}u))"
        return f"({eid} == 1 ? {bumped} : {old})"
