"""Phase launches: a run of dependent kernels as one launch, its work-groups meeting between them.

Each launch costs PoCL's CPU driver a round trip through its thread pool: the finished
command's event is completed, the next command is submitted and every pool thread is woken
to take work-groups.  A 16-core Xeon with PoCL 5.0 pays 45-95 us a launch and 27 us between
launches in a stream; squeezenet1_1's 22 launches cost it more than their arithmetic, and a
2-core Zen 4 with PoCL 3.1 pays 11-16 us a launch.  Here a run of consecutive kernels becomes
one launch of one work-group per compute unit: the work-groups take the first kernel's
work-groups in blocks from a shared counter (`CHUNK`), then all meet at a barrier across the
launch (`tilec_grid_sync`, an atomic counter and a generation word in a small buffer of their
own), and go on to the next kernel.  The pool's threads stay awake from the
first kernel to the last, and the host makes one launch where it made dozens.  Kernels one
core does in a few microseconds (`SERIAL_PHASE_S`: an LSTM's steps, a squeeze-excitation's
products) run on the first work-group alone, one after another, with one barrier after the
lot; a run that one core does in less than `SMALL_RUN_S` is a launch of one work-group.  So
chains (`plan.chain`) are not made where a call's kernels are phase launches.

A barrier across work-groups is safe only where every work-group of the launch runs at the same
time: a work-group waiting there holds its thread until the last one arrives.  PoCL's CPU
driver ("pthread", "cpu" from PoCL 4 on) runs a kernel's work-groups on a pool of one thread a
compute unit, each thread taking a share of what is left (one each when there are no more
work-groups than threads), and the launch has one work-group a compute unit, no more than the
device reports at the call.  A launch is never made with another such launch running
(`runtime.launch` holds a lock from its launch to its end); other kernels only delay it.  The
serial drivers ("basic", "cpu-minimal", TBB's) and GPUs keep one kernel a launch.  As a last
guard a work-group that has waited 2**34 spins (many seconds) raises a flag in the buffer and
every work-group leaves; the runtime reads the flag after the first calls and refuses the
results.

Which kernels join (`phase_member`): kernels without local memory or barriers in the form the
generators write, either of one work-item a work-group (CPU contractions, sibling launches) or
whose work-items ask for their global index alone (CPU row kernels, one row a work-item;
elementwise kernels): each work-item is then one unit of the phase; consecutive in launch
order, none settled by the constants alone (those run once, at bind).  Each member is kept as
generated but for its `__kernel` line (an ordinary function with its unit as a last
parameter) and its work-item queries along axis 0 (that parameter, and its own count);
members whose text is the same but for tensor names are written once and called with their
own arguments (`digest`: the runtime's canonical text, `runtime.share`).  Where the driver
refuses to build a phase launch, the compile runs the kernels as separate launches and says
so (`compiler.compile`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace

from ..plan.hw import HwModel
from .kernel_text import KernelArg, KernelSource
from .siblings import _ARG_NAME, _SIGNATURE, with_queries

# The sync buffer's name among a phase launch's arguments (no tensor is named so: tensor
# names come from the program, whose identifiers cannot start with "tilec:").
GRID_SYNC = "tilec:grid_sync"
# The sync buffer, in ints: arrivals at 0, the generation at 16, the abort flag at 32, each on a
# cache line of its own (the waiting work-groups read the generation; arrivals write theirs).
SYNC_INTS = 64
ABORT_INDEX = 32
# A work-group takes blocks of at most this many of a kernel's work-groups (a quarter of its
# share where that is fewer; one at least), dealt from a counter to whichever work-group is
# free, as the driver's threads take them: neighbouring tiles run at once on the cores, which
# share what they read through the last-level cache, and a core that is slow (or taken by
# another process for a while) holds one block back, not a share.  On the 2-core Zen 4
# squeezenet1_1 ran 0.93x of its separate launches with blocks of 1, 4 or 16 side by side,
# 1.30x with each work-group taking one contiguous share of every kernel (both cores
# streaming apart through its filters), and the same dealt from the counter; beside a busy
# process the counter's launch took 1.67x the separate launches' time, fixed blocks 1.85x.
CHUNK = 16
# A run whose work one core does in less than this is one work-group (the others' threads
# would wake and meet at every barrier for nothing): mlp_gelu_ln's three kernels (27 us on two
# cores of the Zen 4) took 0.11 ms as a launch of two work-groups, against 0.03 launched apart.
SMALL_RUN_S = 100e-6
# A kernel whose work one core does in less than this runs on the launch's first work-group
# alone, with the small kernels next to it, and one barrier after them: on the 16-core Xeon
# a barrier of all the work-groups costs microseconds, and an LSTM's 110 tiny kernels (a few
# thousand multiply-adds each) took 1.4 ms as phases of 16 work-groups.
SERIAL_PHASE_S = 10e-6
# Most kernels in one launch: each adds a function and a barrier to one program's text.
MAX_PHASES = 64
# Most arguments of one launch, the sync buffer included: OpenCL's least CL_DEVICE_MAX_
# PARAMETER_SIZE is 1024 bytes (128 pointers); PoCL reports that.
MAX_ARGS = 120

# What a work-item of a larger work-group may ask that a phase's unit cannot answer.
_GROUP_QUERIES = re.compile(r"\bget_(group_id|local_id|num_groups|local_size)\s*\(")

SYNC_TEXT = """\
#ifndef TILEC_GRID_SYNC
#define TILEC_GRID_SYNC
#define TILEC_CHUNK @CHUNK@
/* How many of a kernel's `total` work-groups a work-group of the launch takes at a time:
 * at most TILEC_CHUNK (neighbours share what they read), a quarter of its share at most. */
