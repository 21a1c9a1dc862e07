"""Which padding constraints a GPU kernel applies where it stages an input tile
(`codegen.staged_masks` writes the tests; the time model charges the reads accordingly).

A constraint `sum(c_k * k) <= rhs` can be tested on a staged element when, for each merged
index m of the staged input (positions p_m = sum(mult_k * k) over the indices it walks,
`plan.layout`), its coefficients are one integer lambda_m times the multiples, and it
mentions no index the input does not read: then sum(c_k * k) is sum(c_k * origin_k) +
sum(lambda_m * (p_m - zero_m)) at every point that reads the element."""

from __future__ import annotations

from .flat import FlatContraction
from .local_banks import staging_copy
from .schedule import Schedule, constrained

# A thread's copies of a staged tile up to this many have their coordinates computed once, in
# the kernel's prologue (`codegen.contraction.staging`); past it each copy decodes its
# element again every tile, and a padding test there (divisions and compares an element) cost
# more than the multiply-adds' selects it saves: a 3x3 depthwise convolution (N=32, 112x112,
# 128 channels: 20 copies a thread, 6 multiply-adds a staged element) ran 0.256 -> 0.397 ms
# on an H200 with it.
PRECOMPUTED_COPIES = 16


def copies(st, threads: int, vw: int) -> int:
    """Copy instructions a thread runs for staged input `st` each tile."""
    elems = 1
    for m in st.merged:
        elems *= m[0]
    return -(-elems // (threads * vw))


def express(coeffs: tuple[int, ...], st, vw: int, threads: int
            ) -> tuple[tuple[tuple[int, int], ...], int] | None:
    """((merged index, lambda), ...) and sum(lambda * zero) for a constraint over staged
    input `st` (`schedule.Staged`), or None where it is not a function of the input's staged
    coordinates, or it tests the index a vector copy of `vw` > 1 lanes walks (its lanes
    would differ), or the input is copied by more than `PRECOMPUTED_COPIES` copies a thread
    of `threads`."""
    if not st.parts or copies(st, threads, vw) > PRECOMPUTED_COPIES:
        return None
    owner = {k for parts in st.parts for k, _ in parts}
    if any(c and k not in owner for k, c in enumerate(coeffs)):
        return None
    lams, zero = [], 0
    for m, parts in enumerate(st.parts):
        k0, mult0 = parts[0]
        lam, rem = divmod(coeffs[k0], mult0)
        if rem or any(coeffs[k] != lam * mult for k, mult in parts):
            return None
        if lam and m == 0 and vw > 1:
            return None
        if lam:
            lams.append((m, lam))
            zero += lam * st.merged[m][3]
    return (tuple(lams), zero) if lams else None


# Per input: the constraints its staging applies, each as (constraint number, ((merged
# index, lambda), ...), the merged indices' zero offsets summed with their lambdas).
Assignment = dict[int, tuple[tuple[int, tuple[tuple[int, int], ...], int], ...]]


def assign(s: Schedule, gpu: bool) -> Assignment:
    """The constraints each staged input of schedule `s` applies where it is copied (each to
    the first input that can take it), or none: not a GPU kernel with every input staged (a
    local read cannot fault where the test no longer guards it), not a sum of products (a
    zero operand adds nothing to one; other aggregations keep their hit flags), or a
    constraint on the vector lanes."""
    flat, staged = s.flat, s.staged
    if not (gpu and flat.agg == "+" and flat.comb == "*" and staged
            and len(staged) == len(flat.inputs) and all(st is not None for st in staged)):
        return {}
    if s.vec > 1 and s.vec_index in constrained(flat):
        return {}
    out: dict[int, list] = {}
    for ci in mixed(flat):
        for st in staged:
            found = express(flat.constraints[ci].coeffs, st, staging_copy(s, st.input)[1],
                            s.wg_threads)
            if found is not None:
                out.setdefault(st.input, []).append((ci, *found))
                break
    return {i: tuple(v) for i, v in out.items()}


def mixed(flat: FlatContraction) -> list[int]:
    """Constraints that mention an output index and a reduction index (a window's padding)."""
    outs = set(flat.out_indices)
    out = []
    for ci, c in enumerate(flat.constraints):
        used = {k for k, x in enumerate(c.coeffs) if x}
        if used & outs and used - outs:
            out.append(ci)
    return out
