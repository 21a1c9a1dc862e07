"""Sibling kernels: independent kernels close together in launch order run as one launch.

A launch costs a CPU device's driver more than many of a model's kernels take to run: PoCL
5.0's CPU driver on a 16-core Xeon spends 30 us on a launch of one empty work-group and
45-60 us on one of 64-1024, in an in-order stream (PoCL 3.0 on two cores: 2-5 us).  A fire
module of squeezenet reads its squeeze output into two convolutions (1x1 and 3x3) that write
the two halves of one concatenation; neither reads what the other writes, so one launch can
run both: its work-groups are the first kernel's, then the second's, and each work-group
runs the part it falls in.

The launch is a small kernel that calls each member, kept as it was generated but for three
things: `__kernel` and its attributes become `static inline` (a part is an ordinary
function), the part's name gets a suffix, and its work-item queries along axis 0 are taken
relative to the part (`get_group_id(0)` less the groups before it, `get_num_groups(0)` its
own count).  Generated kernels are one-dimensional, so nothing else changes.

Which kernels join: kernels on a CPU device that read no local memory and need no barrier
(contraction and elementwise kernels; rows, attention and chains stay alone), with the same
fixed work-group size, none writing a tensor another of the group reads or writes, close
together in launch order: a later kernel joins where it may run before the kernels it is
moved past (`group_siblings`).  Each must read a tensor that changes between calls (derived from
an input that is not a constant): a kernel of constants alone is settled once when the
constants are bound (`runtime.hoist.hoistable`), which a launch shared with a kernel of the
call would prevent."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import replace

from .kernel_text import KernelArg, KernelSource

# Most kernels one launch runs: the wrapper's branches and the program's text grow with them.
MAX_MEMBERS = 8
# How far past a group's first kernel later kernels are looked for (a model's launch order
# keeps siblings close; the search is quadratic in it).
LOOKAHEAD = 24
# The wrapper's argument prefixes, one a member (the members' own arguments are `b_`).
_LETTERS = "acdefhjk"
# A kernel's signature as `macros.signature` writes it: the attribute, the name, the arguments.
_SIGNATURE = re.compile(
    r"__kernel(?: __attribute__\(\(reqd_work_group_size\((\d+), 1, 1\)\)\))?\s*"
    r"void (\w+)\(([^)]*)\)")
_ARG_NAME = re.compile(r"(\w+)\s*$")
_QUERIES = ("get_group_id", "get_global_id", "get_num_groups", "get_global_size")


def joinable(source: KernelSource) -> bool:
    """Whether a kernel can be a part of a shared launch: a fixed work-group size, one kernel
    function in the form the generators write, no local memory and no barrier."""
    text = source.text
    return (source.local_size is not None and source.global_size % source.local_size == 0
            and source.kind in ("contraction", "elementwise")
            and "__local" not in text and "barrier(" not in text
            and len(_SIGNATURE.findall(text)) == 1)


def independent(a: KernelSource, b: KernelSource, slices: Collection[str] = ()) -> bool:
    """Neither writes a tensor the other reads or writes, but for the buffers in `slices`,
    which kernels write in disjoint slices (a concatenation's operands, `plan.placement`:
    each slice is written by one kernel, once)."""
    wa = {x.tensor for x in a.args if x.role == "out"}
    wb = {x.tensor for x in b.args if x.role == "out"}
    ra = {x.tensor for x in a.args if x.role == "in"}
    rb = {x.tensor for x in b.args if x.role == "in"}
    return not (wa & rb) and not (wb & ra) and not (wa & wb - set(slices))


def varying_tensors(sources: Sequence[KernelSource], inputs: Collection[str],
                    constants: Collection[str]) -> set[str]:
    """Tensors whose values change between calls: inputs that are not constants, and what
    kernels write from them (in launch order)."""
    varying = {n for n in inputs if n not in constants}
    for s in sources:
        if any(x.tensor in varying for x in s.args if x.role == "in"):
            varying.update(x.tensor for x in s.args if x.role == "out")
    return varying


def group_siblings(sources: Sequence[KernelSource], varying: Collection[str],
                   slices: Collection[str] = ()) -> list[list[int]]:
    """Groups of kernels that share a launch, in the order they run (indices into
    `sources`; groups of one where nothing joins).  A group starts at the first kernel not
    yet placed and takes the later ones (up to `LOOKAHEAD` on) that can join it and can run
    before every kernel they are moved past: an inception block's four branch heads, read
    from one input, form one group and their second convolutions the next, though each
    branch was emitted whole."""
    # Each kernel's facts once (a model has a hundred kernels, each looked at up to
    # LOOKAHEAD times).
    ok = [joinable(s) and any(x.tensor in varying for x in s.args if x.role == "in")
          for s in sources]
    left = list(range(len(sources)))
    groups: list[list[int]] = []
    while left:
        head = left.pop(0)
        group = [head]
        if ok[head]:
            passed: list[int] = []  # kernels the group's later members were moved past
            for j in left[:LOOKAHEAD]:
                s = sources[j]
                if len(group) < MAX_MEMBERS and ok[j] \
                        and s.local_size == sources[head].local_size \
                        and all(independent(sources[m], s, slices) for m in group) \
                        and all(independent(sources[k], s) for k in passed):
                    group.append(j)
                else:
                    passed.append(j)
            left = [k for k in left if k not in group]
        groups.append(group)
    return groups


def merge(members: Sequence[KernelSource]) -> KernelSource:
    """One kernel running `members` (joinable, independent, one work-group size) in one
    launch: the first's work-groups first, then the second's, and so on."""
    local = members[0].local_size
    assert local is not None and all(m.local_size == local for m in members)
    name = f"siblings_{members[0].name}"
    parts, params, calls, lines = [], [], [], []
    first = 0
    for k, m in enumerate(members):
        groups = m.global_size // local
        sig = _SIGNATURE.search(m.text)
        assert sig is not None, m.name
        part = f"{name}_part{k}"
        body = m.text[:sig.start()] + f"static inline void {part}({sig.group(3)})" \
            + m.text[sig.end():]
        body = _relative(body, first, groups, local)
        parts.append(body)
        args = [a.strip() for a in sig.group(3).split(",") if a.strip()]
        names = []
        for a in args:
            arg = _ARG_NAME.search(a)
            assert arg is not None, a
            # `b_X` of member k is `<letter k>_X` here: still one letter and a tensor's name,
            # so kernels that differ only in tensors are shared (`runtime.share`).
            own = arg.group(1)
            renamed = f"{_LETTERS[k]}_{own[2:] if re.match(r'[A-Za-z]_', own) else own}"
            params.append(a[:arg.start()] + renamed)
            names.append(renamed)
        test = "" if k == len(members) - 1 else f"if (g < {first + groups}) "
        calls.append(f"    {'else ' if k else ''}{test}{part}({', '.join(names)});")
        lines.append(f" *   work-groups {first}-{first + groups - 1}: {m.name}")
        first += groups
    head = "\n".join([
        "/*",
        f" * {len(members)} kernels in one launch (none reads what another writes, and what "
        "they write lies apart):",
        *lines,
        " */"])
    wrapper = "\n".join([
        head,
        f"__kernel __attribute__((reqd_work_group_size({local}, 1, 1)))",
        f"void {name}(",
        ",\n".join(f"    {p}" for p in params) + ")",
        "{",
        "    const size_t g = get_group_id(0);",
        *calls,
        "}",
        ""])
    args: tuple[KernelArg, ...] = tuple(a for m in members for a in m.args)
    return replace(members[0], name=name, text="\n".join(parts) + "\n" + wrapper, args=args,
                   global_size=first * local,
                   cost="\n".join(m.cost for m in members if m.cost),
                   flops=sum(m.flops for m in members),
                   bytes_moved=sum(m.bytes_moved for m in members), members=tuple(members))


def _relative(text: str, first: int, groups: int, local: int) -> str:
    """`text` with its work-item queries along axis 0 relative to its own work-groups."""
    return with_queries(text, {"get_group_id": f"((size_t)get_group_id(0) - {first})",
                               "get_global_id": f"((size_t)get_global_id(0) - {first * local})",
                               "get_num_groups": f"((size_t){groups})",
                               "get_global_size": f"((size_t){groups * local})"})


def with_queries(text: str, subs: dict[str, str]) -> str:
    """`text` with each work-item query along axis 0 (`get_group_id(0)`, `get_global_id(0)`,
    `get_num_groups(0)`, `get_global_size(0)`) replaced by the expression `subs` gives it:
    how a kernel runs as a part of another launch (`merge`, `phases.fuse`)."""
    for q in _QUERIES:
        text = re.sub(rf"\b{q}\(0\)", subs[q], text)
    return text


def merge_siblings(sources: Sequence[KernelSource], inputs: Collection[str],
                   constants: Collection[str], slices: Collection[str] = ()) -> list[KernelSource]:
    """`sources` with each run of sibling kernels (`group_siblings`) merged into one;
    `slices`: buffers kernels write in disjoint slices (`independent`).  The kernels settled
    by the constants alone come first: they run once where the constants are bound (a
    filter's panels), and in place they would keep the kernel reading their result from
    joining the kernels before them (squeezenet's last two fire modules: two launches more)."""
    fixed = settled(sources, inputs, constants)
    sources = [s for i, s in enumerate(sources) if i in fixed] + \
        [s for i, s in enumerate(sources) if i not in fixed]
    varying = varying_tensors(sources, inputs, constants)
    return [merge([sources[i] for i in g]) if len(g) > 1 else sources[g[0]]
            for g in group_siblings(sources, varying, slices)]


def settled(sources: Sequence[KernelSource], inputs: Collection[str],
            constants: Collection[str]) -> set[int]:
    """The kernels (indices) whose results follow from the constants alone: every tensor one
    touches is a constant no kernel writes, or is written by such kernels only (what
    `runtime.hoist.hoistable` runs once at bind)."""
    writers: dict[str, set[int]] = {}
    for i, s in enumerate(sources):
        for x in s.args:
            if x.role == "out":
                writers.setdefault(x.tensor, set()).add(i)
    chosen = set(range(len(sources)))
    fixed_inputs = {n for n in constants if n in inputs and n not in writers}
    while True:
        ready = fixed_inputs | {t for t, ws in writers.items()
                                if t not in inputs and ws <= chosen}
        keep = {i for i in chosen if all(x.tensor in ready for x in sources[i].args)}
        if keep == chosen:
            return chosen
        chosen = keep


__all__ = ["LOOKAHEAD", "MAX_MEMBERS", "group_siblings", "independent", "joinable", "merge",
           "merge_siblings", "settled", "varying_tensors", "with_queries"]
