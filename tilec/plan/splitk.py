"""Split-K: a GPU sum with few outputs and a long reduction, as partial sums and their sum.

A GPU kernel gives each work-group a tile of the output and has it walk the whole
reduction.  Where the output is small and the reduction long, no tile keeps the device busy:
VGG's 3x3 convolutions over 512 channels at 14x14 and batch 1 have 100K outputs and 4608
multiply-adds each, and every tile of the contraction as written either leaves most of the
H200's 132 compute units idle (a few large work-groups) or gives each work-item one
accumulator (local-memory bound): 0.19 ms at best, 4.8 TFLOP/s.  Cutting the reduction into
S parts gives S times the work-groups, each over 1/S of the reduction (BLAS libraries call it
split-K), and a second, cheap contraction adds the parts:

    A_parts[part, n, co, x, y : S, N, CO, X, Y] = +(X[n, C*part + ci, x + i - 1, y + j - 1]
                                                    * W[co, C*part + ci, i, j]), ci < C;
    A[n, co, x, y : N, CO, X, Y] = +(A_parts[part, n, co, x, y]);

Same points, same sum (ci = C*part + ci' is a bijection onto 0 .. CI-1, C*S = CI); the
statements after A (bias, ReLU) fuse into the second contraction as they did into the first.
On the H200 that convolution ran 0.082 ms at S=4, 0.066 at S=8 and 0.063 at S=16 (the
second kernel 4-5 us), against cuDNN's 0.129 ms; at 28x28, 0.324 -> 0.180 ms at S=4.

When: only on GPU models that predict times, for a `+` contraction whose output indices are
plain, with fewer outputs than BUSY per work-item slot of the device, and a reduction index
no constraint mentions.  Each S that divides that index's range (powers of two, at least
MIN_CHUNK of the range a part) is searched, more parts until the prediction gets worse, and
the split with the least predicted time, both kernels counted, is taken where its first
kernel's tile is one the time model is trusted with (`trust.time_ranks`) and fills the
device, and it is faster than the contraction as written where that one's prediction is
trusted too.  An untrusted tile as written is one whose prediction the model overrates (a
few large work-groups, `trust.fills`): there the trusted split is taken.  On the H200 the
time model predicted the split 512-channel convolutions within 20% (63 us for 58-61 at
14x14, 204 us for 180 at 28x28), and that one at 28x28 as written at 552 us for 324."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from ..lang import ir
from .copies import plain_indices, statement_text
from .defract import rewritten
from .flat import FlatContraction
from .flatten import flatten
from .hw import HwModel
from .reduce import fresh, substitute
from .trust import fills

# Fewest points of the split index a part walks: shorter parts make more partial sums to
# write and add than they save.
MIN_CHUNK = 8
MAX_PARTS = 64
# Contractions with at least this many outputs a work-item slot of the device (compute units
# x the largest work-group) are not tried: every tile of theirs fills the device already.
BUSY = 4
# Contractions weighed in worker processes from this many on (a process starts in ~0.5 s).
MIN_PARALLEL = 4
# Nor those whose multiply-adds take less than this many launches at the device's peak
# rate: a split adds a launch, and the searches for its part counts cost a compile about a
# second each (on the H200, a 64-channel 3x3 convolution at 28x28, a fifth of a launch's
# work, ran 20 us either way; the same at 56x56, 0.8 of one, 44 -> 25 us split).
SMALL_LAUNCHES = 0.25
DEFAULT_LAUNCH_US = 5.0


@dataclass(frozen=True)
class Choice:
    """What the search makes of one flat contraction: its tile, the predicted seconds (None:
    not predicted) and whether the time model ranked it (`TiledPlan.ranked_by_time`)."""

    tile: tuple[int, ...]
    seconds: float | None
    trusted: bool


# The search as compile runs it (its cache, top-k and cost model).
Search = Callable[[FlatContraction], Choice]


@dataclass(frozen=True)
class Split:
    """The contraction writing `output` summed in `parts` parts of its index `index`."""

    output: str
    index: str
    size: int  # the index's range
    parts: int
    seconds: float | None  # predicted, both kernels (None: the parts were configured)
    unsplit: float | None  # predicted for the contraction as written (None: not trusted)

    def describe(self) -> str:
        if self.seconds is None:
            return (f"split-K: {self.output}'s sum over {self.index} in {self.parts} parts "
                    "(as configured)")
        before = "not predicted" if self.unsplit is None else f"{self.unsplit * 1e6:.1f} us"
        return (f"split-K: {self.output}'s sum over {self.index} in {self.parts} parts, "
                f"predicted {self.seconds * 1e6:.1f} us for both kernels ({before} as written)")


def split_sums(program: ir.Program, hw: HwModel, search: Search,
               keep: frozenset[str] = frozenset(), parts: int | None = None,
               workers: int = 0) -> tuple[ir.Program, tuple[Split, ...]]:
    """`program` with each contraction that gains from it split (the module docstring), and
    the splits made.  `parts`: every contraction that can be split is, in that many parts
    (where they divide its index's range), on any device.  Contractions writing a tensor in
    `keep` stay as written (a tile the user forced names their indices).  `workers`: that
    many processes weigh the contractions at once (`search` must then pickle); contractions
    alike but for their tensors' names are weighed once."""
    if parts is None and (hw.kind != "gpu" or not hw.compute_units):
        return program, ()
    todo = [op for op in program.ops if isinstance(op, ir.Contraction) and op.output not in keep]
    keys = {id(op): _alike(op, program.tensors) for op in todo}
    firsts: dict[tuple, ir.Contraction] = {}
    for op in todo:
        firsts.setdefault(keys[id(op)], op)
    jobs = [(op, {n: program.tensors[n] for n in op.tensors}, program.source, hw, search,
             parts) for op in firsts.values()]
    decided = dict(zip(firsts, _map(_decide, jobs, workers), strict=True))
    tensors = dict(program.tensors)
    ops: list[ir.Statement] = []
    made: list[Split] = []
    for op in program.ops:
        split = decided.get(keys[id(op)]) if id(op) in keys else None
        if split is None:
            ops.append(op)
            continue
        trial = _split(op, tensors, split.index, split.size, split.parts)
        tensors[trial.tensor.name] = trial.tensor
        ops += trial.statements
        made.append(dataclasses.replace(split, output=op.output))
    if not made:
        return program, ()
    return dataclasses.replace(program, ops=tuple(ops), tensors=tensors), tuple(made)


def _alike(op: ir.Contraction, tensors) -> tuple:
    """What a split decision depends on: the statement with its tensors named by first
    appearance, their shapes and types (a model's repeated layers are one decision)."""
    alias: dict[str, str] = {}
    names = [op.output] + [a.tensor for a in op.inputs]
    for n in names:
        alias.setdefault(n, f"#{len(alias)}")
    return (op.agg, op.comb, op.out_idx, op.indices, op.no_defract, op.default,
            tuple((alias[a.tensor], a.idx) for a in op.inputs),
            tuple((c.poly, c.bound) for c in op.constraints),
            tuple((alias[n], tensors[n].shape, tensors[n].dtype) for n in dict.fromkeys(names)))


def _map(fn, jobs: list, workers: int) -> list:
    if workers < 2 or len(jobs) < MIN_PARALLEL:
        return [fn(j) for j in jobs]
    from .workers import map_in_processes

    return map_in_processes(fn, jobs, workers)


def _decide(job) -> Split | None:
    op, tensors, source, hw, search, parts = job
    return _choose(op, tensors, hw, search, source, parts)


def _index_to_split(op: ir.Contraction, flat: FlatContraction) -> tuple[str, int] | None:
    """The longest reduction index that starts at 0 and that no constraint mentions."""
    outs = {n for q in op.out_idx for n, _ in q.terms}
    best = None
    for name, lo, size in flat.index_bounds:
        if name in outs or lo != 0 or any(c.poly.coef(name) != 0 for c in op.constraints):
            continue
        if best is None or size > best[1]:
            best = (name, size)
    return best


def _choose(op: ir.Contraction, tensors, hw: HwModel, search: Search, source,
            forced: int | None) -> Split | None:
    if op.agg != "+" or op.default is not None or op.no_defract or not op.out_idx:
        return None
    if tensors[op.output].dtype == "float16":
        return None  # partial sums stored in half precision would lose what one sum keeps
    names = plain_indices(op.out_idx)
    if names is None or len(set(names)) != len(names):
        return None
    if rewritten(op, tensors, source=source) is not op:
        return None
    flat0 = flatten(op, tensors, source=source)
    if not flat0.output_covered:
        return None
    found = _index_to_split(op, flat0)
    if found is None:
        return None
    index, size = found
    if forced is not None:
        if forced < 2 or size % forced:
            return None
        return Split(op.output, index, size, forced, None, None)
    outputs = 1
    for k in flat0.out_indices:
        outputs *= flat0.ranges[k]
    slots = hw.compute_units * max(hw.max_work_group_size, hw.threads)
    if outputs >= BUSY * slots:
        return None  # enough outputs to keep every compute unit busy
    if hw.peak_gflops and 2 * flat0.points / (hw.peak_gflops * 1e3) < \
            SMALL_LAUNCHES * (hw.launch_us or DEFAULT_LAUNCH_US):
        return None  # too little work for a second launch to pay: not worth the searches
    as_written = search(flat0)
    unsplit = as_written.seconds if as_written.trusted else None
    options = [p for p in _powers_of_two(MAX_PARTS)
               if size % p == 0 and size // p >= MIN_CHUNK]
    if not options:
        return None
    first = next((i for i, p in enumerate(options) if outputs * p >= BUSY * slots),
                 len(options) - 1)
    tried: dict[int, float | None] = {}

    def predicted_at(i: int) -> float:
        if i not in tried:
            tried[i] = _predicted(_split(op, tensors, index, size, options[i]), search, hw)
        t = tried[i]
        return float("inf") if t is None else t

    # From the parts that fill the device by count, more parts while the prediction
    # improves, else fewer while it does (two or three searches instead of one per option).
    i = first
    while i + 1 < len(options) and predicted_at(i + 1) < predicted_at(i):
        i += 1
    if i == first:
        while i > 0 and predicted_at(i - 1) < predicted_at(i):
            i -= 1
    best = predicted_at(i)
    if best == float("inf") or (unsplit is not None and best >= unsplit):
        return None
    return Split(op.output, index, size, options[i], best, unsplit)


@dataclass(frozen=True)
class _Trial:
    parts: int
    partial: ir.Contraction  # the parts' sums
    total: ir.Contraction  # their sum, writing the original output
    tensor: ir.Tensor  # the parts' tensor
    flats: tuple[FlatContraction, FlatContraction]

    @property
    def statements(self) -> tuple[ir.Contraction, ir.Contraction]:
        return (self.partial, self.total)


def _powers_of_two(top: int) -> list[int]:
    out, p = [], 2
    while p <= top:
        out.append(p)
        p *= 2
    return out


def _predicted(trial: _Trial, search: Search, hw: HwModel) -> float | None:
    """Both kernels' predicted seconds, or None where the first's tile is not one the time
    model is trusted with, or does not fill the device either."""
    first = search(trial.flats[0])
    if not first.trusted or first.seconds is None or not fills(trial.flats[0], first.tile, hw):
        return None
    second = search(trial.flats[1])
    if second.seconds is None:
        return None
    return first.seconds + second.seconds


def _split(op: ir.Contraction, tensors, index: str, size: int, parts: int) -> _Trial:
    """`op` as the sums of `parts` parts of `index` (range `size`) and their sum."""
    out = tensors[op.output]
    chunk = size // parts
    taken = set(op.indices)
    part = fresh("part", taken)
    name = fresh(f"{op.output}_parts", set(tensors))
    env = {index: ir.Poly.make({part: chunk, index: 1})}
    inputs = tuple(ir.Access(a.tensor, tuple(substitute(q, env) for q in a.idx), a.span)
                   for a in op.inputs)
    shape = (parts, *out.shape)
    tensor = ir.Tensor(name, shape, out.dtype)
    partial = dataclasses.replace(
        op, output=name, out_idx=(ir.Poly.index(part), *op.out_idx), inputs=inputs,
        constraints=(*op.constraints, ir.Constraint(ir.Poly.index(index), chunk, op.span)),
        indices=tuple(sorted(taken)))
    partial = dataclasses.replace(partial, text=statement_text(partial, shape))
    total = ir.Contraction(
        output=op.output, out_idx=op.out_idx, agg="+", comb=None,
        inputs=(ir.Access(name, (ir.Poly.index(part), *op.out_idx)),), constraints=(),
        indices=tuple(sorted({part, *plain_indices(op.out_idx)})), span=op.span)
    total = dataclasses.replace(total, text=statement_text(total, out.shape))
    both = {**tensors, name: tensor}
    return _Trial(parts, partial, total, tensor,
                  (flatten(partial, both), flatten(total, both)))
