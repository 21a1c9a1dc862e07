"""The vector copies of a staged tile into local memory (the contraction kernel's staging)."""

from __future__ import annotations

from . import clexpr
from .kernel_text import buf


def global_vector(t, g: str, vw: int) -> str:
    """The aligned vector of `vw` elements of tensor `t` at element offset `g`."""
    return f"*((__global const {clexpr.COMPUTE[t.dtype]}{vw}*)({buf(t.name)} + {g}))"


def zeros(t, vw: int) -> str:
    """A zero of `t`'s compute type, a vector of them where `vw` > 1."""
    zero = clexpr.literal(0, t.dtype)
    return f"({clexpr.COMPUTE[t.dtype]}{vw})({zero})" if vw > 1 else zero


def vector_copy(st, t, i: int, vw: int, local: str, test: str = "") -> str:
    """Copy one aligned vector from global memory into the local buffer; where `test` (the
    vector's bounds and padding tests, the same for every lane) fails, a vector of zeros."""
    c = clexpr.COMPUTE[t.dtype]
    load = global_vector(t, "g", vw)
    if test:
        load = f"({test}) ? {load} : {zeros(t, vw)}"
    ls0 = st.merged[0][2]
    if ls0 == 1 and all(m[2] % vw == 0 for m in st.merged[1:]) and st.local_base % vw == 0:
        return f"*((__local {c}{vw}*)(s_{i} + {local})) = {load};"
    lanes = "xyzw" if vw <= 4 else None
    parts = [f"const {c}{vw} v = {load};"]
    for j in range(vw):
        lane = f"v.{lanes[j]}" if lanes else f"v.s{j:x}"
        parts.append(f"s_{i}[{local} + {j * ls0}] = {lane};")
    return " ".join(parts)
