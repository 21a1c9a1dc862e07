"""ast.Function + input shapes -> ir.Program: names, size symbols, dtypes, ranks, shapes,
linearity of index polynomials.  Every problem is a `TileCheckError` pointing into the source.

One pass over the syntax tree whose parts (inputs, size expressions, index polynomials,
statements, typed expressions) share one set of symbol tables; the typed expressions are
written in `check_expr`, PlaidML's builtin functions in `builtins`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction

import numpy as np

from ..errors import Source, Span, TileCheckError
from . import ast, ir
from .bounds import propagate
from .builtins import INLINE, BuiltinChecks
from .check_expr import TypedExprs, _shape_text

SUPPORTED_DTYPES = ("float32", "float16", "int32", "int16", "int8", "uint32", "uint16", "uint8")
INT32_LIMIT = 2**31


def normalize_dtype(dtype: object, what: str = "dtype") -> str:
    try:
        name = np.dtype(dtype).name  # type: ignore[arg-type]
    except TypeError:
        name = str(dtype)
    if name == "float64":
        name = "float32"
    if name not in SUPPORTED_DTYPES + ("bool",):
        raise TileCheckError(f"{what}: unsupported element type {dtype!r} "
                             f"(expected one of {', '.join(SUPPORTED_DTYPES)})")
    return name


def check(fn: ast.Function, shapes: Mapping[str, Sequence[int]],
          dtype: str | Mapping[str, str] = "float32",
          values: Mapping[str, int] | None = None) -> ir.Program:
    """Give `fn` meaning for inputs of the given shapes (and element types).  `values` fixes
    0-d integer inputs that the program uses as sizes (PlaidML's integer parameters, such as
    a reshape's target size): they are constants of the compiled program."""
    return _Checker(fn, shapes, dtype, values or {}).run()


class _Checker(TypedExprs, BuiltinChecks):
    def __init__(self, fn: ast.Function, shapes: Mapping[str, Sequence[int]],
                 dtype: str | Mapping[str, str], values: Mapping[str, int]):
        self.fn = fn
        self.source: Source = fn.source
        self.shapes = shapes
        self.dtype = dtype
        self.values = values
        self.sizes: dict[str, int] = {}  # size symbol -> value
        self.size_origin: dict[str, str] = {}
        self.tensors: dict[str, ir.Tensor] = {}
        self.ops: list[ir.Statement] = []
        self.fixed: dict[str, int] = {}  # inputs bound as sizes
        self.prngs: dict = {}  # name -> builtins.Prng
        # Every name the program uses, so that builtins' temporaries never collide.
        self.taken: set[str] = {i.name for i in fn.inputs} | {
            s.output.name if isinstance(s, ast.Contraction) else s.name for s in fn.stmts}

    def err(self, message: str, span: Span | None) -> TileCheckError:
        return TileCheckError(message, source=self.source, span=span)

    # inputs ------------------------------------------------------------------------------------
    def run(self) -> ir.Program:
        names = {i.name for i in self.fn.inputs}
        for extra in sorted(set(self.values) - names):
            raise self.err(f"a value was given for {extra!r}, which is not an input of the "
                           f"function (inputs: {', '.join(sorted(names)) or 'none'})",
                           Span(self.fn.span.line, self.fn.span.col))
        for extra in sorted(set(self.shapes) - names):
            header = Span(self.fn.span.line, self.fn.span.col)  # the `function` keyword
            raise self.err(f"a shape was given for {extra!r}, which is not an input of the "
                           f"function (inputs: {', '.join(sorted(names)) or 'none'})", header)
        seen: set[str] = set()
        for inp in self.fn.inputs:
            if inp.name in seen:
                raise self.err(f"input {inp.name!r} is declared twice", inp.span)
            seen.add(inp.name)
            self._bind_input(inp)
        for stmt in self.fn.stmts:
            if isinstance(stmt, ast.Contraction):
                self.ops.append(self._contraction(stmt))
            elif (op := self._assignment(stmt)) is not None:
                self.ops.append(op)
        outs: list[str] = []
        for o in self.fn.outputs:
            if o.name in outs:
                raise self.err(f"output {o.name!r} is listed twice", o.span)
            if o.name in self.prngs:
                raise self.err(f"output {o.name!r} is a random-number draw; output "
                               f"prng_value({o.name}) or prng_state({o.name})", o.span)
            if o.name not in self.tensors or o.name in names:
                raise self.err(f"output {o.name!r} is never assigned (expected a statement "
                               f"`{o.name} = ...` or `{o.name}[...] = ...` in the body)", o.span)
            outs.append(o.name)
        if not outs:
            raise self.err("the function has no outputs", self.fn.span)
        return ir.Program(tuple(i.name for i in self.fn.inputs), tuple(outs), dict(self.tensors),
                          tuple(self.ops), self.source, dict(self.fixed))

    def _input_dtype(self, name: str) -> str:
        d = self.dtype.get(name, "float32") if isinstance(self.dtype, Mapping) else self.dtype
        return normalize_dtype(d, f"input {name}")

    def _bind_input(self, inp: ast.Input) -> None:
        if inp.name not in self.shapes:
            if not inp.dims:
                shape: tuple[int, ...] = ()
            else:
                dims = ", ".join(d.name or str(d.size) for d in inp.dims)
                raise self.err(f"no shape given for input {inp.name!r} (expected "
                               f"{len(inp.dims)} dimensions: {dims})", inp.span)
        else:
            try:
                shape = tuple(int(s) for s in self.shapes[inp.name])
            except (TypeError, ValueError):
                raise self.err(f"the shape given for {inp.name!r} is not a list of integers: "
                               f"{self.shapes[inp.name]!r}", inp.span) from None
        if inp.any_shape:
            # No dimension list: any rank; no size symbols are bound from it.
            for k, size in enumerate(shape):
                if size <= 0:
                    raise self.err(f"dimension {k} of {inp.name!r} is {size}; sizes must be "
                                   "positive", inp.span)
            self.tensors[inp.name] = ir.Tensor(inp.name, shape, self._input_dtype(inp.name))
            self._bind_value(inp)
            return
        if len(shape) != len(inp.dims):
            raise self.err(f"input {inp.name!r} has {len(inp.dims)} dimensions in the function "
                           f"header but the shape given, {_shape_text(shape)}, has {len(shape)}",
                           inp.span)
        for k, (dim, size) in enumerate(zip(inp.dims, shape, strict=True)):
            if size <= 0:
                raise self.err(f"dimension {k} of {inp.name!r} is {size}; sizes must be "
                               "positive", dim.span)
            if dim.name is None:
                if dim.size != size:
                    raise self.err(f"dimension {k} of {inp.name!r} is fixed to {dim.size} in "
                                   f"the header but the shape given has {size}", dim.span)
                continue
            if dim.name in self.sizes and self.sizes[dim.name] != size:
                raise self.err(f"size symbol {dim.name} is {self.sizes[dim.name]} from "
                               f"{self.size_origin[dim.name]} but {size} from dimension {k} of "
                               f"{inp.name!r}", dim.span)
            self.sizes.setdefault(dim.name, size)
            self.size_origin.setdefault(dim.name, f"dimension {k} of {inp.name!r}")
        self.tensors[inp.name] = ir.Tensor(inp.name, shape, self._input_dtype(inp.name))
        self._bind_value(inp)

    def _bind_value(self, inp: ast.Input) -> None:
        """A 0-d integer input with a value given: also a size symbol (its value)."""
        if inp.name not in self.values:
            return
        t = self.tensors[inp.name]
        if t.shape != () or t.dtype not in ir.INT_DTYPES:
            raise self.err(f"a value is given for {inp.name!r}, but only 0-d integer inputs "
                           f"take one (it has shape {_shape_text(t.shape)}, {t.dtype})",
                           inp.span)
        try:
            value = int(self.values[inp.name])
        except (TypeError, ValueError):
            raise self.err(f"the value given for {inp.name!r} is not an integer: "
                           f"{self.values[inp.name]!r}", inp.span) from None
        if inp.name in self.sizes and self.sizes[inp.name] != value:
            raise self.err(f"{inp.name!r} is a size symbol of value {self.sizes[inp.name]} "
                           f"but the value given for the input is {value}", inp.span)
        self.sizes[inp.name] = value
        self.size_origin[inp.name] = f"the value given for input {inp.name!r}"
        self.fixed[inp.name] = value

    def _new_name(self, name: str, span: Span) -> None:
        if name in self.tensors:
            what = "an input" if name in {i.name for i in self.fn.inputs} else "already assigned"
            raise self.err(f"{name!r} is {what}; every tensor is assigned once", span)
        if name in self.sizes:
            raise self.err(f"{name!r} is a size symbol and cannot be assigned", span)

    # sizes and polynomials ---------------------------------------------------------------------
    def _int_literal(self, e: ast.Num) -> int:
        """Fix (fuzz): an integer past int32 reached the reference (OverflowError in numpy's
        int64) and the kernel text unchecked; kernels compute in 32-bit `int`."""
        value = int(e.value)
        if not -INT32_LIMIT <= value < INT32_LIMIT:
            raise self.err(f"the integer {value} does not fit in int32 (expected "
                           f"{-INT32_LIMIT} .. {INT32_LIMIT - 1}; write {value}.0 for a float "
                           "value)", e.span)
        return value

    def size(self, e: ast.Expr) -> int:
        """A size expression: integers and size symbols, + - * and integer (floor) division,
        max and min.  Wherever an integer may stand (index polynomials, output sizes,
        constraints), a size expression may stand too: it is a constant once shapes are bound."""
        value = self._size(e)
        if not -INT32_LIMIT <= value < INT32_LIMIT:  # as for index polynomials below
            raise self.err(f"this size is {value}, past int32 (kernels compute offsets in "
                           "32-bit integers)", e.span)
        return value

    def _size(self, e: ast.Expr) -> int:
        if isinstance(e, ast.Num):
            if e.is_float:
                raise self.err("a size must be an integer", e.span)
            return self._int_literal(e)
        if isinstance(e, ast.Name):
            if e.id not in self.sizes:
                known = ", ".join(sorted(n for n in self.sizes if "." not in n)) or "none"
                t = self.tensors.get(e.id)
                if t is not None and t.shape == () and e.id in {i.name for i in self.fn.inputs}:
                    raise self.err(f"the input {e.id!r} is used as a size, so it is a 0-d "
                                   "integer whose value must be known when compiling: give "
                                   f"it (tilec.compile(..., values={{'{e.id}': N}}), or "
                                   f"--value {e.id}=N)", e.span)
                raise self.err(f"unknown size symbol {e.id!r} (size symbols: {known})", e.span)
            return self.sizes[e.id]
        if isinstance(e, ast.Unary) and e.op == "neg":
            return -self._size(e.operand)
        if isinstance(e, ast.Binary) and e.op in ("add", "sub", "mul", "div"):
            a, b = self._size(e.left), self._size(e.right)
            if e.op == "div":
                if b == 0:
                    raise self.err("division by zero in a size", e.span)
                return a // b
            return a + b if e.op == "add" else a - b if e.op == "sub" else a * b
        if isinstance(e, ast.Call) and e.fn in ("max", "min", "broadcast"):
            if len(e.args) != 2:
                raise self.err(f"{e.fn} takes 2 arguments, got {len(e.args)}", e.span)
            a, b = self._size(e.args[0]), self._size(e.args[1])
            if e.fn == "broadcast":  # numpy's rule for two sizes
                if a != b and 1 not in (a, b):
                    raise self.err(f"broadcast of sizes {a} and {b}: they must be equal or "
                                   "one of them 1", e.span)
                return b if a == 1 else a
            return max(a, b) if e.fn == "max" else min(a, b)
        raise self.err("a size must be built from integers, size symbols and + - * /, max, "
                       "min", e.span)

    def is_size_expr(self, e: ast.Expr) -> bool:
        """Whether `e` uses only integers, size symbols, + - * /, max and min (no index
        variables, no tensors): an integer constant once shapes are bound."""
        if isinstance(e, ast.Num):
            return not e.is_float
        if isinstance(e, ast.Name):
            return e.id in self.sizes
        if isinstance(e, ast.Unary):
            return e.op == "neg" and self.is_size_expr(e.operand)
        if isinstance(e, ast.Binary):
            return (e.op in ("add", "sub", "mul", "div") and self.is_size_expr(e.left)
                    and self.is_size_expr(e.right))
        if isinstance(e, ast.Call):
            return (e.fn in ("max", "min", "broadcast") and len(e.args) == 2
                    and all(self.is_size_expr(a) for a in e.args))
        return False

    def poly(self, e: ast.Expr) -> ir.Poly:
        """An index polynomial: affine in index variables, exact rational coefficients."""
        p = self._poly(e)
        # Fix (fuzz): products of literals escaped the literal check above.
        for c in (p.const, *(v for _, v in p.terms)):
            if abs(c.numerator) >= INT32_LIMIT or c.denominator >= INT32_LIMIT:
                raise self.err(f"the index polynomial {p} has a coefficient or constant past "
                               "int32 (kernels compute offsets in 32-bit integers)", e.span)
        return p

    def _poly(self, e: ast.Expr) -> ir.Poly:
        if isinstance(e, (ast.Call, ast.Binary)) and _has_min_max(e) and self.is_size_expr(e):
            # A size expression with max/min (SAME padding's `max(0, ...) / 2`) is folded to an
            # integer, as PlaidML does; other constant parts keep exact rational arithmetic.
            return ir.Poly.constant(self.size(e))
        if isinstance(e, ast.Num):
            if e.is_float:
                raise self.err("index polynomials take integer constants", e.span)
            return ir.Poly.constant(self._int_literal(e))
        if isinstance(e, ast.Name):
            if e.id in self.sizes:
                return ir.Poly.constant(self.sizes[e.id])
            return ir.Poly.index(e.id)
        if isinstance(e, ast.Unary) and e.op == "neg":
            return -self._poly(e.operand)
        if isinstance(e, ast.Binary) and e.op in ("add", "sub"):
            a, b = self._poly(e.left), self._poly(e.right)
            return a + b if e.op == "add" else a - b
        if isinstance(e, ast.Binary) and e.op == "mul":
            a, b = self._poly(e.left), self._poly(e.right)
            if not a.is_constant and not b.is_constant:
                raise self.err("index polynomials must be linear: a product of two index "
                               "expressions (expected a constant on one side of '*')", e.span)
            return b.scale(a.const) if a.is_constant else a.scale(b.const)
        if isinstance(e, ast.Binary) and e.op == "div":
            a, b = self._poly(e.left), self._poly(e.right)
            if not b.is_constant:
                raise self.err("index polynomials may only be divided by a constant", e.span)
            if b.const == 0:
                raise self.err("division by zero in an index polynomial", e.span)
            return a.scale(Fraction(1) / b.const)
        raise self.err("an index polynomial may use index variables, integers, size symbols, "
                       "size expressions (max, min) and + - * / by a constant", e.span)

    # statements --------------------------------------------------------------------------------
    def _access(self, ref: ast.TensorRef) -> ir.Access:
        t = self.tensors.get(ref.name)
        if t is None:
            raise self.err(f"unknown tensor {ref.name!r}" + self._known(), ref.span)
        if len(ref.idx) != len(t.shape):
            raise self.err(f"{ref.name!r} has {len(t.shape)} dimensions "
                           f"{_shape_text(t.shape)} but {len(ref.idx)} indices are given",
                           ref.span)
        return ir.Access(ref.name, tuple(self.poly(p) for p in ref.idx), ref.span)

    def _known(self) -> str:
        names = sorted(self.tensors)
        return f" (known tensors: {', '.join(names)})" if names else ""

    def _contraction(self, c: ast.Contraction, internal: bool = False) -> ir.Contraction:
        self._new_name(c.output.name, c.output.span)
        n_ops = {None: 1, "*": 2, "+": 2, "==": 2, "?": 3}[c.comb]
        assert len(c.operands) == n_ops
        inputs = tuple(self._access(r) for r in c.operands)
        out_idx = tuple(self.poly(p) for p in c.output.idx)
        sizes = None
        if c.sizes is not None:
            if len(c.sizes) != len(out_idx):
                raise self.err(f"{c.output.name!r} has {len(out_idx)} indices but "
                               f"{len(c.sizes)} sizes", c.output.span)
            sizes = tuple(self.size(s) for s in c.sizes)
            for s, e in zip(sizes, c.sizes, strict=True):
                if s <= 0:
                    raise self.err(f"output size evaluates to {s}; sizes must be positive",
                                   e.span)
        cons = tuple(ir.Constraint(self.poly(k.poly), self.size(k.bound), k.span)
                     for k in c.constraints)
        names: set[str] = set()
        for p in out_idx + tuple(p for a in inputs for p in a.idx) + tuple(k.poly for k in cons):
            names.update(p.indices)
        bounds_in: list[tuple[ir.Poly, int, int]] = []
        for a in inputs:
            for p, n in zip(a.idx, self.tensors[a.tensor].shape, strict=True):
                bounds_in.append((p, 0, n - 1))
        for k in cons:
            bounds_in.append((k.poly, 0, k.bound - 1))
        if sizes is not None:
            for p, n in zip(out_idx, sizes, strict=True):
                bounds_in.append((p, 0, n - 1))
        box = propagate(bounds_in, names)
        # Fix (fuzz): `propagate` stops at the first empty interval, so indices it had not
        # reached yet looked undetermined and were blamed instead of the empty one, depending on
        # statement order.  Whether an index is determined is structural; an empty range is
        # left to flatten (the reference evaluates such a statement to its default).
        empty = [n for n in sorted(names) if box[n][0] > box[n][1]]
        determined = _determined(bounds_in) if empty else names
        for n in sorted(names):
            lo, hi = box[n]
            if n not in determined or not (empty or math.isfinite(lo) and math.isfinite(hi)):
                raise self.err(f"nothing determines the range of index {n!r} (expected it in "
                               "an input access or a constraint such as "
                               f"`, {n} < 3`)", c.output.span)
        if sizes is None:
            if any(not math.isfinite(x) for n in names for x in box[n]):
                raise self.err(f"index {empty[0]!r} has an empty range: no integer value "
                               "satisfies every access and constraint, so the output sizes "
                               "cannot be inferred (give them after ':')", c.output.span)
            inferred = []
            for p in out_idx:
                hi = p.const + sum(max(v * box[k][0], v * box[k][1]) for k, v in p.terms)
                inferred.append(max(1, math.floor(hi) + 1))
            sizes = tuple(inferred)
        dtypes = [self.tensors[a.tensor].dtype for a in inputs]
        dtype = dtypes[-1] if c.comb == "?" else ir.promote(*dtypes)
        if c.comb == "==":  # an equality is boolean (PlaidML's rule too), summed as a count
            dtype = "bool"
        if dtype == "bool" and c.agg in ("+", "*"):
            dtype = "int32"
        default = None
        if c.default is not None:
            d = self.tensors.get(c.default.id)
            if d is None:
                raise self.err(f"unknown tensor {c.default.id!r} after `default`" + self._known(),
                               c.default.span)
            if d.shape != sizes:
                raise self.err(f"the default {c.default.id!r} has shape {_shape_text(d.shape)} "
                               f"but {c.output.name!r} has {_shape_text(sizes)}", c.default.span)
            default = d.name
        self.tensors[c.output.name] = ir.Tensor(c.output.name, sizes, dtype)
        return ir.Contraction(c.output.name, out_idx, c.agg, c.comb, inputs, cons,
                              tuple(sorted(names)), c.no_defract, default, c.text, c.output.span)

    def _assignment(self, a: ast.Assignment, internal: bool = False) -> ir.Elementwise | None:
        self._new_name(a.name, a.span)
        output = a.name in {o.name for o in self.fn.outputs}
        if isinstance(a.expr, ast.Call) and not internal:
            fn = a.expr.fn
            if fn in INLINE:  # the builtin's statements compute the assigned tensor
                self.inline(a.expr, a.name, a.text)
                return None
            if fn == "prng_step":
                self.prng_step(a.name, a.expr)
                return None
            if fn.startswith("assert_") and not output:
                self.assert_statement(a.name, a.expr)
                return None
        if self.is_size_expr(a.expr) and not output:
            # `Pad0 = 0;`, `L = max(0, N - 3);`: a named size, usable in index polynomials,
            # output sizes and constraints (as PlaidML's op library writes them); no tensor.
            self.sizes[a.name] = self.size(a.expr)
            self.size_origin[a.name] = f"the assignment on line {a.span.line}"
            return None
        expr, _ = self.expr(a.expr)
        shape = expr.shape if isinstance(expr, (ir.Ref, ir.Op)) else ()
        dtype = expr.dtype
        self.tensors[a.name] = ir.Tensor(a.name, shape, dtype)
        return ir.Elementwise(a.name, expr, a.text, a.span)

    # elementwise expressions -------------------------------------------------------------------


def _determined(bounds: Sequence[tuple[ir.Poly, int, int]]) -> set[str]:
    """Indices that bounds determine: those alone in a polynomial, then, in turn, those whose
    polynomial's other indices are all determined (what interval propagation finds)."""
    known: set[str] = set()
    changed = True
    while changed:
        changed = False
        for p, _, _ in bounds:
            free = set(p.indices) - known
            if len(free) == 1:
                known |= free
                changed = True
    return known


def _has_min_max(e: ast.Expr) -> bool:
    if isinstance(e, ast.Call):
        return e.fn in ("max", "min", "broadcast") or any(_has_min_max(a) for a in e.args)
    if isinstance(e, ast.Binary):
        return _has_min_max(e.left) or _has_min_max(e.right)
    if isinstance(e, ast.Unary):
        return _has_min_max(e.operand)
    return False

