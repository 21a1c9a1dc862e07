"""Contraction evaluation for the numpy reference: index bounds, a vectorised fast path and a
generic chunked enumeration.  `reference.py` is the public face; this module holds the machinery.

Every access dimension and user constraint becomes an integer `_Row`: lo <= sum(coef*idx) + const
<= hi, scaled by the lcm of its denominators so all arithmetic stays in Python ints and numpy int64.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import product

import numpy as np

from ..errors import TileCheckError
from . import ir

# Points per chunk in the generic path: a dozen int64 arrays of this length stay near 200 MB.
GENERIC_CHUNK = 1 << 21
# The fast path materialises one array over all free indices for non-einsum aggregations.
MAX_BROADCAST = 1 << 24
# Beyond this many coupled assignments the fast path's per-assignment overhead dominates unless
# each assignment still carries a reasonable vector of work.
MAX_ASSIGNMENTS = 4096
# Cyclic constraints can shrink intervals one step per sweep; the result is sound at any point.
MAX_SWEEPS = 1000
_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


@dataclass(frozen=True)
class _Row:
    """lo <= sum(coef * idx) + const <= hi, and the value divisible by `div` (access rows only).
    For an access row the element index is value // div."""

    coefs: tuple[tuple[str, int], ...]
    const: int
    lo: int
    hi: int
    div: int


def _scaled(poly: ir.Poly) -> tuple[tuple[tuple[str, int], ...], int, int]:
    den = 1
    for _, v in poly.terms:
        den = math.lcm(den, v.denominator)
    den = math.lcm(den, poly.const.denominator)
    coefs = tuple((k, int(v * den)) for k, v in poly.terms)
    return coefs, int(poly.const * den), den


def _access_rows(acc: ir.Access, shape: tuple[int, ...]) -> list[_Row]:
    rows = []
    for p, size in zip(acc.idx, shape, strict=True):
        coefs, const, den = _scaled(p)
        rows.append(_Row(coefs, const, 0, den * (size - 1), den))
    return rows


def _constraint_row(c: ir.Constraint) -> _Row:
    # Constraints need no integrality: 0 <= p < bound over the integers scaled by den is
    # 0 <= den*p <= den*bound - 1 exactly, since den*p is an integer at integer points.
    coefs, const, den = _scaled(c.poly)
    return _Row(coefs, const, 0, den * c.bound - 1, 1)


def _all_rows(op: ir.Contraction, tensors: Mapping[str, ir.Tensor]) -> list[list[_Row]]:
    """Rows grouped per access (output first, then inputs), then one group of constraints."""
    groups = [_access_rows(ir.Access(op.output, op.out_idx), tensors[op.output].shape)]
    groups += [_access_rows(a, tensors[a.tensor].shape) for a in op.inputs]
    groups.append([_constraint_row(c) for c in op.constraints])
    return groups


def _check_ranks(op: ir.Contraction, tensors: Mapping[str, ir.Tensor]) -> None:
    accesses = [ir.Access(op.output, op.out_idx), *op.inputs]
    for a in accesses:
        rank = len(tensors[a.tensor].shape)
        if len(a.idx) != rank:
            raise TileCheckError(f"{a.tensor} has rank {rank} but is accessed with "
                                 f"{len(a.idx)} indices", span=a.span or op.span)


# Bounds ------------------------------------------------------------------------------------------

def _term_range(c: int, lo: int | None, hi: int | None) -> tuple[int | None, int | None]:
    """Range of c*x for x in [lo, hi]; None is an infinite end."""
    a = None if lo is None else c * lo
    b = None if hi is None else c * hi
    return (a, b) if c > 0 else (b, a)