static size_t tilec_block(const size_t total, const size_t groups)
{
    return clamp(total / (4 * groups), (size_t)1, (size_t)TILEC_CHUNK);
}
/* The same for a kernel whose units are work-items (an elementwise kernel's elements, a row
 * kernel's rows): a quarter of the share, however many, so that blocks are dealt rarely. */
static size_t tilec_units(const size_t total, const size_t groups)
{
    return max(total / (4 * groups), (size_t)1);
}
/* The first of the next `c` work-groups of the kernel under way that no work-group has taken:
 * the blocks go to whichever work-group is free, as the driver's own threads take them. */
static size_t tilec_next(volatile __global int* sync, const size_t c)
{
    return (size_t)atomic_add(&sync[48], (int)c);
}
#ifndef TILEC_SPIN_LIMIT
#define TILEC_SPIN_LIMIT (1UL << 34)
#endif
/* Every work-group of the launch meets here: the last to arrive resets the count and the
 * blocks dealt, and moves the generation on; the others wait for that.  What a work-group
 * wrote before arriving is seen by every work-group after (the atomics order it).  Returns 1
 * where the launch is to stop: a work-group waited past TILEC_SPIN_LIMIT (the launch's
 * work-groups did not all run at once). */
static int tilec_grid_sync(volatile __global int* sync, const int groups)
{
    const int generation = atomic_add(&sync[16], 0);
    if (atomic_inc(&sync[0]) == groups - 1) {
        atomic_xchg(&sync[0], 0);
        atomic_xchg(&sync[48], 0);  /* the next kernel's blocks are dealt from the first */
        atomic_inc(&sync[16]);
        return sync[32] != 0;
    }
    ulong spins = 0;
    while (sync[16] == generation) {
        if (sync[32] != 0)
            return 1;
        if (++spins > TILEC_SPIN_LIMIT) {
            atomic_xchg(&sync[32], 1);
            return 1;
        }
    }
    atomic_add(&sync[16], 0);  /* what the others wrote is seen from here on */
    return sync[32] != 0;
}
#endif
""".replace("@CHUNK@", str(CHUNK))


def phase_member(source: KernelSource) -> bool:
    """Whether a kernel can be a phase of a shared launch: one kernel function in the form
    the generators write, no local memory and no barrier, and either one work-item a
    work-group or work-items that ask for nothing but their global index (a CPU row kernel's
    rows, an elementwise kernel's elements): each of its work-items is then a unit of the
    phase, as a work-group of one would be."""
    text = source.text
    if source.kind not in ("contraction", "elementwise", "row") or "__local" in text \
            or "barrier(" in text or len(_SIGNATURE.findall(text)) != 1:
        return False
    return source.local_size == 1 or not _GROUP_QUERIES.search(text)


def phase_runs(sources: Sequence[KernelSource], fixed: Collection[int]) -> list[list[int]]:
    """Runs of consecutive kernels (indices into `sources`) that may share a launch, each of
    two kernels or more, within `MAX_PHASES` and `MAX_ARGS`; `fixed`: kernels settled by the
    constants alone (run at bind), which join none."""
    runs: list[list[int]] = []
    run: list[int] = []
    tensors: set[str] = set()
    for i, s in enumerate(sources):
        ok = i not in fixed and phase_member(s)
        names = {a.tensor for a in s.args}
        if run and (not ok or len(run) >= MAX_PHASES
                    or len(tensors | names) + 1 > MAX_ARGS):
            runs.append(run)
            run, tensors = [], set()
        if ok:
            run.append(i)
            tensors |= names
    if run:
        runs.append(run)
    return [r for r in runs if len(r) > 1]


def fuse_phases(sources: Sequence[KernelSource], fixed: Collection[int],
                digest: Callable[[KernelSource], str], hw: HwModel,
                units: int) -> list[KernelSource]:
    """`sources` with each run of `phase_runs` as one kernel (`fuse`) of `units` work-groups
    (the device's compute units; the runtime launches no more than the device reports at the
    call), or of one where one core does the run's work in less than `SMALL_RUN_S`."""
    runs = phase_runs(sources, fixed)
    start = {r[0]: r for r in runs}
    inside = {i for r in runs for i in r}
    out: list[KernelSource] = []
    for i, s in enumerate(sources):
        if i in start:
            members = [sources[j] for j in start[i]]
            small = one_core_seconds(members, hw) < SMALL_RUN_S
            serial = [one_core_seconds([m], hw) < SERIAL_PHASE_S for m in members]
            out.append(fuse(members, digest, 1 if small else units, serial))
        elif i not in inside:
            out.append(s)
    return out


def one_core_seconds(members: Sequence[KernelSource], hw: HwModel) -> float:
    """About how long one core takes over `members`: each kernel's arithmetic at a core's
    share of the peak or its arguments' bytes at the memory's rate, the longer (infinite
    where the model knows neither rate: no launch is made one work-group on a guess)."""
    if not (hw.peak_gflops > 0 and hw.bandwidth_gbs > 0 and hw.compute_units > 0):
        return float("inf")
    core = hw.peak_gflops * 1e9 / hw.compute_units
    total = 0.0
    for m in members:
        moved = sum(a.elems * hw.elem_size(a.dtype) for a in m.args)
        total += max(m.flops / core, moved / (hw.bandwidth_gbs * 1e9))
    return total


def fuse(members: Sequence[KernelSource], digest: Callable[[KernelSource], str],
         groups: int, serial: Sequence[bool] | None = None) -> KernelSource:
    """One kernel of `groups` work-groups running `members` (phase members) in turn.  A
    member that is itself a shared launch of siblings (`siblings.merge`) runs its parts as
    it did: its work-groups numbered across them, each part its own block.  `serial`: the
    members the first work-group runs alone (consecutive ones with no barrier between)."""
    name = f"phases_{members[0].name}"
    functions: dict[str, str] = {}  # a part's text digest -> its function's name
    texts: list[str] = []
    params: dict[str, str] = {}  # tensor -> the launch's parameter
    decls: list[str] = []
    args: dict[str, KernelArg] = {}
    body: list[str] = []
    notes: list[str] = []

    def param(decl: str, a: KernelArg) -> str:
        if a.tensor not in params:
            ident = _ARG_NAME.search(decl)
            assert ident is not None, decl
            pname = "b_" + re.sub(r"^[A-Za-z]_", "", ident.group(1))
            while pname in params.values():
                pname += "_"
            params[a.tensor] = pname
            decls.append(_plain(decl[:ident.start()]) + pname)
            args[a.tensor] = a
        elif a.role == "out":
            args[a.tensor] = replace(args[a.tensor], role="out")
        return params[a.tensor]

    def function(part: KernelSource) -> tuple[str, list[str], int]:
        count = part.global_size  # units: work-items (of one a work-group, or of one row)
        sig = _SIGNATURE.search(part.text)
        assert sig is not None, part.name
        own = [a.strip() for a in sig.group(3).split(",") if a.strip()]
        assert len(own) == len(part.args), part.name
        text = _in_group(part.text, count)
        key = digest(replace(part, text=text))
        if key not in functions:
            fn = f"{name}_f{len(functions)}"
            functions[key] = fn
            # A work-group's tile is a function of its own (the program's code stays one copy
            # a kernel); a work-item's few operations are inlined into the loop over a block
            # of them, which the compiler may then vectorize as the driver would have.
            how = "__attribute__((noinline)) static" if part.local_size == 1 \
                else "static inline"
            texts.append(text[:sig.start()] + f"{how} void {fn}("
                         f"{sig.group(3)}, const size_t tilec_g)" + text[sig.end():])
        return functions[key], [param(d, a) for d, a in zip(own, part.args, strict=True)], count

    def dispatch(parts: list[tuple[str, list[str], int]], pad: str) -> list[str]:
        lines, first = [], 0
        for j, (fn, call, count) in enumerate(parts):
            test = "" if j == len(parts) - 1 else f"if (g < {first + count}) "
            at = f"g - {first}" if first else "g"
            lines.append(f"{pad}{'else ' if j else ''}{test}{fn}({', '.join(call)}, {at});")
            first += count
        return lines

    small = list(serial) if serial is not None else [False] * len(members)
    k = 0
    while k < len(members):
        end = k + 1
        while small[k] and end < len(members) and small[end]:
            end += 1
        if small[k]:
            # Kernels that one core runs sooner than the work-groups meet: the first
            # work-group runs them in turn (its own order keeps what each reads written).
            body.append("    if (get_group_id(0) == 0) {  /* one work-group: small kernels */")
        for m in members[k:end]:
            parts = [function(p) for p in (m.members or (m,))]
            total = sum(c for _, _, c in parts)
            notes.append(f" *   phase {len(notes)}: {m.name} ({total} work-groups"
                         f"{', the first work-group alone' if small[k] else ''})")
            if small[k]:
                body.append(f"        /* {m.name} */")
                body.append(f"        for (size_t g = 0; g < {total}; ++g) {{")
                body += dispatch(parts, "            ")
                body.append("        }")
                continue
            body.append(f"    /* {m.name} */")
            # Blocks dealt from the counter: of up to CHUNK work-groups (`tilec_block`), or of
            # a quarter share of work-items (`tilec_units`).
            size = "tilec_block" if m.local_size == 1 else "tilec_units"
            body.append(f"    for (size_t c = {size}({total}, groups), "
                        f"blk = tilec_next(tilec_sync, c); blk < {total}; "
                        "blk = tilec_next(tilec_sync, c))")
            body.append(f"        for (size_t g = blk; g < min(blk + c, (size_t){total}); "
                        "++g) {")
            body += dispatch(parts, "            ")
            body.append("        }")
        if small[k]:
            body.append("    }")
        body.append("    if (tilec_grid_sync(tilec_sync, (int)groups)) return;"
                    if end < len(members) else
                    "    tilec_grid_sync(tilec_sync, (int)groups);  /* the blocks dealt: reset */")
        k = end
    head = "\n".join([
        "/*",
        f" * {len(members)} kernels in one launch, in turn; the work-groups share each one's "
        "work-groups out",
        " * and meet between them (one work-group a compute unit):",
        *notes,
        " */"])
    wrapper = "\n".join([
        head,
        "__kernel __attribute__((reqd_work_group_size(1, 1, 1)))",
        f"void {name}(",
        ",\n".join(f"    {d}" for d in [*decls, "volatile __global int* tilec_sync"]) + ")",
        "{",
        "    const size_t groups = get_num_groups(0);",
        *body,
        "}",
        ""])
    sync = KernelArg(GRID_SYNC, "sync", "int32", SYNC_INTS)
    return replace(members[0], name=name, kind="phases",
                   text="\n".join([SYNC_TEXT, *texts, wrapper]),
                   args=(*args.values(), sync), global_size=groups, local_size=1,
                   tile={}, cost="\n".join(m.cost for m in members if m.cost),
                   flops=sum(m.flops for m in members),
                   bytes_moved=sum(m.bytes_moved for m in members), members=tuple(members))


def _in_group(text: str, count: int) -> str:
    """`text` with its work-item queries along axis 0 those of unit `tilec_g` of `count` (a
    work-group of one work-item, or one work-item)."""
    return with_queries(text, {"get_group_id": "tilec_g", "get_global_id": "tilec_g",
                               "get_num_groups": f"((size_t){count})",
                               "get_global_size": f"((size_t){count})"})


def _plain(decl: str) -> str:
    """A parameter's type as the launch declares it: without `const` and `restrict` (members
    write what later members read, through other parameters of the same launch)."""
    decl = re.sub(r"\b(const|restrict)\b\s*", "", decl)
    return re.sub(r"\s+", " ", decl).strip() + " "


__all__ = ["ABORT_INDEX", "GRID_SYNC", "MAX_ARGS", "MAX_PHASES", "SYNC_INTS", "SYNC_TEXT",
           "fuse", "fuse_phases", "phase_member", "phase_runs"]
