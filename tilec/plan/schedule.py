"""How a chosen tile becomes work: threads per output index, the vectorised index and its width,
when the output threads leave most of the work-group idle a reduction index split over threads
too (`split_reduction`), and, when inputs are staged in local memory, each input's staged region
(PlaidML's merged load indices with the padded local layout from `layout`).

These choices are made together for one tile: the vector index decides the threads
(`out_threads`) and runs, which decide the staged regions, and the cost model and the
predictions call the same rules (`vector_candidates`, `moves_back`) to price what this builds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property

from .flat import FlatContraction
from .gpu_form import RUN, RunChoice, pipeline_fits, run_candidates
from .group_order import DEFAULT_L2_BYTES, cpu_group_order, past_l2_order, reuse_order
from .hw import HwModel
from .out_threads import split_threads
from .sweep import Sweep, choose_sweep


@dataclass(frozen=True)
class Staged:
    """One input's tile in local memory."""

    input: int  # position among flat.inputs
    # Merged load indices, fastest-varying global stride first: (range, global stride, local
    # stride, position of index value 0 along it when a part runs backwards).
    merged: tuple[tuple[int, int, int, int], ...]
    local_strides: tuple[int, ...]  # per flat index: local address step (0: not addressed)
    elems: int  # local buffer size in elements, padding included
    local_base: int = 0  # local address of the tile's origin
    # Per merged index (same order): the flat indices it walks and their multiples, so that a
    # staged element's position along it is sum(multiple * index) over the tile (plus zero).
    parts: tuple[tuple[tuple[int, int], ...], ...] = ()


