"""Group a checked program's statements into kernels.

A contraction takes the elementwise statements that follow it and have its output's shape as
post-ops (PlaidML fuses the seed's ReLU this way); other runs of same-shaped elementwise
statements become one elementwise kernel.  A tensor is written to global memory only when it is
a program output or a later kernel reads it.  Concatenations are planned first
(`plan.placement`): their operands are written in place, and their copies are no kernels."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..lang import ir
from .attention import AttentionKernel
from .attention import find as find_attention
from .copies import compose_copies
from .defract import overlap_error, rewritten
from .flat import FlatContraction
from .flatten import flatten, with_storage
from .halo import Halo, pad_reads
from .placement import Placement, Storage, place, storage_of
from .rows import RowKernel, find_groups


@dataclass(frozen=True)
class ContractionKernel:
    op: ir.Contraction  # the statement after the reduce and defract rewrites (`defract.py`)
    flat: FlatContraction
    post_ops: tuple[ir.Elementwise, ...]
    writes: tuple[str, ...]  # tensors stored to global memory
    # How output index points map to output elements: "bijective" (each element is one point
    # of the box: uncovered elements are settled inside the kernel) or "injective" (some
    # elements have no point at all: an initialisation kernel runs first).
    out_map: str
    # Where the tensors it touches live when that is inside another tensor's buffer (the flat
    # form addresses the contraction's own accesses there already).
    storage: tuple[tuple[str, Storage], ...] = ()

    @property
    def name(self) -> str:
        return f"contract_{self.op.output}"

    @property
    def produces(self) -> tuple[str, ...]:
        return (self.op.output,) + tuple(p.output for p in self.post_ops)

    @property
    def post_op_count(self) -> int:
        return sum(_count_ops(p.expr) for p in self.post_ops)


def is_plain_copy(k: ContractionKernel) -> bool:
    """Whether the kernel only copies one tensor's elements into another layout: an
    assignment from one input, no post-ops, every output element written, in its own buffer."""
    op = k.op
    return (op.agg == "=" and op.comb is None and len(op.inputs) == 1 and op.default is None
            and not k.post_ops and k.writes == (op.output,) and k.out_map == "bijective"
            and not k.storage)


@dataclass(frozen=True)
class ElementwiseKernel:
    ops: tuple[ir.Elementwise, ...]
    shape: tuple[int, ...]
    writes: tuple[str, ...]
    storage: tuple[tuple[str, Storage], ...] = ()  # as ContractionKernel's

    @property
    def name(self) -> str:
        return f"elementwise_{self.ops[0].output}"

    @property
    def produces(self) -> tuple[str, ...]:
        return tuple(o.output for o in self.ops)


Kernel = ContractionKernel | ElementwiseKernel | RowKernel | AttentionKernel


@dataclass(frozen=True)
class KernelPlan:
    # The checked program; its tensors also name the copies that placement adds.
    program: ir.Program
    kernels: tuple[Kernel, ...]
    # Tensors that live inside another tensor's buffer (`plan.placement`).
    storage: Mapping[str, Storage] = field(default_factory=dict, compare=False)
    # Buffers whose border the runtime fills before any kernel runs (`plan.halo`).
    halos: tuple[Halo, ...] = ()

    def buffers(self) -> tuple[str, ...]:
        """Tensors that own a buffer in global memory: inputs and every tensor a kernel
        writes, or the tensor whose buffer it is written in."""
        out = dict.fromkeys(self.program.inputs)
        for k in self.kernels:
            for w in k.writes:
                out.setdefault(self.root(w))
        return tuple(out)

    def root(self, name: str) -> str:
        """The tensor whose buffer holds `name`."""
        found = self.storage.get(name)
        return name if found is None else found.root


def _count_ops(e: ir.Expr) -> int:
    if isinstance(e, ir.Op):
        return 1 + sum(_count_ops(a) for a in e.args)
    return 0


def _reads(k: Kernel) -> set[str]:
    if isinstance(k, (RowKernel, AttentionKernel)):
        return k.reads()
    ops = k.post_ops if isinstance(k, ContractionKernel) else k.ops
    names = {r for o in ops for r in ir.expr_refs(o.expr)}
    if isinstance(k, ContractionKernel):
        names |= {a.tensor for a in k.op.inputs}
        if k.op.default:
            names.add(k.op.default)
    return names - set(k.produces)


def classify_output(flat: FlatContraction, out_size: int) -> str:
    """Whether distinct index points always write distinct output elements, and whether every
    element has a point (mixed-radix check on the output strides)."""
    pairs = sorted((s, r) for s, r in zip(flat.output.strides, flat.ranges, strict=True) if s)
    span = 0
    for s, r in pairs:
        if s < 0 or s <= span:
            return "overlapping"
        span += s * (r - 1)
    dense = flat.output.offset == 0 and span + 1 == out_size and \
        all(s == prod for (s, _), prod in zip(pairs, _radix(pairs), strict=True))
    return "bijective" if dense else "injective"


def _distinct_per_dim(op: ir.Contraction, flat: FlatContraction) -> bool:
    """Whether distinct index points give distinct output coordinates, dimension by dimension:
    each output index in one output dimension, whose terms are mixed-radix (every coefficient
    larger than what the smaller terms can span), as in `O[BO*x + i, ...]` with i < BO.  The
    flat stride test above can fail for such an output when the box overhangs a dimension; the
    overhanging points are outside the output and never stored."""
    ranges = {n: r for n, _, r in flat.index_bounds}
    seen: set[str] = set()
    for p in op.out_idx:
        terms = sorted((abs(c), n) for n, c in p.terms)
        if any(c.denominator != 1 for c, _ in terms) or seen & {n for _, n in terms}:
            return False
        seen |= {n for _, n in terms}
        span = 0
        for c, n in terms:
            if c <= span:
                return False
            span += int(c) * (ranges.get(n, 1) - 1)
    return True


def _radix(pairs: list[tuple[int, int]]) -> list[int]:
    out, p = [], 1
    for _, r in pairs:
        out.append(p)
        p *= r
    return out


def plan_kernels(program: ir.Program, *, rows: bool = True, place_concats: bool = True,
                 attention: bool | None = None, halos: bool = False) -> KernelPlan:
    """`rows`: fuse reduction chains over the same rows into one kernel (`plan.rows`), and
    attention (scores, softmax, value product) into one kernel (`plan.attention`; `attention`
    None: as `rows`).
    `place_concats`: concatenations without copies (`plan.placement`).  Chains of copies
    are composed into one first (`plan.copies`).  `halos`: zero-padded reads of computed
    tensors read a bordered buffer instead, without bounds tests (`plan.halo`)."""
    attention = rows if attention is None else attention
    # A product writing where a copy puts its output no longer matches attention's pattern.
    program = compose_copies(program, into_products=not attention)
    blocked: set[str] = set()
    skip: set[str] = set()
    while True:
        placement = place(program, blocked, skip) if place_concats else \
            Placement(program.ops, program.tensors)
        work = dataclasses.replace(program, ops=placement.ops, tensors=placement.tensors)
        storage, borders = dict(placement.storage), ()
        if halos:
            work, storage, borders = pad_reads(work, storage, blocked)
        if not storage:
            break
        # Row and attention kernels address tensors row-major: what they read or write keeps
        # its own buffer (and the placement is redone).  A copy into a slice that such a
        # kernel took in (a row kernel's trailing statements) leaves its whole concatenation
        # to copies.
        opaque = list((find_groups(work) if rows else {}).values())
        opaque += list((find_attention(work) if attention else {}).values())
        clash = {n for _, k in opaque for n in k.reads() | set(k.produces) if n in storage}
        if not clash:
            break
        more = {placement.copies[n] for n in clash if n in placement.copies} - skip
        again = (clash - set(placement.copies)) - blocked
        if not more and not again:  # (each round keeps more apart: a safety net)
            place_concats = halos = False
        skip |= more
        blocked |= again
    kernels = _group(work, rows, storage, attention, {h.root: h for h in borders})
    plan = dataclasses.replace(program, tensors=work.tensors)
    return KernelPlan(plan, tuple(_with_writes(work, kernels, storage)), storage, borders)


def _group(program: ir.Program, rows: bool, storage: Mapping[str, Storage],
           attention: bool = True, halos: Mapping[str, Halo] | None = None) -> list:
    groups: list[list] = []  # [contraction-or-None, flat, [elementwise...], out_map]
    row_groups = find_groups(program) if rows else {}
    row_groups.update(find_attention(program) if attention else {})  # an attention group's
    # softmax is a row group inside it: the attention group starts earlier and covers it
    skip_to = 0
    for i, op in enumerate(program.ops):
        if i < skip_to:
            continue
        if i in row_groups:
            skip_to, row_kernel = row_groups[i]
            groups.append([row_kernel, None, None, "rows"])
            continue
        if isinstance(op, ir.Contraction):
            flat_op, flat = _flatten(program, op, storage, i)
            out_map = classify_output(flat, program.tensors[op.output].size)
            flat = _addressed(flat, flat_op, program, storage)
            flat = _windowed(flat, flat_op, halos or {})
            if out_map == "overlapping":
                if flat_op is op and not _distinct_per_dim(op, flat):
                    raise overlap_error(op, program.source)
                # After reduce/defract each output element has one index point by construction.
                # The stride test fails where the box overhangs a dimension (19 = 2*10 - 1) or
                # output dimensions share a residue; constraints keep such points from storing.
                out_map = "injective"
            groups.append([flat_op, flat, [], out_map])
            continue
        shape = program.tensors[op.output].shape
        last = groups[-1] if groups else None
        if last is not None and _fits(program, last, op, shape):
            last[2].append(op)
        else:
            groups.append([None, None, [op], None])
    kernels: list[Kernel] = []
    for c, flat, ew, out_map in groups:
        if out_map == "rows":
            kernels.append(c)
        elif c is not None:
            kernels.append(ContractionKernel(c, flat, tuple(ew), (), out_map))
        else:
            kernels.append(ElementwiseKernel(tuple(ew), program.tensors[ew[0].output].shape,
                                             ()))
    return kernels


def _windowed(flat: FlatContraction, op: ir.Contraction, halos: Mapping[str, Halo]
              ) -> FlatContraction:
    """`flat` with the indices of its reads through a border marked (`FlatContraction.
    windowed`)."""
    names: set[str] = set()
    for a in op.inputs:
        h = halos.get(a.tensor)
        if h is not None:
            names |= {n for p, lo, hi in zip(a.idx, h.lo, h.hi, strict=True) if lo or hi
                      for n, _ in p.terms}
    if not names:
        return flat
    parts = dict(flat.fused)
    found = tuple(k for k, n in enumerate(flat.names) if names & set(parts.get(n, (n,))))
    return dataclasses.replace(flat, windowed=found)


def use_halos(config, hw) -> bool:
    """Whether zero-padded reads of computed tensors read a bordered buffer
    (`Config.halos`)."""
    if config.halos is not None:
        return config.halos
    return hw.kind == "cpu"


def fuse_attention(config, hw) -> bool:
    """Whether to plan attention kernels for this device (`Config.attention_fusion`)."""
    if config.attention_fusion is not None:
        return config.attention_fusion
    return config.row_fusion and hw.kind != "cpu"


def _flatten(program: ir.Program, op: ir.Contraction, storage: Mapping[str, Storage] = {},
             at: int = 0) -> tuple[ir.Contraction, FlatContraction]:
    """The contraction a kernel computes (`op` after the reduce and defract rewrites, which
    keep its points and its text) and its flat form."""
    op = rewritten(op, program.tensors, source=program.source)
    # Shapes of tensors that post-ops may read, so the flattener keeps their indices apart.
    out_shape = program.tensors[op.output].shape
    shapes = {t.shape for t in program.tensors.values()
              if t.shape != out_shape and ir.broadcasts_to(t.shape, out_shape)}
    placed = {a.tensor: storage[a.tensor].strides for a in op.inputs if a.tensor in storage}
    if op.output in storage:
        placed[op.output] = storage[op.output].strides
    return op, flatten(op, program.tensors, broadcast_shapes=tuple(sorted(shapes)),
                       source=program.source, placed=placed,
                       placed_operands=_post_op_storage(program, at, storage))


def _post_op_storage(program: ir.Program, at: int, storage: Mapping[str, Storage]
                     ) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
    """(shape, strides) of the placed tensors that the statements which may become the
    contraction at `at`'s post-ops (`_fits`) read or write at its output element."""
    if not storage:
        return ()
    out_shape = program.tensors[program.ops[at].output].shape
    found: dict[str, None] = {}
    for op in program.ops[at + 1:]:
        if not isinstance(op, ir.Elementwise) or ir.has_eid_op(op.expr) or \
                program.tensors[op.output].shape != out_shape:
            break
        for n in (op.output, *ir.expr_refs(op.expr)):
            if n in storage and ir.broadcasts_to(program.tensors[n].shape, out_shape):
                found.setdefault(n)
    return tuple((program.tensors[n].shape, storage[n].strides) for n in found)


