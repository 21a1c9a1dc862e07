"""Render OpenCL C from a `Schedule` (contractions with their post-ops) or a run of elementwise
statements.  Python decides every expression here; the templates only lay the text out.

Long (over 500 lines) because a contraction kernel's parts (group and thread indices, loads,
the reduction loop, the post-ops and stores) share one set of naming rules; split apart, each
piece would re-derive them."""

from __future__ import annotations

import itertools
from collections.abc import Callable

from ..lang import ir
from ..plan.flat import FlatContraction
from ..plan.flatten import operand_strides
from ..plan.fuse import ContractionKernel
from ..plan.gpu_form import RUN
from ..plan.schedule import Schedule, constrained, windowed
from . import clexpr, columns, vector_finish
from .address import kernel_args
from .clexpr import plain_vector_access
from .interior import Interior, lane_edge, steered_offset
from .kernel_text import (
    LANES,
    KernelArg,
    KernelSource,
    _lin,
    _vec,
    arg_decl,
    buf,
    check_int_offsets,
    prod,
    template_env,
)
from .pipeline import Pipeline, run_point
from .prefetch import next_block
from .split import Split, agg_pair
from .staged_masks import handled, staged_masks
from .staging import staging
from .stream import streamed

__all__ = ["KernelArg", "KernelSource", "arg_decl", "buf", "check_int_offsets",
           "contraction_source", "plain_vector_access", "prod", "template_env"]

# ---------------------------------------------------------------------------------------------
# Contractions

# Most copies of the innermost loop body that nested unrolled loops make (`loops`): past
# this, code generation slows (seconds on PoCL) and the kernels do not run faster.
UNROLL_COPIES = 16
# Where the vector lanes are constrained (a padded pool's window columns) each point's edge
# walks its lanes, and PoCL's time to generate the code grows faster than its length: copies
# x points stays within this.  resnet18's 3x3 max pool on Zen 4 (PoCL 3.1): 28 float16
# vectors took 17 s with the window unrolled, 5.5 s with its rows rolled, 1.9 s with both
# loops rolled (0.32, 0.33, 0.36 ms to run); 28 float8 vectors 2.5, 0.6 and 0.4 s (0.159,
# 0.160, 0.184 ms).
UNROLL_LANE_EDGE_POINTS = 64

