"""OpenCL C text for elementwise expressions, loads and stores of every element type.

Values are computed in `float` for float16/float32, in `uint` for uint32, in `int` for the
other integers and bool (0 or 1).  An operation on an 8- or 16-bit type wraps its result to
that width, as the reference does (C would only wrap on the store).  float16 is only ever
touched through vload_half/vstore_half, which need no extension."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping

from ..lang import ir

# Storage type in buffers, and the type values are computed in.
STORAGE = {"float32": "float", "float16": "half", "int32": "int", "bool": "uchar",
           "int8": "char", "uint8": "uchar", "int16": "short", "uint16": "ushort",
           "uint32": "uint"}
COMPUTE = {"float32": "float", "float16": "float", "int32": "int", "bool": "int",
           "int8": "int", "uint8": "int", "int16": "int", "uint16": "int", "uint32": "uint"}
NARROW = ("int8", "uint8", "int16", "uint16")  # stored narrower than they are computed


_OPERAND = re.compile(r"[\w.]+(\[[^\[\]]*\])*")


def muladd(a: str, b: str, c: str, form: str = "fma") -> str:
    """`a * b + c` as the hardware model's mul-add form says (plan/calibration.py: why the
    forms differ in speed by up to 9x on some drivers)."""
    if form == "fma":
        return f"fma({a}, {b}, {c})"
    if form == "mad":
        return f"mad({a}, {b}, {c})"
    if form != "mul_add":
        raise ValueError(f"unknown mul-add form {form!r}")
    a, b, c = (x if _OPERAND.fullmatch(x) else f"({x})" for x in (a, b, c))
    return f"({a} * {b} + {c})"


def narrow(text: str, dtype: str) -> str:
    """A computed value wrapped to its type's width."""
    return f"((int)({STORAGE[dtype]})({text}))" if dtype in NARROW else text


def literal(value: int | float, dtype: str) -> str:
    if COMPUTE[dtype] == "float":
        # A literal past float32's range is an infinity (as the reference rounds it, and as
        # C would with a warning): Tile has no other way to write one (`-1e39` for -inf).
        v = float(value)
        text = repr(v if abs(v) <= 3.4028234663852886e38 or v != v else v * math.inf)
        if "inf" in text or "nan" in text:
            return {"inf": "INFINITY", "-inf": "(-INFINITY)"}.get(text, "NAN")
        return text + "f"
    return str(int(value)) + ("u" if COMPUTE[dtype] == "uint" else "")


def identity(agg: str, dtype: str) -> str:
    """The start value of an aggregation."""
    c = COMPUTE[dtype]
    if agg == ">":
        return {"float": "(-INFINITY)", "uint": "0u"}.get(c, "INT_MIN")
    if agg == "<":
        return {"float": "INFINITY", "uint": "UINT_MAX"}.get(c, "INT_MAX")
    if agg == "*":
        return literal(1, dtype)
    return literal(0, dtype)


def clamp(x: str, lo: str, hi: str) -> str:
    """clamp(x, lo, hi) of a variable `x` as plain C: the same instructions where the driver
    inlines clamp(), no call (with its register spills) where it does not (`vector_access`)."""
    return f"({x} < {lo} ? {lo} : ({x} > {hi} ? {hi} : {x}))"


# Element types whose buffers are read and written as whole vectors where aligned.
VECTOR_ACCESS = ("float32", "int32", "uint32")


def vector_access(buf: str, offset: str, dtype: str, width: int, const: bool = False) -> str:
    """The `width`-vector at element `offset` of global buffer `buf` as a plain C lvalue, for a
    vector that starts on a multiple of its size (buffers start at least 128 bytes aligned:
    CL_DEVICE_MEM_BASE_ADDR_ALIGN).  vloadN/vstoreN only need element alignment, but they
    are library functions: where the driver's library is built for other CPU features than
    its kernels (the PyPI PoCL 3.0 on AVX-512 CPUs) they stay calls, and every call spills
    all vector registers (the accumulators) to the stack and back.  A pointer dereference is
    one vector load or store on every device."""
    ty = f"{'const ' if const else ''}{STORAGE[dtype]}{width}"
    return f"*((__global {ty}*)({buf} + ({offset})))"


