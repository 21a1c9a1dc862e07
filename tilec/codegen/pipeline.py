"""The GPU forms of a staged contraction kernel (`plan.gpu_form`): vector reads of a run of
accumulator points from local memory, and the software-pipelined reduction loop.

The pipelined loop, for reduction tiles t = 0 .. trips-1 (the nested tile loops flattened into
one, each tile origin decoded from t):

    read tile 0 into registers; write them into half 0 of the local buffers; barrier
    for t: [read tile t+1 into registers]; compute on half t&1;
           [write the registers into half (t+1)&1]; barrier

One barrier a tile is enough: the half written during tile t was last read during tile t-1,
which every thread finished before the barrier that closed it."""

from __future__ import annotations

from ..plan.gpu_form import RUN, run_step
from . import clexpr
from .copy import global_vector, zeros
from .kernel_text import _lin, buf


def half(elems: int) -> int:
    """Elements between the two halves of a double-buffered local array (whole vectors, so the
    second half keeps the first's alignment)."""
    return -(-elems // RUN) * RUN


def run_point(a: int, threads: int, var: str) -> str:
    """The tile-relative position of a thread's point a along a run index: runs of RUN
    consecutive values, neighbouring threads on neighbouring runs."""
    step = run_step(a, threads)
    return f"{var} * {RUN} + {step}" if step else f"{var} * {RUN}"


class Pipeline:
    """The pieces of the pipelined loop for one contraction (`codegen.contraction`)."""

    def __init__(self, con):
        self.con = con
        f, s = con.flat, con.sched
        # The outer tile loops, outermost first, as in `_Contraction.loops`.
        self.outer = [k for k in con.red_idx if con.counts[k] > 1]
        self.trips = 1
        for k in self.outer:
            self.trips *= con.counts[k]
        self.staged = [st for st in s.staged if st is not None]
        self.f = f

    def decode(self, t: str, prefix: str) -> list[str]:
        """Tile origins of flat tile number `t`, the last loop fastest."""
        out, div = [], 1
        for k in reversed(self.outer):
            n, c = self.f.names[k], self.con.counts[k]
            q = f"({t} / {div})" if div > 1 else t
            out.append(f"const int {prefix}_{n} = ({q} % {c}) * {self.con.sched.tile[k]};")
            div *= c
        return out[::-1]

    def fetch(self, prefix: str, copies: dict) -> list[str]:
        """Read one reduction tile's staging elements into the registers f{i}_{q}."""
        out = []
        for st in self.staged:
            i = st.input
            plan = copies[i]
            out.append(plan["base"](prefix))
            for q in range(plan["per"]):
                value = plan["load"](f"sb{i} + sg{i}_{q}")
                if plan["mask"] is not None:  # padding applied here (`staged_masks`)
                    value = f"({plan['mask'](prefix, q)}) ? {value} : {plan['zero']}"
                line = f"f{i}_{q} = {value};"
                if (q + 1) * self.con.sched.wg_threads > plan["units"]:
                    line = f"if (se{i}_{q} < {plan['units']}) {line}"
                out.append(line)
        return out

    def store(self, half_expr: str | None, copies: dict) -> list[str]:
        """Write the registers into a half of each local buffer (n_i points at it)."""
        out = []
        for st in self.staged:
            i = st.input
            plan = copies[i]
            c = clexpr.COMPUTE[self.f.inputs[i].dtype]
            at = f"s_{i}" if half_expr is None else f"s_{i} + ({half_expr}) * {half(st.elems)}"
            out.append(f"__local {c}* n_{i} = {at};")
            for q in range(plan["per"]):
                line = plan["store"](f"n_{i}", f"sl{i}_{q}", f"f{i}_{q}")
                if (q + 1) * self.con.sched.wg_threads > plan["units"]:
                    line = f"if (se{i}_{q} < {plan['units']}) {{ {line} }}"
                out.append(line)
        return out

    def parts(self, copies: dict) -> dict:
        """Template context: `head` before the loop, `top` and `bottom` around the tile's
        computation, `trips`."""
        decls = []
        for st in self.staged:
            i = st.input
            plan = copies[i]
            c = clexpr.COMPUTE[self.f.inputs[i].dtype]
            ty = f"{c}{plan['vw']}" if plan["vw"] > 1 else c
            decls += [f"{ty} f{i}_{q};" for q in range(plan["per"])]
        zero = [f"const int z_{self.f.names[k]} = 0;" for k in self.outer]
        head = decls + ["{"] + ["    " + x for x in zero + self.fetch("z", copies)] + ["}"]
        head += ["{"] + ["    " + x for x in self.store(None, copies)] + ["}"]
        head.append("barrier(CLK_LOCAL_MEM_FENCE);")
        top = self.decode("t", "r")
        for st in self.staged:
            i = st.input
            c = clexpr.COMPUTE[self.f.inputs[i].dtype]
            top.append(f"__local const {c}* c_{i} = s_{i} + (t & 1) * {half(st.elems)};")
        nxt = self.decode("(t + 1)", "nr") + self.fetch("nr", copies)
        top += [f"if (t + 1 < {self.trips}) {{"] + ["    " + x for x in nxt] + ["}"]
        bottom = [f"if (t + 1 < {self.trips}) {{"]
        bottom += ["    " + x for x in self.store("(t + 1) & 1", copies)]
        bottom += ["}", "barrier(CLK_LOCAL_MEM_FENCE);"]
        return {"head": head, "top": top, "bottom": bottom, "trips": self.trips}


def copy_plan(con, st, safe: bool, vw: int, per: int, units: int, zero: int,
              mask=None) -> dict:
    """How one staged input is copied, as functions of names (for `Pipeline`): the tile base
    for reduction-origin variables named prefix_<index>, the global load, the local store,
    and `mask(prefix, q)`, the padding test of copy element q (None: no test)."""
    f = con.flat
    i = st.input
    t = f.inputs[i]
    c = clexpr.COMPUTE[t.dtype]

    def base(prefix: str) -> str:
        terms = [(t.strides[k], f"o_{f.names[k]}") for k in con.out_idx]
        terms += [(t.strides[k], f"{prefix}_{f.names[k]}" if con.counts[k] > 1 else "0")
                  for k in con.red_idx]
        return f"const int sb{i} = {_lin(terms, t.offset - zero)};"

    fill = zeros(t, vw)

    def load(g: str) -> str:
        if vw > 1:  # a vector lies inside the tensor or outside it (`copy_width`)
            value = global_vector(t, g, vw)
        else:
            value = clexpr.load(buf(t.name), g, t.dtype)
        if safe:
            return value
        return f"(({g}) >= 0 && ({g}) < {t.size}) ? {value} : {fill}"

    ls0 = st.merged[0][2] if st.merged else 1  # no merged index: a single element, copied alone
    aligned = ls0 == 1 and all(m[2] % vw == 0 for m in st.merged[1:]) and \
        st.local_base % vw == 0

    def store(into: str, at: str, value: str) -> str:
        if vw == 1:
            return f"{into}[{at}] = {value};"
        if aligned:
            return f"*((__local {c}{vw}*)({into} + {at})) = {value};"
        return " ".join(f"{into}[{at} + {j * ls0}] = {value}.s{j:x};" for j in range(vw))

    return {"base": base, "load": load, "store": store, "per": per, "units": units, "vw": vw,
            "mask": mask, "zero": fill}
