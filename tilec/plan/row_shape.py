"""How a row-fused kernel (`rows.RowKernel`) is laid over the device, chosen by predicted time.

A shape is (threads a row, rows a work-group, elements a work-item takes at a time):

- GPU: T threads share a row (each keeps its share in registers when it is at most
  `MAX_SHARE` elements, else walks the row in memory), their partial results meet in a tree in
  local memory (log2 T barrier steps a reduction); R rows a work-group, so that short rows still
  make work-groups of a few warps.
- CPU: one work-item owns a row and walks it W elements at a time (float vectors; W = 1 where
  the statements do not vectorise), R rows a work-group (one core runs a work-group's rows one
  after another; fewer groups cost less dispatch, more balance the cores).

The time of each candidate, in seconds, with its limiting resource:

    GPU: DRAM      = the tensors once / the bandwidth reached, + the later walks of rows not
                     held in registers / the L2's; Little's law: reached = bytes in flight /
                     (MEM_LATENCY + bytes in flight / DRAM bandwidth), where the resident
                     work-items each have their share of a held row, or IN_FLIGHT reads of a
                     walked one, in flight
         latency   = waves x barrier steps x STEP, waves = groups / (resident groups x CUs)
         compute   = elements x operations x walks / peak
    CPU: compute   = rows x a row's cycles / (clock x cores) + TAIL x a group's time
                     + groups x group overhead / cores
                     a row's cycles = each walk's L / W steps at the larger of the operations'
                     issue (OPS_PER_CYCLE a cycle, EXP_OPS for an exp) and the reductions'
                     dependency chain (REDUCE_LATENCY cycles a step)
         DRAM      = the tensors once / the DRAM bandwidth; rereads from L2 where the rows of
                     a core's work-group exceed L1
    time = launch + |terms|_p

The coefficients (MEM_LATENCY, STEP, the CPU's cycle counts) are this model's free parameters,
from softmax and layer-norm sweeps on an H200 and the 2-core EPYC (BENCHMARKS.md); the device
facts (CUs, bandwidths, peak, launch and work-group costs) are the hardware model's, measured
by `tilec devices --calibrate`.  `tilec tune` times the candidates against these predictions."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..lang import ir
from .hw import HwModel
from .rows import RowKernel

MAX_THREADS = 256  # threads a work-group (R x T) at most
MAX_SHARE = 16  # elements of a row one GPU thread keeps in registers

# Operations whose OpenCL form works unchanged on float vectors with scalar row values mixed in.
VECTOR_OPS = ("add", "sub", "mul", "div", "neg", "exp", "log", "sqrt", "tanh", "sigmoid",
              "abs", "relu", "floor", "ceil", "sin", "cos", "erf")


@dataclass(frozen=True)
class RowCoefficients:
    mem_latency_us: float = 0.7  # a global read without load (GPU)
    in_flight: float = 8.0  # reads a work-item walking a row keeps in flight (GPU)
    sector_bytes: float = 32.0  # a GPU's smallest memory transaction
    step_us: float = 0.03  # one barrier step of a reduction tree in local memory (GPU)
    resident_groups: int = 32  # work-groups a compute unit holds at most (GPU)
    overlap: float = 4.0  # p of the p-norm joining the terms
    ops_per_cycle: float = 2.0  # vector operations a core issues a cycle (CPU)
    # Operations an exp (log, erf, ...) costs where the device's exp() rate was not measured
    # (`HwModel.exp_gops`, calibrated: then from it).
    exp_ops: float = 16.0  # CPU: a library routine
    gpu_exp_ops: float = 4.0  # GPU: the special-function unit
    tail: float = 0.5  # groups' time the last one ends after the others (CPU)
    reduce_latency: float = 4.0  # cycles between steps of one accumulator's chain (CPU)
    launch_us: float = 5.0  # where the device was not calibrated
    group_us: float = 0.05  # a CPU work-group's dispatch, where not calibrated


DEFAULT = RowCoefficients()
_TRANSCENDENTAL = ("exp", "log", "sqrt", "tanh", "sigmoid", "erf", "sin", "cos", "pow")


@dataclass(frozen=True)
class RowShape:
    threads: int  # work-items a row
    rows: int  # rows a work-group
    vec: int  # elements a work-item takes at a time (threads == 1)
    predicted_s: float = math.nan
    bottleneck: str = ""
    note: str = ""  # where the shape came from, when not from the model (a tuning record)

    def describe(self) -> str:
        how = (f"{self.threads} threads a row" if self.threads > 1 else "one work-item a row"
               + (f", {self.vec} elements at a time" if self.vec > 1 else ""))
        return f"{how}, {self.rows} row{'s' if self.rows > 1 else ''} a work-group"


def full_statements(k: RowKernel, program: ir.Program) -> list[str]:
    return [op.output for op in k.ops if isinstance(op, ir.Elementwise)
            and program.tensors[op.output].shape == k.full]


def _names(k: RowKernel) -> set[str]:
    return {n for op in k.ops for n in (op.output, *(
        [op.inputs[0].tensor] if isinstance(op, ir.Contraction) else ir.expr_refs(op.expr)))}


def _vector_safe(e: ir.Expr) -> bool:
    if isinstance(e, ir.Op):
        return e.op in VECTOR_OPS and all(_vector_safe(a) for a in e.args)
    return True


def vector_walk(k: RowKernel, program: ir.Program) -> bool:
    """Whether one work-item may walk the row in float vectors: the row is the last axis and
    every tensor float32 (a scalar loop with a max or a sum does not vectorise by itself: the
    compiler may not reorder float operations)."""
    stmt = {op.output: op for op in k.ops}
    n = len(k.full)
    return (k.axes == (n - 1,) and all(program.tensors[x].dtype == "float32" for x in _names(k))
            and all(_vector_safe(stmt[x].expr) for x in full_statements(k, program)))


def share(k: RowKernel, threads: int) -> int:
    """Elements of the row each thread keeps in registers (0: the row is walked in memory)."""
    s = -(-k.length // threads)
    return s if threads > 1 and s <= MAX_SHARE else 0


# -- candidates ----------------------------------------------------------------------------------

def candidates(k: RowKernel, program: ir.Program, hw: HwModel,
               threads: int | None = None) -> list[RowShape]:
    """Every shape the codegen can make for this kernel on this device; `threads` (Config.
    threads) caps the threads a work-group."""
    cap = min(MAX_THREADS, hw.max_work_group_size or MAX_THREADS, threads or MAX_THREADS)
    cap = 1 << int(math.log2(max(1, cap)))
    out = []
    if hw.kind == "cpu":
        widths = [1]
        if vector_walk(k, program):
            widths += [w for w in (4, 8, 16) if w <= hw.vec_size and w <= k.length]
        for w in widths:
            for r in (1, 4, 16, 64):
                if r <= cap and (r == 1 or r <= k.rows):
                    out.append(RowShape(1, r, w))
        return out
    longest = 1 << max(0, math.ceil(math.log2(max(1, k.length))))
    for t in (4, 8, 16, 32, 64, 128, 256):
        if t > cap or (t > 32 and t > longest):
            continue
        for r in (1, 2, 4, 8, 16):
            wg = r * t
            if wg > cap or (r > 1 and r > k.rows) or (wg < 32 and k.rows >= 32 // t):
                continue
            out.append(RowShape(t, r, 1))
    return out


# -- the model -----------------------------------------------------------------------------------

def _ops(e: ir.Expr, exp_ops: float, along) -> float:
    """Operations an element costs; parts that do not vary along the row (a normalisation's
    `sqrt(Q / C + eps)`) are computed once a row by the compiler and cost nothing here."""
    if not isinstance(e, ir.Op) or not any(along(n) for n in ir.expr_refs(e)):
        return 0.0
    own = exp_ops if e.op in _TRANSCENDENTAL else 1.0
    return own + sum(_ops(a, exp_ops, along) for a in e.args)


def depends(stmt: dict, full, names, loaded=()) -> set[str]:
    """The full statements among `full` that `names` depend on, themselves included (those
    in `loaded`, read back from a stash, without what they depend on)."""
    need, todo = set(), list(names)
    while todo:
        x = todo.pop()
        if x in full and x not in need:
            need.add(x)
            if x not in loaded:
                todo += list(ir.expr_refs(stmt[x].expr))
    return need


def stashes(k: RowKernel, program: ir.Program) -> dict[str, str]:
    """Full-shape statements with a transcendental (softmax's `E = exp(X - M)`) that a
    reduction's walk computes and the last walk needs again, each with the output the kernel
    writes in that last walk (`Y = E / S`) of its shape and 32-bit float type: the reduction's
    walk stores the statement there and the last walk reads it back before overwriting the
    element with the output's value, so each exp is computed once instead of twice (a row
    of a few thousand elements stays in L1 between the walks).  For kernels whose work-item
    owns its rows (`RowShape.threads` 1, rows walked: not `share`d); the code generator
    applies it there."""
    stmt = {op.output: op for op in k.ops}
    full = full_statements(k, program)
    t = program.tensors

    def needed(names) -> set[str]:
        return depends(stmt, full, names)

    def transcendental(e: ir.Expr) -> bool:
        return isinstance(e, ir.Op) and (e.op in _TRANSCENDENTAL or
                                         any(transcendental(a) for a in e.args))

    writes = [n for n in k.writes if n in full]
    reduced = set().union(*[needed({op.inputs[0].tensor}) for op in k.ops
                            if isinstance(op, ir.Contraction)])
    last = needed(set(writes))
    free = [o for o in writes if t[o].dtype == "float32"]
    out: dict[str, str] = {}
    for n in full:
        if n in k.writes or n not in reduced or n not in last or not free or \
                t[n].dtype != "float32" or not transcendental(stmt[n].expr):
            continue
        out[n] = free.pop(0)
    return out


def _walks(k: RowKernel, program: ir.Program, exp_ops: float,
           stashed: bool = False) -> list[tuple[float, bool]]:
    """Per walk over the row: (operations an element, whether it feeds a reduction);
    `stashed`: the last walk reads the `stashes` back instead of computing them."""
    stmt = {op.output: op for op in k.ops}
    full = set(full_statements(k, program))
    kept = stashes(k, program) if stashed else {}
    n = len(k.full)

    def along(name: str) -> bool:  # the tensor varies along the row's axes
        if name in full:
            return True
        shape = (1,) * (n - len(program.tensors[name].shape)) + program.tensors[name].shape
        return any(shape[d] > 1 for d in k.axes)

    def cost(names: set[str], loaded=()) -> float:
        need = depends(stmt, full, names, loaded)
        # A stash costs its store in the reduction's walk and its load in the last one.
        return sum(1.0 if x in loaded else _ops(stmt[x].expr, exp_ops, along) for x in need)

    out = [(cost({op.inputs[0].tensor}) + 1.0 + len(kept), True) for op in k.ops
           if isinstance(op, ir.Contraction)]
    writes = [n for n in k.writes if n in full] or [n for n in k.produces if n in full][-1:]
    if writes:
        out.append((cost(set(writes), set(kept)), False))
    return out


@dataclass(frozen=True)
class _Traffic:
    full_in: float  # bytes of the full-shape inputs (the rows), read once
    other: float  # bytes of everything else read or written once
    inputs: int  # full-shape inputs (each row's share is loaded from each)
    elem: int  # bytes of one of their elements


def _traffic(k: RowKernel, program: ir.Program, hw: HwModel) -> _Traffic:
    t = program.tensors
    size = {n: t[n].size * hw.elem_size(t[n].dtype) for n in k.reads() | set(k.writes)}
    rows = [n for n in k.reads() if t[n].shape == k.full]
    full_in = sum(size[n] for n in rows)
    elem = max((hw.elem_size(t[n].dtype) for n in rows), default=4)
    return _Traffic(float(full_in), float(sum(size.values()) - full_in), len(rows), elem)


def predict(k: RowKernel, program: ir.Program, hw: HwModel, shape: RowShape,
            coeff: RowCoefficients = DEFAULT) -> RowShape:
    """`shape` with its predicted seconds and limiting resource."""
    traffic = _traffic(k, program, hw)
    dram = (traffic.full_in + traffic.other) / (hw.bandwidth_gbs * 1e9)
    launch = (hw.launch_us or coeff.launch_us) * 1e-6
    terms = _gpu_terms(k, program, hw, shape, coeff, traffic, dram) if hw.kind != "cpu" \
        else _cpu_terms(k, program, hw, shape, coeff, traffic.full_in, dram)
    terms = {n: v * _correction(hw, n) for n, v in terms.items()}
    p = coeff.overlap
    body = sum(v ** p for v in terms.values()) ** (1.0 / p)
    limit = max(terms, key=lambda n: terms[n])
    if launch * hw.correct_launch > body:
        limit = "launch"
    return RowShape(shape.threads, shape.rows, shape.vec,
                    body + launch * hw.correct_launch, limit)


def _correction(hw: HwModel, term: str) -> float:
    return {"compute": hw.correct_compute, "latency": hw.correct_compute,
            "DRAM": hw.correct_dram, "L2": hw.correct_l2}.get(term, 1.0)


def _gpu_terms(k, program, hw, shape, coeff, traffic: _Traffic, dram) -> dict[str, float]:
    T, R = shape.threads, shape.rows
    cus = hw.compute_units or max(1, hw.goal_groups // 4)
    bw = hw.bandwidth_gbs * 1e9
    # An exp in operations: from the calibrated exp() rate against the mul-add peak.
    exp_ops = (hw.peak_gflops / 2 / hw.exp_gops) if hw.exp_gops else coeff.gpu_exp_ops
    walks = _walks(k, program, exp_ops)
    held = share(k, T)
    groups = -(-k.rows // R)
    per_cu_threads = 2 * (hw.max_work_group_size or 1024)
    resident = max(1, min(coeff.resident_groups, per_cu_threads // (R * T)))
    live = min(groups, resident * cus) * R * T  # work-items resident at once
    # Little's law: the bytes in flight over the loaded latency (the unloaded one plus the
    # queue those bytes make) give the bandwidth reached.  A held row is loaded at once (its
    # share); a walked row keeps IN_FLIGHT reads a work-item in flight.
    per_item = held * max(1, traffic.inputs) if held else coeff.in_flight
    flight = live * min(per_item, -(-k.length // T)) * traffic.elem
    reached = flight / (coeff.mem_latency_us * 1e-6 + flight / bw)
    # Fewer threads a row than a memory transaction's elements: a warp's read touches each
    # row's transaction partly, and the rest of it is fetched again by the next read.
    reached *= min(1.0, T * traffic.elem / coeff.sector_bytes)
    # Rows held in registers are read once; others once a walk, the later walks from L2.
    rereads = 0.0 if held else traffic.full_in * (len(walks) - 1)
    memory = dram * bw / reached + rereads / min((hw.l2_gbs or 2 * hw.bandwidth_gbs) * 1e9,
                                                 reached * 2)
    waves = math.ceil(groups / (resident * cus))
    reductions = sum(1 for op in k.ops if isinstance(op, ir.Contraction))
    steps = reductions * (int(math.log2(T)) + 2) if T > 1 else 0
    sync = waves * steps * coeff.step_us * 1e-6
    ops = sum(o for o, _ in walks) * k.rows * k.length
    compute = ops / (hw.peak_gflops * 1e9 / 2)  # peak counts a mul-add as two
    return {"DRAM": memory, "latency": sync, "compute": compute}


def _cpu_terms(k, program, hw, shape, coeff, full_in, dram) -> dict[str, float]:
    W, R = shape.vec, shape.rows
    cores = hw.compute_units or 1
    full_speed = hw.muladd_vec or hw.vec_size or 1
    # The clock at which two mul-add pipes of full-speed vectors reach the peak.
    clock = hw.peak_gflops * 1e9 / (cores * 2 * 2 * full_speed)
    cycles = 0.0
    exp_ops = coeff.exp_ops
    if hw.exp_gops:
        # The calibrated exp() rate (lanes a second, all cores) as operations of a W-wide
        # step: a W-lane exp takes W / (lanes a core-cycle) cycles.
        lanes_per_cycle = hw.exp_gops * 1e9 / (cores * clock)
        exp_ops = W / lanes_per_cycle * coeff.ops_per_cycle / max(1.0, W / full_speed)
    walks = _walks(k, program, exp_ops, stashed=shape.threads == 1 and not share(k, 1))
    for ops, reduces in walks:
        # A W-wide vector narrower than the full-speed width takes one instruction; wider
        # ones take W / full_speed.
        per_step = ops * max(1.0, W / full_speed) / coeff.ops_per_cycle
        if reduces:
            per_step = max(per_step, coeff.reduce_latency)
        cycles += math.ceil(k.length / W) * per_step + (k.length % W) * coeff.reduce_latency
    groups = -(-k.rows // R)
    dispatch = groups * (hw.group_us or coeff.group_us) * 1e-6 / cores
    # The cores take work-groups as they free up: the rows spread evenly, and the last group
    # to start ends about half a group's time after the others (the straggler's tail).
    group_s = R * cycles / clock
    compute = max(group_s, k.rows * cycles / clock / cores + coeff.tail * group_s) + dispatch
    row_bytes = full_in / max(1, k.rows) * R
    reread = full_in * (len(walks) - 1)
    cache = hw.l1_gbs if row_bytes <= (hw.l1_bytes or 32768) else hw.l2_gbs
    l1 = reread / ((cache or 4 * hw.bandwidth_gbs) * 1e9)
    return {"compute": compute, "DRAM": dram, "L1": l1}


def can_predict(hw: HwModel) -> bool:
    return hw.peak_gflops > 0 and hw.bandwidth_gbs > 0


def rule(k: RowKernel, program: ir.Program, hw: HwModel, threads: int | None = None) -> RowShape:
    """The shape where the device's peak and bandwidth are unknown: on a CPU a work-item a row
    at the widest vector (work-groups left to the driver: rows 0); on a GPU about eight
    elements a thread, 32 to 256, a row a work-group."""
    if hw.kind == "cpu":
        return RowShape(1, 0, hw.vec_size if vector_walk(k, program) and
                        k.length >= hw.vec_size else 1)
    want = max(32, 1 << max(0, math.ceil(math.log2(max(1, k.length / 8)))))
    cap = min(MAX_THREADS, hw.max_work_group_size or MAX_THREADS, max(hw.threads, 32),
              threads or MAX_THREADS)
    return RowShape(max(1, min(want, 1 << int(math.log2(cap)))), 1, 1)


def choose(k: RowKernel, program: ir.Program, hw: HwModel, threads: int | None = None,
           coeff: RowCoefficients = DEFAULT) -> tuple[RowShape, list[RowShape]]:
    """The fastest predicted shape and every candidate with its prediction, fastest first
    (ties: fewer threads a row, then fewer rows a group, then the narrower vector); without a
    peak and a bandwidth, `rule`'s shape alone."""
    if not can_predict(hw):
        return rule(k, program, hw, threads), []
    ranked = sorted((predict(k, program, hw, s, coeff)
                     for s in candidates(k, program, hw, threads)),
                    key=lambda s: (s.predicted_s, s.threads, s.rows, s.vec))
    return ranked[0], ranked
