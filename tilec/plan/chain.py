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
# A launch's cost where the device was not calibrated (host enqueue and device start).
LAUNCH_US = 5.0
# A GPU's trip to its L2 and back, in cycles (NVIDIA's Hopper: about 600).
GPU_LATENCY_CYCLES = 600


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
    multiply-add a cycle (GPUs have 64-128) and 32 bytes a cycle, both on the low side."""
    ops, elems = _stage_work(k, program)
    clock = (hw.clock_mhz or 1000) * 1e6
    waits = 0.0
    if hw.kind == "gpu":
        # A work-item's elements follow each other: each pass of its loop waits out a trip to
        # the L2 (its store may alias the next load, so the compiler keeps them in order).
        # gpt-style models' 16384-element transposes took 28 us in one work-group of an
        # H200 against about 4 us a launch.
        passes = -(-stage_elements(k, program) // _group_size(hw))
        waits = passes * GPU_LATENCY_CYCLES / clock
    cus = max(1, hw.compute_units)
    peak = hw.peak_gflops * 1e9 / cus if hw.peak_gflops else clock * 64
    l2 = hw.l2_gbs or hw.bandwidth_gbs
    bw = l2 * 1e9 / cus if l2 else clock * 32
    return ops / (peak * STAGE_EFFICIENCY) + elems * 4 / bw + waits


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


def chain_kernels(plan: KernelPlan, hw: HwModel) -> KernelPlan:
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
        kernels += _chains(run, plan, tensors, hw, launch, uses)
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
    return ChainKernel(tuple(piece), _group_size(hw), scratch, tuple(offsets), outs,
                       barriers, note)


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


__all__ = ["ChainKernel", "chain_kernels", "eligible", "stage_buffers", "stage_elements",
           "stage_seconds"]
