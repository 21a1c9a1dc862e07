"""PlaidML's builtin functions, as the checker gives them meaning.

Three kinds:

* Inline builtins (`INLINE`): functions written in Tile itself (softmax over the second axis of
  a 2-D tensor, binary cross-entropy, PlaidML's named operators such as `cmp_eq` or `cond`).
  A call is replaced by the function's statements: tensor arguments are bound to the caller's
  tensors (an expression argument is computed into a temporary first), size arguments become
  named sizes, and the function's own temporaries get fresh names.  Errors inside point at the
  call.
* Size builtins: `broadcast(a, b)` of two sizes (numpy's rule); with `max` and `min` they may
  stand wherever an integer may (see `check.size`).
* Native builtins, new expression nodes (`ir.EID_OPS`): `reshape`, `index`, `gather`,
  `scatter`, `shape`, `prng_step / prng_state / prng_value`, and the conversions `as_float`,
  `as_int`, `as_uint`, `as_bool`.  Assertions (`assert_*`) are checked once shapes are bound.

The random numbers (`prng_*`) come from a counter-based generator, the same on every device
and in the reference: the state tensor's element 0 is the key and element 1 the counter; value
number e (row-major) of a draw is `mix(mix(counter + e) ^ key)`, where `mix` is the 32-bit
integer hash x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16 (all
arithmetic modulo 2^32), and the float is the top 24 bits times 2^-24, in [0, 1).  The next
state is the state with the counter advanced by the number of values drawn; other elements are
kept.  The same state gives the same values; the next state gives new ones.
"""

from __future__ import annotations

import functools
import math
import re
import warnings
from dataclasses import dataclass, fields, is_dataclass, replace

from ..errors import Span, TileCheckError, TileWarning
from . import ast, ir

# name -> (parameters, body).  The body assigns Y, the result.  Parameters used as sizes in the
# body (output sizes, here R) take size arguments; the others take tensors.
INLINE: dict[str, tuple[tuple[str, ...], str]] = {
    # Softmax of each row of a 2-D tensor [R, C]; the maximum is subtracted before exp so that
    # exp cannot overflow.
    "builtin_softmax": (("X", "R", "C"), """
        M[i, 0 : R, 1] = >(X[i, j]);
        E = exp(X - M);
        S[i, 0 : R, 1] = +(E[i, j]);
        Y = E / S;"""),
    "builtin_logsoftmax": (("X", "R", "C"), """
        M[i, 0 : R, 1] = >(X[i, j]);
        E = exp(X - M);
        S[i, 0 : R, 1] = +(E[i, j]);
        Y = X - (M + log(S));"""),
    # P is the (already clipped) prediction, T the target; the third argument (the element
    # count) only scales PlaidML's derivative, so the value does not use it.
    "builtin_binary_crossentropy": (("P", "T", "N"), "Y = -T * log(P) - (1 - T) * log(1 - P);"),
    # The forward value of reverse_grad is its first operand (the second scales the gradient).
    "reverse_grad": (("X", "G"), "Y = X;"),
    "ident": (("X",), "Y = X;"),
    # PlaidML's operators by name.
    "add": (("A", "B"), "Y = A + B;"),
    "sub": (("A", "B"), "Y = A - B;"),
    "mul": (("A", "B"), "Y = A * B;"),
    "div": (("A", "B"), "Y = A / B;"),
    "neg": (("A",), "Y = -A;"),
    "recip": (("A",), "Y = 1.0 / A;"),
    "cond": (("C", "A", "B"), "Y = (C ? A : B);"),
    "cmp_eq": (("A", "B"), "Y = A == B;"),
    "cmp_ne": (("A", "B"), "Y = A != B;"),
    "cmp_lt": (("A", "B"), "Y = A < B;"),
    "cmp_gt": (("A", "B"), "Y = A > B;"),
    "cmp_le": (("A", "B"), "Y = A <= B;"),
    "cmp_ge": (("A", "B"), "Y = A >= B;"),
    "bit_and": (("A", "B"), "Y = A & B;"),
    "bit_or": (("A", "B"), "Y = A | B;"),
    "bit_xor": (("A", "B"), "Y = A ^ B;"),
    "bit_left": (("A", "B"), "Y = A << B;"),
    "bit_right": (("A", "B"), "Y = A >> B;"),
    "bit_not": (("A",), "Y = ~A;"),
}

