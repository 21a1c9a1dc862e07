"""Render OpenCL C from a `Schedule` (contractions with their post-ops) or a run of elementwise
statements.  Python decides every expression here; the templates only lay the text out.

A contraction kernel's parts (group and thread indices, loads, the reduction loop, the
accumulators' post-ops and stores) share one set of naming rules, so they are one class,
`_Contraction`, whose reads (`contraction_in.Inputs`) and accumulators and stores
(`contraction_out.Outputs`) are written in modules of their own."""

from __future__ import annotations

import itertools

from ..lang import ir
from ..plan.flat import FlatContraction
from ..plan.fuse import ContractionKernel
from ..plan.schedule import Schedule, constrained, windowed
from . import clexpr
from .address import kernel_args
from .clexpr import plain_vector_access
from .contraction_in import Inputs
from .contraction_out import Outputs
from .describe import describe
from .edge import edge_code, edge_index
from .interior import Interior, lane_edge, steered_offset
from .kernel_text import (
    KernelArg,
    KernelSource,
    _vec,
    arg_decl,
    buf,
    check_int_offsets,
    prod,
    template_env,
)
from .pipeline import Pipeline, run_point
from .prefetch import next_block
from .split import Split
from .staged_masks import handled, staged_masks
from .staging import staging
from .stream import streamed
from .unroll import unrolled_loops

__all__ = ["KernelArg", "KernelSource", "arg_decl", "buf", "check_int_offsets",
           "contraction_source", "plain_vector_access", "prod", "template_env"]

# ---------------------------------------------------------------------------------------------
# Contractions


class _Contraction(Inputs, Outputs):
    def __init__(self, kernel: ContractionKernel, sched: Schedule, program: ir.Program,
                 cost_lines: list[str], muladd: str = "fma", plain_vectors: bool = False,
                 cpu: bool = False, line_bytes: int = 64, l2_bytes: int = 0,
                 edge_of: tuple[int, int, int] | None = None):
        self.kernel = kernel
        # (k, tile, count) where this is the code of the last tile along output index k
        # (`edge_index`): a narrower tile than the kernel's, at the origin of the kernel's
        # count-th tile of its width.
        self.edge_of = edge_of
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
        self.bases: dict[int, str] | None = None  # while a CPU body is written: `based_read`
        self.sched = sched
        self.flat: FlatContraction = sched.flat
        self.program = program
        self.cost_lines = cost_lines
        f = self.flat
        self.names = [f"i_{n}" for n in f.names]
        self.out_idx = list(f.out_indices)
        self.red_idx = list(f.reduce_indices)
        self.counts = sched.counts()
        if edge_of is not None:
            self.counts = tuple(edge_of[2] if k == edge_of[0] else c
                                for k, c in enumerate(self.counts))
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
        self.edge_k = edge_of[0] if edge_of is not None else edge_index(self)

    def group_walk(self) -> tuple[int, ...] | list[int]:
        """The output indices in the order work-group numbers walk them, fastest first."""
        return self.sched.group_order or self.out_idx

    def group_count(self, k: int) -> int:
        """Work-groups along output index k: its tiles, less those a sweep runs together."""
        return self.counts[k] // (self.sweep.tiles if self.sweep and k == self.sweep.index
                                  else 1)

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
    def prologue(self) -> list[str]:
        f, s = self.flat, self.sched
        out = ["int grp = get_group_id(0);"]
        swept = self.sweep.index if self.sweep else None
        for k in self.group_walk():
            n = f.names[k]
            if k == swept:  # the work-item's first tile; the sweep loop steps through them
                many = self.group_count(k)
                out.append(f"const int g_{n} = (grp % {many}) * "
                           f"{s.tile[k] * self.sweep.tiles}; grp /= {many};")
                continue
            step = self.edge_of[1] if self.edge_of and k == self.edge_of[0] else s.tile[k]
            origin = f"(grp % {self.counts[k]}) * {step}"
            if s.shifted(k) and k != self.edge_k:
                # The last tile ends at the range's end (`Schedule.shift`), unless it has
                # code of its own (`edge_index`).
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
        unrolled = unrolled_loops(self, order)
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
        # CPU reads from one base pointer an input (`based_read`), declared before the loads.
        self.bases = {} if self.cpu else None
        # A padding constraint of a sum of products can zero the operand it guards instead of
        # guarding every update: one select per load, and branch-free FMAs.
        done = handled(self.stage_masks)
        mixed = [] if clean else [ci for ci, kind in enumerate(self.cons_kind)
                                  if kind == "mixed" and ci not in done]
        masked = self.masked_loads(mixed)
        # One load per distinct value: inputs that ignore an output index share it.
        loads: dict[tuple[int, tuple], str] = {}
        where: dict[tuple[int, tuple], int] = {}  # each load's place in memory
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
                    where[key] = self.point_offset(i, c)
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
        run = self.sched.run
        bases, self.bases = [self.bases[i] for i in sorted(self.bases)], None
        return out + bases + streamed(groups, updates, spans, where, run.input if run else None)

    def render(self) -> KernelSource:
        f, s, k_ = self.flat, self.sched, self.kernel
        for t in f.tensors:
            lo, hi = self.offset_bounds(t.strides, t.offset)
            check_int_offsets(f"tensor {t.name} of `{k_.op.text}`", lo,
                              max(hi + self.W - 1, t.size))
        ctx, groups, args = self.context()
        ctx["edge"] = edge_code(self)
        # The vector types unaligned reads use, known once all is written: before the edge
        # code where there is one, else at the top of the prologue.
        if ctx["edge"]:
            ctx["typedefs"] = list(self.typedefs)
        else:
            ctx["prologue"] = list(self.typedefs) + ctx["prologue"]
        text = template_env().get_template("contraction.cl.j2").render(k=ctx)
        wg = s.wg_threads
        tile = dict(zip(f.names, s.tile, strict=True))
        # Two flops per index point, plus each post-op once per output element.
        flops = 2 * f.points + k_.post_op_count * self.program.tensors[k_.op.output].size
        return KernelSource(k_.name, "contraction", text, tuple(args), groups * wg, wg, tile,
                            "\n".join(self.cost_lines), flops)

    def render_body(self) -> str:
        """The kernel's statements alone (`edge_code` puts them in another kernel)."""
        ctx, _, _ = self.context(comment=False)
        ctx["edge"], ctx["body_only"], ctx["typedefs"] = None, True, []
        return template_env().get_template("contraction.cl.j2").render(k=ctx)

    def context(self, comment: bool = True) -> tuple[dict, int, list[KernelArg]]:
        """The template's context, the work-groups and the kernel's arguments (`comment`:
        with the kernel's comment; an edge tile's statements go without)."""
        s, k_ = self.sched, self.kernel
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
        lines = describe(self, groups) if comment else []
        ctx = {
            "title": f"{k_.name}: contraction kernel generated by tilec",
            "comment": [ln.replace("*/", "* /") for ln in lines],
            "name": k_.name, "args": [arg_decl(a) for a in args], "wg": wg,
            "prologue": prologue + staging_pre, "accumulators": self.accumulators(),
            "local_buffers": bufs, "staging": staging, "outer": outer, "inner": inner,
            "body": self.body(inside), "combine": combine, "epilogue": epilogue,
            "interior": None if inside is None else {
                "at": inside.at, "head": inside.head(), "cond": inside.cond,
                "body": self.body(inside, clean=True)},
            "pipe": self.pipe.parts(self.copies) if self.pipe else None,
            "sweep": sweep, "body_only": False, "edge": None, "typedefs": [],
        }
        return ctx, groups, args

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
