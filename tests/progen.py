"""Random Tile programs for the differential, fuzz and oclgrind runs.

A generator draws through a `Picker`, so one generator serves a seeded `random.Random` (the
differential run: program N is the same on every machine) and hypothesis (the fuzz run, which
then shrinks what it finds).  Programs are Tile *text*, so that every stage (parse, check,
flatten, fuse, search, schedule, codegen) runs on them, with tiny shapes (every dimension 1..9).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

# What the randomised tests did (inputs run, programs compared, skips by reason); the conftest
# prints it at the end of the session.
TALLY: Counter[str] = Counter()

# Identifiers that mean something to OpenCL C (keywords, types, builtins) or that look like the
# generated kernel's own variables: Tile programs may use any of them as names.
OPENCL_NAMES = (
    "int", "float", "half", "kernel", "local", "global", "constant", "private", "void", "const",
    "restrict", "if", "for", "while", "return", "sizeof", "double", "char", "uchar", "bool",
    "size_t", "exp", "max", "fma", "select", "clamp", "vload4", "barrier", "get_local_id",
    "INFINITY", "NAN", "true", "main", "o", "oe", "v", "e", "g", "rest", "grp", "thr", "gid",
    "a_0", "x0", "s_0", "b_A", "i_x", "c0", "sb0", "hit_0", "r_k", "u_k",
)
INDEX_NAMES = ("i", "j", "k", "l", "x", "y", "z", "n", "c", "w")
TENSOR_NAMES = ("A", "B", "C", "D", "E", "F", "G", "H", "P", "Q", "R", "T")
# Program N's configuration is drawn from seed N + CHOICE_SALT.
CHOICE_SALT = 1_000_003
HW_MODELS = ("pocl-cpu", "nvidia-h100", "seed-example")
VECTOR_WIDTHS = (1, 2, 4, 8, 16)
THREADS = (1, 2, 4, 8, 16, 32, 64)
# Split reductions (`Config.split_reduction`): automatic, off, forced, forced with N threads.
SPLITS = (None, None, False, True, 2, 8)


class Picker(Protocol):
    def int(self, lo: int, hi: int) -> int: ...  # inclusive
    def pick(self, seq: Sequence[T]) -> T: ...
    def chance(self, p: float) -> bool: ...


class RandomPicker:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def pick(self, seq: Sequence[T]) -> T:
        return seq[self.rng.randrange(len(seq))]

    def chance(self, p: float) -> bool:
        return self.rng.random() < p


class DrawPicker:
    """A picker over hypothesis's `draw`, so failures shrink to small choices."""

    def __init__(self, draw: Callable[[Any], Any]):
        from hypothesis import strategies as st

        self.draw = draw
        self.st = st

    def int(self, lo: int, hi: int) -> int:
        return self.draw(self.st.integers(lo, hi))

    def pick(self, seq: Sequence[T]) -> T:
        return self.draw(self.st.sampled_from(seq))

    def chance(self, p: float) -> bool:
        # Shrinks towards False: the rarer feature goes away first.
        return self.draw(self.st.integers(0, 999)) >= (1 - p) * 1000


@dataclass(frozen=True)
class Generated:
    text: str
    shapes: dict[str, tuple[int, ...]]
    dtype: str
    features: tuple[str, ...] = ()  # what the program exercises, for the run's statistics


