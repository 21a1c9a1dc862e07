"""Fuzzing: mutated valid programs, grammar-token soup and random valid programs go through
every stage that needs no device (parse, check, the numpy reference, flatten and fuse, the tile
search, schedule and codegen).  Only a `TileError` may come out, and one that points into the
text must point inside it.

Each test runs `--fuzz-inputs` examples (300 in CI); the full run is
`pytest tests/test_fuzz.py --fuzz-inputs 7000` (21,000 inputs)."""

from __future__ import annotations

import re
from math import prod

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilec
from tilec.codegen.generate import generate
from tilec.config import Config
from tilec.errors import TileCheckError, TileError, TileSyntaxError
from tilec.lang import ir
from tilec.lang.reference import evaluate_program, index_bounds, random_array
from tilec.plan.fuse import ContractionKernel, plan_kernels
from tilec.plan.hw import HwModel, list_models

from .kernel_cases import CASES, INT_CASES
from .lang.test_parse import TOKENS
from .progen import (
    HW_MODELS,
    OPENCL_NAMES,
    TALLY,
    DrawPicker,
    RandomPicker,
    choose,
    contraction_program,
)

# Work limits for the stages after check: a mutation can turn a size into 10**9, and the
# reference would then enumerate that many points (a test-harness limit, not a tilec one).
MAX_ELEMENTS = 20_000
MAX_POINTS = 200_000

# Codegen alone needs no device: every shipped hardware model.
ALL_MODELS = tuple(list_models())
CORPUS = [(src, shapes, "float32") for src, shapes in CASES.values()] + \
    [(src, shapes, "int32") for src, shapes in INT_CASES.values()]

_TOKEN = re.compile(r"\s+|//[^\n]*|/\*.*?\*/|[A-Za-z_][A-Za-z0-9_]*|[0-9]*\.[0-9]+(?:[eE][-+]?"
                    r"[0-9]+)?|[0-9]+|->|==|!=|<=|>=|&&|\|\||<<|>>|\[\[|\]\]|.", re.S)
NUMBERS = ["0", "1", "2", "3", "7", "-1", "100", "4294967296", "99999999999999999999", "0.0",
           "2.5", "1e39", "1e-45", ".5"]
OPERATORS = ["+", "-", "*", "/", "<", ">", "==", "!=", "<=", ">=", "&&", "||", "&", "|", "^",
             "<<", ">>", "?", ":", "="]
VOCAB = TOKENS + list(OPENCL_NAMES) + NUMBERS + ["function", "default", "no_defract", "M", "N",
                                                 "K", "i", "j", "k", "x", "relu", "as_int"]
SETTINGS = {"deadline": None, "database": None,
            "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.filter_too_much,
                                      HealthCheck.large_base_example]}


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


