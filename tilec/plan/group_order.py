"""The order of a CPU kernel's work-groups: which output index varies fastest from one
work-group to the next.  A CPU core runs consecutive work-groups, so what one group leaves in
its caches is what the next can reuse; the order is chosen for the input panels worth keeping
(`cpu_group_order`: a contiguous panel larger than L1, kept in L2; `reuse_order`: panels that
fit L1), and otherwise follows the output's memory order; `past_l2_order` overrides either
where it would stream an operand larger than L2 again for every row of groups."""

from __future__ import annotations

from .flat import FlatContraction
from .sweep import panel_elems

# Bytes an element: the schedule does not know the element type; float32 is what CPU
# kernels run, and a panel's size only has to be right to within the cache's.
ES = 4
# A model without cache facts: the L2 a core has at least (x86 since Zen 2 and Skylake-SP).
DEFAULT_L2_BYTES = 512 * 1024


def cpu_group_order(flat: FlatContraction, tile: tuple[int, ...],
                    l1_bytes: int) -> tuple[int, ...] | None:
    """The group order that keeps the input with the largest panel (what one work-item reads
    of it: its tile along output indices, whole reductions) in cache for the next groups: the
    output indices it does not read vary fastest.  None where that is the flat order.

    A CPU core runs consecutive work-groups; a matrix product's work-item reads a K x nr panel
    of B and an mr x K block of A, and with nr > mr the B panel is the one to keep once `pack`
    has made it one block (2048 matmul on a Zen 4: 98 ms against 150-200 ms with the panels
    streamed and the A block kept).  Only such a contiguous panel, larger than L1, reorders
    the groups."""
    outs = list(flat.out_indices)
    if not flat.inputs or not outs:
        return None

    big = max(flat.inputs, key=lambda t: panel_elems(flat, t, tile))
    if not _contiguous(big, flat, tile) or ES * panel_elems(flat, big, tile) <= l1_bytes:
        # A strided panel does not stay whole in a set-associative cache anyway; one that
        # fits L1 stays there in any order.
        return None
    order = tuple([k for k in outs if big.strides[k] == 0] +
                  [k for k in outs if big.strides[k] != 0])
    return None if order == tuple(outs) else order


def reuse_order(flat: FlatContraction, tile: tuple[int, ...],
                l1_bytes: int) -> tuple[int, ...] | None:
    """The group order of a CPU kernel that `cpu_group_order` leaves alone: the output index
    most of the inputs' L1-sized panels do not read varies fastest (consecutive work-groups
    on a core find them in L1), ties to the lowest output stride (they walk memory in order,
    which the hardware prefetchers follow).  None where that is the flat order.

    The flat order is the indices' name order, which for an NCHW model puts channels first:
    a max pool's consecutive groups then read rows of different channel planes, a few cache
    lines each, and wait on memory (resnet18's stem pool on a 2-core AVX-512 Xeon, PoCL 3.0:
    0.23 -> 0.15 ms alone with its rows in order), and its stem convolution, whose 38 KB
    filter stays in L1 either way, read seven fresh rows a group walking down the image
    (1.03 -> 0.75 ms along the row).  A panel larger than L1 earns nothing: it comes from
    L2 in any order (a stride-2 3x3 convolution's 147 KB filter block against its 9 KB
    input panel, which two co-blocks in turn share: 0.35 ms with co first, 0.40 with it
    last).

    Where the only inputs worth keeping stay in L1 whole anyway (half of it: a 3x3 depthwise
    filter), memory order decides.  Kept for its filter, a depthwise convolution's channel
    blocks ran outermost and each block read every pixel of the image again, a few cache
    lines of each (N=4 112x112x128 on a Zen 4, PoCL 3.1: 5.0 ms; 3.2 ms with the channel
    blocks of a pixel tile back to back; mobilenet_v2's 14x14x384 ones 10% faster).  Where
    another input's panel is worth keeping too, the larger panel still decides: mobilenet_v2's
    24 -> 144 1x1 convolutions, their 14 KB filter in L1 either way, ran 1.2x slower in the
    model with their three channel blocks of a pixel tile back to back (their input panel
    kept) than with the blocks outermost, although alone they ran the same."""
    outs = list(flat.out_indices)
    if not flat.inputs or not outs:
        return None
    panels = [panel_elems(flat, t, tile) * ES for t in flat.inputs]

    def reuse(k: int, whole: bool = True) -> int:
        return sum(b for t, b in zip(flat.inputs, panels, strict=True)
                   if t.strides[k] == 0 and b <= l1_bytes
                   and (whole or not cached_whole(t, l1_bytes)))

    # Where only inputs that stay in L1 whole would be kept, memory order decides.
    kept = any(reuse(k, whole=False) for k in outs)
    order = tuple(sorted(outs, key=lambda k: (-reuse(k) if kept else 0,
                                              abs(flat.output.strides[k]), -k)))
    return None if order == tuple(outs) else order


def cached_whole(t, l1_bytes: int) -> bool:
    """Whether all of input `t` fits in half of L1 (its size known)."""
    return 0 < t.size * ES <= l1_bytes // 2


