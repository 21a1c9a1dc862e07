"""The cost model: PlaidML's score on GPUs (seed 001's log, number for number) and the CPU model."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tilec
from tilec.plan.cost import cost_from_many, score, score_many
from tilec.plan.flat import FlatContraction, FlatTensor
from tilec.plan.hw import HwModel

from ..flats import matmul_flat, seed_flat

SEED_HW = HwModel.load("seed-example")
CPU = HwModel.load("pocl-cpu")

# Seed 001's cost log, verbatim.
SEED_LOG = """\
Computing cost for tile size: [8, 32, 1, 3, 16, 8, 2]
  Compute score: to=236760072192 wg=12544 il=24 sm=20656 or=32768 mr=19456 mw=32768 op=256 rp=0 tu=256
  over memory
Computing cost for tile size: [8, 32, 1, 3, 16, 4, 4]
  Compute score: to=236760072192 wg=12544 il=24 sm=16272 or=32768 mr=15360 mw=32768 op=256 rp=0 tu=256
  over regs
Computing cost for tile size: [16, 32, 1, 1, 16, 2, 2]
  Compute score: to=236760072192 wg=50176 il=36 sm=6488 or=8192 mr=6144 mw=8192 op=256 rp=0 tu=256
  flops_per_byte=20.5714 occupancy=20
  roof_ratio=1 occ_ratio=1 thread_ratio=1 score=1
Computing cost for tile size: [8, 32, 2, 1, 16, 2, 2]
  Compute score: to=236760072192 wg=50176 il=48 sm=5264 or=8192 mr=5120 mw=8192 op=256 rp=0 tu=256
  flops_per_byte=18.5806 occupancy=20
  roof_ratio=0.929032 occ_ratio=1 thread_ratio=1 score=0.929032
