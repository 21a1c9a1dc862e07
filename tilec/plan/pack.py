"""Packed panels: a CPU matrix product reads its reused operand from a contiguous copy.

A CPU work-item keeps an mr x nr register tile and walks the whole reduction, so it reads a
K x nr panel of B (`C[m, n] = +(A[m, k] * B[k, n])`) whose rows lie a whole row of B apart.
The work-items of one panel run one after another and should find it in L2, but at
power-of-two row lengths every row of the panel falls in the same few cache sets: at 2048
columns (8 KB rows) a 128 KB panel uses 16 of the 1024-set L2's sets and is read from
memory again by every work-item.  BLAS libraries copy B into panels first (MegEngine's and
GotoBLAS's packing); so does this pass, in Tile:

    Bp[no, k, ni : N/nr, K, nr] = =(B[k, nr*no + ni]);
    C[m, nr*no + ni : M, N] = +(A[m, k] * Bp[no, k, ni]);

The product is the same sum over the same points (n = nr*no + ni is a bijection onto
0 .. N-1), and the panel a work-item reads is one contiguous block that the hardware
prefetcher streams.  The copy reads B once; it also turns a transposed operand (`B[n, k]`,
ONNX's Gemm with transB, which the plain kernel gathers lane by lane) into the same panels.
Measured with the copy included: 2-core Zen 4, PyPI PoCL 3.0, 2048 matmul 242 -> 92 ms,
1024 21-31 -> 12 ms; 16-core Xeon (Skylake-SP), PoCL 5.0, 2048 33 -> 12 ms, 1024 4.2 -> 1.9 ms.

Which operand and which nr: the tile search's choice for the contraction as written gives the
vector index u (an output index) and its tile, nr.  An operand is packed when it reads u
plainly along one axis the output also takes plainly and of the same size, nr divides that
size and is smaller (where the tile's width does not divide it, a weight takes the widest
whole vectors that do: squeezenet's 1000 classes under 16-wide tiles, 8-wide panels, its
classifier 1.53 -> 1.21 ms on a 2-core Zen 3), the operand is larger than a core's L2 (one
that fits stays there in any layout: on the 16-core Xeon the 512 matmul ran 0.29 ms as
written and 0.40 ms with the copy, whose launch and pass cost more than the panels save;
a model's weight, named by `constants` and copied once where it is bound, at any size),
and each panel is read by at least `MIN_REREADS` work-groups
(a matrix-vector product reads each element once: the copy would double its traffic).
Only CPU models pack (GPUs stage tiles in local memory), only `+(x * y)` contractions
without rewrites and without constraints on the panel index, and never one whose tile the
user forced
(`--tile` names its indices; such a one may still read a relaid operand, below, whose indices
are those written).  An NHWC convolution's filter `K[i, j, ci, co]` holds its output channels
last already; past L2 it is packed the same way, `K_panels[coo, i, j, ci, coi]` (its padding
constrains pixels and window, not channels), and since a filter is a model's weight, packed
once where it is bound, a filter's panels need only `MIN_FILTER_REREADS` readers (a 7x7
image's rows): resnet18's last 3x3 convolutions (7x7, 512 channels) 1.22 -> 0.84 ms on the
2-core AVX-512 Xeon with the PyPI PoCL, where NCHW with its relaid panels runs 0.81.

The same pass relays a filter (`choose_relayout`): a convolution's weights that hold the
output channels at a stride are copied with that axis last, so that the channels can be the
vector lanes; there constraints on other indices (padding) are allowed.  Where the tile takes
part of the channels, the copy is in panels of the tile's channels, `W_panels[co_o, ci, i, j,
co_i]`, rather than with the channels last: the column a work-item reads of the latter is as
scattered as the filter's was (`_in_panels`).

Long (over 500 lines) because it is one pass making two decisions about the same statements
(panels, relaid copies): their rules, the list of the searches they ask (run ahead in other
processes) and the statements they write share one set of helpers, and the docstring keeps
the measurements behind each rule."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence

from ..lang import ir
from .copies import plain_indices, statement_text
from .defract import rewritten
from .flat import FlatContraction
from .flatten import flatten
from .group_order import DEFAULT_L2_BYTES
from .hw import HwModel
from .reduce import fresh, substitute
from .schedule import make_schedule

# Work-groups that read each panel, at least: the copy reads and writes the operand once,
# so the panels it makes must be read many times for it to pay where the operand changes
# from call to call (a matrix product's).  A filter (more than two axes) is a model's
# weight, whose copy runs once where it is bound, and a small image's few rows of tiles read
# each of its panels a few times only (7 at 7x7 pixels).
MIN_REREADS = 16
MIN_FILTER_REREADS = 4

# The search's tile for a flat contraction and its predicted seconds (None: the model does not
# predict times); compile passes its own search.
TileChoice = Callable[[FlatContraction], tuple[Sequence[int], float | None]]
# Contractions flattened by (output, read through a relaid copy): `searched_flats` fills it,
# `pack_panels` reads it.
Flats = dict[tuple[str, bool], FlatContraction]


@dataclasses.dataclass(frozen=True)
class Packing:
    """How one contraction reads a packed operand: input `operand` (position in `op.inputs`)
    along its axis `axis`, which index `index` reads plainly, in panels of `nr`."""

    operand: int
    axis: int
    index: str
    nr: int


def pack_panels(program: ir.Program, hw: HwModel, choose_tile: TileChoice, *,
                relay_only: Collection[str] = (),
                grouped: Callable[[], Collection[str]] | None = None,
                constants: Collection[str] = (), memo: Flats | None = None) -> ir.Program:
    """`program` with the reused operand of each CPU matrix product packed in panels.

    `choose_tile(flat)` is the tile the search gives a flat contraction (compile passes its
    own search, so the panel width is the register tile compile would build).  Contractions
    whose output is in `relay_only` may only read an operand relaid with an axis last (their
    indices stay as written: a tile the user forced names them); those `grouped()` names are
    left as written (asked once, at the first product that would be packed: the statements
    another kernel kind takes in whole, which only then are worth finding).  `constants`: the
    inputs bound once (a model's weights), packed at any size (`_worth_panels`).  `memo`:
    the contractions `searched_flats` flattened for the same program."""
    if hw.kind != "cpu":
        return program
    constants = bound_once(program, constants)
    tensors = dict(program.tensors)
    ops: list[ir.Statement] = []
    # (operand, axis, nr) -> its packed tensor; nr 0: the operand with that axis moved last.
    made: dict[tuple[str, int, int], str] = {}
    changed = False
    skip: set[str] = set()  # filled from grouped() at the first change
    for op in program.ops:
        p: Packing | Relayout | None = None
        if isinstance(op, ir.Contraction) and op.output in relay_only:
            p = choose_relayout(op, tensors, hw, choose_tile, program, panels=False,
                                memo=memo)
        elif isinstance(op, ir.Contraction) and op.output not in skip:
            p = choose_packing(op, tensors, hw, choose_tile, program, constants, memo) or \
                choose_relayout(op, tensors, hw, choose_tile, program, constants=constants,
                                memo=memo)
        if p is not None and grouped is not None:
            skip |= set(grouped())
            grouped = None
            p = None if op.output in skip else p
        if p is None:
            ops.append(op)
            continue
        if isinstance(p, Relayout):
            ops += _relaid(op, p, tensors, made)
            changed = True
            continue
        x = op.inputs[p.operand]
        key = (x.tensor, p.axis, p.nr)
        if key not in made:
            made[key] = fresh(f"{x.tensor}_panels", set(tensors))
            pack = _pack_statement(x.tensor, p, made[key], tensors, op.span)
            tensors[made[key]] = ir.Tensor(made[key], _packed_shape(tensors[x.tensor].shape, p),
                                           tensors[x.tensor].dtype)
            ops.append(pack)
        ops.append(_reading_panels(op, p, made[key], tensors))
        changed = True
    if not changed:
        return program
    return dataclasses.replace(program, ops=tuple(ops), tensors=tensors)


def bound_once(program: ir.Program, constants: Collection[str]) -> set[str]:
    """`constants` and every tensor computed from them alone (a weight scaled by a folded
    normalization): the runtime computes those once, where the constants are bound
    (`runtime.launch` hoists their kernels), so copying them costs no call anything."""
    done = set(constants)
    if not done:
        return done
    for op in program.ops:
        if isinstance(op, ir.Contraction):
            reads = {x.tensor for x in op.inputs} | ({op.default} if op.default else set())
        else:
            reads = set(ir.expr_refs(op.expr))
        if reads and reads <= done:
            done.add(op.output)
    return done


def searched_flats(program: ir.Program, hw: HwModel, constants: Collection[str] = (),
                   relay_only: Collection[str] = (),
                   memo: Flats | None = None) -> list[FlatContraction]:
    """The contractions `pack_panels` (same arguments) may ask its tile choice about, in its
    order: a few more than it asks, since some answers settle the rest.  For searches run
    ahead in other processes (`runtime.search_ahead`).  `memo` keeps them flattened for
    `pack_panels` (a third of a second for resnet50's)."""
    if hw.kind != "cpu":
        return []
    constants = bound_once(program, constants)
    out: list[FlatContraction] = []
    for op in program.ops:
        if not isinstance(op, ir.Contraction):
            continue
        if op.output not in relay_only:
            flat = _packing_flat(op, program.tensors, hw, program, constants, memo)
            out += [flat] if flat is not None else []
        trial = _relayout_trial(op, program.tensors, program, memo)
        out += [trial[1], trial[2]] if trial is not None else []
    return out


def _flat(op: ir.Contraction, tensors, program: ir.Program, memo: Flats | None,
          relaid: bool = False) -> FlatContraction:
    """`op` flattened (the statement `op` as written stands for, or with `relaid` its trial
    reading a relaid copy), from `memo` where an earlier pass over the same program left it
    (a contraction's flat depends on its inputs alone, which packing does not change)."""
    key = (op.output, relaid)
    if memo is not None and key in memo:
        return memo[key]
    flat = flatten(op, tensors, source=program.source)
    if memo is not None:
        memo[key] = flat
    return flat


def _packing_flat(op: ir.Contraction, tensors, hw: HwModel, program: ir.Program,
                  constants: Collection[str], memo: Flats | None = None
                  ) -> FlatContraction | None:
    """`op` flattened, where `choose_packing` asks for its tile; None where the rules checked
    before that settle it (not packed)."""
    if op.agg != "+" or op.comb != "*" or len(op.inputs) != 2 or \
            op.default is not None or op.no_defract:
        return None
    if op.inputs[0].tensor == op.inputs[1].tensor:
        return None
    if rewritten(op, tensors, source=program.source) is not op:
        return None
    out_plain = plain_indices(op.out_idx)
    if not out_plain:
        return None  # not one index an axis, or a scalar (a dot product): nothing to panel
    # CPU code vectorises the output's unit-stride index (or a reduction): only an operand
    # that reads it plainly and is larger than L2 can be packed.  Checked before the search,
    # which a model's convolutions (their weights do not read it) would otherwise each pay.
    last = ir.Poly.index(out_plain[-1])
    if not any(last in x.idx and _worth_panels(tensors[x.tensor], hw, constants)
               for x in op.inputs):
        return None
    return _flat(op, tensors, program, memo)


def choose_packing(op: ir.Contraction, tensors, hw: HwModel, choose_tile: TileChoice,
                   program: ir.Program, constants: Collection[str] = (),
                   memo: Flats | None = None) -> Packing | None:
    """The operand of `op` to pack and how, or None (the module docstring's rules)."""
    flat = _packing_flat(op, tensors, hw, program, constants, memo)
    if flat is None:
        return None
    out_plain = plain_indices(op.out_idx)
    tile = tuple(choose_tile(flat)[0])
    sched = make_schedule(flat, tile, hw)
    v = sched.vec_index
    if v is None or sched.vec < 2 or v in flat.reduce_indices:
        return None
    u, nr = flat.names[v], tile[v]
    # The panel index must be one of the statement's (not fused with another) and free of
    # constraints (a padded convolution's bound its pixels and window, never its channels).
    if u not in op.indices or any(c.poly.coef(u) != 0 for c in op.constraints) or \
            any(c.coeffs[v] != 0 for c in flat.constraints):
        return None
    n = tensors[op.output].shape[out_plain.index(u)] if u in out_plain else 0
    narrow = n % nr != 0
    if narrow:
        # A count the tile's width does not divide (squeezenet's 1000 classes under 16-wide
        # tiles) takes the widest panels of whole vectors that divide it, if any: a weight's
        # only (bound once), as measured; an operand copied each call keeps its layout.
        nr = max((w for w in range(sched.vec, nr, sched.vec) if n % w == 0), default=0)
    if nr < 2 or n <= nr:
        return None
    for j, x in enumerate(op.inputs):
        axes = [a for a, q in enumerate(x.idx) if q.coef(u) != 0]
        if len(axes) != 1 or x.idx[axes[0]] != ir.Poly.index(u):
            continue
        t = tensors[x.tensor]
        if t.shape[axes[0]] != n or not _worth_panels(t, hw, constants):
            continue
        rereads = 1
        for k in flat.out_indices:
            if flat.inputs[j].strides[k] == 0:
                rereads *= -(-flat.ranges[k] // tile[k])
        weight = len(x.idx) > 2 or x.tensor in constants  # copied once, where it is bound
        if narrow and not weight:
            continue
        if rereads >= (MIN_FILTER_REREADS if weight else MIN_REREADS):
            return Packing(j, axes[0], u, nr)
    return None


def _worth_panels(t: ir.Tensor, hw: HwModel, constants: Collection[str] = ()) -> bool:
    """Whether tensor t is larger than a core's L2 (one that fits stays there in any layout),
    or is a constant.  A model's weights are bound once, so their copy costs no call
    anything, and their rows lie the output channels apart: at the power-of-two channel
    counts of real models a panel's rows alias in L1 (1024 channels: every row in one set;
    64: a 32-channel panel uses half the sets), so a swept work-item re-reads its block from
    L2 for every register tile.  resnet50's 512 -> 1024 stride-2 1x1 convolution (a 2 MiB
    filter, a 2 MiB L2) 1.37 -> 0.81 ms on the 2-core Xeon with the PyPI PoCL; squeezenet's
    filters (4 to 590 KB) on a 2-core Zen 3, the model's kernels 0.90x the time read as
    written (median of three runs)."""
    if t.name in constants:
        return True
    l2 = hw.l2_bytes or DEFAULT_L2_BYTES
    return t.size * hw.elem_size(t.dtype) > l2


def _packed_shape(shape: tuple[int, ...], p: Packing) -> tuple[int, ...]:
    rest = tuple(d for a, d in enumerate(shape) if a != p.axis)
    return (shape[p.axis] // p.nr, *rest, p.nr)


def _pack_statement(name: str, p: Packing, packed: str, tensors, span) -> ir.Contraction:
    """`packed[o, <the other axes>, i] = =(name[..., nr*o + i, ...])`."""
    rank = len(tensors[name].shape)
    axes = [f"d{a}" for a in range(rank) if a != p.axis]
    outer, inner = "po", "pi"
    read = []
    rest = iter(axes)
    for a in range(rank):
        read.append(ir.Poly.make({outer: p.nr, inner: 1}) if a == p.axis
                    else ir.Poly.index(next(rest)))
    op = ir.Contraction(
        output=packed,
        out_idx=(ir.Poly.index(outer), *(ir.Poly.index(a) for a in axes), ir.Poly.index(inner)),
        agg="=", comb=None, inputs=(ir.Access(name, tuple(read)),), constraints=(),
        indices=tuple(sorted([outer, inner, *axes])), span=span)
    dims = _packed_shape(tensors[name].shape, p)
    return dataclasses.replace(op, text=statement_text(op, dims))


def _reading_panels(op: ir.Contraction, p: Packing, packed: str, tensors) -> ir.Contraction:
    """`op` with index u replaced by nr*uo + ui and operand `p.operand` read from the panels."""
    taken = set(op.indices)
    uo, ui = fresh(f"{p.index}o", taken), fresh(f"{p.index}i", taken)
    env = {p.index: ir.Poly.make({uo: p.nr, ui: 1})}
    inputs = []
    for j, x in enumerate(op.inputs):
        if j == p.operand:
            rest = tuple(q for a, q in enumerate(x.idx) if a != p.axis)
            inputs.append(ir.Access(packed, (ir.Poly.index(uo), *rest, ir.Poly.index(ui)),
                                    x.span))
        else:
            inputs.append(ir.Access(x.tensor, tuple(substitute(q, env) for q in x.idx), x.span))
    out_idx = tuple(substitute(q, env) for q in op.out_idx)
    indices = tuple(sorted((set(op.indices) - {p.index}) | {uo, ui}))
    # `no_defract`: the reduce rewrite would fold nr*uo + ui back into one output variable
    # (with constraints tying uo to it), which the panels' index needs apart; the map is a
    # bijection already (ui < nr), so neither rewrite has work to do.
    new = dataclasses.replace(op, out_idx=out_idx, inputs=tuple(inputs), indices=indices,
                              no_defract=True)
    return dataclasses.replace(new, text=statement_text(new, tensors[op.output].shape))


# Relayout: a filter read along an output index at a stride, copied with that axis last

@dataclasses.dataclass(frozen=True)
class Relayout:
    """Input `operand` of a contraction read from a copy with its axis `axis` (which reads
    output index `index`) moved last."""

    operand: int
    axis: int
    index: str


def _relayout_candidate(op: ir.Contraction) -> Relayout | None:
    """The output index to bring into vector lanes and the operand to relay for it: the
    output's axes from the last one back, each a plain index no constraint mentions, which one
    operand reads plainly on an axis other than its last and the other reads not at all or
    plainly on its last axis (an NCHW convolution's co: the input does not read it, the
    filter `W[co, ci, i, j]` holds it first; its y is padded, its x too; a 1x1 convolution's
    pixels, a vector's worth only where their count divides by the width)."""
    fastest = op.out_idx[-1]
    for q in reversed(op.out_idx):
        name = plain_indices((q,))
        if name is None:
            continue
        u = name[0]
        if any(c.poly.coef(u) != 0 for c in op.constraints):
            continue
        reads = [[a for a, p in enumerate(x.idx) if p.coef(u) != 0] for x in op.inputs]
        for j, x in enumerate(op.inputs):
            other = op.inputs[1 - j]
            axes, oaxes = reads[j], reads[1 - j]
            if len(axes) != 1 or x.idx[axes[0]] != q or axes[0] == len(x.idx) - 1:
                continue
            # Below the output's fastest axis, only an operand that does not read that axis
            # (a filter, reused across the pixels) is relaid, never the activations.
            if q is not fastest and any(p.coef(n) != 0 for p in x.idx for n, _ in fastest.terms):
                continue
            if oaxes and (oaxes != [len(other.idx) - 1] or other.idx[-1] != q):
                continue
            return Relayout(j, axes[0], u)
    return None


def choose_relayout(op: ir.Contraction, tensors, hw: HwModel, choose_tile: TileChoice,
                    program: ir.Program, panels: bool = True,
                    constants: Collection[str] = (),
                    memo: Flats | None = None) -> Relayout | Packing | None:
    """The operand of a CPU `+(x * y)` contraction to read from a copy whose last axis is the
    one that reads an output index (`_relayout_candidate`), when the search predicts the
    contraction reading the copy faster by more than the copy costs (without a time model:
    when the copy brings that index into the lanes and the contraction as written has none,
    or fewer).

    The NHWC convolution's filter `K[i, j, co, ci]` is the case this is for: CPU code wants
    the output channels in vector lanes (one broadcast input value times a vector of filter
    values per FMA), but the filter holds them CI elements apart, so the search vectorises
    the reduction instead (lanes summed at the end, two loads an FMA).  The copy
    `K_t[i, j, ci, co]` is small and read by every work-group.  A matrix product with a
    transposed operand (`B[n, k]`) is the same case, and so is the NCHW convolution's filter
    `W[co, ci, i, j]` (its output's lanes then stored one by one: `vector_candidates`), and
    so is a stride-2 1x1 convolution's, whose output columns (7 of them at resnet's last
    stage) would fill 4 of 16 lanes: 0.29 -> 0.09 ms on a 2-core AVX-512 Xeon.
    Constraints may mention other indices (a convolution's padding), not the one brought into
    the lanes: lanes cannot be masked.  Where the tile takes part of the index, the copy is in
    panels instead (a `Packing`, `_in_panels`), unless `panels` is False."""
    got = _relayout_trial(op, tensors, program, memo)
    if got is None:
        return None
    found, flat0, flat = got
    u = found.index
    tile0, before = choose_tile(flat0)
    name = op.inputs[found.operand].tensor
    tile, after = choose_tile(flat)
    sched = make_schedule(flat, tuple(tile), hw)
    if sched.vec_index is None or flat.names[sched.vec_index] != u or sched.dot:
        return None  # the copy would not put the output's index in the lanes
    if before is None or after is None:
        # No time model (an uncalibrated CPU): relay where the contraction as written gets
        # no vectors along an output index (scalar code, or lanes summed at the end), or
        # fewer lanes than the copy gives (a stride-2 1x1 convolution's 7 columns).
        sched0 = make_schedule(flat0, tuple(tile0), hw)
        if sched0.vec_index is not None and not sched0.dot and sched0.vec >= sched.vec:
            return None
        return _in_panels(found, flat, tile, tensors[name]) if panels else found
    t = tensors[name]
    size = t.size * hw.elem_size(t.dtype)
    # A tensor bound once is copied once, where it is bound: no call pays the copy.
    copy = 0.0 if name in constants else \
        (hw.launch_us or 5.0) * 1e-6 + 2 * size / ((hw.bandwidth_gbs or 20.0) * 1e9)
    if after + copy >= before:
        return None
    return _in_panels(found, flat, tile, t) if panels else found


def _relayout_trial(op: ir.Contraction, tensors, program: ir.Program,
                    memo: Flats | None = None
                    ) -> tuple[Relayout, FlatContraction, FlatContraction] | None:
    """(the operand to relay, `op` flattened as written, `op` reading the relaid copy
    flattened), which `choose_relayout` weighs; None where `op` has nothing to relay."""
    if op.agg != "+" or op.comb != "*" or len(op.inputs) != 2 or \
            op.default is not None or op.no_defract or not op.out_idx:
        return None
    if op.inputs[0].tensor == op.inputs[1].tensor:
        return None
    found = _relayout_candidate(op)
    if found is None or rewritten(op, tensors, source=program.source) is not op:
        return None
    flat0 = _flat(op, tensors, program, memo)
    if memo is not None and (op.output, True) in memo:
        return found, flat0, memo[(op.output, True)]
    new_tensors = dict(tensors)
    name = op.inputs[found.operand].tensor
    trial_name = fresh(f"{name}_t", set(tensors))
    new_tensors[trial_name] = ir.Tensor(trial_name, _moved(tensors[name].shape, found.axis),
                                        tensors[name].dtype)
    trial = _reading_relaid(op, found, trial_name)
    flat = flatten(trial, new_tensors, source=program.source)
    if memo is not None:
        memo[(op.output, True)] = flat
    return found, flat0, flat


def _in_panels(r: Relayout, flat: FlatContraction, tile: Sequence[int], t: ir.Tensor) \
        -> Relayout | Packing:
    """A relaid operand whose tile takes part of its index is copied in panels as wide as
    the tile along it instead (`Packing`).  With the index last, a work-item's panel is a
    column of the copy whose lines lie a whole row apart.  At power-of-two rows they share a
    fraction of the cache's sets: past L2 the panel comes from memory for every work-item
    (resnet18's last 3x3 convolutions, 512 channels, a 9.4 MB filter, on a 2-core Zen 4
    with the PyPI PoCL: 3.7 -> 1.8 ms), and a swept work-item's block, which should stay
    in L1 while its register tiles run, does not fit there (the seed convolution's 64
    channels under a 32-channel tile use half of each 256-byte row, and its three window
    columns lie 16 KB apart, a multiple of L1's 4 KB set span: 12 lines a set where L1
    keeps 8; 56x56 on a 2-core Zen 3: 1.82 -> 1.64 ms).  The panel copy costs what the
    plain one does (one pass over the operand); its panels are contiguous, so a block
    spreads over every set and the group order (`cpu_group_order`) keeps a panel in L2
    while the work-items that read it run."""
    nr = tile[flat.names.index(r.index)]
    n = t.shape[r.axis]
    if not 1 < nr < n or n % nr:
        return r
    return Packing(r.operand, r.axis, r.index, nr)


def _moved(seq: Sequence, axis: int) -> tuple:
    return (*seq[:axis], *seq[axis + 1:], seq[axis])


def _reading_relaid(op: ir.Contraction, r: Relayout, name: str) -> ir.Contraction:
    inputs = list(op.inputs)
    x = inputs[r.operand]
    inputs[r.operand] = ir.Access(name, _moved(x.idx, r.axis), x.span)
    return dataclasses.replace(op, inputs=tuple(inputs))


def _relaid(op: ir.Contraction, r: Relayout, tensors, made) -> list[ir.Statement]:
    """The copy (unless an earlier contraction made it) and `op` reading it; adds the copy's
    tensor to `tensors`."""
    x = op.inputs[r.operand]
    t = tensors[x.tensor]
    key = (x.tensor, r.axis, 0)
    out: list[ir.Statement] = []
    if key not in made:
        made[key] = fresh(f"{x.tensor}_t", set(tensors))
        dims = _moved(t.shape, r.axis)
        tensors[made[key]] = ir.Tensor(made[key], dims, t.dtype)
        names = [f"d{a}" for a in range(len(t.shape))]
        copy = ir.Contraction(
            output=made[key], out_idx=tuple(ir.Poly.index(n) for n in _moved(names, r.axis)),
            agg="=", comb=None, inputs=(ir.Access(x.tensor, tuple(ir.Poly.index(n)
                                                                  for n in names)),),
            constraints=(), indices=tuple(sorted(names)), span=op.span)
        out.append(dataclasses.replace(copy, text=statement_text(copy, dims)))
    new = _reading_relaid(op, r, made[key])
    out.append(dataclasses.replace(new, text=statement_text(new, tensors[op.output].shape)))
    return out