def _contiguous(t, flat: FlatContraction, tile: tuple[int, ...]) -> bool:
    """Whether a work-item's panel of input `t` is one block of memory: its indices, by
    stride, each step over everything the faster ones cover (a packed operand's panel)."""
    span = 1
    for k in sorted((k for k, st in enumerate(t.strides) if st), key=lambda k: t.strides[k]):
        if t.strides[k] != span:
            return False
        span *= tile[k] if k in flat.out_indices else flat.ranges[k]
    return True


# An order that reads this many times fewer bytes from beyond L2 replaces the one the rules
# above chose (their measured gains are within L2: a few percent to 1.5x; vgg11's 3x3
# convolutions, whose input the channel blocks read twice, ran within 4% either way on the
# 16-core Xeon at 2x) ...
PAST_L2_GAIN = 3.0
# ... where it reads every input about once (at most this many times its bytes).  An order
# that still streams an operand again row after row is left to the sweep (`plan.sweep`),
# which keeps a panel across several register tiles of a work-item and is sized for the
# order the rules above chose.
PAST_L2_ONCE = 1.25


def past_l2_order(flat: FlatContraction, tile: tuple[int, ...], l2_bytes: int,
                  order: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """`order` (None: the flat order), or one whose fastest index reads `PAST_L2_GAIN` times
    fewer bytes from beyond L2 (`past_l2_bytes`) and every input about once (`PAST_L2_ONCE`),
    the others as they were.

    The rules above keep what fits L1 or a contiguous panel; an operand read in strided
    panels and larger than L2 falls to neither.  squeezenet's classifier (a 1x1 convolution,
    13x13 pixels, 512 -> 1000 channels, a 2 MB filter whose 1000 columns no 16-wide panel
    divides, so `pack` leaves it) kept its 26 KB input panel and walked the whole filter for
    each of 13 rows of pixels: 26 MB from L3 or memory a call, 1.96 ms in the model on a
    2-core Zen 4 where onnxruntime takes 0.82.  With the pixels fastest the filter's panel
    serves its 13 groups from L2 and the input (346 KB) stays in L2: 2.3 MB."""
    outs = tuple(flat.out_indices)
    if len(outs) < 2 or not flat.inputs or l2_bytes <= 0 or _windowed(flat):
        return order
    current = order or outs
    # Indices of one group each vary in no order: the first of the others is the fastest.
    many = [k for k in current if flat.ranges[k] > tile[k]]
    if len(many) < 2:
        return order
    now = past_l2_bytes(flat, tile, many[0], l2_bytes)
    once = PAST_L2_ONCE * sum(ES * _distinct_elems(flat, t) for t in flat.inputs)
    best, least = None, min(now, once)
    for k in many[1:]:
        b = past_l2_bytes(flat, tile, k, l2_bytes)
        if b * PAST_L2_GAIN <= now and b <= least:
            best, least = k, b
    if best is None:
        return order
    new = (best, *(k for k in current if k != best))
    return None if new == outs else new


def past_l2_bytes(flat: FlatContraction, tile: tuple[int, ...], fastest: int,
                  l2_bytes: int) -> float:
    """Bytes the work-groups read from beyond L2 with output index `fastest` varying from one
    group to the next (a row of groups: one sweep of it).  An input that does not read it
    keeps its panel for the row: one panel a row.  One that does is read whole once if what
    a row reads of it fits half of L2 (the rest of the row's data shares the cache), and
    again for every row if not."""
    counts = {k: -(-flat.ranges[k] // tile[k]) for k in flat.out_indices}
    groups = 1
    for c in counts.values():
        groups *= c
    rows = groups // counts[fastest]
    total = 0.0
    for t in flat.inputs:
        panel = ES * panel_elems(flat, t, tile)
        whole = ES * _distinct_elems(flat, t)
        if t.strides[fastest] == 0:
            total += min(panel * rows, max(whole, panel))
            continue
        row = min(panel * counts[fastest], whole)
        total += whole if row <= l2_bytes // 2 else row * rows
    return total


def _windowed(flat: FlatContraction) -> bool:
    """Whether an input reads a window (an output and a reduction index along one axis, as a
    3x3 convolution's `x + i`): neighbouring groups then share rows, which `past_l2_bytes`
    counts apart, and the sweep (`plan.sweep`) keeps them; vgg11's 3x3 convolutions
    reordered by the count ran 0.94 and 1.01 of their time on the 16-core Xeon, within
    noise on the Zen 4.  Matrix products and 1x1 convolutions have no window."""
    outs, reds = set(flat.out_indices), set(flat.reduce_indices)
    for t in flat.inputs:
        out_strides = {abs(t.strides[k]) for k in outs if t.strides[k]}
        if any(t.strides[k] and abs(t.strides[k]) in out_strides for k in reds):
            return True
    return False


def _distinct_elems(flat: FlatContraction, t) -> int:
    """Elements of input `t` the contraction reads (its buffer, where known; else the product
    of the ranges of the indices it reads)."""
    n = 1
    for k, st in enumerate(t.strides):
        if st:
            n *= flat.ranges[k]
    return min(n, t.size) if t.size else n