def plain_vector_access(hw) -> bool:
    """Whether aligned global vectors are read and written as pointer dereferences (and the
    others through `unaligned_typedef`) rather than vloadN/vstoreN on this hardware model:
    on CPUs (the unaligned form declares a clang vector type, and a GPU's compiler may split
    an access of element alignment), unless the calibration measured vloadN faster
    (`hw.vector_access`, plan/calibration.choose_access).  Some PoCL builds leave vloadN a
    library call that spills every accumulator; where it is inlined it runs as fast as the
    plain form but costs PoCL 2-5x the time to generate a kernel's code (its library reads
    a vector lane by lane, and LLVM merges the lanes back)."""
    if hw.kind != "cpu":
        return False
    return hw.vector_access != "vload"


def unaligned_type(dtype: str, width: int) -> str:
    """The name of `unaligned_typedef`'s vector type."""
    return f"{STORAGE[dtype]}{width}_u"


def unaligned_typedef(dtype: str, width: int) -> str:
    """A vector type aligned like its element, declared in the kernel: a pointer to it reads
    or writes a vector at any element offset as one unaligned vector access (`load` and
    `store` with `unaligned`), where vloadN/vstoreN stay library calls (`vector_access`)."""
    return f"typedef {STORAGE[dtype]} {unaligned_type(dtype, width)} " \
        f"__attribute__((ext_vector_type({width}), aligned({ir.DTYPE_BYTES[dtype]})));"


def load(buf: str, offset: str, dtype: str, width: int = 1, aligned: bool = False,
         unaligned: bool = False) -> str:
    """A value (or a vector of `width` consecutive values) converted to its compute type.
    `aligned`: the vector starts on a multiple of its size (`vector_access`); `unaligned`:
    it may not, and is read through `unaligned_typedef`'s type, which the kernel declares."""
    c = COMPUTE[dtype]
    if width > 1 and aligned and dtype in VECTOR_ACCESS:
        return vector_access(buf, offset, dtype, width, const=True)
    if width > 1 and unaligned and dtype in VECTOR_ACCESS:
        return f"*((__global const {unaligned_type(dtype, width)}*)({buf} + ({offset})))"
    if width == 1:
        if dtype == "float16":
            return f"vload_half({offset}, {buf})"
        if dtype == "bool" or dtype in NARROW:
            return f"(int){buf}[{offset}]"
        return f"{buf}[{offset}]"
    if dtype == "float16":
        return f"vload_half{width}(0, {buf} + ({offset}))"
    if dtype == "bool" or dtype in NARROW:
        return f"convert_{c}{width}(vload{width}(0, {buf} + ({offset})))"
    return f"vload{width}(0, {buf} + ({offset}))"


def load_pairs(buf: str, offset: str, dtype: str, width: int, unaligned: bool = False) -> str:
    """A vector of `width` values two elements apart (a stride-2 window's columns): the even
    lanes of a vector read and the odd lanes of one that starts width - 1 later, so that the
    reads cover exactly the elements from the first lane's to the last lane's (a read one
    element past the last could leave the buffer).  CPU compilers make each half a vector
    load and the pair one shuffle."""
    if width == 2:
        return f"(({COMPUTE[dtype]}2)({load(buf, offset, dtype)}, " \
               f"{load(buf, f'{offset} + 2', dtype)}))"
    first = load(buf, offset, dtype, width, unaligned=unaligned)
    second = load(buf, f"({offset}) + {width - 1}", dtype, width, unaligned=unaligned)
    return f"(({COMPUTE[dtype]}{width})(({first}).even, ({second}).odd))"


