"""OpenCL C for a row-fused kernel (`plan.rows.RowKernel`): softmax, normalisations and other
chains of reductions over the same rows, one kernel.

A row is owned by a work-group of T threads on a GPU (T from the row's length, each thread
strides over the row and the partial results meet in a tree in local memory), by one work-item
on a CPU (its work-groups then hold many rows and need no barrier).  For each reduction the row
is walked once, computing the full-shape statements it depends on at each element (they are
never stored unless something outside the kernel reads them); the row statements (the
reductions' results and what is computed from them) are private values every thread holds.
A last walk stores the full-shape results.  The walks re-read the row's inputs: a row of a few
thousand elements stays in the L1/L2 cache between them."""

from __future__ import annotations

import math
import re

from ..lang import ir
from ..plan.hw import HwModel
from ..plan.row_shape import RowShape, choose, depends, share, stashes, vector_walk
from ..plan.rows import RowKernel
from . import clexpr
from .clexpr import plain_vector_access
from .kernel_text import (
    LANES,
    KernelArg,
    KernelSource,
    arg_decl,
    buf,
    check_int_offsets,
    row_major_strides,
    template_env,
)


class _RowText:
    def __init__(self, k: RowKernel, program: ir.Program, shape: RowShape,
                 plain: bool = False):
        self.k, self.program, self.T, self.R = k, program, shape.threads, shape.rows
        # Where vloadN/vstoreN and fmax/fmin are library calls (`clexpr.plain_vector_access`):
        # vectors through a pointer to a declared vector type, max and min as a compare and
        # a select.  One work-item a row only (CPU shapes).
        self.plain = plain and shape.threads == 1
        self.typedefs: dict[str, None] = {}
        self.tensors = program.tensors
        self.full, self.axes = k.full, set(k.axes)
        self.n = len(self.full)
        self.stmt = {op.output: op for op in k.ops}
        self.full_names = [op.output for op in k.ops
                           if isinstance(op, ir.Elementwise)
                           and self.tensors[op.output].shape == self.full]
        # The row's axes last and in order: the element number p is the flat offset.
        self.trailing = tuple(sorted(self.axes)) == tuple(range(self.n - len(self.axes), self.n))
        # One work-item a row walks it W elements at a time (vector loads, vector exp).
        self.W = shape.vec if (self.T == 1 and shape.vec > 1 and vector_walk(k, program)
                               and k.length >= shape.vec) else 1
        # A work-group a row: when each thread's share of the row is small, the row's inputs
        # are loaded once into registers (c_X[j], element lid + j*T) and every walk reads them
        # there; the walks are unrolled over j.
        self.K = share(k, self.T)
        names = {n for op in k.ops for n in (op.output, *(
            [op.inputs[0].tensor] if isinstance(op, ir.Contraction) else ir.expr_refs(op.expr)))}
        self.cached = sorted(n for n in names if n not in self.stmt
                             and self.tensors[n].shape == self.full) if self.K else []
        # Statements a reduction's walk stores in an output for the last walk to read back
        # (`plan.row_shape.stashes`): a work-item that owns its rows only.
        self.stash = stashes(k, program) if self.T == 1 and not self.K else {}
        self.stored: set[str] = set()  # the stashes an earlier walk stored
        self._last = False

    # offsets -------------------------------------------------------------------------------
    def offset(self, name: str, in_row: bool) -> str:
        """Offset of tensor `name` (broadcast to F) at this row (and element, `in_row`)."""
        shape = self.tensors[name].shape
        if shape == self.full and self.trailing:
            return "row_base + p" if in_row else "row_base"
        pad = (1,) * (self.n - len(shape)) + tuple(shape)
        strides = (0,) * (self.n - len(shape)) + tuple(row_major_strides(shape))
        terms = []
        for d in range(self.n):
            if pad[d] == 1:
                continue
            if d in self.axes and not in_row:
                raise ValueError(f"{name} varies along the row")
            terms.append(f"a{d}" if strides[d] == 1 else f"a{d} * {strides[d]}")
        return " + ".join(terms) if terms else "0"

    def load(self, name: str, in_row: bool, w: int = 1) -> str:
        if in_row and name in self.cached:
            return f"c_{name}[j]"
        t = self.tensors[name]
        along = bool(t.shape) and t.shape[-1] != 1  # varies along the (last) row axis
        w = w if in_row and along else 1
        return clexpr.load(buf(name), self.offset(name, in_row), t.dtype, w,
                           unaligned=self.unaligned(t.dtype, w))

    def unaligned(self, dtype: str, w: int) -> bool:
        """Whether a vector of w elements of dtype goes through `clexpr.unaligned_typedef`
        (declared at the kernel's head)."""
        if not self.plain or w == 1 or dtype not in clexpr.VECTOR_ACCESS:
            return False
        self.typedefs[clexpr.unaligned_typedef(dtype, w)] = None
        return True

    def combine(self, agg: str, ctype: str, acc: str, value: str, w: int = 1) -> str:
        """The statement folding `value` (w lanes) into accumulator `acc`."""
        if self.plain and agg in "><" and ctype == "float":
            # The contraction's CPU rule (`_Contraction.update`): a NaN read loses both ways.
            return f"{{ const {_vec(ctype, w)} v_ = {value}; " \
                f"{acc} = (v_ {agg} {acc}) ? v_ : {acc}; }}"
        return f"{acc} = {_combine(agg, ctype, acc, value)};"

    # values --------------------------------------------------------------------------------
    def _ref(self, in_row: bool, w: int = 1):
        def ref(name: str) -> str:
            if name in self.stmt and name in self.full_names:
                return f"f_{name}"
            if name in self.stmt:
                return f"r_{name}"
            return self.load(name, in_row, w)
        return ref

    def needed(self, names: set[str], loaded: set[str] = frozenset()) -> list[str]:
        """The full statements `names` depend on, in program order (`loaded`: read back
        from their stash, so not what they depend on)."""
        need = depends(self.stmt, self.full_names, names, loaded)
        return [n for n in self.full_names if n in need]

    def walk(self, targets: set[str], tail, last: bool = False) -> list[str]:
        """Loops over the row's elements computing what `targets` need, then `tail(w)` (lines
        for values w elements wide): a vector loop and a scalar one for the rest, or one loop
        (strided by the row's threads).  A reduction's walk stores the stashes it computes;
        the `last` walk reads them back."""
        L, W = self.k.length, self.W
        self._last = last
        if self.K:
            return self._loop(f"int j = 0; j < {self.K}; ++j", targets, tail(1), 1,
                              unrolled=True)
        if W == 1:
            step = "++p" if self.T == 1 else f"p += {self.T}"
            out = self._loop(f"int p = {'lid' if self.T > 1 else '0'}; p < {L}; {step}",
                             targets, tail(1), 1)
        else:
            out = self._vector_loops(targets, tail)
        if not last:
            self.stored |= {n for n in self.needed(targets) if n in self.stash}
        return out

    def _vector_loops(self, targets: set[str], tail) -> list[str]:
        L, W = self.k.length, self.W
        main = L - L % W
        out = self._loop(f"int p = 0; p < {main}; p += {W}", targets, tail(W), W)
        if main < L:
            out += self._loop(f"int p = {main}; p < {L}; ++p", targets, tail(1), 1)
        return out

    def _loop(self, head: str, targets: set[str], tail: list[str], w: int,
              unrolled: bool = False) -> list[str]:
        lines = []
        loaded = self.stored if self._last else set()
        for n in self.needed(targets, loaded):
            op = self.stmt[n]
            ctype = _vec(clexpr.COMPUTE[self.tensors[n].dtype], w)
            if n in loaded:
                o = self.stash[n]
                lines.append(f"    const {ctype} f_{n} = {self.load(o, True, w)};  "
                             f"/* {n}, stored in {o} by an earlier walk */")
                continue
            text = clexpr.expr(op.expr, self._ref(True, w))
            lines.append(f"    const {ctype} f_{n} = {text};  /* {op.text} */"
                         .replace("*/;", "*/"))
            if n in self.stash and not self._last and n not in self.stored:
                o, dt = self.stash[n], self.tensors[n].dtype
                keep = clexpr.store(buf(o), self.offset(o, True), f"f_{n}", dt, w,
                                    unaligned=self.unaligned(dt, w))
                lines.append(f"    {keep}  /* kept for the last walk */")
        lines += [f"    {t}" for t in tail]
        coords = [f"    {c}" for c in _used(self.elem_coords(), "\n".join(lines))]
        if not unrolled:
            return [f"for ({head}) {{"] + coords + lines + ["}"]
        return ["#pragma unroll", f"for ({head}) {{"] + self._guarded(coords + lines) + ["}"]

    def _guarded(self, lines: list[str]) -> list[str]:
        """The body of an unrolled walk: element p = lid + j*T, skipped past the row's end."""
        head = [f"    const int p = lid + j * {self.T};"]
        if self.k.length % self.T == 0:
            return head + lines
        return head + [f"    if (p < {self.k.length}) {{"] + [f"    {x}" for x in lines] + \
            ["    }"]

    def fill(self) -> list[str]:
        """Each thread's elements of the row's cached inputs, loaded once."""
        out = []
        for n in self.cached:
            t = self.tensors[n]
            c = clexpr.COMPUTE[t.dtype]
            load = clexpr.load(buf(n), self.offset(n, True), t.dtype)
            body = [f"    {x}" for x in _used(self.elem_coords(), load)]
            body.append(f"    c_{n}[j] = {load};")
            out += [f"{c} c_{n}[{self.K}];  /* the row of {n}, {self.K} elements a thread */",
                    "#pragma unroll", f"for (int j = 0; j < {self.K}; ++j) {{"] + \
                self._guarded(body) + ["}"]
        return out

    def _coords(self, axes: list[int], var: str) -> list[str]:
        """`const int a<d> = ...;` for `axes`, from the mixed-radix number `var` (the last
        axis fastest)."""
        out, inner = [], 1
        for d in reversed(axes):
            coord = var if inner == 1 else f"{var} / {inner}"
            coord = coord if d == axes[0] else f"({coord}) % {self.full[d]}"
            out.append(f"const int a{d} = {coord};")
            inner *= self.full[d]
        return out[::-1]

    def row_coords(self) -> list[str]:
        out = self._coords([d for d in range(self.n) if d not in self.axes], "row")
        if self.trailing:
            out.append(f"const int row_base = row * {self.k.length};")
        return out

    def elem_coords(self) -> list[str]:
        return self._coords(sorted(self.axes), "p")

    # statements ----------------------------------------------------------------------------
    def reduction(self, op: ir.Contraction) -> list[str]:
        name, src = op.output, op.inputs[0].tensor
        dtype = self.tensors[name].dtype
        ctype = clexpr.COMPUTE[dtype]
        acc = f"acc_{name}"
        W = self.W

        def value(w: int) -> str:
            v = f"f_{src}" if src in self.full_names else self.load(src, True, w)
            return f"({ctype})({v})" if self.tensors[src].dtype != dtype else v

        def tail(w: int) -> list[str]:
            a = acc if w == 1 else f"v{acc}"
            return [self.combine(op.agg, ctype, a, value(w), w)]

        ident = clexpr.identity(op.agg, dtype)
        lines = [f"{ctype} {acc} = {ident};  /* {op.text} */".replace("*/;", "*/")]
        if W > 1:
            lines.append(f"{ctype}{W} v{acc} = ({ctype}{W})({ident});")
        lines += self.walk({src}, tail)
        if W > 1 and self.plain and op.agg in "><" and ctype == "float":
            # Lane by lane: a tree of selects would repeat each operand's text.
            lines += [self.combine(op.agg, ctype, acc, f"v{acc}.s{LANES[j]}")
                      for j in range(W)]
        elif W > 1:  # the vector's lanes, then the scalar rest (already in acc)
            lanes = [f"v{acc}.s{LANES[j]}" for j in range(W)]
            while len(lanes) > 1:  # a tree over the lanes
                lanes = [_combine(op.agg, ctype, lanes[j], lanes[j + 1]).join("()")
                         if op.agg in "+*" else _combine(op.agg, ctype, lanes[j], lanes[j + 1])
                         for j in range(0, len(lanes), 2)]
            lines.append(f"{acc} = {_combine(op.agg, ctype, acc, lanes[0])};")
        if self.T > 1:
            red = f"red_{ctype}"
            lines += [
                f"{red}[lid] = {acc};",
                "barrier(CLK_LOCAL_MEM_FENCE);",
                f"for (int s = {self.T // 2}; s > 0; s >>= 1) {{",
                f"    if (lid < s) {red}[lid] = "
                f"{_combine(op.agg, ctype, f'{red}[lid]', f'{red}[lid + s]')};",
                "    barrier(CLK_LOCAL_MEM_FENCE);",
                "}",
                f"const {ctype} r_{name} = {clexpr.narrow(f'{red}[0]', dtype)};",
                "barrier(CLK_LOCAL_MEM_FENCE);  /* the buffer is used again */"]
        else:
            lines.append(f"const {ctype} r_{name} = {clexpr.narrow(acc, dtype)};")
        return lines

    def row_statement(self, op: ir.Elementwise) -> list[str]:
        ctype = clexpr.COMPUTE[self.tensors[op.output].dtype]
        text = clexpr.expr(op.expr, self._ref(False))
        return [f"const {ctype} r_{op.output} = {text};  /* {op.text} */".replace("*/;", "*/")]

    def body(self) -> tuple[list[str], list[str]]:
        lines: list[str] = self.fill()
        locals_: set[str] = set()
        for op in self.k.ops:
            if isinstance(op, ir.Contraction):
                lines += self.reduction(op)
                locals_.add(clexpr.COMPUTE[self.tensors[op.output].dtype])
            elif op.output not in self.full_names:
                lines += self.row_statement(op)
        full_writes = [n for n in self.k.writes if n in self.full_names]
        # Several rows a work-group: the last group's spare rows repeat the last row (so that
        # every thread meets the barriers) and store nothing.
        spare = self.T > 1 and self.R > 1 and self.k.rows % self.R != 0
        if full_writes:
            stores = self.walk(set(full_writes), lambda w: [
                clexpr.store(buf(n), self.offset(n, True), f"f_{n}", self.tensors[n].dtype, w,
                             unaligned=self.unaligned(self.tensors[n].dtype, w))
                for n in full_writes], last=True)
            lines += (["if (live) {"] + [f"    {x}" for x in stores] + ["}"]) if spare \
                else stores
        row_writes = [n for n in self.k.writes if n not in self.full_names]
        if row_writes:
            stores = [clexpr.store(buf(n), self.offset(n, False), f"r_{n}",
                                   self.tensors[n].dtype) for n in row_writes]
            cond = "live && lid == 0" if spare else "lid == 0"
            lines += ([f"if ({cond}) {{"] + [f"    {s}" for s in stores] + ["}"]
                      if self.T > 1 else stores)
        decls = []
        if self.T > 1:
            for c in sorted(locals_):
                if self.R > 1:  # each row's threads reduce in their own part of the buffer
                    decls += [f"__local {c} red_{c}_all[{self.R * self.T}];",
                              f"__local {c}* red_{c} = red_{c}_all + "
                              f"get_local_id(0) / {self.T} * {self.T};"]
                else:
                    decls.append(f"__local {c} red_{c}[{self.T}];")
        return decls, _used(self.row_coords(), "\n".join(lines)) + lines