def _propagate(rows: list[_Row], names: tuple[str, ...]) -> dict[str, list[int | None]]:
    box: dict[str, list[int | None]] = {k: [None, None] for k in names}
    for _ in range(MAX_SWEEPS):
        changed = False
        for row in rows:
            parts = [_term_range(c, *box[k]) for k, c in row.coefs]
            for j, (name, c) in enumerate(row.coefs):
                rest_lo: int | None = row.const
                rest_hi: int | None = row.const
                for m, (plo, phi) in enumerate(parts):
                    if m == j:
                        continue
                    rest_lo = None if rest_lo is None or plo is None else rest_lo + plo
                    rest_hi = None if rest_hi is None or phi is None else rest_hi + phi
                # row.lo - rest_hi <= c*x <= row.hi - rest_lo
                lo_cx = None if rest_hi is None else row.lo - rest_hi
                hi_cx = None if rest_lo is None else row.hi - rest_lo
                if c > 0:
                    new_lo = None if lo_cx is None else -((-lo_cx) // c)
                    new_hi = None if hi_cx is None else hi_cx // c
                else:
                    new_lo = None if hi_cx is None else -((-hi_cx) // c)
                    new_hi = None if lo_cx is None else lo_cx // c
                cur = box[name]
                if new_lo is not None and (cur[0] is None or new_lo > cur[0]):
                    cur[0] = new_lo
                    changed = True
                if new_hi is not None and (cur[1] is None or new_hi < cur[1]):
                    cur[1] = new_hi
                    changed = True
                if cur[0] is not None and cur[1] is not None and cur[0] > cur[1]:
                    return box  # empty: no point satisfies the rows
                parts[j] = _term_range(c, *cur)
        if not changed:
            break
    return box


def index_bounds(contraction: ir.Contraction,
                 tensors: Mapping[str, ir.Tensor]) -> dict[str, tuple[int, int]]:
    """Inclusive (min, max) of every index variable, from interval propagation over the access
    ranges and the user constraints.  A sound over-approximation; min > max when no point exists."""
    op = contraction
    _check_ranks(op, tensors)
    rows = [r for g in _all_rows(op, tensors) for r in g]
    names = tuple(dict.fromkeys([*op.indices, *(k for r in rows for k, _ in r.coefs)]))
    box = _propagate(rows, names)
    # `_propagate` stops at the first empty interval, so the indices it had not reached yet are
    # still unbounded there; which came first, an "unbounded" error or the empty result, used to
    # depend on the order of the indices (their names).  As in check.py: whether an index is
    # determined is structural, and a statement with no valid point evaluates to its default.
    empty = any(lo is not None and hi is not None and lo > hi for lo, hi in box.values())
    known = _determined(rows) if empty else set(names)
    out = {}
    for k in names:
        lo, hi = box[k]
        if k not in known or not empty and (lo is None or hi is None):
            raise TileCheckError(f"index {k} is unbounded in `{op.text or op.output}`: "
                                 "it needs an access or a constraint that limits it",
                                 span=op.span)
        out[k] = (0, -1) if empty else (lo, hi)
    return out


def _determined(rows: list[_Row]) -> set[str]:
    """Indices that the rows bound: those alone in a row, then, in turn, those whose row's
    other indices are all bounded (what interval propagation finds, without its values)."""
    known: set[str] = set()
    changed = True
    while changed:
        changed = False
        for r in rows:
            free = {k for k, _ in r.coefs} - known
            if len(free) == 1:
                known |= free
                changed = True
    return known


# Values ------------------------------------------------------------------------------------------

def acc_dtype(op: ir.Contraction, tensors: Mapping[str, ir.Tensor]) -> np.dtype:
    # float64 / int64 accumulators: float32 sums stay accurate, int32 sums wrap like C on the cast.
    dts = [tensors[op.output].dtype, *(tensors[a.tensor].dtype for a in op.inputs)]
    return np.dtype(np.float64 if any(d in ir.FLOAT_DTYPES for d in dts) else np.int64)


def combine(comb: str | None, vals: list[np.ndarray], dt: np.dtype) -> np.ndarray:
    if comb is None:
        return vals[0].astype(dt, copy=False)
    if comb == "*":
        return vals[0].astype(dt, copy=False) * vals[1].astype(dt, copy=False)
    if comb == "+":
        return vals[0].astype(dt, copy=False) + vals[1].astype(dt, copy=False)
    # Equality compares the stored values in their own types, not the accumulator's.
    eq = vals[0] == vals[1]
    if comb == "==":
        return eq.astype(dt)
    if comb == "?":
        return np.where(eq, vals[2].astype(dt, copy=False), np.zeros((), dt))
    raise TileCheckError(f"unknown combination {comb!r}")


def identity(agg: str, dt: np.dtype) -> int | float:
    if agg in ("+", "="):
        return 0
    if agg == "*":
        return 1
    if dt.kind == "f":
        return -np.inf if agg == ">" else np.inf
    info = np.iinfo(dt)
    return info.min if agg == ">" else info.max


# Generic path ------------------------------------------------------------------------------------

def _row_values(row: _Row, env: Mapping[str, np.ndarray], n: int) -> np.ndarray:
    v = np.full(n, row.const, dtype=np.int64)
    for k, c in row.coefs:
        v += c * env[k]
    return v


def generic(op: ir.Contraction, tensors: Mapping[str, ir.Tensor],
            arrays: Mapping[str, np.ndarray], bounds: Mapping[str, tuple[int, int]],
            acc: np.ndarray, covered: np.ndarray) -> None:
    """Enumerate the bounding box in chunks, mask invalid points, scatter with ufunc.at."""
    groups = _all_rows(op, tensors)
    names = tuple(bounds)
    lows = np.array([bounds[k][0] for k in names], dtype=np.int64)
    shape = tuple(bounds[k][1] - bounds[k][0] + 1 for k in names)
    total = math.prod(shape)
    if total <= 0:
        return
    flat_acc = acc.reshape(-1)
    flat_cov = covered.reshape(-1)
    out_strides = ir.Tensor("", acc.shape).strides
    for start in range(0, total, GENERIC_CHUNK):
        lin = np.arange(start, min(start + GENERIC_CHUNK, total), dtype=np.int64)
        coords = np.unravel_index(lin, shape) if names else ()
        env = {k: v + lo for k, v, lo in zip(names, coords, lows, strict=True)}
        n = len(lin)
        ok = np.ones(n, dtype=bool)
        for g in groups:
            for row in g:
                v = _row_values(row, env, n)
                ok &= (v >= row.lo) & (v <= row.hi)
                if row.div != 1:
                    ok &= v % row.div == 0
        if not ok.any():
            continue
        env = {k: v[ok] for k, v in env.items()}
        m = int(ok.sum())
        elems = [[_row_values(r, env, m) // r.div for r in g] for g in groups[:-1]]
        vals = [arrays[a.tensor][tuple(e)] if e else np.broadcast_to(arrays[a.tensor], (m,))
                for a, e in zip(op.inputs, elems[1:], strict=True)]
        value = combine(op.comb, vals, acc.dtype)
        target = np.zeros(m, dtype=np.int64)
        for e, s in zip(elems[0], out_strides, strict=True):
            target += e * s
        scatter(op.agg, flat_acc, target, value)
        flat_cov[target] = True


def scatter(agg: str, flat: np.ndarray, target: np.ndarray, value: np.ndarray) -> None:
    if agg == "+":
        np.add.at(flat, target, value)
    elif agg == "*":
        np.multiply.at(flat, target, value)
    elif agg == ">":
        np.maximum.at(flat, target, value)
    elif agg == "<":
        np.minimum.at(flat, target, value)
    else:  # "=": valid programs agree at every point; numpy keeps the last write
        flat[target] = value


# Fast path ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FastPlan:
    coupled: tuple[str, ...]  # enumerated in a Python loop
    free: tuple[str, ...]  # vectorised; each row holds at most one of them after fixing `coupled`


def plan_fast(op: ir.Contraction, tensors: Mapping[str, ir.Tensor],
              bounds: Mapping[str, tuple[int, int]]) -> FastPlan | None:
    """Pick the cheapest set of indices to enumerate so that every row keeps at most one free
    index; None where the fast path does not apply (rational access coefficients, too costly)."""
    groups = _all_rows(op, tensors)
    if any(r.div != 1 and r.coefs for g in groups[:-1] for r in g):
        return None
    names = tuple(bounds)
    size = {k: bounds[k][1] - bounds[k][0] + 1 for k in names}
    rows = [r for g in groups for r in g]
    multi = [frozenset(k for k, _ in r.coefs) for r in rows if len(r.coefs) > 1]
    coupling = sorted({k for s in multi for k in s}, key=lambda k: (size[k], k))
    best: tuple[int, tuple[str, ...]] | None = None
    if len(coupling) <= 12:
        for mask in range(1 << len(coupling)):
            chosen = {coupling[i] for i in range(len(coupling)) if mask >> i & 1}
            if all(len(s - chosen) <= 1 for s in multi):
                cost = math.prod(size[k] for k in chosen)
                if best is None or cost < best[0]:
                    best = (cost, tuple(sorted(chosen)))
    else:  # greedy: enumerate the smallest index of each row still holding several free ones
        chosen: set[str] = set()
        for s in multi:
            rest = sorted(s - chosen, key=lambda k: (size[k], k))
            chosen.update(rest[:-1])
        best = (math.prod(size[k] for k in chosen), tuple(sorted(chosen)))
    assert best is not None  # the full coupling set always qualifies
    cost, coupled = best
    free = tuple(k for k in names if k not in coupled)
    total = math.prod(size.values())
    if cost > MAX_ASSIGNMENTS and cost * 256 > total:
        return None
    if len(free) > len(_LETTERS):
        return None
    einsum_ok = op.agg == "+" and op.comb in (None, "*")
    if not einsum_ok and math.prod(size[k] for k in free) > MAX_BROADCAST:
        return None
    return FastPlan(coupled, free)


def _assignments(plan: FastPlan, bounds: Mapping[str, tuple[int, int]]) -> Iterator[dict]:
    spans = [range(bounds[k][0], bounds[k][1] + 1) for k in plan.coupled]
    for vals in product(*spans):
        yield dict(zip(plan.coupled, vals, strict=True))


def _free_ranges(rows: list[_Row], fixed: Mapping[str, int],
                 box: dict[str, list[int]]) -> list[tuple[str | None, int, int]] | None:
    """Tighten `box` in place for this assignment; per row, (free index, coef, const), or None
    when the assignment has no valid point."""
    out: list[tuple[str | None, int, int]] = []
    for r in rows:
        b = r.const
        free: str | None = None
        a = 0
        for k, c in r.coefs:
            if k in fixed:
                b += c * fixed[k]
            else:
                free, a = k, c
        if free is None:
            if not r.lo <= b <= r.hi or b % r.div:
                return None
        else:
            # r.lo <= a*x + b <= r.hi
            p, q = r.lo - b, r.hi - b
            lo, hi = (-((-p) // a), q // a) if a > 0 else (-((-q) // a), p // a)
            cur = box[free]
            cur[0] = max(cur[0], lo)
            cur[1] = min(cur[1], hi)
            if cur[0] > cur[1]:
                return None
        out.append((free, a, b // r.div if free is None else b))
    return out


def _view(arr: np.ndarray, dims: list[tuple[str | None, int, int]],
          box: Mapping[str, list[int]]) -> tuple[np.ndarray, list[str]]:
    """Basic-indexing view of one access: a stepped slice per free dimension, an int otherwise."""
    key: list[slice | int] = []
    axes: list[str] = []
    for free, a, b in dims:
        if free is None:
            key.append(b)
            continue
        lo, hi = box[free]
        start, stop = a * lo + b, a * hi + b + (1 if a > 0 else -1)
        key.append(slice(start, stop if stop >= 0 else None, a))
        axes.append(free)
    return arr[tuple(key)], axes


def _output_target(dims: list[tuple[str | None, int, int]], box: Mapping[str, list[int]],
                   order: list[str]) -> tuple:
    """Index into the accumulator for the output access; fancy indexing where one index fills
    several dimensions (a diagonal), so the selection's axes are `order` either way."""
    frees = [f for f, _, _ in dims if f is not None]
    if len(set(frees)) == len(frees):
        key: list[slice | int] = []
        for free, a, b in dims:
            if free is None:
                key.append(b)
                continue
            lo, hi = box[free]
            stop = a * hi + b + (1 if a > 0 else -1)
            key.append(slice(a * lo + b, stop if stop >= 0 else None, a))
        return tuple(key)
    fancy: list[np.ndarray | int] = []
    for free, a, b in dims:
        if free is None:
            fancy.append(b)
            continue
        lo, hi = box[free]
        shape = [1] * len(order)
        shape[order.index(free)] = hi - lo + 1
        fancy.append((a * np.arange(lo, hi + 1) + b).reshape(shape))
    return tuple(fancy)


def fast(op: ir.Contraction, tensors: Mapping[str, ir.Tensor],
         arrays: Mapping[str, np.ndarray], bounds: Mapping[str, tuple[int, int]],
         plan: FastPlan, acc: np.ndarray, covered: np.ndarray) -> None:
    groups = _all_rows(op, tensors)
    rows = [r for g in groups for r in g]
    cuts = np.cumsum([len(g) for g in groups]).tolist()
    letter = {k: _LETTERS[i] for i, k in enumerate(plan.free)}
    use_einsum = op.agg == "+" and op.comb in (None, "*")
    for fixed in _assignments(plan, bounds):
        box = {k: list(bounds[k]) for k in plan.free}
        dims = _free_ranges(rows, fixed, box)
        if dims is None:
            continue
        per_group = [dims[s:e] for s, e in zip([0, *cuts[:-1]], cuts, strict=True)]
        out_order = list(dict.fromkeys(f for f, _, _ in per_group[0] if f is not None))
        views = [_view(arrays[a.tensor], d, box) for a, d in zip(op.inputs, per_group[1:-1],
                                                                 strict=True)]
        in_free = {f for _, axes in views for f in axes}
        red = [k for k in plan.free if k not in out_order]
        length = {k: box[k][1] - box[k][0] + 1 for k in plan.free}
        if use_einsum:
            result = _einsum_values(views, out_order, in_free, red, length, letter, acc.dtype)
        else:
            result = _broadcast_values(op, views, out_order, red, length, letter, acc.dtype)
        target = _output_target(per_group[0], box, out_order)
        _accumulate(op.agg, acc, target, result)
        covered[target] = True


def _einsum_values(views: list[tuple[np.ndarray, list[str]]], out_order: list[str],
                   in_free: set[str], red: list[str], length: Mapping[str, int],
                   letter: Mapping[str, str], dt: np.dtype) -> np.ndarray:
    present = [k for k in out_order if k in in_free]
    spec = ",".join("".join(letter[k] for k in axes) for _, axes in views)
    spec += "->" + "".join(letter[k] for k in present)
    ops = [v.astype(dt) for v, _ in views]
    value = np.einsum(spec, *ops, optimize=len(ops) > 1)
    # Indices that no operand reads still count points: a sum over them multiplies.
    mult = math.prod(length[k] for k in red if k not in in_free)
    if mult != 1:
        value = value * mult
    shape = [length[k] if k in in_free else 1 for k in out_order]
    return np.broadcast_to(value.reshape(shape), [length[k] for k in out_order])


def _broadcast_values(op: ir.Contraction, views: list[tuple[np.ndarray, list[str]]],
                      out_order: list[str], red: list[str], length: Mapping[str, int],
                      letter: Mapping[str, str], dt: np.dtype) -> np.ndarray:
    order = out_order + red
    vals = []
    for v, axes in views:
        distinct = [k for k in order if k in axes]
        spec = "".join(letter[k] for k in axes) + "->" + "".join(letter[k] for k in distinct)
        arr = np.einsum(spec, v) if len(distinct) != len(axes) or axes != distinct else v
        vals.append(arr.reshape([length[k] if k in axes else 1 for k in order]))
    full = np.broadcast_to(combine(op.comb, vals, dt), [length[k] for k in order])
    axes_red = tuple(range(len(out_order), len(order)))
    if not axes_red:
        return full
    if op.agg == "+":
        return full.sum(axis=axes_red)
    if op.agg == "*":
        return full.prod(axis=axes_red)
    if op.agg == ">":
        return full.max(axis=axes_red)
    if op.agg == "<":
        return full.min(axis=axes_red)
    return full[(Ellipsis,) + (-1,) * len(axes_red)]


def _accumulate(agg: str, acc: np.ndarray, target: tuple, value: np.ndarray) -> None:
    # Within one assignment each output element is hit once, so plain indexing is safe.
    if agg == "+":
        acc[target] += value
    elif agg == "*":
        acc[target] *= value
    elif agg == ">":
        acc[target] = np.maximum(acc[target], value)
    elif agg == "<":
        acc[target] = np.minimum(acc[target], value)
    else:
        acc[target] = value