@dataclass
class _Poly:
    terms: list[tuple[int, str]]
    off: int = 0
    div: int = 1  # > 1: `(poly) / div`, only the points where it divides exactly (defract)

    def text(self) -> str:
        out = ""
        for c, v in self.terms:
            term = v if abs(c) == 1 else f"{abs(c)}*{v}"
            if not out:
                out = term if c > 0 else f"-{term}"
            else:
                out += f" + {term}" if c > 0 else f" - {term}"
        if self.off or not out:
            if not out:
                out = str(self.off)
            else:
                out += f" + {self.off}" if self.off > 0 else f" - {-self.off}"
        return f"({out}) / {self.div}" if self.div > 1 else out

    def raw(self, point: dict[str, int]) -> int:
        return self.off + sum(c * point[v] for c, v in self.terms)

    def at(self, point: dict[str, int]) -> int:
        return self.raw(point) // self.div

    def fit(self, point: dict[str, int], top: int = 8) -> None:
        """Shift the offset so that `point` lands on a whole index in 0..top."""
        raw = self.raw(point)
        self.off += min(max(raw // self.div, 0), top) * self.div - raw

    def span(self, ranges: dict[str, int]) -> tuple[int, int]:
        lo = hi = self.off
        for c, v in self.terms:
            top = c * (ranges[v] - 1)
            lo += min(0, top)
            hi += max(0, top)
        return lo // self.div, hi // self.div


@dataclass
class _Program:
    dtype: str
    inputs: list[tuple[str, list[str]]] = field(default_factory=list)  # name, header dims
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    body: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    features: list[str] = field(default_factory=list)
    symbols: dict[str, int] = field(default_factory=dict)

    def text(self) -> str:
        ins = ", ".join(f"{n}[{', '.join(d)}]" if d is not None else n for n, d in self.inputs)
        body = "\n".join(f"  {s}" for s in self.body)
        return f"function ({ins}) -> ({', '.join(self.outputs)}) {{\n{body}\n}}\n"


def _names(p: Picker, pool: Sequence[str], n: int, taken: set[str], odd: float) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        name = p.pick(OPENCL_NAMES) if p.chance(odd) else p.pick(pool)
        if name not in taken:
            taken.add(name)
            out.append(name)
    return out


def contraction_program(p: Picker) -> Generated:
    """One contraction with random ranks, index polynomials (offsets, strides, dilations),
    constraints, aggregation and combination, then random elementwise post-ops."""
    dtype = p.pick(("float32",) * 6 + ("int32", "int32", "float16"))
    prog = _Program(dtype)
    taken: set[str] = set()
    odd = 0.1  # share of OpenCL words among the names
    n_out, n_red = p.int(1, 3), p.int(0, 3)
    out_idx = _names(p, INDEX_NAMES, n_out, taken, odd)
    red_idx = _names(p, INDEX_NAMES, n_red, taken, odd)
    ranges = {v: p.int(1, 6) for v in out_idx} | {v: p.int(1, 4) for v in red_idx}
    every = out_idx + red_idx
    tnames = _names(p, TENSOR_NAMES, 9, taken, odd)
    sym_count = [0]

    def header_dims(size_list: tuple[int, ...]) -> list[str]:
        dims = []
        for s in size_list:
            if p.chance(0.7):
                sym = f"S{sym_count[0]}"
                sym_count[0] += 1
                prog.symbols[sym] = s
                dims.append(sym)
            else:
                dims.append(str(s))
        return dims

    # Operands ----------------------------------------------------------------------------------
    n_in = p.pick((1, 2, 2, 2, 2, 3))
    comb = {1: None, 2: p.pick(("*", "*", "*", "+", "==")), 3: "?"}[n_in]
    accesses: list[list[_Poly]] = []
    for _ in range(n_in):
        polys = []
        for _ in range(p.int(1, 3)):
            k = p.pick((1, 1, 1, 2, 0)) if every else 0
            vs = [p.pick(every) for _ in range(k)]
            terms = [(p.pick((1, 1, 1, 1, 2, 3, -1)), v) for v in dict.fromkeys(vs)]
            div = p.pick((2, 3)) if terms and p.chance(0.06) else 1
            polys.append(_Poly(terms, p.pick((0, 0, 0, -2, -1, 1, 2)), div))
        accesses.append(polys)
    # Every index must be bounded by the input accesses: a dimension bounds an index once all
    # its other indices are bounded (the checker's propagation).
    for v in every:
        if v not in _bounded(accesses):
            a = accesses[p.int(0, n_in - 1)]
            a.append(_Poly([(1, v)], p.pick((0, 0, 1, -1))))
    # A witness point that every access, output position and constraint admits: without one
    # most programs would have an empty index range (an error, and nothing to compare).
    witness = {v: p.int(0, ranges[v] - 1) for v in every}
    for a in accesses:
        for q in a:
            q.fit(witness)
    if any(q.div > 1 for a in accesses for q in a):
        prog.features.append("defract")
    in_names = tnames[:n_in]
    for name, polys in zip(in_names, accesses, strict=True):
        shape = []
        for q in polys:
            lo, hi = q.span(ranges)
            size = min(9, max(1, hi + 1 + p.pick((0, 0, 0, 0, -1, -2, 1, 2))))
            shape.append(max(size, q.at(witness) + 1))
        prog.shapes[name] = tuple(shape)
        prog.inputs.append((name, header_dims(tuple(shape))))
    if any(q.off < 0 for a in accesses for q in a):
        prog.features.append("padding")
    if any(abs(c) > 1 for a in accesses for q in a for c, v in q.terms if v in out_idx):
        prog.features.append("stride")
    if any(abs(c) > 1 for a in accesses for q in a for c, v in q.terms if v in red_idx):
        prog.features.append("dilation")

    # Output --------------------------------------------------------------------------------------
    out_polys: list[_Poly] = []
    for v in out_idx:
        form = p.pick(("plain",) * 12 + ("double", "plus", "zero"))
        if form == "double":
            out_polys.append(_Poly([(2, v)]))
            prog.features.append("strided-output")
        elif form == "plus":
            out_polys.append(_Poly([(1, v)], 1))
        else:
            out_polys.append(_Poly([(1, v)]))
        if form == "zero" and p.chance(0.5):
            out_polys.append(_Poly([], 0))  # a constant dimension, as in softmax's M[r, 0]
    # Operands of the same shape as the output (a default, post-op operands, a second
    # contraction) need that shape up front: the checker's inference follows clipping.
    want_default, want_post, want_chain = p.chance(0.1), p.chance(0.65), p.chance(0.12)
    sizes_given = (want_default or want_post or want_chain or p.chance(0.6)
                   or any(q.off or abs(q.terms[0][0]) > 1 for q in out_polys if q.terms))
    out_sizes: list[int] = []
    for q in out_polys:
        lo, hi = q.span(ranges)
        out_sizes.append(max(1, q.at(witness) + 1, hi + 1 + p.pick((0, 0, 0, -1, 1, 2))))
    O = tnames[n_in]
    lhs = ", ".join(q.text() for q in out_polys)
    if sizes_given:
        lhs += " : " + ", ".join(_size_text(p, s, prog.symbols) for s in out_sizes)
    agg = p.pick(("+",) * 6 + (">", ">", "<", "*") + (("=",) * 3 if not red_idx else ()))
    if agg == "*" and dtype == "float16":
        agg = "+"
    ops = [f"{n}[{', '.join(q.text() for q in a)}]" for n, a in zip(in_names, accesses,
                                                                    strict=True)]
    operands = {None: lambda: ops[0], "*": lambda: f"{ops[0]} * {ops[1]}",
                "+": lambda: f"{ops[0]} + {ops[1]}", "==": lambda: f"{ops[0]} == {ops[1]}",
                "?": lambda: f"{ops[0]} == {ops[1]} ? {ops[2]}"}[comb]()
    stmt = f"{O}[{lhs}] = {agg}({operands})"
    for _ in range(p.pick((0, 0, 0, 1, 1, 2))):
        vs = list(dict.fromkeys(p.pick(every) for _ in range(p.int(1, 2)))) if every else []
        q = _Poly([(p.pick((1, 1, -1, 2)), v) for v in vs], p.pick((0, 0, 1, -1)))
        if q.at(witness) < 0:  # a constraint `poly < bound` also means 0 <= poly
            q.off -= q.at(witness)
        lo, hi = q.span(ranges)
        bound = max(1, q.at(witness) + 1, p.int(lo + 1, hi + 1))
        stmt += f", {q.text()} < {_size_text(p, bound, prog.symbols)}"
        prog.features.append("constraint")
    if want_default:
        D = tnames[n_in + 1]
        prog.shapes[D] = tuple(out_sizes)
        prog.inputs.append((D, header_dims(tuple(out_sizes))))
        stmt += f" default {D}"
        prog.features.append("default")
    if p.chance(0.05) and not any(q.div > 1 for a in accesses for q in a):
        stmt += " no_defract"
    prog.body.append(stmt + ";")
    prog.features += [dtype, f"agg{agg}", f"comb{comb or '-'}", f"rank{len(out_polys)}"]

    # Post-ops --------------------------------------------------------------------------------
    last = O
    outputs = [O]
    if want_post:
        # An operand that broadcasts to the output: a suffix of its shape, some sizes 1.
        P = tnames[n_in + 2]
        bshape = [1 if p.chance(0.3) else d for d in out_sizes[p.int(0, len(out_sizes)):]]
        prog.shapes[P] = tuple(bshape)
        prog.inputs.append((P, header_dims(tuple(bshape)) if bshape or p.chance(0.5) else None))
        leaves = [O, P]
        R = tnames[n_in + 3]
        prog.body.append(f"{R} = {_expr(p, leaves, dtype, 3, O)};")
        last = R
        outputs = [R]
        prog.features.append("post-op")
        if p.chance(0.3):
            S = tnames[n_in + 4]
            prog.body.append(f"{S} = {_expr(p, [R], dtype, 2, R)};")
            outputs = [S]
            last = S
        if p.chance(0.25):
            outputs.append(O)
    if want_chain:
        # A second contraction reading the first one's result (post-ops keep its shape).
        T = tnames[n_in + 5]
        idx = _names(p, INDEX_NAMES, len(out_sizes), set(), 0.0)
        keep = idx[:-1] if len(idx) > 1 else idx
        agg2 = p.pick(("+", ">", "<"))
        prog.body.append(f"{T}[{', '.join(keep)}] = {agg2}({last}[{', '.join(idx)}]);")
        outputs.append(T)
        prog.features.append("chain")
    prog.outputs = list(dict.fromkeys(outputs))
    if taken & set(OPENCL_NAMES):
        prog.features.append("opencl-name")
    return Generated(prog.text(), dict(prog.shapes), dtype, tuple(dict.fromkeys(prog.features)))


def _bounded(accesses: list[list[_Poly]]) -> set[str]:
    known: set[str] = set()
    changed = True
    while changed:
        changed = False
        for a in accesses:
            for q in a:
                free = {v for _, v in q.terms} - known
                if len(free) == 1:
                    known |= free
                    changed = True
    return known


def _size_text(p: Picker, value: int, symbols: dict[str, int]) -> str:
    """A size as a literal, or as an expression of a size symbol that has some value."""
    if symbols and p.chance(0.3):
        sym = p.pick(sorted(symbols))
        diff = value - symbols[sym]
        if diff == 0:
            return sym
        return f"{sym} + {diff}" if diff > 0 else f"{sym} - {-diff}"
    return str(value)


def _expr(p: Picker, leaves: list[str], dtype: str, depth: int, must: str) -> str:
    """A random elementwise expression over `leaves` that reads `must` at least once."""
    text = _subexpr(p, leaves, dtype, depth)
    if must not in _words(text):
        text = f"({text}) + {must}" if p.chance(0.5) else f"max({text}, {must})"
    return text


def _words(text: str) -> set[str]:
    import re

    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))


