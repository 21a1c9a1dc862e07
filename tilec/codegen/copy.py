"""The vector copies of a staged tile into local memory (the contraction kernel's staging)."""

from __future__ import annotations

from . import clexpr
from .kernel_text import buf


def copy_width(st, t, safe: bool, W: int, tile: tuple[int, ...]) -> int:
    """Elements each copy instruction of the staging moves: a vector of W when the
    tensor's unit-stride run is a whole number of vectors and every vector the tile reads
    starts on a multiple of W (then one aligned global load moves W elements), else 1."""
    if W <= 1 or not safe or t.dtype not in ("float32", "int32") or not st.merged:
        return 1
    rng, gs, _, _ = st.merged[0]
    if gs != 1 or rng % W or any(z for *_, z in st.merged) or t.offset % W:
        return 1
    if any(m[1] % W for m in st.merged[1:]):
        return 1
    # The tile's origin: each index moves it by stride x a multiple of its tile size.
    for k, stride in enumerate(t.strides):
        if stride % W and tile[k] % W:
            return 1
    return W


def vector_copy(st, t, i: int, vw: int, local: str) -> str:
    """Copy one aligned vector from global memory into the local buffer."""
    c = clexpr.COMPUTE[t.dtype]
    load = f"*((__global const {c}{vw}*)({buf(t.name)} + g))"
    ls0 = st.merged[0][2]
    if ls0 == 1 and all(m[2] % vw == 0 for m in st.merged[1:]) and st.local_base % vw == 0:
        return f"*((__local {c}{vw}*)(s_{i} + {local})) = {load};"
    lanes = "xyzw" if vw <= 4 else None
    parts = [f"const {c}{vw} v = {load};"]
    for j in range(vw):
        lane = f"v.{lanes[j]}" if lanes else f"v.s{j:x}"
        parts.append(f"s_{i}[{local} + {j * ls0}] = {lane};")
    return " ".join(parts)