# Native builtins and their argument counts (None: at least the given minimum, see below).
NATIVE = {"reshape": None, "index": 2, "gather": 2, "scatter": 3, "shape": 1,
          "prng_step": None, "prng_state": 1, "prng_value": 1, "as_uint": 2, "as_bool": None}
CONVERSION_WIDTHS = {"as_float": {16: "float16", 32: "float32"},
               "as_int": {8: "int8", 16: "int16", 32: "int32"},
               "as_uint": {8: "uint8", 16: "uint16", 32: "uint32"}}


@dataclass(frozen=True)
class Prng:
    """What `prng_step(S, d...)` names: a draw of values of shape `dims` from state `state`."""

    state: str
    dims: tuple[int, ...]


@functools.cache
def _inline_body(name: str) -> tuple[ast.Statement, ...]:
    from .parse import parse

    params, body = INLINE[name]
    fn = parse(f"function ({', '.join(params)}) -> (Y) {{ {body} }}", f"<builtin {name}>")
    return fn.stmts


def _size_params(name: str) -> set[str]:
    """The parameters the body uses as sizes (after ':' in an output, or in a constraint)."""
    out: set[str] = set()
    for st in _inline_body(name):
        if isinstance(st, ast.Contraction):
            for e in (st.sizes or ()) + tuple(k.bound for k in st.constraints):
                out |= _names(e)
    return out


def _names(e) -> set[str]:
    if isinstance(e, ast.Name):
        return {e.id}
    out: set[str] = set()
    if is_dataclass(e):
        for f in fields(e):
            v = getattr(e, f.name)
            for x in (v if isinstance(v, tuple) else (v,)):
                if isinstance(x, ast.Node):
                    out |= _names(x)
    return out


def renamed(node, names: dict[str, str], span: Span):
    """`node` with tensor and size names replaced (index variables are never in `names`) and
    every span set to `span` (errors inside a builtin point at its call)."""
    if isinstance(node, tuple):
        return tuple(renamed(x, names, span) for x in node)
    if not isinstance(node, ast.Node):
        return node
    changes = {f.name: renamed(getattr(node, f.name), names, span) for f in fields(node)
               if f.name not in ("span", "text")}
    if isinstance(node, ast.Name):
        changes["id"] = names.get(node.id, node.id)
    if isinstance(node, (ast.TensorRef, ast.Assignment)):
        changes["name"] = names.get(node.name, node.name)
    return replace(node, **changes, span=span)


def prng_mix(x):
    """The generator's 32-bit hash, on numpy uint32 arrays (wrapping arithmetic)."""
    import numpy as np

    x = np.asarray(x, dtype=np.uint32)
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint32(16))
        x = x * np.uint32(0x7FEB352D)
        x = x ^ (x >> np.uint32(15))
        x = x * np.uint32(0x846CA68B)
        x = x ^ (x >> np.uint32(16))
    return x


def prng_values(state, shape: tuple[int, ...]):
    """The float32 values of one draw (the reference's side of the generator)."""
    import numpy as np

    flat = np.asarray(state).reshape(-1).astype(np.int64).astype(np.uint32)
    key, counter = flat[0], flat[1]
    n = math.prod(shape)
    with np.errstate(over="ignore"):
        e = (np.arange(n, dtype=np.uint64) + np.uint64(counter)).astype(np.uint32)
    h = prng_mix(prng_mix(e) ^ key)
    return ((h >> np.uint32(8)).astype(np.float64) * 2.0 ** -24).astype(np.float32) \
        .reshape(shape)


