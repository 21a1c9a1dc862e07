"""Rolled chains: a run of stages that repeats with shifted buffers becomes one loop.

A recurrent layer's chain is the same few stages once a time step: step t reads the gate
weights step t - 1 read, and the slices and scratch tensors of its own step, which lie at
offsets that grow by a fixed amount a step.  Written out, an LSTM of 32 steps is 290 stages of
text that NVIDIA's compiler took 12 s to build (one chain of 160 stages), and the same kernel
is mostly instruction fetches of code run once.  Written as a loop over the steps, the text
(and its build) is one step's.

The rolling works on the stages' text, so it only ever restates what the unrolled kernel
says.  Each stage is its lines with the chain's scratch tensors as their names; a stage's
*shape* is that text with every integer literal and every scratch tensor's name blanked,
its *values* the literals and the tensors' scratch offsets in order.  Stages s .. s + n*p - 1
roll into a loop of n passes over p stages when stage i + t*p has stage i's shape and values
that are stage i's plus t times a fixed step for every t < n: pass t of the loop then reads
exactly the text of the stages it replaces (a literal v that moves by d a pass is written
`v + d * step`, and a scratch tensor that moves gets its pointer at the top of the pass).
Literals inside names (`float4`, `b_const_15`) and floating-point constants are not integer
literals and must match as they are."""

from __future__ import annotations

import re
from dataclasses import dataclass

# Fewest passes worth a loop.
MIN_PASSES = 3
# Longest period tried (stages a pass).
MAX_PERIOD = 64

_INT = re.compile(r"(?<![\w.])\d+(?![\w.])")
_COMMENT = re.compile(r"/\*.*?\*/", re.S)
# A stage's own values (post-ops, elementwise temporaries) are named after their tensors;
# they are local to the stage, so one pass's names serve every pass.
_LOCAL = re.compile(r"\bv_\w+")


def _code(text: str, sub) -> str:
    """`text` with `sub` applied to its code, its comments left as they are."""
    out, at = [], 0
    for m in _COMMENT.finditer(text):
        out += [sub(text[at:m.start()]), m.group(0)]
        at = m.end()
    return "".join(out + [sub(text[at:])])


@dataclass(frozen=True)
class Block:
    """One stage: its title comment (left out of the comparison), its lines (its barrier
    and loop)."""

    comment: str
    lines: tuple[str, ...]

    @property
    def text(self) -> list[str]:
        return [self.comment, *self.lines]


@dataclass(frozen=True)
class _Form:
    shape: int  # the blanked text's number among the chain's distinct ones
    values: tuple[int, ...]


def _form(b: Block, offsets: dict[str, int], pattern: re.Pattern | None,
          shapes: dict[str, int]) -> _Form:
    text = "\n".join(b.lines)
    values: list[int] = []

    def name(m: re.Match) -> str:
        values.append(offsets[m.group(0)])
        return "@"

    def lit(m: re.Match) -> str:
        values.append(int(m.group(0)))
        return "#"

    # Names first, in text order, then literals: both orders are the same for every stage of
    # one shape, which is all the comparison needs.  Comments are not compared.
    if pattern is not None:
        text = _code(text, lambda t: pattern.sub(name, t))
    text = _COMMENT.sub("", _code(text, lambda t: _INT.sub(lit, t)))
    local: dict[str, str] = {}
    text = _LOCAL.sub(lambda m: local.setdefault(m.group(0), f"v_{len(local)}"), text)
    return _Form(shapes.setdefault(text, len(shapes)), tuple(values))


def roll(blocks: list[Block], offsets: dict[str, int], scratch: str
         ) -> tuple[list[str], set[str]]:
    """The stages' lines, with each repeating run as a loop (see the module docstring), and
    the scratch pointers the lines name outside a loop's own declarations (those to declare
    at the top).  `offsets` maps scratch pointer names to their element offsets in `scratch`
    (the scratch buffer's pointer name)."""
    pattern = re.compile(r"\b(" + "|".join(sorted(map(re.escape, offsets), key=len,
                                                  reverse=True)) + r")\b") if offsets else None
    shapes: dict[str, int] = {}
    forms = [_form(b, offsets, pattern, shapes) for b in blocks]
    top: set[str] = set()
    lines = _emit(blocks, forms, 0, len(blocks), scratch, pattern, top)
    return lines, top