def _subexpr(p: Picker, leaves: list[str], dtype: str, depth: int) -> str:
    is_float = dtype != "int32"
    if depth == 0 or p.chance(0.25):
        if p.chance(0.8):
            return p.pick(leaves)
        return p.pick(("0.5", "2.0", "1.5", "-0.25")) if is_float else p.pick(("1", "3", "-2"))
    a = _subexpr(p, leaves, dtype, depth - 1)
    b = _subexpr(p, leaves, dtype, depth - 1)
    unary = ["relu", "abs"]
    binary = ["+", "-", "*", "max", "min", "/"]
    if is_float:
        unary += ["tanh", "sigmoid", "expneg", "sqrtabs"]
    else:
        unary += ["shifts"]
        binary += ["&", "|", "^"]
    # A comparison or truncation on float16 flips on the rounding of the fused (unrounded)
    # intermediate: only where the intermediate is float32 or int32.
    if dtype != "float16":
        binary.append("select")
    if dtype == "float32":
        unary.append("as_int")
    op = p.pick(unary + binary)
    if op == "/":
        # Integer division by zero is defined (0) in Tile; a float denominator stays away from 0.
        return f"({a} / {b})" if not is_float else f"({a} / (abs({b}) + 0.5))"
    if op == "shifts":
        return f"(({a} << 2) >> 1)"
    if op == "as_int":
        return f"as_int({a} * 4.0, 32)"
    if op == "expneg":
        return f"exp(-abs({a}))"
    if op == "sqrtabs":
        return f"sqrt(abs({a}))"
    if op in ("relu", "abs", "tanh", "sigmoid"):
        return f"{op}({a})"
    if op in ("max", "min"):
        return f"{op}({a}, {b})"
    if op == "select":
        return f"({a} > {b} ? {a} : {b} * 0.5)" if is_float else f"({a} > {b} ? {a} : {b})"
    return f"({a} {op} {b})"