def _addressed(flat: FlatContraction, op: ir.Contraction, program: ir.Program,
               storage: Mapping[str, Storage]) -> FlatContraction:
    """The flat form with placed accesses addressed in their root's buffer."""
    names = [op.output] + [a.tensor for a in op.inputs]
    placed = {n: (storage[n].root, storage[n].offset, storage[n].strides)
              for n in names if n in storage}
    return with_storage(flat, op, program.tensors, placed) if placed else flat


def _fits(program: ir.Program, group: list, op: ir.Elementwise,
          shape: tuple[int, ...]) -> bool:
    c, _, ew, out_map = group
    if out_map == "rows":
        return False
    if c is not None:
        if out_map != "bijective" or program.tensors[c.output].shape != shape:
            return False
        # Position-dependent nodes (index, gather, ...) need an elementwise kernel's element
        # number; reading the contraction's output elsewhere than at the element needs it in
        # memory first.
        return not ir.has_eid_op(op.expr)
    if program.tensors[ew[0].output].shape != shape:
        return False
    # A gather, reshape, scatter or generator reads its operands at other elements: they must
    # come from memory, not from this kernel's own values.
    return not (ir.gathered(op.expr) & {o.output for o in ew})


def _with_writes(program: ir.Program, kernels: list[Kernel],
                 storage: Mapping[str, Storage] = {}) -> list[Kernel]:
    out = []
    for i, k in enumerate(kernels):
        # A placed tensor is read through its root (or a view of it): always stored.
        later = set(program.outputs) | set(storage)
        for j in kernels[i + 1:]:
            later |= _reads(j)
        writes = tuple(n for n in k.produces if n in later)
        if isinstance(k, RowKernel):
            out.append(RowKernel(k.ops, k.full, k.axes, writes))
        elif isinstance(k, AttentionKernel):
            out.append(dataclasses.replace(k, writes=writes))
        elif isinstance(k, ContractionKernel | ElementwiseKernel):
            out.append(dataclasses.replace(k, writes=writes,
                                           storage=_touched(k, storage, program)))
    return out


def _touched(k: ContractionKernel | ElementwiseKernel, storage: Mapping[str, Storage],
             program: ir.Program) -> tuple[tuple[str, Storage], ...]:
    if not storage:
        return ()
    names = _reads(k) | set(k.produces)
    if isinstance(k, ContractionKernel):
        names |= {a.tensor for a in k.op.inputs}
    return tuple((n, storage_of(n, program.tensors, storage)) for n in sorted(names)
                 if n in storage)
