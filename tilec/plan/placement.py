"""Concatenations without copies: producers write straight into their slice of the
concatenated buffer, and readers of the concatenation read that buffer.

A concatenation in Tile is a chain of copy contractions, each writing one operand into its
slice along one axis and taking the rest from the previous link (`default`):

    C_part0[i0, i1, i2 : 2, 12, 5] = =(A[i0, i1, i2]);
    C[i0, i1 + 4, i2 : 2, 12, 5] = =(B[i0, i1, i2]) default C_part0;

(the graph's `concat` lowers to this; a Tile program may write it too).  `place` finds such
chains by their index spaces and gives tensors a *storage* (`Storage`): the root buffer, the
element offset of the tensor's origin in it, and the root's strides.  Each operand computed by
the program is *placed* in its slice of the concatenation's storage; the chain's statements
disappear.  Concatenations are taken largest first, so that where a tensor appears in several
(DenseNet's blocks: concat(x0, x1), concat(x0, x1, x2), ...) it is placed in the largest; a
smaller one whose operands already lie side by side in one buffer becomes a *view* of it
(storage only, no kernel).

An operand stays where it is, and one copy (`P = A`, an elementwise statement whose output is
placed) writes it into the slice, when it cannot be placed: it is a program input or output,
placed elsewhere already (in another concatenation, or twice in this one), read as a `default`
or at other elements than its own (gather, reshape, ...), written or read by a kernel that
addresses tensors only row-major (`blocked`: row-fused kernels), or of another element type.
Each slice is written exactly once, so buffers never clash: the root's buffer lives from the
first write of any of its tensors to the last read of any of them (the kernels name the root).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..lang import ir


@dataclass(frozen=True)
class Storage:
    """Element (c0, c1, ...) of the tensor is element `offset + sum(c_d * strides[d])` of the
    root tensor's buffer."""

    root: str
    offset: int
    strides: tuple[int, ...]

    def shifted(self, axis: int, by: int) -> Storage:
        return Storage(self.root, self.offset + by * self.strides[axis], self.strides)


def storage_of(name: str, tensors: Mapping[str, ir.Tensor],
               storage: Mapping[str, Storage]) -> Storage:
    """A tensor's storage: its placement, or its own buffer, row-major."""
    found = storage.get(name)
    return found if found is not None else Storage(name, 0, tensors[name].strides)


@dataclass(frozen=True)
class Concat:
    """One concatenation found in a program: `output` is the operands side by side along
    `axis`, operand k starting at `parts[k][1]` and copied by statement `links[k]`."""

    output: str
    axis: int
    parts: tuple[tuple[str, int], ...]  # in order along the axis
    links: tuple[int, ...]


@dataclass(frozen=True)
class Placement:
    """The program's statements with the concatenations' copies gone (and the copies of
    operands that could not be placed added), and where placed tensors live."""

    ops: tuple[ir.Statement, ...]
    tensors: Mapping[str, ir.Tensor]  # the program's, and the added copies'
    storage: Mapping[str, Storage] = field(default_factory=dict)
    concats: tuple[Concat, ...] = ()
    views: tuple[str, ...] = ()  # concatenations that are views of a larger one
    copied: tuple[str, ...] = ()  # operands written into their slice by a copy
    copies: Mapping[str, str] = field(default_factory=dict)  # copy tensor -> concatenation


def _plain(p: ir.Poly) -> str | None:
    if len(p.terms) == 1 and p.terms[0][1] == 1 and p.const == 0:
        return p.terms[0][0]
    return None


def _link(op: ir.Statement, tensors: Mapping[str, ir.Tensor]
          ) -> tuple[str, int | None, int] | None:
    """(operand, axis, start) when `op` copies its operand into a slice of its output along
    one axis (axis None: the whole output)."""
    if not isinstance(op, ir.Contraction) or op.agg != "=" or op.comb is not None:
        return None
    if len(op.inputs) != 1 or op.constraints:
        return None
    acc = op.inputs[0]
    src, dst = tensors[acc.tensor], tensors[op.output]
    if src.dtype != dst.dtype or len(src.shape) != len(dst.shape) or not dst.shape:
        return None
    names = [_plain(p) for p in acc.idx]
    if None in names or len(set(names)) != len(names) or set(names) != set(op.indices):
        return None
    axis, start = None, 0
    for d, (p, n) in enumerate(zip(op.out_idx, dst.shape, strict=True)):
        if p.terms != acc.idx[d].terms or p.const.denominator != 1 or p.const < 0:
            return None
        if p.const == 0 and src.shape[d] == n:
            continue
        if axis is not None or p.const + src.shape[d] > n:
            return None
        axis, start = d, int(p.const)
    return acc.tensor, axis, start