def _used(coords: list[str], text: str) -> list[str]:
    """The coordinate definitions (`const int a2 = ...;`) whose name the text uses."""
    return [c for c in coords if re.search(rf"\b{c.split()[2]}\b", text)]


def _combine(agg: str, ctype: str, a: str, b: str) -> str:
    if agg == "+":
        return f"{a} + {b}"
    if agg == "*":
        return f"{a} * {b}"
    fn = ("fmax" if agg == ">" else "fmin") if ctype == "float" else \
        ("max" if agg == ">" else "min")
    return f"{fn}({a}, {b})"


def _vec(ctype: str, w: int) -> str:
    return ctype if w == 1 else f"{ctype}{w}"


def row_source(k: RowKernel, program: ir.Program, hw: HwModel,
               threads: int | None = None, shape: RowShape | None = None) -> KernelSource:
    """The kernel in `shape`, by default the one the time model predicts fastest."""
    ranked: list[RowShape] = []
    if shape is None:
        shape, ranked = choose(k, program, hw, threads)
    t = _RowText(k, program, shape, plain_vector_access(hw))
    T, R = t.T, t.R
    for name in set(k.reads()) | set(k.writes):
        check_int_offsets(f"tensor {name}", 0, program.tensors[name].size)
    decls, body = t.body()
    decls = list(t.typedefs) + decls
    if T > 1 and R > 1:
        head = [f"const int lid = get_local_id(0) % {T};  /* {R} rows a work-group */"]
        if k.rows % R:
            head += [f"const int mine = get_group_id(0) * {R} + get_local_id(0) / {T};",
                     f"const int live = mine < {k.rows};",
                     f"const int row = live ? mine : {k.rows - 1};"]
        else:
            head += [f"const int row = get_group_id(0) * {R} + get_local_id(0) / {T};"]
    elif T > 1:
        head = ["const int row = get_group_id(0);", "const int lid = get_local_id(0);"]
    else:
        head = ["const int row = get_global_id(0);", f"if (row >= {k.rows}) return;"]
    ins = sorted(k.reads())
    args = [KernelArg(n, "in", program.tensors[n].dtype, program.tensors[n].size) for n in ins]
    args += [KernelArg(n, "out", program.tensors[n].dtype, program.tensors[n].size)
             for n in k.writes]
    axes = ", ".join(str(d) for d in k.axes)
    how = (f"{T} threads a row, partial results combined in local memory" if T > 1 else
           "one work-item a row" + (f", {t.W} elements at a time" if t.W > 1 else ""))
    if R > 1:
        how += f", {R} rows a work-group"
    comment = [op.text.replace("*/", "* /") for op in k.ops] + [
        f"{k.rows} rows of {k.length} elements (axes {axes} of "
        f"[{', '.join(map(str, k.full))}]); {how}"]
    if shape.note:
        comment.append(shape.note)
    if not math.isnan(shape.predicted_s):
        comment.append(f"predicted {shape.predicted_s * 1e6:.1f} us, limited by "
                       f"{shape.bottleneck}")
    wg = T * R if R > 0 else None
    ctx = {"title": f"{k.name}: row-fused kernel generated by tilec", "comment": comment,
           "name": k.name, "args": [arg_decl(a) for a in args],
           "wg": wg,
           "decls": decls, "head": head, "body": body}
    text = template_env().get_template("rows.cl.j2").render(k=ctx)
    per_elem = sum(_ops(op.expr) if isinstance(op, ir.Elementwise) else 1 for op in k.ops
                   if isinstance(op, ir.Contraction) or op.output in t.full_names)
    flops = k.rows * k.length * per_elem
    cost = (f"{k.name}: {how} ({k.rows} rows x {k.length}); intermediate full-shape tensors "
            f"not stored: {', '.join(n for n in t.full_names if n not in k.writes) or 'none'}")
    if shape.note:
        cost += f"; {shape.note}"
    elif not math.isnan(shape.predicted_s):
        cost += f"; predicted {shape.predicted_s * 1e6:.4g} us, limited by {shape.bottleneck}"
    if len(ranked) > 1:  # what the model weighed: the next candidates
        cost += "; next: " + ", ".join(
            f"{s.threads} thr x {s.rows} rows" + (f" x {s.vec} wide" if s.vec > 1 else "")
            + f" {s.predicted_s * 1e6:.4g} us" for s in ranked[1:4])
    groups = -(-k.rows // R) if R > 0 else k.rows
    total = groups * R * T if R > 0 else k.rows
    return KernelSource(k.name, "row", text, tuple(args), total, wg, {}, cost, flops)


def _ops(e: ir.Expr) -> int:
    return 1 + sum(_ops(a) for a in e.args) if isinstance(e, ir.Op) else 0
