"""Local work-size candidates for measured tuning (seed 000: MACE and MNN).

MACE times a fixed list of local sizes derived from the global size (3-D launches) or from the
kernel's maximum work-group size (2-D launches).  MNN sweeps powers of two along each axis up to
twice the global size.  Both drop sizes the kernel or the device cannot launch: the product over
the axes must not pass the kernel's maximum work-group size (CL_KERNEL_WORK_GROUP_SIZE, which
the driver lowers for register-hungry kernels), and no axis may pass the device's work-item size
for it.

tilec launches every kernel 1-D, so `mace_local_sizes` also defines a 1-D list: the x-axis values
of MACE's 3-D list (gws, gws/4, gws/8, 4, 1), the x-axis values of its 2-D list (kwg / 2^k), and
MNN's untuned default (the largest divisor of gws no larger than gws / (2 * compute units)).
Everything here is pure, so it is tested without a device.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

Size = tuple[int, ...]


def _fits(lws: Size, kwg: int, items: Sequence[int]) -> bool:
    total = 1
    for x, limit in zip(lws, items, strict=False):
        if x <= 0 or x > limit:
            return False
        total *= x
    return 0 < total <= kwg


def _mace_3d(g: Sequence[int]) -> list[Size]:
    xs = (g[0], g[0] // 4, g[0] // 8, 4, 1)
    zs = (g[2], g[2] // 8, g[2] // 4, 8, 4, 1)
    return [(x, g[1], z) for x in xs for z in zs]


def _mace_2d(kwg: int) -> list[Size]:
    out = [(kwg // (1 << k), 1 << k) for k in range(1, 9)]
    return out + [(kwg, 1), (1, kwg)]


def _mnn_default(gws: int, kwg: int, compute_units: int) -> int:
    cores = max(1, 2 * compute_units)
    group = gws // cores
    if gws % cores == 0:
        return max(1, group)
    while group > 1:
        if gws % group == 0 and group <= kwg:
            return group
        group -= 1
    return 1


def mace_local_sizes(gws: Sequence[int], kwg: int, items: Sequence[int],
                     compute_units: int = 1) -> list[Size]:
    """MACE's candidate local sizes for a launch of global size `gws` (1 to 3 axes), kernel
    maximum work-group size `kwg` and device work-item sizes `items`, in MACE's order, without
    duplicates and without sizes the launch cannot use."""
    g = tuple(int(x) for x in gws)
    if len(g) == 3:
        cands = _mace_3d(g)
    elif len(g) == 2:
        cands = _mace_2d(kwg)
    elif len(g) == 1:
        xs = [g[0], g[0] // 4, g[0] // 8, 4, 1]
        xs += [kwg // (1 << k) for k in range(9)]
        xs.append(_mnn_default(g[0], kwg, compute_units))
        cands = [(x,) for x in xs]
    else:
        raise ValueError(f"OpenCL launches have 1 to 3 axes, not {len(g)}")
    return list(dict.fromkeys(c for c in cands if _fits(c, kwg, items)))


def pow2_local_sizes(gws: Sequence[int], kwg: int, items: Sequence[int]) -> list[Size]:
    """MNN's sweep: powers of two along each axis while the size is at most twice the global
    size (or at most 4), keeping the combinations the kernel and the device allow."""
    axes = []
    for g in gws:
        vals, x = [], 1
        while x <= 2 * g or x <= 4:
            vals.append(x)
            x *= 2
        axes.append(vals)
    return [c for c in itertools.product(*axes) if _fits(c, kwg, items)]


def thread_budgets(max_threads: int, kwg: int, items: Sequence[int]) -> list[int]:
    """Thread counts to try for a contraction.  Its work-group size comes from the schedule,
    which spreads powers of two over the output indices, so MNN's power-of-two sweep covers
    every size a schedule can take (MACE's values would round down onto it)."""
    limit = min(max_threads, kwg, items[0] if items else kwg)
    out, t = [], 1
    while t <= limit:
        out.append(t)
        t *= 2
    return out


def elementwise_local_sizes(count: int, kwg: int, items: Sequence[int],
                            compute_units: int = 1) -> list[int | None]:
    """Local sizes for a 1-D elementwise launch of `count` work-items: the driver's choice
    (None) first, then MACE's list and MNN's sweep, ascending."""
    sizes = {c[0] for c in mace_local_sizes((count,), kwg, items, compute_units)}
    sizes |= {c[0] for c in pow2_local_sizes((count,), kwg, items)}
    return [None, *sorted(sizes)]