def store(buf: str, offset: str, value: str, dtype: str, width: int = 1,
          aligned: bool = False, unaligned: bool = False) -> str:
    if width > 1 and aligned and dtype in VECTOR_ACCESS:
        return f"{vector_access(buf, offset, dtype, width)} = {value};"
    if width > 1 and unaligned and dtype in VECTOR_ACCESS:
        return f"*((__global {unaligned_type(dtype, width)}*)({buf} + ({offset}))) = {value};"
    if width == 1:
        if dtype == "float16":
            return f"vstore_half({value}, {offset}, {buf});"
        if dtype == "bool":
            return f"{buf}[{offset}] = (uchar)(({value}) != 0);"
        if dtype in NARROW:
            return f"{buf}[{offset}] = ({STORAGE[dtype]})({value});"
        return f"{buf}[{offset}] = {value};"
    if dtype == "float16":
        return f"vstore_half{width}({value}, 0, {buf} + ({offset}));"
    if dtype == "bool":
        return f"vstore{width}(convert_uchar{width}(({value}) != 0) & (uchar)1, 0, " \
               f"{buf} + ({offset}));"
    if dtype in NARROW:
        return f"vstore{width}(convert_{STORAGE[dtype]}{width}({value}), 0, {buf} + ({offset}));"
    return f"vstore{width}({value}, 0, {buf} + ({offset}));"


_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "eq": "==", "ne": "!=", "lt": "<",
          "gt": ">", "le": "<=", "ge": ">=", "and": "&&", "or": "||", "bitand": "&",
          "bitor": "|", "bitxor": "^", "shl": "<<", "shr": ">>"}


def _cast(text: str, frm: str, to: str) -> str:
    return text if COMPUTE[frm] == COMPUTE[to] else f"(({COMPUTE[to]})({text}))"


# Operations whose OpenCL form computes a float vector lane by lane exactly as it computes a
# float (`vector_safe`).  Left out: comparisons, logic and select (vector comparisons give -1
# for true, and a vector condition picks by its lanes' sign bits), conversions, integers.
VECTOR_OPS = ("add", "sub", "mul", "div", "neg", "exp", "log", "sqrt", "tanh", "floor", "ceil",
              "round", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "erf",
              "sigmoid", "abs", "relu", "min", "max", "pow")
# Of those, the builtins that take no scalar beside a vector in every argument position.
_VECTOR_ARGS = ("min", "max", "pow")


def vector_safe(e: ir.Expr) -> bool:
    """Whether `expr(e, ref, width=W)` computes W lanes at once with the scalar form's result
    in every lane: float tensors and operations (constants of any type: converted as
    scalars), operations in VECTOR_OPS."""
    if isinstance(e, ir.Const):
        return True
    if COMPUTE[e.dtype] != "float":
        return False
    if isinstance(e, ir.Op):
        return e.op in VECTOR_OPS and all(vector_safe(a) for a in e.args)
    return True