@dataclass(frozen=True)
class Schedule:
    flat: FlatContraction
    tile: tuple[int, ...]
    threads: tuple[int, ...]  # per flat index; 1 for reduction indices
    vec_index: int | None  # the flat index spread over vector lanes
    vec: int  # lanes (1: scalar code)
    staged: tuple[Staged | None, ...]  # per input; None: read through the cache
    # A reduction index whose tile is shared by `split` threads per output thread (each takes
    # every split-th point, or vector, of it); their partial results are combined in local
    # memory before the stores.  None / 1: every thread reduces its whole tile alone.
    split_index: int | None = None
    split: int = 1
    # GPU forms (`gpu_form`): input `run.input`'s points along output index `run.index` come
    # in runs of RUN read as one vector; `pipeline`: the next reduction tile is read into
    # registers while this one is computed, the local tiles double-buffered.
    run: RunChoice | None = None
    pipeline: bool = False
    # The reduction loops are left rolled (no unroll hints): a variant `tilec tune` times on
    # CPUs, where LLVM's handling of the unrolled loops can spill (`VARIANTS`).
    rolled: bool = False
    # Output indices in the order work-group numbers walk them, fastest first (None: the flat
    # order).  CPU cores take consecutive groups: `cpu_group_order` keeps the largest panel.
    group_order: tuple[int, ...] | None = None
    # CPU models, outputs whose points are distinct elements (`distinct_points`): the last
    # tile along an output index the tile does not divide is moved back to end where the
    # range ends (its first points repeat the previous tile's: the same values stored twice).
    # Every point is then inside the ranges: no store masks, no clamped reads for a partial
    # tile, and vectors along an index whose range they do not divide (NCHW's 55x55 images).
    shift: bool = False
    # CPU models: one work-item runs several register tiles along an output index, each
    # reduction block at a time (`sweep.choose_sweep`); None: one tile a work-item.
    sweep: Sweep | None = None
    # CPU models: the last, partial tile along one output index runs code of its own
    # (`codegen.edge`); False: it moves back (`shift`) like the others (`Config.edge_tiles`).
    edges: bool = True

    def shifted(self, k: int) -> bool:
        """Whether output index k's last tile is moved back (`shift`)."""
        r = self.flat.ranges[k]
        return self.shift and k in self.flat.out_indices and r > self.tile[k] and \
            r % self.tile[k] != 0

    @property
    def staged_bytes(self) -> int:
        """Local memory the staged tiles take (twice where the loop is pipelined)."""
        return sum(4 * st.elems for st in self.staged if st is not None) * \
            (2 if self.pipeline else 1)

    @property
    def out_threads(self) -> int:
        n = 1
        for t in self.threads:
            n *= t
        return n

    @property
    def wg_threads(self) -> int:
        return self.out_threads * self.split

    @property
    def dot(self) -> bool:
        """Vector lanes run along a reduction index (summed across lanes at the end)."""
        return self.vec_index is not None and self.vec_index in self.flat.reduce_indices

    def counts(self) -> tuple[int, ...]:
        """Tiles along each index: work-groups for output indices (times `sweep`'s tiles
        along its index), loop trips otherwise."""
        return tuple(-(-r // t) for r, t in zip(self.flat.ranges, self.tile, strict=True))

    def groups(self) -> int:
        """Work-groups: output tiles, less the tiles a sweep runs in one work-item."""
        n = 1
        for k in self.flat.out_indices:
            n *= self.counts()[k]
        return n // self.sweep.tiles if self.sweep else n

    def units(self, k: int) -> int:
        """Points of index k each work-group spreads over its threads (vectors count once)."""
        return self.tile[k] // self.vec if k == self.vec_index else self.tile[k]

    def acc_counts(self) -> tuple[int, ...]:
        """Accumulator points per thread along each output index (1 elsewhere)."""
        return self._acc_counts

    @cached_property  # asked for every accumulator point the time model counts
    def _acc_counts(self) -> tuple[int, ...]:
        out = []
        for k in range(len(self.tile)):
            out.append(-(-self.units(k) // self.threads[k]) if k in self.flat.out_indices
                       else 1)
        return tuple(out)

    def ragged(self, k: int) -> bool:
        """Whether threads x accumulators overshoot index k's tile (the extra points repeat
        the tile's last one and are never stored)."""
        return k in self.flat.out_indices and \
            self.threads[k] * self.acc_counts()[k] > self.units(k)


def constrained(flat: FlatContraction) -> set[int]:
    return {k for c in flat.constraints for k, v in enumerate(c.coeffs) if v}


def windowed(flat: FlatContraction) -> set[int]:
    """The constrained indices, and those of a padded window read through a border
    (`plan.halo`): tile choices treat both alike, only the code's bounds tests differ."""
    return constrained(flat) | set(flat.windowed)


def distinct_points(flat: FlatContraction) -> bool:
    """Whether distinct points of the output indices always address distinct output elements
    (mixed-radix output strides), so that a point computed twice stores one value twice."""
    pairs = sorted((abs(flat.output.strides[k]), flat.ranges[k]) for k in flat.out_indices)
    span = 0
    for st, r in pairs:
        if st <= span:
            return False
        span += st * (r - 1)
    return True


def moves_back(flat: FlatContraction, k: int, cpu: bool) -> bool:
    """Whether a partial last tile along index k moves back to end at its range's end
    (`Schedule.shift`): CPU models, output indices of outputs with distinct points."""
    return cpu and k in flat.out_indices and distinct_points(flat)


def shift_fits(flat: FlatContraction, k: int, tile_k: int, cpu: bool) -> bool:
    """Whether the tile along k never overshoots its range: it divides the range, or it is
    shorter and the last one moves back (`moves_back`)."""
    r = flat.ranges[k]
    return r % tile_k == 0 or (r > tile_k and moves_back(flat, k, cpu))


def vector_candidates(flat: FlatContraction, staged: bool = False,
                      cpu: bool = False, masked: bool = True, lanes: int = 0) -> list[int]:
    """Indices that can be spread over vector lanes, best first.

    An index qualifies when no constraint mentions it (a lane mask per point would be needed)
    and no tensor must gather along it (stride other than 0 or 1); the output's unit-stride
    index is preferred, as its stores are contiguous too.  With `staged` (every input staged
    in local memory, laid out with the vector index innermost: `stage_input`), an input may
    have any stride along it: its copy into local memory does the gathering once, and the
    reads from local memory are vectors (a convolution's output channels, which its NHWC
    filter holds at stride CI, become a matmul's n).  On `cpu` models, an output index the
    output holds at another stride qualifies last: its lanes are stored one by one, once an
    output element, while the reduction reads whole vectors (an NCHW convolution's output
    channels, read from a filter relaid with them innermost: `plan.pack`); an input may hold
    an output index at stride 2 (a stride-2 window's columns: two vector reads and a shuffle,
    `clexpr.load_strided`), behind every unit-stride candidate; an index of odd range, which
    no vector fits, is passed over unless its last tile can move back (`shift_fits`); a
    constrained output index of a one-input reduction comes last (CPU models), and one of a
    product only where nothing else qualifies and `masked` (inputs read from global memory,
    where `interior.lane_edge` masks the border's lanes).  On `cpu` models with `lanes` (the
    vector width), an index shorter than a vector comes after those that fill one:
    a stride-2 1x1 convolution's 7 output columns fill 4 of 16 lanes, its 512 output
    channels (read from a relaid filter) all of them."""
    scored = _vector_scores(flat, staged, cpu, products=False, lanes=lanes)
    if not scored and cpu and masked and len(flat.inputs) > 1 and not _relayable(flat):
        # A product with no other candidate, and none a copy of one operand could make (an
        # NCHW depthwise convolution: both inputs hold its channels apart), spreads its
        # constrained output columns over lanes rather than run scalar code.
        scored = _vector_scores(flat, staged, cpu, products=True, lanes=lanes)
    return [k for *_, k in sorted(scored)]


def _relayable(flat: FlatContraction) -> bool:
    """Whether an unconstrained output index is read by one input only: a copy of that
    input with the index last (`plan.pack`) makes it a vector candidate (an NCHW
    convolution's output channels)."""
    blocked = windowed(flat)
    return any(sum(1 for t in flat.inputs if t.strides[k]) == 1
               for k in flat.out_indices if k not in blocked)


def _vector_scores(flat: FlatContraction, staged: bool, cpu: bool,
                   products: bool, lanes: int = 0) -> list[tuple]:
    """`vector_candidates`' sort keys, one for each index that qualifies (`products`: a
    constrained output index of a product may)."""
    blocked = windowed(flat)
    scored = []
    for k in range(len(flat.names)):
        # A constrained output index (padded pooling columns: `codegen.interior.lane_edge`)
        # only where every output is written (hit flags are one a point, not a lane) and,
        # unless `products`, not in products: the model does not price the edge, and an NCHW
        # convolution's pixels as lanes would displace its channels (`plan.pack`).
        if k in blocked and not (cpu and not staged and k in flat.out_indices
                                 and flat.output_covered
                                 and (products or len(flat.inputs) == 1)):
            continue
        strides = [t.strides[k] for t in flat.inputs]
        if staged and flat.output.strides[k] == 1 and all(s >= 0 for s in strides):
            strides = [0 if s == 0 else 1 for s in strides]
        out = flat.output.strides[k]
        paired = cpu and not staged and k in flat.out_indices
        if any(s not in ((0, 1, 2) if paired else (0, 1)) for s in strides) or \
                1 not in strides + [out]:
            continue
        if out not in (0, 1) and not (cpu and k in flat.out_indices):
            continue
        if cpu and flat.ranges[k] % 2 and not moves_back(flat, k, cpu):
            continue  # no vector fits an odd range (`_register_tile`): the CPU model looks on
        loads = sum(1 for s in strides if s == 1)
        pairs = sum(1 for s in strides if s == 2)
        short = cpu and lanes > 1 and flat.ranges[k] < lanes
        scored.append((k in blocked, short, 0 if out == 1 else 1 if out == 0 else 2, pairs,
                       -loads, k))
    return scored


def _pow2_divisor(n: int, cap: int) -> int:
    w = 1
    while w * 2 <= cap and n % (w * 2) == 0:
        w *= 2
    return w


# Code variants of a tile that `tilec tune` may time and its records name ("": the default).
UNPIPELINED = "unpipelined"  # the reduction loop not pipelined where the GPU forms would
ROLLED = "rolled"  # the reduction loops not unrolled
MOVED_BACK = "moved-back"  # a CPU kernel's partial last tile moved back, no edge code
VARIANTS = ("", UNPIPELINED, ROLLED, MOVED_BACK)


def make_schedule(flat: FlatContraction, tile: tuple[int, ...], hw: HwModel, *,
                  vec: int | None = None, staging: str | None = None,
                  threads: int | None = None,
                  split_reduction: bool | int | None = None,
                  gpu_forms: bool | None = None, variant: str = "") -> Schedule:
    """`split_reduction`: None decides (see `split_choice`), False never splits, True splits
    with the threads the output leaves over (4 where it leaves fewer than 2), an int asks for
    that many threads on the reduction index (a power of two; fewer where the tile is short).
    `gpu_forms` (`gpu_form`'s runs and pipelined loop): None = on a GPU model staging in local
    memory, False = never, True = wherever inputs are staged.  `variant` (`VARIANTS`, which
    `tilec tune` times): UNPIPELINED keeps the reduction loop unpipelined where the forms would
    pipeline it (the registers the pipelined loop holds can cost a compute unit work-groups),
    ROLLED leaves the reduction loops rolled, MOVED_BACK gives a CPU kernel's partial last
    tile no code of its own (`codegen.edge`)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown code variant {variant!r}")
    width = hw.vec_size if vec is None else vec
    use_local = (staging or hw.staging) == "local"
    forms = use_local and (gpu_forms if gpu_forms is not None else hw.kind == "gpu")
    budget = hw.threads if threads is None else threads
    cpu = hw.kind == "cpu"
    vec_index, lanes, th, run = _register_tile(flat, tile, width, budget, forms, True, cpu,
                                               use_local)
    if forms and run is None and vec_index is not None and any(
            t.strides[vec_index] not in (0, 1) for t in flat.inputs):
        # A gathered vector index pays (transposing copies, small register tiles) only with
        # runs beside it, the matmul form: without, the seed conv at N=1 224x224 ran 0.209 ms
        # against 0.186 with its vectors along ci.
        vec_index, lanes, th, run = _register_tile(flat, tile, width, budget, forms, False,
                                                   cpu, use_local)
    staged = tuple(
        None if not use_local else
        stage_input(flat, tuple(tile), i, run.index, RUN) if run is not None and i == run.input
        else stage_input(flat, tuple(tile), i, vec_index, lanes)
        for i in range(len(flat.inputs)))
    sched = Schedule(flat, tuple(tile), tuple(th), vec_index, lanes, staged, run=run)
    auto = hw.staging == "local" or hw.kind == "gpu"
    # A split kernel reads some inputs through the cache (`read_once`): the room its combine
    # may take is what the device leaves beside the tiles that stay staged.
    kept = tuple(None if read_once(flat, tile, st, vec_index) else st for st in staged)
    room = SPLIT_LOCAL_BYTES
    if hw.local_mem_bytes:
        room = min(room, hw.local_mem_bytes - sum(4 * st.elems for st in kept if st))
    k, n = split_choice(sched, budget, auto, split_reduction, room)
    if n > 1:
        # A run is read from its local tile: where the split reads that input through the
        # cache instead, its points are plain reads.
        if run is not None and kept[run.input] is None:
            run = None
        sched = Schedule(flat, tuple(tile), tuple(th), vec_index, lanes, kept, k, n, run)
    elif forms:
        trips = 1
        for k2 in flat.reduce_indices:
            trips *= -(-flat.ranges[k2] // tile[k2])
        live = [st for st in staged if st is not None]
        if variant != UNPIPELINED and pipeline_fits(
                [_elems(st) for st in live], [st.elems for st in live], sched.wg_threads, trips,
                hw.local_mem_bytes):
            sched = Schedule(flat, tuple(tile), tuple(th), vec_index, lanes, staged,
                             run=run, pipeline=True)
    if hw.kind == "cpu":
        l1 = hw.l1_bytes or 32 * 1024
        go = cpu_group_order(flat, tuple(tile), l1) or reuse_order(flat, tuple(tile), l1)
        go = past_l2_order(flat, tuple(tile), hw.l2_bytes or DEFAULT_L2_BYTES, go)
        sched = replace(sched, group_order=go,
                        shift=distinct_points(flat))
        if sched.split == 1 and not any(staged):
            points = 1
            for k in flat.out_indices:
                points *= sched.acc_counts()[k]
            sched = replace(sched, sweep=choose_sweep(
                flat, tuple(tile), hw, vec_index=vec_index, lanes=lanes, acc_points=points,
                es=4, groups=sched.groups(), fastest=go[0] if go else None))
    if variant == MOVED_BACK:
        return replace(sched, edges=False)
    return replace(sched, rolled=True) if variant == ROLLED else sched


def _register_tile(flat: FlatContraction, tile: tuple[int, ...], width: int, budget: int,
                   forms: bool, gathered: bool, cpu: bool = False, local: bool = False):
    """(vector index, lanes, threads per index, runs) for a tile: the first vector candidate
    (`gathered`: one an input holds at another stride may be, `vector_candidates`) and the
    first run candidate whose thread split leaves each thread whole runs along it."""
    vec_index, lanes = None, 1
    if width > 1:
        # Masked lanes in products (`interior.lane_edge`) read global memory: not staged.
        for k in vector_candidates(flat, staged=forms and gathered, cpu=cpu, masked=not local,
                                   lanes=width):
            w = _pow2_divisor(tile[k], width)
            if not shift_fits(flat, k, tile[k], cpu):
                w = min(w, _pow2_divisor(flat.ranges[k], width))
            if w > 1:
                vec_index, lanes = k, w
                break
    run = None
    th = split_threads(flat, tile, budget, vec_index, lanes)
    for cand in run_candidates(flat, tuple(tile), vec_index, stage_input) if forms else []:
        t2 = split_threads(flat, tile, budget, vec_index, lanes, cand)
        acc = -(-tile[cand.index] // t2[cand.index])
        if acc % RUN == 0 and acc * t2[cand.index] == tile[cand.index]:
            run, th = cand, t2
            break
    return vec_index, lanes, th, run


def read_once(flat: FlatContraction, tile: Sequence[int], st: Staged | None,
              vec_index: int | None) -> bool:
    """Whether a split kernel reads staged input `st` through the cache: its tile holds as
    many elements as the tile has points, so each is read once (a matrix-vector product's
    matrix, softmax's rows) and staging would only add a copy and two barriers a reduction
    tile.  Inputs reused within the tile, and inputs gathered along the vector index (read
    from their staged tile only), stay staged."""
    if st is None:
        return False
    points = 1
    for t in tile:
        points *= t
    return _elems(st) >= points and (
        vec_index is None or flat.inputs[st.input].strides[vec_index] in (0, 1))


def _elems(st: Staged) -> int:
    n = 1
    for m in st.merged:
        n *= m[0]
    return n


# Local memory the combine of a split reduction may take (partial results and hit flags).
SPLIT_LOCAL_BYTES = 16384


def split_choice(sched: Schedule, budget: int, auto: bool, forced: bool | int | None,
                 room: int = SPLIT_LOCAL_BYTES) -> tuple[int | None, int]:
    """(reduction index, threads on it) for a split reduction, or (None, 1).

    Automatic (`forced` None) on a model that stages in local memory or is a GPU, when the
    output threads are fewer than half the budget: the leftover threads (a power of two) go to
    the reduction index with the most points per tile (vectors count once; ties: not the
    vector index, then the first), no more threads than it has points (every thread gets one
    at least in a full tile), and no more than fit the combine's local buffer (`room` bytes:
    `SPLIT_LOCAL_BYTES`, or what the device's local memory leaves beside the staged tiles).
    Only aggregations whose partial results combine (+, *, >, <) split; `=` never does."""
    flat = sched.flat
    if forced is False or flat.agg not in ("+", "*", ">", "<") or not flat.reduce_indices:
        return None, 1
    out = sched.out_threads
    if forced is None:
        if not auto or 2 * out >= budget:
            return None, 1
        avail = budget // out
    elif forced is True:
        avail = budget // out if budget // out >= 2 else 4
    else:
        avail = int(forced)
    k = max(flat.reduce_indices, key=lambda k: (sched.units(k), k != sched.vec_index, -k))
    n = _floor_pow2(min(avail, sched.units(k)))
    points = 1
    for a in sched.acc_counts():
        points *= a
    lanes = sched.vec if sched.vec_index is not None and not sched.dot else 1
    while n > 1 and out * n * points * (lanes + 1) * 4 > room:
        n //= 2
    return (k, n) if n > 1 else (None, 1)


def _floor_pow2(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def stage_input(flat: FlatContraction, tile: tuple[int, ...], i: int,
                vec_index: int | None = None, lanes: int = 1) -> Staged:
    """PlaidML's merged load indices and padded local layout for input i (see `layout`).

    Where the vector lanes walk this input's unit-stride local index, the layout is widened so
    that every vector starts on a multiple of the lane count: each stride past the first
    becomes a multiple of `lanes`, padded by `lanes` where PlaidML pads by one.  The kernel can
    then read a whole vector from local memory in one aligned access (a 129-float row would
    split every float4 read into four)."""
    from .layout import read_plan

    lay = read_plan(flat.names, flat.inputs[i], tile, 1)
    indices = list(lay.indices)
    elems = lay.local_size_elems
    strides = {id(m): m.local_stride for m in indices}
    if vec_index is not None and lanes > 1 and flat.inputs[i].strides[vec_index] != 0:
        name = flat.names[vec_index]
        # The merged index holding the vector index moves innermost (where it is not already:
        # a gathered input, `vector_candidates(staged=True)`), the others keep their order.
        inner = sorted((m for m in indices if (name, 1) in m.parts),
                       key=lambda m: m.local_stride)
        if inner:
            moved = inner[0].local_stride != 1
            order = sorted(indices, key=lambda m: (m is not inner[0], m.local_stride))
            cur = 1
            for j, m in enumerate(order):
                strides[id(m)] = cur
                nxt = order[j + 1].local_stride if j + 1 < len(order) else None
                span = cur * m.range
                # PlaidML bumped the running size by one here when the next stride exceeds
                # this span; bump by a whole vector instead (every row of a moved layout:
                # its rows are written by transposing copies).
                padded = nxt is not None and (moved or nxt > m.local_stride * m.range)
                cur = -(-span // lanes) * lanes + (lanes if padded else 0)
            elems = max(1, sum((m.range - 1) * strides[id(m)] for m in order) + 1)
            elems = -(-elems // lanes) * lanes
    merged, local_strides, base = [], [0] * len(tile), 0
    for m in indices:
        ls = strides[id(m)]
        parts = tuple((flat.names.index(name), mult) for name, mult in m.parts)
        merged.append(((m.range, m.global_stride, ls, m.zero), parts))
        base += m.zero * ls
        for k, mult in parts:
            local_strides[k] = mult * ls
    merged.sort(key=lambda x: abs(x[0][1]))
    return Staged(i, tuple(m for m, _ in merged), tuple(local_strides), elems, base,
                  tuple(p for _, p in merged))
