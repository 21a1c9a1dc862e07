"""Chains: runs of small kernels launched as one work-group that runs them in turn.

A recurrent layer unrolled over its sequence (an LSTM of 32 steps is about 260 kernels at
batch 1), or any graph whose tail is a row of tiny products, spends its time launching
kernels: each does a few thousand multiply-adds, and a launch costs microseconds on the host
and on the device whatever the kernel does.  A *chain* is one kernel of one work-group whose
work-items run each member kernel's elements in turn (a *stage*), with a barrier on global
memory between stages that depend on each other (within one work-group, `barrier(
CLK_GLOBAL_MEM_FENCE)` makes the stage's writes visible to the next).  One compute unit does
all the work, so only kernels small enough that one compute unit finishes them within about
a launch's cost join a chain.

Tensors that only the chain's stages touch live in one scratch buffer (a tensor this pass adds
to the program), at fixed offsets: a chain of a hundred stages would otherwise need hundreds
of arguments (OpenCL guarantees 128 at most).  Inputs, outputs and everything another kernel
reads keep their buffers and are the chain's arguments.

Which kernels may be stages: contraction kernels whose index box is exactly their output
(every element one point, so a work-item can own an element) and elementwise kernels.  Row
and attention kernels have their own work-group shapes and stay alone; so do plain copies of
program inputs (a weight relaid at bind, computed on the host there) and kernels touching a
haloed buffer (its border is the runtime's)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

from ..lang import ir
from .fuse import ContractionKernel, ElementwiseKernel, KernelPlan, _reads, is_plain_copy
from .hw import HwModel
from .placement import fresh_name

Stage = ContractionKernel | ElementwiseKernel

# Fewest kernels worth a chain: two launches saved at least.
MIN_STAGES = 3
# Most stages one chain takes: the kernel's text (and its build time) grows with them, and
# one barrier a stage is about a microsecond of idle threads at most.
MAX_STAGES = 160
# Most buffer arguments of a chain (OpenCL promises 128 parameters; their bytes count too).
MAX_ARGS = 48
# Scratch tensors start on 16-element (64-byte) boundaries: whole cache lines per tensor.
ALIGN = 16
# One work-item's work in a stage is scalar code with no register tile: this fraction of a
# compute unit's peak is what it reaches (a guess that only decides what counts as small).
STAGE_EFFICIENCY = 0.25
# Cycles a CPU work-item spends on each output element of a stage whatever its bytes: index
# arithmetic, the loads and the store of scalar code, one element after another.  On the
# 16-core Xeon (PoCL 5.0) vit_small's chained attention reshapes (three stages of 75,648
# elements) ran 1.2-1.3 ms a chain, about 15 cycles an element, where the bytes alone
# predicted a few microseconds: the model took 23.9 ms with them, 15.3 with them as kernels.
CPU_ELEMENT_CYCLES = 8
# A launch's cost where the device was not calibrated (host enqueue and device start).
LAUNCH_US = 5.0
# A GPU's trip to its L2 and back, in cycles (NVIDIA's Hopper: about 600).
GPU_LATENCY_CYCLES = 600
# A GPU dot-product stage: at most this many work-items share one element's row (one warp's
# worth of float4 reads covers a 128-long row), and each keeps partial sums of at most this
# many elements at once (its independent loads in flight).
MAX_LANES = 32
MAX_ROWS = 16


@dataclass(frozen=True)
class ChainKernel:
    stages: tuple[Stage, ...]
    threads: int  # the work-group's size (one group runs everything)
    scratch: str  # the scratch tensor ("" when no tensor stays inside the chain)
    inner: tuple[tuple[str, int], ...]  # buffer (root tensor) -> element offset in scratch
    writes: tuple[str, ...]  # tensors stored that live outside the chain, and the scratch
    # Where some stages must wait for earlier ones: barrier before stage i when barriers[i].
    barriers: tuple[bool, ...]
    note: str = ""  # why the run was chained (the cost log's line)
    # Work-items that share each stage's dot products (`lanes`); 0: one element a work-item.
    lanes: tuple[int, ...] = ()
    roll: bool = True  # repeating stages written as a loop (`codegen.roll`)

    @property
    def name(self) -> str:
        return f"chain_{self.stages[0].name}"

    @property
    def produces(self) -> tuple[str, ...]:
        return tuple(n for s in self.stages for n in s.produces)

    def reads(self) -> set[str]:
        out: set[str] = set()
        for s in self.stages:
            out |= _reads(s)
        return out - set(self.produces)


def stage_buffers(k: Stage, plan: KernelPlan) -> tuple[set[str], set[str]]:
    """(buffers read, buffers written) by one stage, as root tensors."""
    reads = {plan.root(n) for n in _reads(k)}
    if isinstance(k, ContractionKernel):
        reads |= {t.name for t in k.flat.inputs}  # flat tables already name the roots
    writes = {plan.root(n) for n in k.writes}
    return reads, writes


def stage_elements(k: Stage, program: ir.Program) -> int:
    """The output elements a stage's work-items walk (one a pass of a work-item's loop)."""
    if isinstance(k, ContractionKernel):
        return program.tensors[k.op.output].size
    return max(1, program.tensors[k.ops[0].output].size)


def _stage_work(k: Stage, program: ir.Program) -> tuple[int, int]:
    """(arithmetic operations, elements touched) of a stage."""
    n = stage_elements(k, program)
    if isinstance(k, ContractionKernel):
        posts = sum(program.tensors[p.output].size for p in k.post_ops)
        return 2 * k.flat.points + posts, k.flat.points + n
    return n * len(k.ops), n * (1 + len(k.writes))


def stage_seconds(k: Stage, program: ir.Program, hw: HwModel) -> float:
    """The time one compute unit takes for a stage, roughly: its arithmetic at a share of the
    unit's peak and its elements through the unit's share of the L2.  A model without a
    measured peak or bandwidth (a GPU not calibrated) counts from the clock: 32 lanes of
    multiply-add a cycle (GPUs have 64-128) and 32 bytes a cycle, both on the low side.  A
    GPU's work-items wait out trips to the L2, a CPU core's take `CPU_ELEMENT_CYCLES` an
    element."""
    ops, elems = _stage_work(k, program)
    clock = (hw.clock_mhz or 1000) * 1e6
    waits = 0.0
    if hw.kind == "gpu":
        # A work-item's elements follow each other: each pass of its loop waits out a trip to
        # the L2 (its store may alias the next load, so the compiler keeps them in order).
        # gpt-style models' 16384-element transposes took 28 us in one work-group of an
        # H200 against about 4 us a launch.
        n = lanes(k, program, hw)
        if n:  # a batch of rows: a trip a float4 of each lane's share of the row (the
            # batch's rows in flight together), one for the reduction and the stores
            row = _row_length(k, program)
            batches = -(-stage_elements(k, program) // lane_batch(k, program, hw, n))
            passes = batches * (-(-row // (4 * n)) + 1)
        else:
            passes = -(-stage_elements(k, program) // _group_size(hw))
        waits = passes * GPU_LATENCY_CYCLES / clock
    elif hw.kind == "cpu":
        waits = stage_elements(k, program) * CPU_ELEMENT_CYCLES / clock
    cus = max(1, hw.compute_units)
    peak = hw.peak_gflops * 1e9 / cus if hw.peak_gflops else clock * 64
    l2 = hw.l2_gbs or hw.bandwidth_gbs
    bw = l2 * 1e9 / cus if l2 else clock * 32
    return ops / (peak * STAGE_EFFICIENCY) + elems * 4 / bw + waits


def dot_index(k: ContractionKernel, program: ir.Program, width: int) -> int | None:
    """The reduction index a sum of products walks in vectors of `width` (a dot product along
    rows contiguous in memory: one vector load a row, a horizontal sum at the end), or None.
    Work-items of a chain run scalar code otherwise: the compilers do not vectorise across
    work-items whose loops differ, and a 128-long dot product one lane at a time is most of
    an unrolled LSTM step's time on a CPU."""
    f = k.flat
    if f.agg != "+" or f.comb != "*" or \
            program.tensors[k.op.output].dtype != "float32" or \
            any(t.dtype != "float32" for t in f.inputs):
        return None
    outs = set(f.out_indices)
    if any({i for i, x in enumerate(c.coeffs) if x} - outs for c in f.constraints):
        return None  # a constraint on the reduction: points drop out of the rows
    best = None
    for i in f.reduce_indices:
        strides = [t.strides[i] for t in f.inputs]
        if 1 in strides and set(strides) <= {0, 1} and f.ranges[i] >= width and \
                (best is None or f.ranges[i] > f.ranges[best]):
            best = i
    return best