def expr(e: ir.Expr, ref: Callable[[str], str], types: Mapping[str, str] | None = None,
         positional: Callable[[ir.Op, list[str]], str] | None = None, width: int = 1,
         bind: Callable[[str], str] | None = None) -> str:
    """Scalar OpenCL C for `e`; `ref(name)` gives the text of a tensor's value at the element,
    `positional(op, args)` the text of an ir.EID_OPS node (only elementwise kernels have one).
    `width` > 1: the text of a `width`-vector, for an expression `vector_safe` accepts, whose
    `ref` gives vectors; constants beside vectors in min/max/pow become vectors.
    `bind(text)`: the name of a constant the caller declared holding `text` (a statement
    before this expression's).  With it a float relu is a compare and select on that name
    (`x > 0 ? x : 0`, the same value as `fmax(x, 0)` for every x, NaN included) rather than
    the builtin, which some PoCL builds leave a library call (plan/calibration.py): CPU
    contractions' post-ops, where a call between two accumulators' stores puts all the
    others on the stack and back."""

    def walk(x: ir.Expr) -> tuple[str, str]:
        if isinstance(x, ir.Const):
            return literal(x.value, x.dtype), x.dtype
        if isinstance(x, ir.Ref):
            return ref(x.name), x.dtype
        if x.op in ir.EID_OPS:
            if positional is None:
                raise ValueError(f"{x.op} needs the element's position")
            inner = [walk(a)[0] for a in x.args if not isinstance(a, ir.Ref)]
            return positional(x, inner), x.dtype
        args = [walk(a) for a in x.args]
        if width > 1 and x.op in _VECTOR_ARGS:
            vec = f"{COMPUTE[x.dtype]}{width}"
            args = [(t, dt) if ir.expr_refs(a) else
                    (f"(({vec})({_cast(t, dt, x.dtype)}))", x.dtype)
                    for (t, dt), a in zip(args, x.args, strict=True)]
        text, dt = node(x, args)
        return narrow(text, dt), dt

    def node(x: ir.Op, args: list[tuple[str, str]]) -> tuple[str, str]:
        dt = x.dtype
        c = COMPUTE[dt]
        if x.op == "select":
            (cond, tc), (a, ta), (b, tb) = args
            if COMPUTE[tc] == "float":  # OpenCL C takes no float condition; nonzero is true
                cond = f"({cond}) != 0.0f"
            return f"(({cond}) ? {_cast(a, ta, dt)} : {_cast(b, tb, dt)})", dt
        if x.op in _INFIX:
            (a, ta), (b, tb) = args
            if x.op in ("and", "or", "eq", "ne", "lt", "gt", "le", "ge"):
                common = ir.promote(ta, tb)
                return f"({_cast(a, ta, common)} {_INFIX[x.op]} {_cast(b, tb, common)})", dt
            if x.op in ("shl", "shr"):
                return f"({_cast(a, ta, dt)} {_INFIX[x.op]} ({_cast(b, tb, dt)} & 31))", dt
            if x.op == "div" and c == "uint":
                a, b = _cast(a, ta, dt), _cast(b, tb, dt)
                return f"(({b}) == 0u ? 0u : ({a}) / ({b}))", dt
            if x.op == "div" and c == "int":
                # Fix (differential): C leaves x / 0 and INT_MIN / -1 undefined (PoCL returned
                # garbage, x86 can trap); the reference defines them as 0 and a wrap-around.
                a, b = _cast(a, ta, dt), _cast(b, tb, dt)
                return (f"(({b}) == 0 ? 0 : ({b}) == -1 ? (int)(0u - (uint)({a})) "
                        f": ({a}) / ({b}))"), dt
            return f"({_cast(a, ta, dt)} {_INFIX[x.op]} {_cast(b, tb, dt)})", dt
        if x.op == "neg":
            (a, ta), = args
            return f"(-{_cast(a, ta, dt)})", dt
        if x.op == "not":
            (a, _), = args
            return f"(!({a}))", dt
        if x.op == "bitnot":
            (a, ta), = args
            return f"(~{_cast(a, ta, dt)})", dt
        if x.op in ir.CONVERSIONS:
            (a, ta), _ = args
            if dt in NARROW and COMPUTE[ta] == "float":
                return f"((int)({a}))", dt  # truncate, then wrap (below) like the reference
            return _cast(a, ta, dt), dt
        conv = [_cast(a, ta, dt) for a, ta in args]
        if x.op in ("exp", "log", "sqrt", "tanh", "floor", "ceil", "round", "sin", "cos", "tan",
                    "asin", "acos", "atan", "sinh", "cosh", "erf"):
            if c != "float":
                return conv[0], dt
            return f"{x.op}({conv[0]})", dt
        if x.op == "sigmoid":
            return f"(1.0f / (1.0f + exp(-{conv[0]})))", dt
        if x.op == "abs":
            return ({"float": f"fabs({conv[0]})", "uint": conv[0]}.get(
                c, f"((int)abs({conv[0]}))")), dt
        if x.op == "relu":
            if bind is not None and c == "float":
                v = conv[0] if conv[0].isidentifier() else bind(conv[0])
                return f"({v} > 0.0f ? {v} : 0.0f)", dt
            return ({"float": f"fmax({conv[0]}, 0.0f)", "uint": conv[0]}.get(
                c, f"max({conv[0]}, 0)")), dt
        if x.op in ("min", "max"):
            fn = ("f" + x.op) if c == "float" else x.op
            return f"{fn}({conv[0]}, {conv[1]})", dt
        if x.op == "pow":
            return f"pow({conv[0]}, {conv[1]})", dt
        raise ValueError(f"no OpenCL form for {x.op}")

    text, _ = walk(e)
    return text
