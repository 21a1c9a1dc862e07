"""The order of a step's loads and updates (`codegen.stream.streamed`): on CPU models the input
with the most distinct loads is streamed, each of its loads followed by the updates it
completes; GPU models write every load first.  Texts are checked device-free; every CPU kernel
case runs against the numpy reference in test_kernels with this order."""

from __future__ import annotations

import dataclasses
import re

import pytest

import tilec
from tilec.codegen.generate import generate
from tilec.config import Config
from tilec.plan.fuse import plan_kernels
from tilec.plan.hw import HwModel

from ..device import needs_device
from .test_kernels import run_case
from .test_plain_builtins import contraction_texts

NCHW_3X3 = """function (I[N, CI, H, W], F[CO, CI, KH, KW]) -> (O) {
  O[n, co, x0, x1 : N, CO, H, W] = +(I[n, ci, x0 + k0 - 1, x1 + k1 - 1] * F[co, ci, k0, k1]);
}"""
MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }"
DECL = re.compile(r"const (?:float|int)\d* (x\d+(?:_\d+)*) = ")


def avx512_cpu() -> HwModel:
    return dataclasses.replace(HwModel.load("pocl-cpu"), vec_size=16, registers=32)


def innermost_bodies(text: str) -> list[list[str]]:
    """The statement lines of each innermost loop (one without a loop inside)."""
    lines = [x.strip() for x in text.splitlines()]
    out = []
    for n, line in enumerate(lines):
        if not line.startswith("for ("):
            continue
        body, depth = [], 1
        for x in lines[n + 1:]:
            depth += x.count("{") - x.count("}")
            if depth <= 0:
                break
            body.append(x)
        if not any(b.startswith("for (") for b in body):
            out.append(body)
    return out


def streamed_order(body: list[str]) -> tuple[int, int]:
    """(updates, updates written before one of their operands' loads or after a later load of
    the same input): 0 bad where each load is followed by the updates it completes."""
    where = {}
    for n, line in enumerate(body):
        m = DECL.search(line)
        if m:
            where[m.group(1)] = n
    updates = bad = 0
    for n, line in enumerate(body):
        if "fma(" not in line and "mad(" not in line and " * " not in line:
            continue
        names = [x for x in re.findall(r"\b(x\d+(?:_\d+)*)\b", line) if x in where]
        if not names or DECL.search(line):
            continue
        updates += 1
        last = max(names, key=lambda x: where[x])
        same = [v for v in where if v.split("_")[0] == last.split("_")[0]]
        if any(where[x] > n for x in names) or any(where[last] < where[v] < n for v in same):
            bad += 1
    return updates, bad


@pytest.mark.parametrize("src,shapes", [
    (NCHW_3X3, {"I": (1, 64, 14, 14), "F": (64, 64, 3, 3)}),
    (MATMUL, {"A": (96, 256), "B": (256, 256)}),
])
def test_cpu_streams_one_input_through_the_updates(src, shapes):
    """Each streamed load is followed at once by its updates, so one streamed value is live at a
    time (every load first kept half of a 28-accumulator tile on the stack on Zen 4)."""
    texts = contraction_texts(src, shapes, avx512_cpu())
    bodies = [b for t in texts for b in innermost_bodies(t)]
    checked = [streamed_order(b) for b in bodies]
    assert any(u >= 4 for u, _ in checked), bodies
    assert all(bad == 0 for _, bad in checked), bodies


def test_gpu_models_write_every_load_first():
    text = "\n".join(contraction_texts(NCHW_3X3, {"I": (1, 64, 14, 14), "F": (64, 64, 3, 3)},
                                       HwModel.load("nvidia-h100")))
    checked = 0
    for body in innermost_bodies(text):
        first = [n for n, x in enumerate(body) if "fma(" in x or "mad(" in x]
        loads = [n for n, x in enumerate(body) if DECL.search(x)]
        if first and loads:
            assert max(loads) < min(first), body
            checked += 1
    assert checked, text


@needs_device
@pytest.mark.parametrize("src,shapes", [
    (NCHW_3X3, {"I": (1, 64, 14, 14), "F": (64, 64, 3, 3)}),
    (MATMUL, {"A": (96, 256), "B": (256, 256)}),
])
def test_streamed_kernels_compute_the_reference(src, shapes):
    run_case(src, shapes)


POOL_NHWC = """function (I[N, X, Y, C]) -> (O) {
  O[n, x, y, c : N, X / 2, Y / 2, C] = >(I[n, 2*x + i, 2*y + j, c]), i < 2, j < 2;
}"""
POOL_TILE = {"O": {"c": 64, "i": 2, "j": 2, "x": 1, "y": 7}}  # N=1: n is no index
LOAD = re.compile(r"const float16 x0_(\d+)_(\d+)_(\d+) = ")


def test_a_cpu_tile_reads_each_input_in_memory_order():
    """A 2x2 stride-2 pool's tile of 7 pixels x 4 channel vectors (NHWC): the loads go pixel
    by pixel, the four channel vectors of one pixel together, as memory holds them, where the
    point order (channel vector first) would read every other 256 bytes four times over."""
    plan = plan_kernels(tilec.check_program(POOL_NHWC, {"I": (1, 28, 28, 64)}, "float32"))
    sources, _ = generate(plan, avx512_cpu(), Config(use_disk_cache=False, tiles=POOL_TILE))
    (text,) = [s.text for s in sources if s.kind == "contraction"]
    assert "tile: c=64, i=2, j=2, x=1, y=7" in text
    loads = [tuple(map(int, m.groups())) for m in LOAD.finditer(text)]
    assert len(loads) == 28, text  # 4 channel vectors x 7 pixels
    # Names give (channel vector, x, y); memory order is y, then the channel vector.
    assert loads == sorted(loads, key=lambda t: (t[1], t[2], t[0])), loads
    assert loads != sorted(loads), "the point order itself"


@needs_device
def test_memory_ordered_pools_compute_the_reference():
    run_case(POOL_NHWC, {"I": (1, 28, 42, 64)}, tiles=POOL_TILE)
    run_case(POOL_NHWC, {"I": (1, 14, 30, 64)}, tiles=POOL_TILE, seed=3)  # 15 = 2 x 7 + 1