def find_concats(program: ir.Program) -> list[Concat]:
    """The program's concatenation chains (see the module docstring)."""
    tensors = program.tensors
    links: dict[str, tuple[int, tuple[str, int | None, int]]] = {}
    for i, op in enumerate(program.ops):
        found = _link(op, tensors)
        if found is not None:
            links[op.output] = (i, found)
    reads = readers(program)
    nxt: dict[str, str] = {}  # link output -> the link that takes it as its default
    for name, (i, _) in links.items():
        d = program.ops[i].default  # type: ignore[union-attr]
        if d is not None:
            nxt[d] = name
    out = []
    for name, (i, _) in links.items():
        if program.ops[i].default is not None:  # type: ignore[union-attr]
            continue
        chain = [name]
        while chain[-1] in nxt:
            chain.append(nxt[chain[-1]])
        found = _chain(program, chain, links, reads)
        if found is not None:
            out.append(found)
    return out


def _chain(program: ir.Program, chain: list[str], links, readers) -> Concat | None:
    tensors = program.tensors
    end = chain[-1]
    shape = tensors[end].shape
    for name in chain[:-1]:
        # A partial result is only the next link's default, and the same shape.
        if tensors[name].shape != shape or tensors[name].dtype != tensors[end].dtype or \
                name in program.outputs or len(readers[name]) != 1:
            return None
    axes = {links[n][1][1] for n in chain}
    if len(chain) == 1 and axes == {None}:
        axis = 0
    elif len(axes) == 1 and None not in axes:
        axis = axes.pop()
    else:
        return None
    parts = sorted((links[n][1][2], links[n][1][0]) for n in chain)
    at = 0
    for start, operand in parts:
        if start != at:
            return None  # a gap or an overlap: not a partition of the axis
        at += tensors[operand].shape[axis]
    if at != shape[axis]:
        return None
    chain = sorted(chain, key=lambda n: links[n][1][2])
    return Concat(end, axis, tuple((links[n][1][0], links[n][1][2]) for n in chain),
                  tuple(links[n][0] for n in chain))


def readers(program: ir.Program) -> dict[str, list[tuple[int, str]]]:
    """tensor -> (statement, how): "access" (a contraction operand), "default", "ref" (an
    elementwise operand at its own element) or "gather" (read at other elements)."""
    out: dict[str, list[tuple[int, str]]] = {n: [] for n in program.tensors}
    for i, op in enumerate(program.ops):
        if isinstance(op, ir.Contraction):
            for a in op.inputs:
                out[a.tensor].append((i, "access"))
            if op.default is not None:
                out[op.default].append((i, "default"))
        else:
            far = ir.gathered(op.expr)
            for n in ir.expr_refs(op.expr):
                out[n].append((i, "gather" if n in far else "ref"))
    return out


def place(program: ir.Program, blocked: Iterable[str] = (), skip: Iterable[str] = ()
          ) -> Placement:
    """Place the operands of every concatenation in it (see the module docstring).  Tensors in
    `blocked` keep their own buffers (a kernel reads or writes them row-major); the
    concatenations named in `skip` keep their copies."""
    skip = set(skip)
    concats = [c for c in find_concats(program) if c.output not in skip]
    blocked = set(blocked) | set(program.inputs) | set(program.outputs)
    tensors = dict(program.tensors)
    reads = readers(program)
    link_of = {i for c in concats for i in c.links}
    concat_out = {c.output for c in concats}
    producer = {op.output: (i, op) for i, op in enumerate(program.ops)}

    def addressable(name: str) -> bool:
        """Every statement that reads it can address it through a storage."""
        return name not in blocked and all(
            how == "ref" or how == "access" or i in link_of for i, how in reads[name])

    def writable(name: str) -> bool:
        if name in concat_out:
            return True
        found = producer.get(name)
        if found is None or found[0] in link_of:
            return False
        op = found[1]
        return not (isinstance(op, ir.Contraction) and op.default is not None)

    storage: dict[str, Storage] = {}
    views, copied, copies = [], [], {}
    extra: dict[int, list[ir.Statement]] = {}  # link position -> copies in its place
    # Largest first; among equal sizes the later one (it may take the earlier as an operand).
    position = {c.output: max(c.links) for c in concats}
    for c in sorted(concats, key=lambda c: (-tensors[c.output].size, -position[c.output])):
        root = tensors[c.output]
        if c.output not in storage and addressable(c.output):
            view = _view(c, storage, tensors)
            if view is not None:
                storage[c.output] = view
                views.append(c.output)
                continue
        # Larger concatenations came first, so this one's storage (when placed) is final.
        home = storage_of(c.output, tensors, storage)
        for k, (operand, start) in enumerate(c.parts):
            want = home.shifted(c.axis, start)
            if storage.get(operand) == want:
                continue
            if (operand not in storage and tensors[operand].dtype == root.dtype
                    and writable(operand) and addressable(operand)):
                storage[operand] = want
                continue
            t = tensors[operand]
            copy = fresh_name(f"{c.output}_at{start}", tensors)
            tensors[copy] = ir.Tensor(copy, t.shape, t.dtype)
            storage[copy] = want
            stmt = ir.Elementwise(copy, ir.Ref(operand, t.dtype, t.shape),
                                  f"{copy} = {operand};  (into its slice of {c.output})")
            extra.setdefault(c.links[k], []).append(stmt)
            copied.append(operand)
            copies[copy] = c.output
    dropped = set()
    for i, operand in _reshapes(program, storage, blocked | concat_out, reads, writable, skip):
        storage[operand] = Storage(program.ops[i].output, 0, tensors[operand].strides)
        dropped.add(i)
    if not concats and not dropped:
        return Placement(program.ops, program.tensors)
    ops: list[ir.Statement] = []
    for i, op in enumerate(program.ops):
        if i in link_of:
            ops += extra.get(i, [])
        elif i not in dropped:
            ops.append(op)
    return Placement(tuple(ops), tensors, storage, tuple(concats), tuple(views), tuple(copied),
                     copies)


