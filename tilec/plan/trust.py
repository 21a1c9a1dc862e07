"""Where the time model ranks a padded convolution's tiles.

The time model was fitted on kernels of the matmul form and on tiles that fill the device;
outside them it can be far off (a 1-accumulator tile predicted 5x too slow, four large
work-groups 2x too fast), and PlaidML's score then ranks more safely.  `search` asks
`time_ranks` of the model's best tile, and `staged_fits` of every tile it keeps."""

from __future__ import annotations

from .flat import FlatContraction
from .hw import HwModel
from .schedule import make_schedule


def time_ranks(flat: FlatContraction, tile, hw: HwModel) -> bool:
    """Whether the time model's best tile is one it is trusted with: in the matmul form, on
    a GPU keeping the compute units busy, or a CPU pooling window."""
    return matmul_form(flat, tile, hw) or fills(flat, tile, hw) or cpu_window(flat, hw)


def cpu_window(flat: FlatContraction, hw: HwModel) -> bool:
    """A one-input reduction on a CPU (a padded max or average pool).  PlaidML's score
    prices reuse between inputs, which a one-input reduction has none of, and so ranks its
    tiles by their sizes alone: on resnet18's 3x3 stride-2 max pool (Zen 4, one thread) it
    picked 28 vectors, 0.35 ms to run and 17 s for PoCL to generate, where the time model's
    first choice (4 vectors by 4 rows) ran in 0.19 ms, the best of the 12 tiles tuned."""
    return hw.kind == "cpu" and len(flat.inputs) == 1


def matmul_form(flat: FlatContraction, tile, hw: HwModel) -> bool:
    """Whether a tile's kernel is in the form the time model was fitted on: a register tile
    read from local memory by vectors along an output index and by runs (`gpu_form`)."""
    s = make_schedule(flat, tuple(int(t) for t in tile), hw)
    return s.run is not None and s.vec_index is not None and not s.dot


def fills(flat: FlatContraction, tile, hw: HwModel) -> bool:
    """Whether a GPU tile gives at least 3/4 of the compute units a work-group.  The time
    model's best convolution tiles that do were as fast as PlaidML's pick or faster on the
    H200 (N=1, 3x3: 128->256 at 56x56 0.100 ms against 0.320, 64->128 at 112x112 0.094
    against 0.143); those that leave half the units idle or more were not (512->512 at 7x7
    0.76 against 0.13 ms, at 14x14 0.175 against 0.057): the model overrates a few large
    work-groups."""
    if hw.kind != "gpu":
        return False
    groups = 1
    for k in flat.out_indices:
        groups *= -(-flat.ranges[k] // int(tile[k]))
    cus = hw.compute_units or max(1, hw.goal_groups // 4)
    return 4 * groups >= 3 * cus


def staged_fits(flat: FlatContraction, tile, hw: HwModel) -> bool:
    """Whether the tile's schedule stages no more than the device's local memory.  The tile
    statistics guess which inputs a split kernel reads through the cache (`cost`); the
    schedule decides, and a guess it overrules must not reach the code generator (NVIDIA
    built 74 KB of static local arrays where 48 KB are reported; a Mali's 32 KB would not)."""
    if not hw.local_mem_bytes or hw.staging != "local":
        return True
    return make_schedule(flat, tuple(int(t) for t in tile), hw).staged_bytes \
        <= hw.local_mem_bytes
