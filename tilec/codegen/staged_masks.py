"""Padding applied where a GPU kernel stages its input tile, not where it multiplies.

A padded convolution's input read `D[n, x + i - 1, y + j - 1, ci]` carries the constraints
`1 <= x + i <= X` and `1 <= y + j <= Y`.  Checked at every multiply-add, each point of the
register tile selects its value against zero: on an H200 the seed convolution's inner loop
did eight vector selects (32 lanes) for 64 FMAs.  But such a constraint depends on the
indices only through the staged input's own coordinates (`x + i` is one merged index of
`D`'s tile, `plan.layout`), so it holds or fails for a staged element as a whole: the copy
into local memory writes a zero where it fails, and the multiply-adds read the tile unmasked.
A zero operand adds nothing to a sum of products, which is the only aggregation this is
done for (the hit flags of other aggregations still need the test), and only where every
input is staged: a read of local memory cannot fault where the constraint no longer guards
it.  (One difference remains: where the other operand is infinite or NaN, 0 x inf is NaN
while the excluded point added nothing, as with `--halos` on CPUs and as a zero-padded
convolution computes in torch or onnxruntime.)

Which constraints a staged input can take is `plan.staged_pad`'s rule (the time model
charges the reads by it too); here the tests are written, the origins being the tile's (the
work-group's output origin, the reduction tile's start)."""

from __future__ import annotations

from collections.abc import Callable

from ..plan.staged_pad import Assignment, assign
from .kernel_text import _lin

Masks = Assignment


def staged_masks(con) -> Masks:
    """The constraints each staged input of contraction `con` (`codegen.contraction`)
    applies when copied (`plan.staged_pad.assign`), none where the kernel keeps hit flags."""
    return {} if con.need_hit else assign(con.sched, not con.cpu)


def condition(con, entries, coord: Callable[[int], str], origin: Callable[[int], str]) -> str:
    """The test a staged element passes (C text): `coord(m)` its position along merged
    index m, `origin(k)` the tile's origin along flat index k."""
    tests = []
    for ci, lams, zero in entries:
        c = con.flat.constraints[ci]
        terms = [(x, o) for k, x in enumerate(c.coeffs) if x and (o := origin(k)) != "0"]
        terms += [(lam, coord(m)) for m, lam in lams]
        tests.append(f"({_lin(terms, -zero)} <= {c.rhs})")
    return " && ".join(tests)


def invariant(con, entries) -> bool:
    """Whether the test is the same for every reduction tile (it mentions no reduction index
    that has more than one tile): then it is computed once."""
    return all(con.counts[k] == 1 for ci, _, _ in entries
               for k, x in enumerate(con.flat.constraints[ci].coeffs)
               if x and k in con.red_idx)


def handled(masks: Masks) -> set[int]:
    """The constraints the staging applies (the multiply-adds need not)."""
    return {ci for entries in masks.values() for ci, _, _ in entries}