class BuiltinChecks:
    """The checker's side of the builtins (mixed into `check._Checker`, whose state it uses:
    `sizes`, `tensors`, `ops`, `err`, `expr`, `size`, `is_size_expr`)."""

    def _fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.taken:
            k += 1
            name = f"{base}{k}"
        self.taken.add(name)
        return name

    def _hoist(self, e: ast.Expr, base: str) -> str:
        """A tensor name for an argument: the tensor itself, or a temporary computing it."""
        if isinstance(e, ast.Name) and e.id in self.tensors:
            return e.id
        if isinstance(e, ast.Name) and e.id in self.prngs:
            raise self.err(f"{e.id!r} is a random-number draw (prng_step); read it through "
                           f"prng_value({e.id}) or prng_state({e.id})", e.span)
        x, _ = self.expr(e)
        name = self._fresh(base)
        shape = x.shape if isinstance(x, (ir.Ref, ir.Op)) else ()
        self.tensors[name] = ir.Tensor(name, shape, x.dtype)
        self.ops.append(ir.Elementwise(name, x, f"{name} = (argument)", e.span))
        return name

    # inline builtins ---------------------------------------------------------------------------
    def inline(self, call: ast.Call, target: str | None, text: str) -> str:
        """Check the statements of an inline builtin for this call; returns the tensor that
        holds the result (`target`, or a fresh temporary)."""
        params, _ = INLINE[call.fn]
        if len(call.args) != len(params):
            raise self.err(f"{call.fn} takes {len(params)} argument"
                           f"{'s' if len(params) > 1 else ''} ({', '.join(params)}), "
                           f"{len(call.args)} given", call.span)
        sizes = _size_params(call.fn)
        used = set().union(*(_names(st) for st in _inline_body(call.fn)))
        out = target or self._fresh(f"{call.fn.removeprefix('builtin_')}")
        names: dict[str, str] = {"Y": out}
        shown: dict[str, str] = {"Y": out}  # for the statements' text
        for p, a in zip(params, call.args, strict=True):
            if p not in used:  # checked, but it does not enter the value
                if not self.is_size_expr(a):
                    self.expr(a)
                continue
            if p in sizes:
                if not self.is_size_expr(a):
                    raise self.err(f"argument {p} of {call.fn} is a size: an expression of "
                                   "integers and size symbols", a.span)
                internal = f"{p}.{len(self.sizes)}"  # a dot: never a user's or index name
                self.sizes[internal] = self.size(a)
                names[p] = internal
                shown[p] = str(self.sizes[internal])
            else:
                names[p] = shown[p] = self._hoist(a, f"{out}_{p}")
        body = _inline_body(call.fn)
        for st in body:
            assigned = st.output.name if isinstance(st, ast.Contraction) else st.name
            if assigned not in names:
                names[assigned] = shown[assigned] = self._fresh(f"{out}_{assigned}")
        try:
            for st in body:
                own = re.sub(r"\b[A-Za-z_]\w*\b", lambda m: shown.get(m.group(), m.group()),
                             st.text.strip().rstrip(";"))
                st = replace(renamed(st, names, call.span), text=f"{own}  [{text}]")
                if isinstance(st, ast.Contraction):
                    self.ops.append(self._contraction(st, internal=True))
                else:
                    self.ops.append(self._assignment(st, internal=True))
        except TileCheckError as exc:
            raise self.err(f"in {call.fn}: {exc.message}", call.span) from None
        return out

    # native builtins ---------------------------------------------------------------------------
    def native(self, e: ast.Call) -> tuple[ir.Expr, bool]:
        fn, args = e.fn, e.args
        if fn in CONVERSION_WIDTHS:
            return self._conversion(e)
        if fn == "as_bool":
            if len(args) not in (1, 2):
                raise self.err(f"as_bool takes 1 or 2 arguments, {len(args)} given", e.span)
            if len(args) == 2:
                bits = self._bits(e)
                if bits != 1:
                    raise self.err(f"as_bool takes a width of 1, not {bits}", args[1].span)
            x, _ = self.expr(args[0])
            return ir.Op("ne", (x, ir.Const(0, "int32")), "bool", _shape(x)), False
        want = NATIVE[fn]
        if want is not None and len(args) != want:
            raise self.err(f"{fn} takes {want} argument{'s' if want > 1 else ''}, "
                           f"{len(args)} given", e.span)
        return getattr(self, f"_b_{fn}")(e), False

    def _bits(self, e: ast.Call) -> int:
        b = e.args[1]
        if not (isinstance(b, ast.Num) and not b.is_float):
            raise self.err(f"the second argument of {e.fn} is a bit width literal", b.span)
        return int(b.value)

    def _conversion(self, e: ast.Call) -> tuple[ir.Expr, bool]:
        if len(e.args) != 2:
            raise self.err(f"{e.fn} takes 2 arguments (a tensor and a bit width), "
                           f"{len(e.args)} given", e.span)
        bits = self._bits(e)
        widths = CONVERSION_WIDTHS[e.fn]
        if bits not in widths:
            extra = (" (64-bit types are not supported: OpenCL's embedded profile lacks them)"
                     if bits == 64 else "")
            raise self.err(f"{e.fn} takes a width of {', '.join(map(str, widths))}, not "
                           f"{bits}{extra}", e.args[1].span)
        x, _ = self.expr(e.args[0])
        return ir.Op(e.fn, (x, ir.Const(bits, "int32")), widths[bits], _shape(x)), False

    def _sizes_of(self, args, what: str) -> tuple[int, ...]:
        dims = []
        for a in args:
            if not self.is_size_expr(a):
                self.size(a)  # says what is wrong where it can (an input used as a size)
                raise self.err(f"the sizes of {what} are integers or size expressions", a.span)
            d = self.size(a)
            if d <= 0:
                raise self.err(f"a size of {what} is {d}; sizes must be positive", a.span)
            dims.append(d)
        return tuple(dims)

    def _b_reshape(self, e: ast.Call) -> ir.Expr:
        if not e.args:
            raise self.err("reshape takes a tensor and its new sizes", e.span)
        src = self.tensors[self._hoist(e.args[0], "reshape_in")]
        dims = self._sizes_of(e.args[1:], "reshape")
        if math.prod(dims) != src.size:
            raise self.err(f"reshape {_text(src.shape)} to {_text(dims)}: {src.size} elements "
                           f"do not fill {math.prod(dims)}", e.span)
        return ir.Op("reshape", (ir.Ref(src.name, src.dtype, src.shape),), src.dtype, dims)

    def _axis(self, a: ast.Expr, rank: int, fn: str) -> int:
        if not self.is_size_expr(a):
            raise self.err(f"the axis of {fn} is an integer", a.span)
        axis = self.size(a)
        if not -rank <= axis < rank:
            raise self.err(f"axis {axis} is out of range for a tensor of rank {rank}", a.span)
        return axis % rank

    def _b_index(self, e: ast.Call) -> ir.Expr:
        x, _ = self.expr(e.args[0])
        shape = _shape(x)
        axis = self._axis(e.args[1], len(shape), "index") if shape else None
        if axis is None:
            raise self.err("index() needs a tensor of rank 1 or more", e.args[0].span)
        return ir.Op("index", (ir.Const(axis, "int32"),), "int32", shape)

    def _b_shape(self, e: ast.Call) -> ir.Expr:
        x, _ = self.expr(e.args[0])
        shape = _shape(x)
        if not shape:
            raise self.err("shape() of a scalar has no elements", e.args[0].span)
        return ir.Op("shape", tuple(ir.Const(d, "int32") for d in shape), "int32",
                     (len(shape),))

    def _b_gather(self, e: ast.Call) -> ir.Expr:
        v = self.tensors[self._hoist(e.args[0], "gather_values")]
        i = self.tensors[self._hoist(e.args[1], "gather_index")]
        if not v.shape:
            raise self.err("gather reads rows of its first operand, which needs rank 1 or more",
                           e.args[0].span)
        return ir.Op("gather", (ir.Ref(v.name, v.dtype, v.shape), ir.Ref(i.name, i.dtype,
                                                                          i.shape)),
                     v.dtype, i.shape + v.shape[1:])

    def _b_scatter(self, e: ast.Call) -> ir.Expr:
        v = self.tensors[self._hoist(e.args[0], "scatter_values")]
        i = self.tensors[self._hoist(e.args[1], "scatter_index")]
        like, _ = self.expr(e.args[2])
        shape = _shape(like)
        if not shape:
            raise self.err("scatter's third operand gives the result's shape: rank 1 or more",
                           e.args[2].span)
        if v.shape != i.shape + shape[1:]:
            raise self.err(f"scatter: the values' shape {_text(v.shape)} must be the index's "
                           f"{_text(i.shape)} followed by the result's trailing sizes "
                           f"{_text(shape[1:])}", e.span)
        return ir.Op("scatter", (ir.Ref(v.name, v.dtype, v.shape), ir.Ref(i.name, i.dtype,
                                                                           i.shape)),
                     ir.promote(v.dtype, "int32") if v.dtype == "bool" else v.dtype, shape)

    def _b_prng_step(self, e: ast.Call) -> ir.Expr:
        raise self.err("prng_step(S, sizes...) names a draw: assign it (`P = prng_step(...);`) "
                       "and read it with prng_value(P) and prng_state(P)", e.span)

    def prng_step(self, name: str, e: ast.Call) -> None:
        if not e.args:
            raise self.err("prng_step takes a state tensor and the sizes of the draw", e.span)
        s = self.tensors[self._hoist(e.args[0], "prng_state_in")]
        if s.dtype not in ("uint32", "int32"):
            raise self.err(f"the state of prng_step is a uint32 (or int32) tensor, not "
                           f"{s.dtype}", e.args[0].span)
        if s.size < 2:
            raise self.err(f"the state of prng_step needs 2 or more elements (key and "
                           f"counter); {s.name!r} has {s.size}", e.args[0].span)
        self.prngs[name] = Prng(s.name, self._sizes_of(e.args[1:], "prng_step"))

    def _draw(self, e: ast.Call) -> Prng:
        a = e.args[0]
        if not (isinstance(a, ast.Name) and a.id in self.prngs):
            raise self.err(f"{e.fn} reads a draw named by `P = prng_step(...)`", a.span)
        return self.prngs[a.id]

    def _b_prng_value(self, e: ast.Call) -> ir.Expr:
        p = self._draw(e)
        s = self.tensors[p.state]
        return ir.Op("prng", (ir.Ref(s.name, s.dtype, s.shape),), "float32", p.dims)

    def _b_prng_state(self, e: ast.Call) -> ir.Expr:
        p = self._draw(e)
        s = self.tensors[p.state]
        count = math.prod(p.dims) % 2**32
        return ir.Op("prng_state", (ir.Ref(s.name, s.dtype, s.shape),
                                    ir.Const(count - 2**32 if count >= 2**31 else count,
                                             "int32")),
                     s.dtype, s.shape)

    # assertions -----------------------------------------------------------------------------
    def assert_statement(self, name: str, call: ast.Call) -> None:
        """`A = assert_...(condition);` whose value no output needs: PlaidML drops such a
        statement unevaluated.  Here it is evaluated; a false one is a warning (PlaidML's op
        library has such asserts with conditions that do not hold) and the name becomes a size
        of value 0 or 1."""
        ok = self.assertion(call)
        if not ok:
            where = f"{self.source.name}:{call.span.line}:{call.span.col}"
            warnings.warn(TileWarning(f"{where}: {call.fn}: the condition is false for these "
                                      "shapes; its value is never used, so the program runs "
                                      "(as PlaidML runs it)"), stacklevel=4)
        self.sizes[name] = int(ok)
        self.size_origin[name] = f"the assertion on line {call.span.line}"

    def assertion(self, e: ast.Call) -> bool:
        """`assert_<what>(condition)`: the condition compares size expressions; its value."""
        if len(e.args) != 1:
            raise self.err(f"{e.fn} takes one condition", e.span)
        c = e.args[0]
        ops = {"eq": "==", "ne": "!=", "lt": "<", "gt": ">", "le": "<=", "ge": ">="}
        if not (isinstance(c, ast.Binary) and c.op in ops and self.is_size_expr(c.left)
                and self.is_size_expr(c.right)):
            raise self.err(f"the condition of {e.fn} compares two size expressions", c.span)
        a, b = self.size(c.left), self.size(c.right)
        return {"eq": a == b, "ne": a != b, "lt": a < b, "gt": a > b, "le": a <= b,
                "ge": a >= b}[c.op]


def _shape(x: ir.Expr) -> tuple[int, ...]:
    return () if isinstance(x, ir.Const) else x.shape


def _text(shape) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"
