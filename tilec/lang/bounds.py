"""Interval bounds of index variables from `lo <= poly <= hi` constraints, by propagation.

Used by the checker to find indices that nothing bounds and to infer omitted output sizes.  The
flattener computes the exact (LP) bounds; these are a sound box around them."""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction

from .ir import Poly

Interval = tuple[float | Fraction, float | Fraction]


def propagate(constraints: Iterable[tuple[Poly, int, int]], names: Iterable[str],
              rounds: int = 64) -> dict[str, Interval]:
    """Tighten [-inf, inf] boxes of `names` until every `lo <= poly <= hi` is respected."""
    box: dict[str, list] = {n: [-math.inf, math.inf] for n in names}
    cons = list(constraints)
    for _ in range(rounds):
        changed = False
        for poly, lo, hi in cons:
            for var, coef in poly.terms:
                rest_min, rest_max = poly.const, poly.const
                for other, c in poly.terms:
                    if other == var:
                        continue
                    a, b = box[other]
                    rest_min += min(c * a, c * b) if math.isfinite(a) and math.isfinite(b) \
                        else (c * a if c > 0 else c * b)
                    rest_max += max(c * a, c * b) if math.isfinite(a) and math.isfinite(b) \
                        else (c * b if c > 0 else c * a)
                # coef * var in [lo - rest_max, hi - rest_min]
                low, high = lo - rest_max, hi - rest_min
                if coef > 0:
                    vlo, vhi = low / coef, high / coef
                else:
                    vlo, vhi = high / coef, low / coef
                if _finite(vlo):
                    vlo = math.ceil(Fraction(vlo))
                if _finite(vhi):
                    vhi = math.floor(Fraction(vhi))
                cur = box[var]
                if vlo > cur[0]:
                    cur[0] = vlo
                    changed = True
                if vhi < cur[1]:
                    cur[1] = vhi
                    changed = True
                if cur[0] > cur[1]:
                    return {n: (b[0], b[1]) for n, b in box.items()}
        if not changed:
            break
    return {n: (b[0], b[1]) for n, b in box.items()}


def _finite(x) -> bool:
    return not (isinstance(x, float) and math.isinf(x))