# Forced tiles and configurations ---------------------------------------------------------------

@dataclass(frozen=True)
class Choice:
    hw: str
    vector_width: int
    staging: str
    threads: int
    tiles: dict[str, dict[str, int]]
    split_reduction: bool | int | None = None

    def config_kwargs(self) -> dict[str, Any]:
        return {"hw": self.hw, "vector_width": self.vector_width, "staging": self.staging,
                "threads": self.threads, "tiles": self.tiles,
                "split_reduction": self.split_reduction}


def choose(p: Picker, plan, models: Sequence[str] = HW_MODELS) -> Choice:
    """A random hardware model, vector width, staging, thread budget, a forced tile for
    every contraction kernel of `plan` (sizes 1..range, divisors or not), and whether
    reductions are split over threads (automatic, off, forced)."""
    from tilec.plan.fuse import ContractionKernel

    tiles: dict[str, dict[str, int]] = {}
    for k in plan.kernels:
        if isinstance(k, ContractionKernel):
            tile = {}
            for name, r in zip(k.flat.names, k.flat.ranges, strict=True):
                form = p.pick(("any", "any", "full", "one", "pow2"))
                if form == "full":
                    t = r
                elif form == "one":
                    t = 1
                elif form == "pow2":
                    t = min(r, 2 ** p.int(0, 4))
                else:
                    t = p.int(1, r)
                tile[name] = t
            tiles[k.name] = tile
    hw, vec, staging, threads = (p.pick(models), p.pick(VECTOR_WIDTHS),
                                 p.pick(("local", "global")), p.pick(THREADS))
    # Drawn last, so that every earlier choice of a seed stays what it was.
    return Choice(hw, vec, staging, threads, tiles, p.pick(SPLITS))