class _Contraction:
    def __init__(self, kernel: ContractionKernel, sched: Schedule, program: ir.Program,
                 cost_lines: list[str], muladd: str = "fma", plain_vectors: bool = False,
                 cpu: bool = False, line_bytes: int = 64, l2_bytes: int = 0):
        self.kernel = kernel
        self.line_bytes, self.l2_bytes = line_bytes, l2_bytes  # `prefetch`
        self.muladd = muladd  # the hardware model's mul-add form (clexpr.muladd)
        self.plain_vectors = plain_vectors  # `plain_vector_access`
        # `Interior` and steered reads (CPU models), for contractions whose every output
        # element is one point (convolutions): ConvTranspose-like maps (an init kernel and a
        # defracted product) read NaN from poisoned memory with them on some tiles.
        self.interior_split = cpu and kernel.out_map == "bijective"
        # CPU models also stream loads through their updates (`stream.streamed`) and take
        # max/min as a compare and select (`update`).
        self.cpu = cpu
        self.sched = sched
        self.flat: FlatContraction = sched.flat
        self.program = program
        self.cost_lines = cost_lines
        f = self.flat
        self.names = [f"i_{n}" for n in f.names]
        self.out_idx = list(f.out_indices)
        self.red_idx = list(f.reduce_indices)
        self.counts = sched.counts()
        self.acc = sched.acc_counts()
        out_t = program.tensors[kernel.op.output]
        self.dtype = out_t.dtype
        self.ctype = clexpr.COMPUTE[self.dtype]
        self.W = sched.vec
        self.v = sched.vec_index
        self.points = list(itertools.product(*[range(self.acc[k]) for k in self.out_idx]))
        # A constraint mentions the vector index (padded pooling columns): the edge walks
        # lanes (`interior.lane_edge`).
        self.lanes_constrained = self.W > 1 and self.v in constrained(f)
        self.cons_kind = []  # per constraint: "red", "out" or "mixed"
        for c in f.constraints:
            used = {k for k, x in enumerate(c.coeffs) if x}
            self.cons_kind.append("red" if used <= set(self.red_idx) else
                                  "out" if used <= set(self.out_idx) else "mixed")
        self.need_hit = (not f.output_covered) and (f.agg != "+" or kernel.op.default
                                                    is not None)
        self.split = Split(self) if sched.split > 1 else None
        # Tensors inside another tensor's buffer (the flat tables address the contraction's
        # own accesses there already; post-op operands and results are addressed here).
        self.placed = dict(kernel.storage)
        self.pipe = Pipeline(self) if sched.pipeline else None
        self.copies: dict[int, dict] = {}  # per staged input: how it is copied (`pipeline`)
        # Padding constraints the staging copy applies (`staged_masks`): the multiply-adds
        # then read the local tile unmasked.
        self.stage_masks = staged_masks(self)
        self.typedefs: dict[str, None] = {}  # the vector types unaligned accesses use
        # A sweep (`plan.sweep`) where the kernel reads through the cache, one output element
        # a point, nothing settled at the end but the sums: the partial sums kept between
        # reduction blocks are then the whole state of a tile.
        self.sweep = sched.sweep if (
            sched.sweep is not None and self.interior_split and not self.pipe and
            not self.split and sched.run is None and not (sched.staged and any(sched.staged))
            and not sched.dot and not self.need_hit and kernel.op.default is None) else None

    # positions -----------------------------------------------------------------------------
    def pos(self, k: int, a: int) -> str:
        """Absolute flat index k of accumulator point a along k."""
        return f"p_{self.flat.names[k]}_{a}"

    def point_env(self, c: tuple[int, ...]) -> dict[int, str]:
        env = {k: self.pos(k, a) for k, a in zip(self.out_idx, c, strict=True)}
        env.update({k: self.names[k] for k in self.red_idx})
        return env

    def rel(self, k: int, a: int, raw: bool = False) -> str:
        return f"{'w' if raw else 'q'}_{self.flat.names[k]}_{a}"

    # offsets and loads -----------------------------------------------------------------------
    def offset_bounds(self, strides: tuple[int, ...], off: int,
                      starts: bool = False) -> tuple[int, int]:
        """Extreme offsets over every position the kernel forms, partial tiles included;
        `starts`: of vectors' first lanes, which are multiples of W along the vector index
        (`lanes_aligned`), the last one W - 1 or less before the tile's end."""
        lo = hi = off
        for k, s in enumerate(strides):
            top = self.counts[k] * self.sched.tile[k] - 1
            if self.sched.shifted(k):  # the last tile ends where the range does
                top = self.flat.ranges[k] - (self.W if starts and k == self.v else 1)
            if starts and k == self.v and self.lanes_aligned():
                top -= (self.sched.tile[k] - 1) % self.W
            lo += min(0, s * top)
            hi += max(0, s * top)
        return lo, hi

    def lanes_aligned(self) -> bool:
        """Every vector's first position along the vector index is a multiple of W: tiles
        are multiples of W and threads, accumulators and loop steps move by W (not the GPU
        forms' runs, nor a reduction split along the vector index)."""
        s = self.sched
        return self.W > 1 and self.v is not None and s.tile[self.v] % self.W == 0 and \
            not s.shifted(self.v) and \
            (s.run is None or s.run.index != self.v) and \
            not (self.split and s.split_index == self.v)

    def vector_aligned(self, t_index: int) -> bool:
        """Tensor t_index's vectors (W consecutive elements along the vector index) all start
        on a multiple of W in its buffer, clamped or not (`guarded`): read and written as
        whole vectors (clexpr.vector_access) instead of through vloadN/vstoreN."""
        t, W = self.flat.tensors[t_index], self.W
        return self.plain_vectors and self.lanes_aligned() and t.strides[self.v] == 1 and \
            t.offset % W == 0 and t.size % W == 0 and \
            all(x % W == 0 for k, x in enumerate(t.strides) if k != self.v)

    def overhangs(self, k: int) -> bool:
        """Whether output index k's tiles reach past its range (a partial last tile that does
        not move back: `Schedule.shift`)."""
        return self.counts[k] * self.sched.tile[k] > self.flat.ranges[k] and \
            not self.sched.shifted(k)

    def lanes_fit(self) -> bool:
        """Whether vector lanes never pass the vector index's range: vectors start on
        multiples of W of a range W divides, or the last tile moves back."""
        v, W = self.v, self.W
        return W == 1 or v is None or self.sched.shifted(v) or \
            (self.lanes_aligned() and self.flat.ranges[v] % W == 0)

    def span(self, t) -> int:
        """Elements one read of tensor t covers: a vector's lanes, `stride` apart."""
        if self.W == 1 or self.v is None or t.strides[self.v] == 0:
            return 1
        return (self.W - 1) * abs(t.strides[self.v]) + 1

    def guarded(self, t_index: int, expr: str, width: int, decls: list[str] | None = None,
                name: str = "g") -> str:
        """Offset `expr` of a read of `width` elements, clamped into the tensor where some
        position the kernel forms falls outside it.  With `decls`, the offset is declared
        there as `name` and clamped by clexpr.clamp (plain C: clamp() is a library call on
        some drivers, and a call in the loop spills every accumulator); without, clamp()."""
        t = self.flat.tensors[t_index]
        lo, hi = self.offset_bounds(t.strides, t.offset, starts=width > 1)
        hi += width - 1
        if lo >= 0 and hi < t.size:
            return expr
        if decls is None:
            return f"clamp({expr}, 0, {t.size - width})"
        decls.append(f"const int {name} = {expr};")
        return clexpr.clamp(name, "0", str(t.size - width))

    def input_value(self, i: int, c: tuple[int, ...], decls: list[str] | None = None,
                    name: str = "g", clamp: bool = True, at: str | None = None,
                    element: bool = False) -> str:
        """Text of input i at accumulator point c (vector of W lanes where vectorised); an
        offset that needs clamping is declared first, as `name`, in `decls` (`guarded`);
        `clamp=False` where the read is known to be in bounds (`Interior`); `at`: an
        offset in bounds by construction (`steered_offset`); `element`: an input the lanes
        share as its one element, not broadcast to W lanes."""
        t = self.flat.inputs[i]
        st = self.sched.staged[i] if self.sched.staged else None
        env = self.point_env(c)
        W, v = self.W, self.v
        ctype = clexpr.COMPUTE[t.dtype]
        if st is not None:
            off = self.local_offset(i, c)
            name = self.local_name(i)
            step = st.local_strides[v] if v is not None else 0
            if W == 1 or v is None or t.strides[v] == 0:
                val = f"{name}[{off}]"
                return val if W == 1 or element else f"(({ctype}{W})({val}))"
            if step == 1:
                if st.local_base % W == 0 and all(
                        ls % W == 0 for k, ls in enumerate(st.local_strides) if k != v):
                    # Every vector starts on a multiple of W (the layout is widened for it,
                    # the thread's lane offset and the loop step are multiples of W), and
                    # the buffer is aligned to a vector: one aligned local read.
                    return f"*((__local const {ctype}{W}*)({name} + ({off})))"
                return f"vload{W}(0, {name} + ({off}))"
            lanes = ", ".join(f"{name}[{off} + {j * step}]" for j in range(W))
            return f"(({ctype}{W})({lanes}))"
        terms = [(t.strides[k], env[k]) for k in range(len(self.names))]
        off = _lin(terms, t.offset)
        if at is not None:
            off, clamp = at, False
        if W == 1 or v is None or t.strides[v] == 0:
            at = self.guarded(i + 1, off, 1, decls, name) if clamp else off
            val = clexpr.load(buf(t.name), at, t.dtype)
            return val if W == 1 or element else f"(({ctype}{W})({val}))"
        at = self.guarded(i + 1, off, self.span(t), decls, name) if clamp else off
        if t.strides[v] == 2:  # every other element (`vector_candidates(cpu)`)
            return clexpr.load_pairs(buf(t.name), at, t.dtype, W,
                                     unaligned=self.unaligned(t.dtype))
        aligned = self.vector_aligned(i + 1)
        return clexpr.load(buf(t.name), at, t.dtype, W, aligned=aligned,
                           unaligned=not aligned and self.unaligned(t.dtype))

    def binder(self, lines: list[str], ctype: str, var: str) -> Callable[[str], str] | None:
        """clexpr.expr's `bind` for a post-op computing `var`: each value it names becomes a
        constant appended to `lines` (var_0, var_1, ...).  Only where vloadN was measured a
        library call (`plain_vectors`): the builtins it keeps out of post-ops are calls too."""
        if not self.plain_vectors:
            return None
        names: list[str] = []

        def bind(text: str) -> str:
            names.append(f"{var}_{len(names)}")
            lines.append(f"const {ctype} {names[-1]} = {text};")
            return names[-1]
        return bind

    def unaligned(self, dtype: str, width: int | None = None) -> bool:
        """Whether a vector of dtype (of W lanes, or `width`) that may start anywhere is read
        or written through the kernel's `clexpr.unaligned_typedef` (devices with
        `plain_vectors`; the typedef is then declared in the prologue)."""
        if not self.plain_vectors or dtype not in clexpr.VECTOR_ACCESS:
            return False
        self.typedefs[clexpr.unaligned_typedef(dtype, width or self.W)] = None
        return True

    def local_offset(self, i: int, c: tuple[int, ...]) -> str:
        """Where staged input i's value for accumulator point c is in its local tile."""
        st = self.sched.staged[i]
        terms = []
        for k in range(len(self.names)):
            ls = st.local_strides[k]
            if ls == 0:
                continue
            var = self.rel(k, c[self.out_idx.index(k)]) if k in self.out_idx \
                else f"u_{self.flat.names[k]}"
            terms.append((ls, var))
        return _lin(terms, st.local_base)

    def local_name(self, i: int) -> str:
        """Input i's local tile: the array, or the current half of a double-buffered one."""
        return f"c_{i}" if self.pipe else f"s_{i}"

    def run_load(self, i: int, c: tuple[int, ...]) -> tuple[str, str, str]:
        """(variable, declaration, component) for a point of the run input: the run's vector,
        read once from local memory, and the point's component of it."""
        r = self.sched.run
        pos = self.out_idx.index(r.index)
        a = c[pos]
        start = c[:pos] + (a - a % RUN,) + c[pos + 1:]
        key = [x // RUN if k == r.index else x for k, x in zip(self.out_idx, c, strict=True)
               if self.flat.inputs[i].strides[k] != 0]
        var = f"xr{i}_" + "_".join(map(str, key))
        ctype = clexpr.COMPUTE[self.flat.inputs[i].dtype]
        off = self.local_offset(i, start)
        decl = f"const {ctype}{RUN} {var} = " \
            f"*((__local const {ctype}{RUN}*)({self.local_name(i)} + ({off})));"
        return var, decl, f"{var}.s{LANES[a % RUN]}"

    def constraint_text(self, ci: int, env: dict[int, str]) -> str:
        c = self.flat.constraints[ci]
        return f"({_lin([(x, env[k]) for k, x in enumerate(c.coeffs) if x])} <= {c.rhs})"

    # pieces ----------------------------------------------------------------------------------
    def prologue(self) -> list[str]:
        f, s = self.flat, self.sched
        out = ["int grp = get_group_id(0);"]
        swept = self.sweep.index if self.sweep else None
        for k in s.group_order or self.out_idx:
            n = f.names[k]
            if k == swept:  # the work-item's first tile; the sweep loop steps through them
                many = self.counts[k] // self.sweep.tiles
                out.append(f"const int g_{n} = (grp % {many}) * "
                           f"{s.tile[k] * self.sweep.tiles}; grp /= {many};")
                continue
            origin = f"(grp % {self.counts[k]}) * {s.tile[k]}"
            if s.shifted(k):  # the last tile ends at the range's end (`Schedule.shift`)
                origin = f"min({origin}, {f.ranges[k] - s.tile[k]})"
            out.append(f"const int o_{n} = {origin}; grp /= {self.counts[k]};")
        out.append("int thr = get_local_id(0);")
        if self.split and self.split.rank_first:
            out.append(self.split.rank_line())
        # Neighbouring threads take neighbouring elements of the output's lowest-stride index:
        # their stores coalesce and their vector reads of local memory are conflict-free.
        for k in sorted(self.out_idx, key=lambda k: abs(f.output.strides[k])):
            n = f.names[k]
            out.append(f"const int h_{n} = thr % {s.threads[k]}; thr /= {s.threads[k]};")
        if self.split and not self.split.rank_first:
            out.append(self.split.rank_line())
        self.sweep_positions: list[str] = []
        for k in self.out_idx:
            n = f.names[k]
            lanes = self.W if k == self.v else 1
            if k == swept:
                lines = self.sweep_positions
                lines.append(f"const int o_{n} = g_{n} + s_{n} * {s.tile[k]};")
            else:
                lines = out
            for a in range(self.acc[k]):
                rel = f"(h_{n} + {a * s.threads[k]})" if a else f"h_{n}"
                rel = f"{rel} * {lanes}" if lanes > 1 else rel
                if s.run is not None and k == s.run.index:
                    rel = run_point(a, s.threads[k], f"h_{n}")
                if s.ragged(k):
                    # Past the tile's end: redo its last point (in bounds, never stored).
                    lines.append(f"const int {self.rel(k, a, raw=True)} = {rel};")
                    rel = f"min({self.rel(k, a, raw=True)}, {s.tile[k] - lanes})"
                lines.append(f"const int {self.rel(k, a)} = {rel};")
                lines.append(f"const int {self.pos(k, a)} = o_{n} + {self.rel(k, a)};")
        return out

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

    def sweep_parts(self, outer: list[dict], epilogue: list[str]) -> dict | None:
        """The sweep loop's head (the tile's positions, its accumulators: zero in the first
        reduction block, its partial sums after) and tail (partial sums kept, or in the last
        block the epilogue)."""
        if not self.sweep:
            return None
        n, p = self.flat.names[self.sweep.index], len(self.points)
        init = self.acc_init()
        first = " && ".join(f"{lp['var']} == 0" for lp in outer)
        last = " && ".join(f"{lp['var']} == {(-(-lp['end'] // lp['step']) - 1) * lp['step']}"
                           for lp in outer)
        head = list(self.sweep_positions)
        head += next_block(self.flat, self.sched.tile, self.sweep, outer,
                           self.sched.wg_threads, self.pos, self.line_bytes, self.l2_bytes)
        head += [f"{self.acc_type()} a_{j} = ({first}) ? {init} : part[s_{n} * {p} + {j}];"
                 for j in range(p)]
        tail = [f"if (!({last})) {{"]
        tail += [f"    part[s_{n} * {p} + {j}] = a_{j};" for j in range(p)]
        tail += ["} else {", "    /* Finish each output element: empty-element default, "
                 "post-ops, stores. */"]
        tail += ["    " + ln for ln in epilogue] + ["}"]
        return {"var": f"s_{n}", "tiles": self.sweep.tiles, "head": head, "tail": tail}

    def loops(self) -> tuple[list[dict], list[dict]]:
        f, s = self.flat, self.sched
        outer, inner = [], []
        for k in self.red_idx:
            n = f.names[k]
            if self.counts[k] > 1:
                outer.append({"var": f"r_{n}", "index": k, "end": f.ranges[k],
                              "step": s.tile[k]})
        # Constrained indices outermost and the vector index innermost, so that masks are
        # loop-invariant in the innermost loop and its body is only loads and FMAs.
        blocked = windowed(f)
        order = sorted(self.red_idx, key=lambda k: (k == self.v, k not in blocked, k))
        # Nested unrolled loops copy the body the product of their trip counts: innermost
        # first, loops are unrolled while that product stays within UNROLL_COPIES.  A 7x7x3
        # stem convolution fully unrolled (147 copies) took PoCL 5-9 s to generate and ran
        # half as fast as with its outer loop rolled.
        unrolled, copies = set(), 1
        # A pipelined GPU loop (`pipeline`) may unroll 16 trips: its tile is in local memory,
        # and the unrolled local reads are what the compiler schedules around the FMAs.
        longest = 16 if self.pipe else 8
        points = len(self.points) if self.lanes_constrained else 0
        for k in reversed(order if not s.rolled else []):  # rolled: a tuned variant
            trips = -(-s.tile[k] // (self.W if k == self.v else 1))
            if trips > longest or copies * trips > UNROLL_COPIES or \
                    points * copies * trips > UNROLL_LANE_EDGE_POINTS:
                # A window read through a border (`plan.halo`) has no edge code to fold:
                # its loops outside a rolled one stay rolled (a third less code to generate
                # for resnet50's 3x3 convolutions; run times within noise).
                if self.cpu and self.flat.windowed and not self.flat.constraints:
                    break
                continue
            unrolled.add(k)
            copies *= trips
        for k in order:
            n = f.names[k]
            step = self.W if k == self.v else 1
            loop = {"var": f"u_{n}", "index": k, "start": 0, "end": s.tile[k], "step": step,
                    "unroll": k in unrolled}
            inner.append(self.split.loop(loop) if self.split and k == s.split_index else loop)
        return outer, inner

    def staging(self) -> tuple[list[str], list[dict], list[str]]:
        """Local buffers, the copy blocks run per reduction tile, and prologue lines
        (`codegen.staging`)."""
        return staging(self)

    def origin(self, k: int, prefix: str | None = None) -> str:
        """The tile's origin along flat index k: the work-group's along an output index, the
        reduction tile's (named prefix_<index> in the pipelined loop's copies) along a sum's."""
        n = self.flat.names[k]
        if k in self.out_idx:
            return f"o_{n}"
        if prefix is not None:
            return f"{prefix}_{n}" if self.counts[k] > 1 else "0"
        return self.red_var(k)

    def red_var(self, k: int) -> str:
        n = self.flat.names[k]
        return f"r_{n}" if self.counts[k] > 1 else "0"

    def body(self, inside: Interior | None = None, clean: bool = False) -> list[str]:
        """The innermost loop's body.  With `inside` (`Interior`) the split above declared
        the constrained indices; `clean`: the interior's copy, where every constraint holds."""
        f = self.flat
        out = []
        fixed = set(inside.fixed) if inside else set()
        for k in self.red_idx:
            n = f.names[k]
            if k not in fixed:
                out.append(f"const int i_{n} = {self.red_var(k)} + u_{n};")
        for k in self.red_idx:
            if f.ranges[k] % self.sched.tile[k] and k not in fixed:
                out.append(f"if (i_{f.names[k]} >= {f.ranges[k]}) break;")
        red_env = {k: self.names[k] for k in self.red_idx}
        for ci, kind in enumerate(self.cons_kind):
            if kind == "red" and not fixed:
                out.append(f"if (!{self.constraint_text(ci, red_env)}) continue;")
        if not clean and self.lanes_constrained:
            return out + lane_edge(self)
        # A padding constraint of a sum of products can zero the operand it guards instead of
        # guarding every update: one select per load, and branch-free FMAs.
        done = handled(self.stage_masks)
        mixed = [] if clean else [ci for ci, kind in enumerate(self.cons_kind)
                                  if kind == "mixed" and ci not in done]
        masked = self.masked_loads(mixed)
        # One load per distinct value: inputs that ignore an output index share it.
        loads: dict[tuple[int, tuple], str] = {}
        groups: list[tuple[tuple[int, tuple], list[str]]] = []  # each load's statements

        def keys(c: tuple[int, ...]) -> list[tuple[int, tuple]]:
            """Per input, the load point c reads: (input, the coordinates it depends on)."""
            return [(i, tuple(a for k, a in zip(self.out_idx, c, strict=True)
                              if t.strides[k] != 0)) for i, t in enumerate(f.inputs)]

        runs: set[str] = set()  # run vectors read so far (`run_load`)
        for c in self.points:
            for key, t in zip(keys(c), f.inputs, strict=True):
                i = key[0]
                if key not in loads:
                    var = f"x{i}_" + "_".join(map(str, key[1])) if key[1] else f"x{i}"
                    loads[key] = var
                    step: list[str] = []  # this load's statements
                    groups.append((key, step))
                    ty = _vec(clexpr.COMPUTE[t.dtype], self.W)
                    run = self.sched.run
                    if run is not None and i == run.input:
                        rv, decl, value = self.run_load(i, c)
                        if rv not in runs:
                            runs.add(rv)
                            step.append(decl)
                        value = f"(({ty})({value}))" if self.W > 1 else value
                    guards = [self.constraint_text(ci, self.point_env(c))
                              for ci in masked.get(i, ())]
                    # On a CPU, an input the lanes share is masked as its one element and then
                    # broadcast: a lane mask of it would be a loop-invariant vector that holds
                    # a register through the whole reduction loop (on 16 AVX2 registers, one
                    # accumulator then lives on the stack).  Not on GPUs: there the NHWC 3x3
                    # convolution at N=32 ran 2.2x slower on an H200.
                    shared = (bool(guards) and self.W > 1 and self.span(t) == 1
                              and self.interior_split and (run is None or i != run.input))
                    if run is None or i != run.input:
                        # A masked read on a CPU steers its address instead of clamping it
                        # (`steered_offset`); its mask is computed once, as m<read>.  Only
                        # where one input carries every constraint (a convolution's input):
                        # where they are split, a constraint that keeps this read in bounds
                        # may be carried by the other input's read.
                        steered = None
                        if guards and self.interior_split and len(masked) == 1:
                            steered = steered_offset(self, i, c, f"m{var[1:]}")
                            if steered is not None:
                                step.append(f"const int m{var[1:]} = {' && '.join(guards)};")
                                guards = [f"m{var[1:]}"]
                        value = self.input_value(i, c, step, f"g{var[1:]}",
                                                 clamp=not (clean and i in inside.plain),
                                                 at=steered, element=shared)
                    if guards:
                        # A lane mask keeps the load unconditional (its address is clamped in
                        # bounds) where a scalar `c ? load : 0` would become a branch.  `?:`
                        # on a vector condition is select() (OpenCL C 6.3), written as an
                        # operator: select() is a library call on some drivers (`vector_access`).
                        cond = " && ".join(guards)
                        if shared:
                            # The element is read first, so that the select picks between
                            # two values (a read inside `?:` could become a branch).
                            ctype = clexpr.COMPUTE[t.dtype]
                            step.append(f"const {ctype} e{var[1:]} = {value};")
                            value = f"(({ty})(({cond}) ? e{var[1:]} : ({ctype})(0)))"
                        elif self.W > 1:
                            itype = _vec("int", self.W)
                            value = f"(({itype})(-(int)({cond})) ? {value} : ({ty})(0))"
                        else:
                            value = f"(({cond}) ? {value} : ({ty})(0))"
                    step.append(f"const {ty} {var} = {value};")
        updates: list[tuple[list[tuple[int, tuple]], str]] = []  # (the loads it reads, text)
        for j, c in enumerate(self.points):
            reads = keys(c)
            vals = [loads[key] for key in reads]
            env = self.point_env(c)
            conds = [self.constraint_text(ci, env) for ci in mixed
                     if not any(ci in cs for cs in masked.values())]
            update = self.update(f"a_{j}", vals)
            hit = f" hit_{j} = 1;" if self.need_hit else ""
            if conds:
                updates.append((reads, f"if ({' && '.join(conds)}) {{ {update}{hit} }}"))
            else:
                updates.append((reads, update + hit))
        if not self.cpu:  # GPU models: every load first
            return out + [x for _, lines in groups for x in lines] + [u for _, u in updates]
        spans = [self.span(t) for t in f.inputs]
        return out + streamed(groups, updates, spans)

    def masked_loads(self, mixed: list[int]) -> dict[int, tuple[int, ...]]:
        """Constraints to apply by zeroing an input's loaded value (input -> constraints).
        Only for a sum of products without hit flags, and only when the input's value already
        depends on every output index the constraint mentions."""
        f = self.flat
        if not mixed or f.agg != "+" or f.comb != "*" or self.need_hit:
            return {}
        out: dict[int, list[int]] = {}
        for ci in mixed:
            used = {k for k, x in enumerate(f.constraints[ci].coeffs) if x and k in self.out_idx}
            for i, t in enumerate(f.inputs):
                if all(t.strides[k] != 0 for k in used):
                    out.setdefault(i, []).append(ci)
                    break
            else:
                return {}
        return {i: tuple(cs) for i, cs in out.items()}

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

    def render(self) -> KernelSource:
        f, s, k_ = self.flat, self.sched, self.kernel
        for t in f.tensors:
            lo, hi = self.offset_bounds(t.strides, t.offset)
            check_int_offsets(f"tensor {t.name} of `{k_.op.text}`", lo,
                              max(hi + self.W - 1, t.size))
        args = self.args()
        bufs, staging, staging_pre = self.staging()
        epilogue, combine = self.epilogue(), []
        if self.split:
            bufs += self.split.buffers()
            combine, epilogue = self.split.combine(), self.split.wrap(epilogue)
        outer, inner = self.loops()
        inside = Interior(self) if Interior.applies(self) else None
        prologue = self.prologue()  # (the sweep's positions come from it)
        sweep = self.sweep_parts(outer, epilogue)
        if sweep:
            epilogue = []
        wg = s.wg_threads
        groups = prod(self.counts[k] for k in self.out_idx)
        if self.sweep:
            groups //= self.sweep.tiles
        tile = dict(zip(f.names, s.tile, strict=True))
        comment = [k_.op.text, ""]
        comment += [f"tile: {', '.join(f'{n}={t}' for n, t in tile.items())}",
                    f"threads: {wg} per group, {groups} groups; "
                    f"{len(self.points)} accumulators of {self.acc_type()} per thread"]
        if self.v is not None:
            comment.append(f"vector: {self.W} lanes along {f.names[self.v]}"
                           + (" (reduction: lanes summed at the end)" if s.dot else ""))
        comment.append("staging: " + ("local memory" if s.staged and any(s.staged) else
                                      "none (read through cache)"))
        if s.run is not None:
            comment.append(f"runs: {f.inputs[s.run.input].name} read {RUN} points along "
                           f"{f.names[s.run.index]} at a time from local memory")
        if self.pipe:
            comment.append("pipelined: the next reduction tile read into registers during "
                           "this one, local tiles double-buffered")
        if self.split:
            comment.append(f"split reduction: {s.split} threads along {f.names[s.split_index]}"
                           f" per output thread, combined in local memory")
        if self.sweep:
            comment.append(self.sweep.describe(f, s.tile[self.sweep.index]))
        if k_.post_ops:
            comment.append("post-ops: " + "; ".join(p.text for p in k_.post_ops))
        comment += [""] + f.table().splitlines()
        for c in f.constraints:
            comment.append("constraint: " + f.constraint_text(c))
        comment += [""] + self.cost_lines
        ctx = {
            "title": f"{k_.name}: contraction kernel generated by tilec",
            "comment": [ln.replace("*/", "* /") for ln in comment],
            "name": k_.name, "args": [arg_decl(a) for a in args], "wg": wg,
            "prologue": prologue + staging_pre, "accumulators": self.accumulators(),
            "local_buffers": bufs, "staging": staging, "outer": outer, "inner": inner,
            "body": self.body(inside), "combine": combine, "epilogue": epilogue,
            "interior": None if inside is None else {
                "at": inside.at, "head": inside.head(), "cond": inside.cond,
                "body": self.body(inside, clean=True)},
            "pipe": self.pipe.parts(self.copies) if self.pipe else None,
            "sweep": sweep,
        }
        ctx["prologue"] = list(self.typedefs) + ctx["prologue"]  # known once all is written
        text = template_env().get_template("contraction.cl.j2").render(k=ctx)
        # Two flops per index point, plus each post-op once per output element.
        flops = 2 * f.points + k_.post_op_count * self.program.tensors[k_.op.output].size
        return KernelSource(k_.name, "contraction", text, tuple(args), groups * wg, wg, tile,
                            "\n".join(self.cost_lines), flops)

    def args(self) -> list[KernelArg]:
        k_, p = self.kernel, self.program
        reads: list[str] = [a.tensor for a in k_.op.inputs]
        if k_.op.default:
            reads.append(k_.op.default)
        for po in k_.post_ops:
            reads += list(ir.expr_refs(po.expr))
        produced = set(k_.produces)
        ins = list(dict.fromkeys(r for r in reads if r not in produced))
        if self.placed:  # arguments are buffers: the roots of placed tensors
            return kernel_args(ins, k_.writes, p, self.placed)
        args = [KernelArg(n, "in", p.tensors[n].dtype, p.tensors[n].size) for n in ins]
        args += [KernelArg(n, "out", p.tensors[n].dtype, p.tensors[n].size) for n in k_.writes]
        return args


def _guarded(inner: list[str], conds: list[str]) -> list[str]:
    """`inner` as a block, run where every condition holds."""
    head = f"if ({' && '.join(conds)}) {{" if conds else "{"
    return [head] + ["    " + s for s in inner] + ["}"]


def contraction_source(kernel: ContractionKernel, sched: Schedule, program: ir.Program,
                       cost_lines: list[str] | None = None, hw=None) -> KernelSource:
    """The kernel's text; `hw`, the hardware model, picks the mul-add form, the vector access
    form (`plain_vector_access`), on CPUs the unmasked interior (`Interior`), and the cache
    line a sweep's prefetches step by and the L2 they pass over (`prefetch`)."""
    return _Contraction(kernel, sched, program, cost_lines or [],
                        hw.muladd if hw is not None else "fma",
                        hw is not None and plain_vector_access(hw),
                        hw is not None and hw.kind == "cpu",
                        (hw.mem_width if hw is not None and hw.mem_width else 64),
                        hw.l2_bytes if hw is not None else 0).render()