@st.composite
def mutated(draw) -> tuple[str, dict, str]:
    """A corpus program (or a freshly generated one) with a few token edits and, sometimes, an
    edited shape."""
    if draw(st.booleans()):
        src, shapes, dtype = draw(st.sampled_from(CORPUS))
    else:
        # A seed rather than a DrawPicker: hypothesis's per-draw cost would dominate the run.
        g = contraction_program(RandomPicker(draw(st.integers(0, 2**32))))
        src, shapes, dtype = g.text, g.shapes, g.dtype
    toks = tokens(src)
    words = [t for t in toks if t.strip()]
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 2, 3]))):
        if not toks:
            break
        k = draw(st.integers(0, len(toks) - 1))
        # Mostly edits that keep the text parseable, so that check and the later stages see it.
        op = draw(st.sampled_from(["own", "own", "own", "number", "number", "operator",
                                   "operator", "drop", "dup", "swap", "vocab", "insert",
                                   "truncate"]))
        if op == "operator":
            ops = [i for i, t in enumerate(toks) if t in OPERATORS]
            if ops:
                toks[draw(st.sampled_from(ops))] = draw(st.sampled_from(OPERATORS))
        elif op == "drop":
            toks.pop(k)
        elif op == "dup":
            toks.insert(k, toks[k])
        elif op == "swap" and k + 1 < len(toks):
            toks[k], toks[k + 1] = toks[k + 1], toks[k]
        elif op == "own":
            names = [i for i, t in enumerate(toks) if t[:1].isalpha() or t[:1] == "_"]
            if names:
                toks[draw(st.sampled_from(names))] = draw(st.sampled_from(
                    [w for w in words if w[:1].isalpha() or w[:1] == "_"]))
        elif op == "vocab":
            toks[k] = draw(st.sampled_from(VOCAB))
        elif op == "insert":
            toks.insert(k, " " + draw(st.sampled_from(VOCAB)) + " ")
        elif op == "number":
            nums = [i for i, t in enumerate(toks) if t[:1].isdigit()]
            if nums:
                toks[draw(st.sampled_from(nums))] = draw(st.sampled_from(NUMBERS))
        elif op == "truncate":
            toks = toks[:k]
    shapes = dict(shapes)
    if shapes and draw(st.integers(0, 3)) == 0:
        name = draw(st.sampled_from(sorted(shapes)))
        edit = draw(st.sampled_from(["drop", "rank+", "rank-", "size", "extra", "junk"]))
        dims = list(shapes[name])
        if edit == "drop":
            del shapes[name]
        elif edit == "rank+":
            shapes[name] = tuple(dims + [draw(st.integers(1, 4))])
        elif edit == "rank-":
            shapes[name] = tuple(dims[:-1])
        elif edit == "size" and dims:
            dims[draw(st.integers(0, len(dims) - 1))] = draw(st.sampled_from([0, -1, 1, 2, 13]))
            shapes[name] = tuple(dims)
        elif edit == "extra":
            shapes["Zz"] = (2,)
        else:
            shapes[name] = draw(st.sampled_from([("a",), (2.5,), None, 3]))
    return "".join(toks), shapes, dtype


def _statements(src: str) -> list[str]:
    body = src[src.index("{") + 1:src.rindex("}")]
    return [s.strip() for s in body.split(";") if s.strip()]


STATEMENTS = sorted({s for src, _, _ in CORPUS for s in _statements(src)})
HEADERS = sorted({src[:src.index("->")] for src, _, _ in CORPUS})


@st.composite
def soup(draw) -> tuple[str, dict, str]:
    """Tokens of the real programs in random order (more of it parses than of plain text), or
    their statements under another program's header (all of it parses: check's turn)."""
    src, shapes, dtype = draw(st.sampled_from(CORPUS))
    if draw(st.booleans()):
        stmts = draw(st.lists(st.sampled_from(STATEMENTS), min_size=1, max_size=4))
        outs = [re.match(r"[A-Za-z_]\w*", s).group(0) for s in stmts]  # type: ignore[union-attr]
        outs = draw(st.lists(st.sampled_from(outs + ["A", "O"]), min_size=1, max_size=3))
        head = draw(st.sampled_from(HEADERS + [src[:src.index("->")]]))
        body = "".join(f"\n  {s};" for s in stmts)
        return f"{head}-> ({', '.join(outs)}) {{{body}\n}}\n", shapes, dtype
    words = [t for t in tokens(src) if t.strip()]
    n = draw(st.integers(1, 60))
    picked = draw(st.lists(st.sampled_from(words + VOCAB), min_size=n, max_size=n))
    head = draw(st.sampled_from(["", "function (A[M, K], B[K, N]) -> (C) {",
                                 src[:src.index("{") + 1]]))
    sep = draw(st.sampled_from([" ", "", "\n"]))
    return head + sep.join(picked) + draw(st.sampled_from(["", "}", ";}"])), shapes, dtype


def assert_inside(err: TileError, text: str, *, located: bool) -> None:
    if err.line is None:
        assert not located, f"a parse/check error without a line: {err}"
        return
    lines = text.split("\n")
    assert 1 <= err.line <= len(lines), (err.line, err.col, str(err))
    assert 1 <= err.col <= len(lines[err.line - 1]) + 1, (err.line, err.col, str(err))
    if located:  # later stages carry the span but not always the source
        assert str(err).startswith(f"fuzz.tile:{err.line}:{err.col}: "), str(err)