"""  # noqa: E501
SEED_TILES = [(8, 32, 1, 3, 16, 8, 2), (8, 32, 1, 3, 16, 4, 4), (16, 32, 1, 1, 16, 2, 2),
              (8, 32, 2, 1, 16, 2, 2)]


def test_seed_log_number_for_number() -> None:
    flat = seed_flat()
    text = "".join(score(flat, t, SEED_HW, post_ops=2).log_text() + "\n" for t in SEED_TILES)
    assert text == SEED_LOG


def test_seed_statuses_and_stats() -> None:
    flat = seed_flat()
    over_mem, over_regs, best, second = (score(flat, t, SEED_HW, 2) for t in SEED_TILES)
    assert (over_mem.status, over_mem.score) == ("over memory", -1.0)
    assert (over_regs.status, over_regs.regs) == ("over regs", 32768)
    assert best.to == 59190018048 * 4
    assert (best.occupancy, best.roof_ratio, best.score) == (20, 1, 1)
    assert second.roof_ratio == pytest.approx(18.5806 / 20, rel=1e-5)


def test_seed_choice_scores_one() -> None:
    c = score(seed_flat(), (8, 32, 2, 3, 16, 2, 2), SEED_HW, 2)
    assert c.ok and c.score == 1.0
    assert (c.il, c.sm, c.mr, c.or_, c.mw, c.wg) == (16, 12648, 12288, 8192, 8192, 50176)
    assert c.flops_per_byte == pytest.approx(23.04, abs=1e-12)


def test_to_json_record() -> None:
    c = score(seed_flat(), (8, 32, 2, 3, 16, 2, 2), SEED_HW, 2)
    rec = json.loads(json.dumps(c.to_json()))
    assert rec["version"] == 1
    assert rec["tile"] == {"ci": 8, "co": 32, "i": 2, "j": 3, "n": 16, "x": 2, "y": 2}
    assert (rec["or"], rec["sm"], rec["status"], rec["score"]) == (8192, 12648, "ok", 1.0)
    assert rec["hw"] == "seed-example"


def test_post_ops_and_post_inputs() -> None:
    flat = seed_flat()
    t = (8, 32, 2, 3, 16, 2, 2)
    plain = score(flat, t, SEED_HW, 0)
    assert plain.to == 59190018048 * 2
    bias = score(flat, t, SEED_HW, 2, post_inputs=1)
    assert bias.mr == plain.mr + (32 // 8) * 16 * 2 * 2 * 4  # one bias element per output


# -- the vectorised score agrees with the scalar one ------------------------------------------

def _agree(flat: FlatContraction, hw: HwModel, tiles: np.ndarray, post_ops: int = 0) -> None:
    stats = score_many(flat, tiles, hw, post_ops)
    for i in range(tiles.shape[0]):
        assert cost_from_many(flat, hw, tiles, stats, i) == score(flat, tiles[i], hw, post_ops)


@pytest.mark.parametrize("model", ["seed-example", "nvidia-h100", "mali-g52", "pocl-cpu"])
def test_score_many_equals_score_seed_conv(model: str) -> None:
    hw = HwModel.load(model)
    flat = seed_flat()
    rng = np.random.default_rng(1)
    tiles = np.stack([rng.integers(1, r + 1, size=150) for r in flat.ranges], axis=1)
    # Small, plausible tiles too, so that "ok" tiles are well represented.
    small = np.stack([np.minimum(r, 2 ** rng.integers(0, 6, size=150)) for r in flat.ranges],
                     axis=1)
    _agree(flat, hw, np.concatenate([tiles, small]), post_ops=2)


@st.composite
def flats(draw: st.DrawFn) -> FlatContraction:
    k = draw(st.integers(1, 4))
    names = tuple("abcd"[:k])
    ranges = tuple(draw(st.integers(1, 12)) for _ in range(k))
    outs = draw(st.lists(st.booleans(), min_size=k, max_size=k))
    strides = [0] * k
    step = 1
    for j in range(k - 1, -1, -1):  # row-major over the output indices
        if outs[j]:
            strides[j] = step
            step *= ranges[j]
    tensors = [FlatTensor("O", tuple(strides), 0)]
    for name in "AB"[: draw(st.integers(1, 2))]:
        s = tuple(draw(st.sampled_from([0, 1, -1, 2, 3, 4, 8, 12, -16, 100])) for _ in range(k))
        tensors.append(FlatTensor(name, s, 0))
    return FlatContraction(names, ranges, tuple(tensors))


@st.composite
def hw_models(draw: st.DrawFn) -> HwModel:
    kind = draw(st.sampled_from(["gpu", "cpu"]))
    l1 = draw(st.sampled_from([1024, 4096, 32768]))
    staging = "global" if kind == "cpu" else draw(st.sampled_from(["local", "global"]))
    return HwModel(
        name="random", kind=kind, threads=draw(st.sampled_from([1, 2, 4, 16, 64, 256])),
        mem_width=draw(st.sampled_from([4, 8, 32, 64, 128])),
        max_mem=draw(st.integers(1, 20000)), max_regs=draw(st.integers(1, 20000)),
        goal_groups=draw(st.integers(1, 64)),
        goal_flops_per_byte=draw(st.floats(0.25, 64.0)), staging=staging,
        vec_size=draw(st.sampled_from([1, 2, 4, 8, 16])),
        registers=draw(st.integers(3, 32)) if kind == "cpu" else 0,
        l1_bytes=l1, l2_bytes=l1 * draw(st.sampled_from([2, 8, 32])))


@given(flats(), hw_models(), st.integers(0, 2**31), st.integers(0, 3))
@settings(max_examples=120, deadline=None)
def test_score_many_equals_score_random(flat: FlatContraction, hw: HwModel, seed: int,
                                        post_ops: int) -> None:
    rng = np.random.default_rng(seed)
    tiles = np.stack([rng.integers(1, r + 1, size=12) for r in flat.ranges], axis=1)
    _agree(flat, hw, tiles, post_ops)


# -- the CPU model -----------------------------------------------------------------------------

def test_cpu_never_over_memory_and_no_local_memory() -> None:
    flat = matmul_flat(512, 512, 512)
    for t in [(512, 4, 16), (512, 512, 512), (1, 1, 1)]:
        c = score(flat, t, CPU)
        assert c.sm == 0 and c.status != "over memory"


def test_cpu_register_limits() -> None:
    flat = matmul_flat(512, 512, 512)
    fits = score(flat, (256, 4, 16), CPU)
    # 4x2 accumulators, a row of B (two vectors) kept, A's four broadcasts streamed through
    # one register (each meets both B vectors, then dies)
    assert fits.ok and fits.vregs == 8 + 2 + 1
    blas = score(flat, (256, 6, 16), CPU)  # the BLAS kernels' 6x16 tile on 16 AVX2 registers
    assert blas.ok and blas.vregs == 12 + 2 + 1
    too_many = score(flat, (256, 8, 16), CPU)  # 16 accumulator registers alone fill AVX2
    assert too_many.status == "over regs"


def test_cpu_penalises_ragged_vectors() -> None:
    flat = matmul_flat(480, 480, 480)
    whole = score(flat, (240, 2, 16), CPU)
    ragged = score(flat, (240, 2, 12), CPU)  # 12 columns: the code falls back to 4-lane vectors
    assert whole.ok and ragged.ok
    assert whole.compute_ratio > ragged.compute_ratio
    assert whole.score > ragged.score


def test_cpu_chunk_beyond_l1_is_penalised() -> None:
    flat = matmul_flat(512, 512, 512)
    fits = score(flat, (256, 4, 16), CPU)
    spills = score(flat, (512, 4, 16), CPU)
    assert fits.mr <= CPU.max_mem < spills.mr
    assert spills.cache_ratio < 1 == fits.cache_ratio
    assert fits.score > spills.score


def test_cpu_log_has_cpu_line() -> None:
    text = score(matmul_flat(64, 64, 64), (64, 4, 16), CPU).log_text().splitlines()
    assert text[0] == "Computing cost for tile size: [64, 4, 16]"
    assert text[2].startswith("  cpu: vregs=11 ")
    avx512 = dataclasses.replace(CPU, vec_size=16, registers=32, max_regs=2048)
    assert score(matmul_flat(64, 64, 64), (64, 8, 32), avx512).ok


def test_cpu_stride_two_reads_are_vectors() -> None:
    """A stride-2 window's columns along the vector index are read as vectors (two reads and
    a shuffle), not lane by lane: a first convolution's 8 x 8 tile fits 16 registers."""
    src = """function (I[N, CI, H, W], F[CO, CI, KH, KW]) -> (O) {
      O[n, co, x0, x1 : N, CO, 111, 111] = +(I[n, ci, 2*x0 + k0, 2*x1 + k1] * F[co, ci, k0, k1]);
    }"""
    from tilec.plan.fuse import plan_kernels

    program = tilec.check_program(src, {"I": (1, 3, 224, 224), "F": (64, 3, 3, 3)}, "float32")
    flat = plan_kernels(program).kernels[0].flat
    tile = tuple({"ci": 3, "co": 8, "k0": 3, "k1": 3, "x0": 1, "x1": 8}[n] for n in flat.names)
    c = score(flat, tile, dataclasses.replace(CPU, vec_size=8, registers=16))
    assert c.ok and c.vregs == 8 + 1 + 1, c  # 8 accumulators, the input vector, a weight
