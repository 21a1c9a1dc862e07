"""Software prefetch in swept CPU kernels: the next reduction block of the filter panel is
brought into L2 while the sweep's register tiles compute on the current one.

A swept kernel (`plan.sweep`) reads, per reduction block, a block of its largest input (a
convolution's filter panel, 32 input channels x 3 x 3 x 32 output channels: 36 KB) from past
L2 with its first register tile, then from L1 with the others.  Where the filter is larger
than L2 (resnet's 512-channel 3x3 convolutions: 9.4 MB) and the rest of the model has pushed
it out of the last-level cache too, that first tile waits on memory for the whole block: the
hardware prefetcher follows the stream only once the misses have started.  Prefetched one
sweep tile ahead, a slice per tile (the block's lines split over the sweep's tiles), the next
block arrives while the current one is computed.  resnet18's layer4 3x3 convolution in the
model on a 2-core AVX-512 Xeon (PoCL 3.0): 1.13 -> 0.84 ms.

A block is one span of addresses (a packed matrix panel, an OIHW-relaid filter) or, where
that span is mostly other tiles' data, its contiguous runs: a channels-last filter panel keeps
the window taps outermost, so a block of input channels is nine runs a whole panel apart
(`_in_runs`).  Each run starts a new page, where the hardware prefetcher, which stops at page
boundaries, starts learning again: resnet18's layer4 3x3 convolutions in the model on the
2-core Xeon (PoCL 3.0) 1.26-1.29 -> 0.95-1.00 ms with the runs prefetched.

The prefetch goes to L2 (`__builtin_prefetch(p, 0, 2)`: locality 2, x86 `prefetcht1`), not
L1: the current block lives in L1 and the next one would evict it.  Prefetches never fault,
so lines past a partial last tile cost nothing but the request.  The builtin is clang's (PoCL
and the other clang-based CPU drivers); elsewhere the macro is empty."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..lang import ir
from ..plan.flat import FlatContraction
from ..plan.pack import DEFAULT_L2_BYTES
from ..plan.sweep import Sweep, panel_elems
from . import clexpr
from .kernel_text import _lin, buf, prod

# The block's lines are prefetched only where they are mostly the lines it reads: its address
# span at most this many times the elements it reads (a packed filter panel: 1; a filter with
# the output channels apart would fetch lines of channels other work-items read).
MAX_SPAN = 2
# A scattered block is prefetched run by run only where each run is at least this many lines.
MIN_RUN = 8

MACRO = ["#ifndef TILEC_PREFETCH",
         "#if defined(__clang__)",
         "#define TILEC_PREFETCH(p) __builtin_prefetch((p), 0, 2)",
         "#else",
         "#define TILEC_PREFETCH(p)",
         "#endif",
         "#endif"]


def next_block(flat: FlatContraction, tile: Sequence[int], sweep: Sweep | None,
               outer: list[dict], wg_threads: int, pos: Callable[[int, int], str],
               line_bytes: int = 64, l2_bytes: int = 0) -> list[str]:
    """Lines for the head of the sweep loop that prefetch this tile's slice of the next
    reduction block of the largest input, or none where that does not apply: no sweep, more
    than one blocked reduction index (the next block is then not one step along it), more
    than one thread a group (the thread reads part of the panel), an input that fits in L2
    (`l2_bytes`, a core's; 0: unknown) where it stays between calls, a negative stride or
    offset (addresses before the buffer), or a block whose addresses are too scattered
    (`MAX_SPAN`).  `pos(k, 0)` names the thread's first position along output index k."""
    if sweep is None or len(outer) != 1 or wg_threads != 1 or not flat.inputs:
        return []
    t = max(flat.inputs, key=lambda x: panel_elems(flat, x, tuple(tile)))
    if any(s < 0 for s in t.strides) or t.offset < 0 or t.strides[sweep.index] != 0:
        return []
    if t.size * ir.DTYPE_BYTES[t.dtype] <= (l2_bytes or DEFAULT_L2_BYTES):
        return []  # layer1's 3x3 filters (147 KB): 6-9% slower with the prefetches
    r = outer[0]["index"]
    step, end = outer[0]["step"], outer[0]["end"]
    span, elems, terms, dims = 1, 1, [], []
    for k, st in enumerate(t.strides):
        if st == 0:
            continue
        extent = step if k == r else tile[k] if k in flat.out_indices else flat.ranges[k]
        span += st * (extent - 1)
        elems *= extent
        if extent > 1:
            dims.append((st, extent))
        if k in flat.out_indices:
            terms.append((st, pos(k, 0)))
    line = max(1, line_bytes // ir.DTYPE_BYTES[t.dtype])
    var = outer[0]["var"]
    s = f"s_{flat.names[sweep.index]}"
    base = _lin(terms + [(t.strides[r], f"({var} + {step})")], t.offset)
    head = MACRO + [
        f"/* The next reduction block of {t.name} into L2 while this one is computed, "
        f"1/{sweep.tiles} of it a sweep tile (`codegen.prefetch`). */",
        f"if ({var} + {step} < {end}) {{",
        f"    __global const {clexpr.STORAGE[t.dtype]}* pf = {buf(t.name)} + ({base});"]
    if span <= MAX_SPAN * elems:
        # Steps of a line from the block's first element reach its last one's line wherever
        # the block starts within a line.
        reach = span + line - 1
        lines = -(-reach // line)
        per = -(-lines // sweep.tiles) * line  # elements a sweep tile prefetches
        return head + [
            f"    for (int l = {s} * {per}; l < min({reach}, ({s} + 1) * {per}); l += {line}) "
            f"TILEC_PREFETCH(pf + l);", "}"]
    return _in_runs(head, dims, line, sweep.tiles, s)


def _in_runs(head: list[str], dims: list[tuple[int, int]], line: int, tiles: int,
             s: str) -> list[str]:
    """A scattered block prefetched as its contiguous runs: a channels-last filter panel's
    block is one run of input x output channels for each window tap, the taps a whole panel
    of input channels apart (resnet's 512-channel 3x3 filter: nine 4 KB runs 64 KB apart,
    each a new page the hardware prefetcher learns again).  The lines are numbered run after
    run and a sweep tile takes its share; none where the runs are shorter than `MIN_RUN`
    lines (a line per instruction for little data) or interleave with what others read."""
    dims = sorted(dims)
    run = 1
    while dims and dims[0][0] == run:  # innermost strides that continue each other
        run *= dims.pop(0)[1]
    if run < MIN_RUN * line:
        return []
    # Outer dimensions must not overlap the run or each other (a run of another tile's
    # channels between two of ours would be fetched for nothing, or twice).
    reach = run
    for st, extent in dims:
        if st < reach:
            return []
        reach = st * (extent - 1) + reach
    count = prod(e for _, e in dims)
    per_run = -(-(run + line - 1) // line)  # a run's lines from any start within a line
    total = count * per_run
    per = -(-total // tiles)
    offset, rest = [], f"(l / {per_run})"
    for i, (st, extent) in enumerate(dims):
        digit = rest if i == len(dims) - 1 else f"{rest} % {extent}"
        offset.append(f"{st} * ({digit})")
        rest = f"{rest} / {extent}"
    offset.append(f"{line} * (l % {per_run})")
    return head + [
        f"    for (int l = {s} * {per}; l < min({total}, ({s} + 1) * {per}); l += 1) "
        f"TILEC_PREFETCH(pf + {' + '.join(offset)});", "}"]