def _emit(blocks, forms, lo: int, hi: int, scratch, pattern, top: set[str]) -> list[str]:
    found = _best(forms, lo, hi)
    if found is None:
        if pattern is not None:
            for b in blocks[lo:hi]:
                top.update(pattern.findall("\n".join(b.lines)))
        return [ln for b in blocks[lo:hi] for ln in b.text]
    s, p, n = found
    body = _loop(blocks, forms, s, p, n, scratch, pattern, top)
    return (_emit(blocks, forms, lo, s, scratch, pattern, top) + body
            + _emit(blocks, forms, s + n * p, hi, scratch, pattern, top))


def _best(forms: list[_Form], lo: int, hi: int) -> tuple[int, int, int] | None:
    """(start, period, passes) of the run covering the most stages, or None."""
    best, covered = None, 0
    for p in range(1, min(MAX_PERIOD, (hi - lo) // MIN_PASSES) + 1):
        s = lo
        while s + MIN_PASSES * p <= hi:
            n = _passes(forms, s, p, hi)
            if n >= MIN_PASSES and n * p > covered:
                best, covered = (s, p, n), n * p
            s += max(1, (n - 1) * p) if n >= MIN_PASSES else 1
    return best


def _passes(forms: list[_Form], s: int, p: int, hi: int) -> int:
    """How many passes of period p from s repeat stage s .. s + p - 1 linearly."""
    n = 1
    while s + (n + 1) * p <= hi and all(_repeats(forms, i, p, n) for i in range(s, s + p)):
        n += 1
    return n


def _repeats(forms: list[_Form], i: int, p: int, t: int) -> bool:
    """Stage i + t*p has stage i's shape and its values moved t times the first pass's step."""
    a, b, c = forms[i], forms[i + p], forms[i + t * p]
    return c.shape == a.shape and all(
        vc - va == t * (vb - va) for va, vb, vc in zip(a.values, b.values, c.values, strict=True))


def _loop(blocks, forms, s: int, p: int, n: int, scratch, pattern, top: set[str]
          ) -> list[str]:
    stages = f"{p} stages" if p > 1 else "1 stage"
    lines = [f"/* stages {s + 1} to {s + n * p}: {n} passes of {stages}, each pass's "
             "scratch tensors and offsets a fixed step after the last's (titles: the first "
             "pass's) */",
             f"for (int step = 0; step < {n}; ++step) {{"]
    steps = [[vb - va for va, vb in zip(forms[i].values, forms[i + p].values, strict=True)]
             for i in range(s, s + p)]
    # A scratch tensor named in the loop moves by some step d at each place (0: it stays).
    # It keeps its name where it moves by one step everywhere and never stays; otherwise
    # each moving step gets a pointer of its own (the name alone would shadow the top's).
    found: dict[str, set[int]] = {}
    for i in range(s, s + p):
        names = _names(blocks[i], pattern)
        for nm, d in zip(names, steps[i - s], strict=False):
            found.setdefault(nm, set()).add(d)
    pointer: dict[tuple[str, int], str] = {}
    for nm, ds in found.items():
        if 0 in ds:
            top.add(nm)
        for j, d in enumerate(sorted(d for d in ds if d)):
            pointer[nm, d] = nm if len(ds) == 1 else f"{nm}_{j + 1}"
    body: list[str] = []
    offsets_of: dict[str, int] = {}
    for i in range(s, s + p):
        a = forms[i]
        values = iter(zip(a.values, steps[i - s], strict=True))
        text = "\n".join(blocks[i].lines)

        def name(m: re.Match, values=values) -> str:
            v, d = next(values)
            offsets_of[m.group(0)] = v
            return m.group(0) if not d else pointer[m.group(0), d]

        def lit(m: re.Match, values=values) -> str:
            v, d = next(values)
            if not d:
                return str(v)
            term = _term(v, d)
            return term if term == "step" else f"({term})"

        if pattern is not None:
            text = _code(text, lambda t, name=name: pattern.sub(name, t))
        text = _code(text, lambda t, lit=lit: _INT.sub(lit, t))
        body += [blocks[i].comment, *text.split("\n")]
    decls = [f"    __global float* {var} = {scratch} + {_term(offsets_of[nm], d)};"
             for (nm, d), var in pointer.items()]
    return lines + decls + ["    " + ln for ln in body] + ["}"]


def _names(b: Block, pattern) -> list[str]:
    """The scratch tensors a stage names, in the order its values list them."""
    if pattern is None:
        return []
    found: list[str] = []

    def collect(t: str) -> str:
        found.extend(m.group(0) for m in pattern.finditer(t))
        return t

    _code("\n".join(b.lines), collect)
    return found


def _term(v: int, d: int) -> str:
    step = "step" if d == 1 else f"{d} * step"
    return step if v == 0 else f"{v} + {step}"


__all__ = ["Block", "roll"]