def small(program: ir.Program) -> bool:
    if any(t.size > MAX_ELEMENTS for t in program.tensors.values()):
        return False
    for op in program.ops:
        if isinstance(op, ir.Contraction):
            try:
                box = index_bounds(op, program.tensors)
            except TileError:
                return True  # the reference raises it again, which is what is under test
            if prod(max(0, hi - lo + 1) for lo, hi in box.values()) > MAX_POINTS:
                return False
    return True


def through_every_stage(text: str, shapes, dtype: str, hw: str, seed: int) -> str:
    """Run the device-free pipeline; returns how far it got (for the statistics)."""
    from tilec.errors import Source

    src = Source(text, "fuzz.tile")
    try:
        program = tilec.check_program(src, shapes, dtype)
    except TileError as e:
        assert_inside(e, text, located=True)
        return "rejected by parse" if isinstance(e, TileSyntaxError) else "rejected by check"
    if not small(program):
        return "checked (too large to evaluate)"
    try:
        rng = np.random.default_rng(seed)
        arrays = {n: random_array(rng, program.tensors[n].shape, program.tensors[n].dtype)
                  for n in program.inputs}
        evaluate_program(program, arrays)
    except TileError as e:
        assert_inside(e, text, located=False)
        return "rejected by the reference"
    try:
        plan = plan_kernels(program)
        generate(plan, HwModel.load(hw), Config(top_k=2))
    except TileError as e:
        assert_inside(e, text, located=False)
        return "rejected by flatten/fuse/codegen"
    return "compiled"


@given(case=mutated(), hw=st.sampled_from(HW_MODELS), seed=st.integers(0, 3))
def _mutated(case, hw, seed):
    text, shapes, dtype = case
    TALLY["fuzz: mutated programs"] += 1
    TALLY[f"fuzz: mutated, {through_every_stage(text, shapes, dtype, hw, seed)}"] += 1


def test_mutated_programs_raise_only_located_tile_errors(fuzz_inputs: int) -> None:
    settings(max_examples=fuzz_inputs, **SETTINGS)(_mutated)()


@given(case=soup(), hw=st.sampled_from(HW_MODELS))
def _soup(case, hw):
    text, shapes, dtype = case
    TALLY["fuzz: token soup"] += 1
    TALLY[f"fuzz: soup, {through_every_stage(text, shapes, dtype, hw, 0)}"] += 1


def test_token_soup_raises_only_located_tile_errors(fuzz_inputs: int) -> None:
    settings(max_examples=fuzz_inputs, **SETTINGS)(_soup)()


@st.composite
def valid_with_config(draw):
    g = contraction_program(DrawPicker(draw))
    return g, DrawPicker(draw)


@given(case=valid_with_config())
def _valid(case):
    """Valid random programs with random forced tiles, widths, staging and thread budgets:
    every stage up to the OpenCL text, and the text declares what the launch needs."""
    g, picker = case
    TALLY["fuzz: generated programs"] += 1
    try:
        plan = plan_kernels(tilec.check_program(g.text, g.shapes, g.dtype))
    except TileCheckError as e:  # e.g. a division the defract rewrite does not handle
        assert_inside(e, g.text, located=False)
        TALLY["fuzz: generated, rejected by check/fuse"] += 1
        return
    choice = choose(picker, plan, ALL_MODELS)
    sources, _ = generate(plan, HwModel.load(choice.hw), Config(**choice.config_kwargs()))
    for s in sources:
        assert f"void {s.name}(" in s.text
        if s.local_size:
            assert s.global_size % s.local_size == 0, s.name
            assert f"reqd_work_group_size({s.local_size}, 1, 1)" in s.text, s.name
    kernels = [k for k in plan.kernels if isinstance(k, ContractionKernel)]
    assert len([s for s in sources if s.kind == "contraction"]) == len(kernels)


def test_generated_programs_compile_to_opencl_text(fuzz_inputs: int) -> None:
    settings(max_examples=fuzz_inputs, **SETTINGS)(_valid)()