def lanes(k: Stage, program: ir.Program, hw: HwModel) -> int:
    """How many work-items of a GPU chain share one element's dot product (0: none do).

    A work-item walking its own row reads one float4 of a different row than its neighbours
    at every load: 32 rows a warp, none of the reads coalesced, and one trip to the L2 a pass
    of its loop (an LSTM gate's 128 x 128 product took ~4.5 us that way on an H200).  With
    `lanes` work-items a row, neighbours read neighbouring float4s of one row, each work-item
    keeps partial sums of up to `MAX_ROWS` rows with their loads in flight together, and the
    partial sums meet in local memory.  Only where the dot index is the product's only
    reduction index and a row has at least 4 float4s."""
    if hw.kind != "gpu" or not isinstance(k, ContractionKernel):
        return 0
    row = _row_length(k, program)
    n = 1
    while n * 2 <= min(MAX_LANES, row // 4):
        n *= 2
    return n if n >= 4 else 0


def _row_length(k: ContractionKernel, program: ir.Program) -> int:
    """The length of a sum of products' rows where the dot index is its only reduction index
    (0 otherwise)."""
    i = dot_index(k, program, 4)
    return 0 if i is None or len(k.flat.reduce_indices) != 1 else k.flat.ranges[i]


def lane_rows(k: Stage, program: ir.Program, hw: HwModel, n: int) -> int:
    """Rows whose partial sums a work-item of a lane stage keeps at once: up to `MAX_ROWS`,
    never more than `n` (a batch's elements, `lane_batch`, are then at most one a work-item
    when their sums are finished), and the batch's partial sums within half the local memory
    (OpenCL's least for a full profile, 32 KB, where the model does not say)."""
    group = _group_size(hw)
    per_pass = group // n
    rows = max(1, min(MAX_ROWS, n, -(-stage_elements(k, program) // per_pass)))
    room = (hw.local_mem_bytes or 32768) // 2
    while rows > 1 and per_pass * rows * (n + 1) * 4 > room:
        rows //= 2
    return rows


def lane_batch(k: Stage, program: ir.Program, hw: HwModel, n: int) -> int:
    """Elements a lane stage finishes per batch (the group's rows a pass, times `lane_rows`)."""
    return _group_size(hw) // n * lane_rows(k, program, hw, n)


def launch_seconds(hw: HwModel) -> float:
    return max(hw.launch_us, LAUNCH_US) * 1e-6


def eligible(k, plan: KernelPlan, halo_roots: set[str]) -> bool:
    program = plan.program
    if isinstance(k, ContractionKernel):
        f = k.flat
        box = 1
        for i in f.out_indices:
            box *= f.ranges[i]
        if k.out_map != "bijective" or not f.output_covered or \
                box != program.tensors[k.op.output].size:
            return False
        if is_plain_copy(k) and all(a.tensor in program.inputs for a in k.op.inputs):
            return False
    elif not isinstance(k, ElementwiseKernel):
        return False
    reads, writes = stage_buffers(k, plan)
    return not ((reads | writes) & halo_roots)


def _group_size(hw: HwModel) -> int:
    want = 256 if hw.kind == "gpu" else 64
    if hw.max_work_group_size:
        want = min(want, hw.max_work_group_size)
    return max(1, want)


def chain_kernels(plan: KernelPlan, hw: HwModel, *, loops: bool = True) -> KernelPlan:
    """`plan` with each run of consecutive small kernels replaced by one chain kernel."""
    halo_roots = {h.root for h in plan.halos}
    launch = launch_seconds(hw)
    uses = _Uses(plan)
    small = []
    for k in plan.kernels:
        small.append(eligible(k, plan, halo_roots) and
                     stage_seconds(k, plan.program, hw) <= launch)
    kernels: list = []
    tensors = dict(plan.program.tensors)
    i = 0
    while i < len(plan.kernels):
        j = i
        while j < len(plan.kernels) and small[j] and j - i < MAX_STAGES:
            j += 1
        run = list(plan.kernels[i:j])
        if len(run) < MIN_STAGES:
            kernels.append(plan.kernels[i])
            i += 1
            continue
        kernels += [dataclasses.replace(c, roll=loops) if isinstance(c, ChainKernel) else c
                    for c in _chains(run, plan, tensors, hw, launch, uses)]
        i = j
    if len(kernels) == len(plan.kernels):
        return plan
    program = dataclasses.replace(plan.program, tensors=tensors)
    return dataclasses.replace(plan, program=program, kernels=tuple(kernels))


def _chains(run: list[Stage], plan: KernelPlan, tensors: dict, hw: HwModel,
            launch: float, uses: _Uses) -> list:
    """The run as chains within the argument limit (a kernel left alone where a piece has
    too few stages)."""
    out: list = []
    start = 0
    while start < len(run):
        end = start + 1
        while end < len(run) and len(_outer(run[start:end + 1], plan, uses)) <= MAX_ARGS:
            end += 1
        piece = run[start:end]
        if len(piece) < MIN_STAGES:
            out += piece
        else:
            out.append(_make(piece, plan, tensors, hw, launch, uses))
        start = end
    return out


class _Uses:
    """Each kernel's buffers (root tensors read, written) and how many kernels touch each
    buffer, found once: a run that grows a stage at a time asks again at every stage."""

    def __init__(self, plan: KernelPlan):
        self.of: dict[int, tuple[set[str], set[str]]] = {}
        self.count: Counter[str] = Counter()
        for k in plan.kernels:
            if isinstance(k, ContractionKernel | ElementwiseKernel):
                r, w = stage_buffers(k, plan)
            else:
                r = {plan.root(n) for n in k.reads()}
                w = {plan.root(n) for n in set(k.writes) | set(k.produces)}
            self.of[id(k)] = (r, w)
            self.count.update(r | w)


def _outer(piece: list[Stage], plan: KernelPlan, uses: _Uses) -> set[str]:
    """The buffers a piece takes as arguments (those not kept inside it), scratch aside."""
    used: set[str] = set()
    for k in piece:
        r, w = uses.of[id(k)]
        used |= r | w
    return used - set(_inner(piece, plan, uses))


def _inner(piece: list[Stage], plan: KernelPlan, uses: _Uses) -> list[str]:
    """Buffers only the piece touches: written in it, float32, neither input nor output, no
    kernel outside it reading or writing them."""
    program = plan.program
    touched: Counter[str] = Counter()
    written: dict[str, None] = {}
    for k in piece:
        r, w = uses.of[id(k)]
        touched.update(r | w)
        written.update(dict.fromkeys(sorted(w)))
    keep = set(program.inputs) | set(program.outputs) | {h.root for h in plan.halos}
    return [n for n in written if n not in keep and touched[n] == uses.count[n]
            and program.tensors[n].dtype == "float32"]


def _make(piece: list[Stage], plan: KernelPlan, tensors: dict, hw: HwModel,
          launch: float, uses: _Uses) -> ChainKernel:
    inner = _inner(piece, plan, uses)
    offsets, size = [], 0
    for n in inner:
        offsets.append((n, size))
        size += -(-tensors[n].size // ALIGN) * ALIGN
    scratch = ""
    if inner:
        scratch = fresh_name(f"{piece[0].name}_scratch", tensors)
        tensors[scratch] = ir.Tensor(scratch, (size,), "float32")
    writes = {plan.root(n) for k in piece for n in k.writes} - set(inner)
    outs = tuple(sorted(writes)) + ((scratch,) if scratch else ())
    barriers = _barriers(piece, uses)
    each = [stage_seconds(k, plan.program, hw) for k in piece]
    note = (f"chain of {len(piece)} kernels in one work-group: about "
            f"{sum(each) * 1e6:.1f} us of work on one compute unit against "
            f"{len(piece)} launches of {launch * 1e6:.1f} us; {sum(barriers)} barriers, "
            f"{len(inner)} tensors in a scratch buffer of {size} elements")
    shared = tuple(lanes(k, plan.program, hw) for k in piece)
    if any(shared):
        note += f"; {sum(1 for n in shared if n)} dot products shared by lanes of a row"
    return ChainKernel(tuple(piece), _group_size(hw), scratch, tuple(offsets), outs,
                       barriers, note, shared)


def _barriers(piece: list[Stage], uses: _Uses) -> tuple[bool, ...]:
    """A barrier before a stage that reads what the stages since the last barrier wrote,
    or writes what they read or wrote (stages without such a link share a phase, and the
    group's work-items spread over all of them)."""
    out = []
    reads: set[str] = set()
    writes: set[str] = set()
    for k in piece:
        r, w = uses.of[id(k)]
        need = bool(r & writes or w & (reads | writes))
        if need:
            reads, writes = set(), set()
        out.append(need)
        reads |= r
        writes |= w
    return tuple(out)


__all__ = ["ChainKernel", "chain_kernels", "dot_index", "eligible", "lane_batch", "lane_rows",
           "lanes", "stage_buffers", "stage_elements", "stage_seconds"]