def _reshapes(program: ir.Program, storage: Mapping[str, Storage], blocked: set[str],
              reads, writable, skip: set[str]) -> list[tuple[int, str]]:
    """Copies that keep every element at its offset (a reshape: `O[0, c] = =(X[0, 0, 0, c])`,
    `O[t, 0, c] = =(X[0, t, c])`) whose operand can live in the output's buffer instead: the
    operand's producer then writes the output's memory and the copy goes.  The operand must
    be read by the copy alone, be written by a statement of its own and be placed nowhere
    else; the output must not be placed itself nor hold other tensors."""
    tensors = program.tensors
    roots = {s.root for s in storage.values()}
    out = []
    for i, op in enumerate(program.ops):
        if not isinstance(op, ir.Contraction) or op.agg != "=" or op.comb is not None or \
                len(op.inputs) != 1 or op.constraints or op.default is not None:
            continue
        x, o = op.inputs[0].tensor, op.output
        src, dst = tensors[x], tensors[o]
        if src.shape == dst.shape or src.size != dst.size or src.dtype != dst.dtype or \
                o in skip or x in blocked or x in storage or x in roots or o in storage or \
                o in roots or o in program.inputs or x == o or \
                [r for r, _ in reads[x]] != [i] or not writable(x):
            continue
        if _same_offsets(op, src, dst):
            out.append((i, x))
            roots |= {o, x}
    return out


def _same_offsets(op: ir.Contraction, src: ir.Tensor, dst: ir.Tensor) -> bool:
    """Whether the copy reads, for each output element, the operand's element at the same
    row-major offset, inside the operand's bounds."""
    size = {}  # output index -> its range
    for p, n, st in zip(op.out_idx, dst.shape, dst.strides, strict=True):
        name = _plain(p)
        if name is None:
            if not (p.is_constant and p.const == 0 and n == 1):
                return False
            continue
        if name in size:
            return False
        size[name] = (n, st)
    found = ir.access_strides(op.inputs[0].idx, src.shape, src.strides,
                              {k: (0, n - 1) for k, (n, _) in size.items()})
    if found is None:
        return False
    step, offset = found
    return offset == 0 and all(step[k] == st for k, (n, st) in size.items() if n > 1)


def _view(c: Concat, storage: Mapping[str, Storage],
          tensors: Mapping[str, ir.Tensor]) -> Storage | None:
    """The concatenation's storage when its operands already lie side by side in one buffer,
    in its order along its axis."""
    found = None
    for operand, start in c.parts:
        s = storage.get(operand)
        if s is None:
            return None
        origin = s.shifted(c.axis, -start)
        if found is not None and origin != found:
            return None
        found = origin
    return found


def fresh_name(stem: str, tensors: Mapping[str, ir.Tensor]) -> str:
    name, k = stem, 1
    while name in tensors:
        name, k = f"{stem}_{k}", k + 1
    return name


__all__ = ["Concat", "Placement", "Storage", "find_concats", "fresh_name", "place", "readers",
           "storage_of"]
