"""A contraction kernel's accumulators: their declaration and update (the aggregation, a
vector's lanes folded), and at the end each point's post-ops and stores, guarded where the
point may lie outside the output (`Outputs`, a part of `contraction._Contraction`,
whose naming rules it shares: `point_env`, `rel`, `constraint_text`, `vector_aligned`)."""

from __future__ import annotations

from ..plan.flatten import operand_strides
from . import clexpr, columns, vector_finish
from .kernel_text import LANES, _lin, _vec, buf
from .split import agg_pair


class Outputs:
    """The accumulators: declared, updated, then their post-ops and stores (mixed into
    `contraction._Contraction`)."""

    def acc_type(self) -> str:
        return _vec(self.ctype, self.W)

    def acc_init(self) -> str:
        """An accumulator's starting value: the aggregation's identity, as a vector."""
        init = clexpr.identity(self.flat.agg, self.dtype)
        return f"(({self.acc_type()})({init}))" if self.W > 1 else init

    def accumulators(self) -> list[str]:
        init = self.acc_init()
        if self.sweep:  # partial sums of every swept tile; the registers come per tile
            return [f"{self.acc_type()} part[{self.sweep.tiles * len(self.points)}];"]
        out = [f"{self.acc_type()} a_{j} = {init};" for j in range(len(self.points))]
        if self.need_hit:
            out += [f"int hit_{j} = 0;" for j in range(len(self.points))]
        return out

    def update(self, acc: str, vals: list[str], lanes: int | None = None) -> str:
        """The update of accumulator `acc` by the input values `vals`; `lanes`: of that many
        lanes where not the kernel's vectors (1: one lane of one, `interior.lane_edge`)."""
        f = self.flat
        W = self.W if lanes is None else lanes
        ty = _vec(self.ctype, W)
        is_float = self.ctype == "float"
        if f.comb == "*" and f.agg == "+" and is_float:
            return f"{acc} = {clexpr.muladd(vals[0], vals[1], acc, self.muladd)};"
        if f.comb is None:
            val = vals[0]
        elif f.comb in ("*", "+"):
            val = f"({vals[0]} {f.comb} {vals[1]})"
        else:
            cond = f"({vals[0]} == {vals[1]})"
            then = vals[2] if f.comb == "?" else (f"(({ty})(1))" if W > 1 else "1")
            if W > 1:
                itype = _vec("int", W)
                val = f"(({itype}){cond} ? {then} : ({ty})(0))"  # select(), as an operator
            else:
                val = f"({cond} ? {then} : 0)"
        if f.agg == "+":
            return f"{acc} += {val};"
        if f.agg == "*":
            return f"{acc} *= {val};"
        if f.agg in (">", "<") and is_float and self.cpu:
            # CPU models: a compare and select, which x86 compilers make one max/min
            # instruction; fmax's NaN rule costs a compare and a blend more (the 3x3 max
            # pool ran 1.1x faster on Zen 4).  The same result: the accumulator starts at
            # the identity and never takes a NaN, and a NaN read loses both ways.
            if not val.isidentifier():
                return f"{{ const {ty} v_ = {val}; {acc} = (v_ {f.agg} {acc}) ? v_ : {acc}; }}"
            return f"{acc} = ({val} {f.agg} {acc}) ? {val} : {acc};"
        if f.agg in (">", "<"):
            fn = ("fmax" if f.agg == ">" else "fmin") if is_float else \
                ("max" if f.agg == ">" else "min")
            return f"{acc} = {fn}({acc}, {val});"
        return f"{acc} = {val};"

    def horizontal(self, acc: str) -> str:
        """Fold the lanes of a dot-mode accumulator with the aggregation."""
        parts = [f"{acc}.s{LANES[j]}" for j in range(self.W)]
        while len(parts) > 1:
            parts = [agg_pair(self.flat.agg, self.ctype, a, b)
                     for a, b in zip(parts[::2], parts[1::2], strict=True)]
        return parts[0]

    def epilogue(self) -> list[str]:
        f = self.flat
        partial = [k for k in self.out_idx if self.overhangs(k)]
        conds = []
        for c in self.points:
            env = self.point_env(c)
            cj = [f"{env[k]} < {f.ranges[k]}" for k in partial]
            cj += [f"{self.rel(k, a, raw=True)} < {self.sched.tile[k]}"
                   for k, a in zip(self.out_idx, c, strict=True) if self.sched.ragged(k)]
            # Fix (differential): where every element is one point of the box ("bijective"),
            # an element that a constraint on output indices excludes has no other writer, so
            # `finish` writes it the empty value; guarding its store left poison there.  Where
            # an init kernel has written those values, an excluded point may alias another
            # element (defract), so its store stays guarded.
            if self.kernel.out_map != "bijective":
                cj += [self.constraint_text(ci, env) for ci, kind in enumerate(self.cons_kind)
                       if kind == "out"]
            conds.append(cj)

        def guarded(j: int) -> list[str]:
            return _guarded(self.point_block(j), conds[j])

        u = columns.column_index(self)
        if u is None:
            return [ln for j in range(len(self.points)) for ln in guarded(j)]
        out = []
        for js in columns.groups(self, u):
            if len(js) == 1:
                out += guarded(js[0])
                continue
            block = ["{", f"    const int o = {self.out_offset(js[0])};"]
            block += ["    " + ln for ln in columns.finish(self, js, u)] + ["}"]
            # Columns where every point is inside the output; point by point where not.
            cond = list(dict.fromkeys(x for j in js for x in conds[j]))
            if cond:
                block[0] = f"if ({' && '.join(cond)}) {{"
                block += ["else {"] + ["    " + ln for j in js for ln in guarded(j)] + ["}"]
            out += block
        return out

    def whole_vectors(self) -> bool:
        """Whether the epilogue may treat an accumulator's lanes alike: vectors over output
        elements, each element written once, with no empty-element default to settle."""
        return self.W > 1 and not self.sched.dot and not self.need_hit and \
            self.kernel.op.default is None and "out" not in self.cons_kind

    def out_offset(self, j: int) -> str:
        """The output offset of accumulator point j (of its vector's first lane)."""
        out_t, env = self.flat.output, self.point_env(self.points[j])
        return _lin([(out_t.strides[k], env[k]) for k in self.out_idx], out_t.offset)

    def point_block(self, j: int) -> list[str]:
        """Accumulator j's post-ops and stores, one vector or lane by lane."""
        k_, out_t = self.kernel, self.flat.output
        vec_out = self.W > 1 and not self.sched.dot
        inner = [f"const int o = {self.out_offset(j)};"]
        # (Lanes the output holds apart, `vector_candidates(cpu)`, are stored one by one.)
        whole = self.whole_vectors()
        direct = whole and out_t.strides[self.v] == 1 and not k_.post_ops
        if whole and k_.post_ops and vector_finish.applies(self):
            inner += vector_finish.finish(self, j)
        elif direct:
            if k_.op.output in k_.writes:
                aligned = self.vector_aligned(0)
                inner.append(clexpr.store(buf(out_t.name), "o", f"a_{j}", self.dtype,
                                          self.W, aligned=aligned, unaligned=not aligned
                                          and self.unaligned(self.dtype)))
        else:
            for lane in (range(self.W) if vec_out else [None]):
                inner += self.finish(j, lane)
        return inner

    def finish(self, j: int, lane: int | None) -> list[str]:
        """One output element: settle uncovered elements, run post-ops, store what is kept."""
        f, k_ = self.flat, self.kernel
        lines = ["{"]
        acc = f"a_{j}"
        if lane is not None:
            acc = f"{acc}.s{LANES[lane]}"
            lines.append(f"const int oe = o + {lane * f.output.strides[self.v]};")
        else:
            lines.append("const int oe = o;")
        val = self.horizontal(acc) if self.sched.dot else acc
        if self.split and self.split.folded:
            val = self.split.value(j)
        if self.need_hit or k_.op.default is not None or "out" in self.cons_kind:
            empty = clexpr.literal(0, self.dtype)
            if k_.op.default is not None:
                dt = self.program.tensors[k_.op.default].dtype
                empty = clexpr.load(buf(k_.op.default), "oe", dt)
            ok = [f"hit_{j}"] if self.need_hit else []
            ok += [self.constraint_text(ci, self.point_env(self.points[j]))
                   for ci, kind in enumerate(self.cons_kind) if kind == "out"]
            if ok:
                val = f"(({' && '.join(ok)}) ? {val} : {empty})"
        lines.append(f"const {self.ctype} v = {val};")
        names = {k_.op.output: "v"}
        for p in k_.post_ops:
            def ref(name: str) -> str:
                if name in names:
                    return names[name]
                into, at = self.at_output(name, j, lane)
                return clexpr.load(buf(into), at, self.program.tensors[name].dtype)
            var = f"v_{p.output}"
            ctype = clexpr.COMPUTE[self.program.tensors[p.output].dtype]
            text = clexpr.expr(p.expr, ref, bind=self.binder(lines, ctype, var))
            lines.append(f"const {ctype} {var} = {text};")
            names[p.output] = var
        for w in k_.writes:
            into, at = (f.output.name, "oe") if w == k_.op.output else \
                self.at_output(w, j, lane)
            lines.append(clexpr.store(buf(into), at, names[w], self.program.tensors[w].dtype))
        lines.append("}")
        return lines

    def at_output(self, name: str, j: int, lane: int | None, elem: str = "oe") -> tuple[str, str]:
        """(buffer, offset) of tensor `name`, numpy-broadcast to the output, at accumulator
        point j's output element (lane `lane` of its vector), whose output offset the kernel
        has in variable `elem`."""
        f = self.flat
        s = self.placed.get(name)
        strides, off = self.operand(name)
        if s is None and strides == f.output.strides and off == f.output.offset:
            return name, elem  # laid out as the output: the output's offset
        env = self.point_env(self.points[j])
        terms = [(st, env[k]) for k, st in enumerate(strides)]
        if lane is not None and strides[self.v]:
            off += lane * strides[self.v]
        return (name, _lin(terms, off)) if s is None else (s.root, _lin(terms, off + s.offset))

    def operand(self, name: str) -> tuple[tuple[int, ...], int]:
        """(strides along the flat indices, offset) of tensor `name` broadcast to the output,
        in its own buffer or where it is placed.  The same for every point and lane of the
        tile: computed once a tensor (a model's epilogues ask thousands of times)."""
        cache = self.__dict__.setdefault("_operand", {})
        if name not in cache:
            k_ = self.kernel
            s = self.placed.get(name)
            cache[name] = operand_strides(
                k_.op.out_idx, self.flat, self.program.tensors[name].shape,
                self.program.tensors[k_.op.output].shape, None if s is None else s.strides)
        return cache[name]


def _guarded(inner: list[str], conds: list[str]) -> list[str]:
    """`inner` as a block, run where every condition holds."""
    head = f"if ({' && '.join(conds)}) {{" if conds else "{"
    return [head] + ["    " + s for s in inner] + ["}"]
