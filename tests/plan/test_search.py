"""Tile search: ranking, rejection, fallbacks, the cost log."""

from __future__ import annotations

import io
import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilec.errors import TileError
from tilec.plan.cost import Cost, score
from tilec.plan.flat import FlatContraction, FlatTensor
from tilec.plan.hw import HwModel
from tilec.plan.search import candidates, score_tile, search, write_log
from tilec.plan.space import CPU_SIDES, count, cpu_candidates, slides

from ..flats import matmul_flat, seed_flat

SEED_HW = HwModel.load("seed-example")
CPU = HwModel.load("pocl-cpu")


def _rank_key(c: Cost) -> tuple:
    return (-c.score, -c.flops_per_byte)


def test_candidates() -> None:
    assert candidates(224) == [1, 2, 4, 7, 8, 14, 16, 28, 32, 56, 64, 112, 128, 224]
    assert candidates(3) == [1, 2, 3]
    assert candidates(1) == [1]


def test_cpu_register_sides() -> None:
    assert cpu_candidates(56) == [1, 2, 3, 4, 5, 6, 7, 8, 12, 14, 16, 28, 32, 56]
    assert cpu_candidates(4) == [1, 2, 4] and cpu_candidates(1) == [1]
    assert cpu_candidates(13) == [1, 2, 4, 8, 13]  # 5 or 3 would cover 15 (`CPU_SIDE_WASTE`)


def test_sliding_windows() -> None:
    import tilec
    from tilec.plan.fuse import plan_kernels

    def flat(src: str, shapes: dict):
        prog = tilec.check_program(f"function ({src}", shapes, "float32")
        return plan_kernels(prog).kernels[0].flat

    conv = "D[N, X, Y, C], K[I, J, C, F]) -> (O) {{ O[n, x, y, f : N, {o}, {o}, F] = " \
           "+(D[n, {r}, {c}, c] * K[i, j, c, f]); }}"
    shapes = {"D": (1, 8, 8, 4), "K": (3, 3, 4, 8)}
    for o, r, c in (("X", "x+i-1", "y+j-1"), ("6", "x+i", "y+j"), ("3", "2*x+i", "2*y+j")):
        assert slides(flat(conv.format(o=o, r=r, c=c), shapes)), r  # same, valid, strided
    assert not slides(flat(conv.format(o="4", r="x+2*i", c="y+2*j"), shapes))  # dilated
    assert not slides(matmul_flat(64, 64, 64))
    pointwise = "D[N, X, Y, C], W[C, F]) -> (O) { O[n, x, y, f : N, X, Y, F] = " \
                "+(D[n, x, y, c] * W[c, f]); }"
    assert not slides(flat(pointwise, {"D": (1, 8, 8, 4), "W": (4, 8)}))


def test_cpu_search_takes_register_sides_that_do_not_divide_the_range() -> None:
    """The seed conv at N=1 56x56 on an AVX2 model: 12 accumulators (4 vectors of output
    channels by 3 points: 1.60-1.84 ms on a Zen 3 against 2.05 for 2 vectors by 4 points,
    the best tile of powers of two), though 3 does not divide 56.  Pools and copies keep
    their candidates, and so do products without a window."""
    import dataclasses

    import tilec
    from tilec.plan.fuse import plan_kernels

    avx2 = dataclasses.replace(CPU, vec_size=8, registers=16)
    src = """function (D[N, X, Y, CI], K[I, J, CO, CI]) -> (O) {
      O[n, x, y, co : N, X, Y, CO] = +(D[n, x+i-1, y+j-1, ci] * K[i, j, co, ci]);
    }"""
    prog = tilec.check_program(src, {"D": (1, 56, 56, 64), "K": (3, 3, 64, 64)}, "float32")
    conv = plan_kernels(prog).kernels[0].flat
    plan = search(conv, avx2)
    sides = [(t, r) for t, r, s in zip(plan.tile, conv.ranges, conv.output.strides,
                                       strict=True) if s and t in CPU_SIDES and r % t]
    assert sides and plan.cost.vregs == avx2.registers, plan.describe()
    outs = set(conv.out_indices)
    assert plan.candidates_scored + plan.pruned == count(
        [(cpu_candidates if k in outs else candidates)(r) for k, r in enumerate(conv.ranges)])
    # A product without a window (a 1x1 convolution) keeps its candidates.
    short = tilec.check_program(src.replace("x+i-1, y+j-1", "x+i, y+j"),
                                {"D": (1, 56, 56, 64), "K": (1, 1, 64, 64)}, "float32")
    flat = plan_kernels(short).kernels[0].flat
    plan = search(flat, avx2)
    assert plan.candidates_scored + plan.pruned == count(map(candidates, flat.ranges))
    pool = tilec.check_program(
        "function (X[N, H, W, C]) -> (P) { P[n, x, y, c : N, 28, 28, C] = "
        ">(X[n, 2*x + i, 2*y + j, c]), i < 2, j < 2; }", {"X": (1, 56, 56, 64)}, "float32")
    flat = plan_kernels(pool).kernels[0].flat
    plan = search(flat, avx2)
    assert plan.candidates_scored + plan.pruned == count(map(candidates, flat.ranges))


def test_register_sides_hold_at_most_16_accumulators() -> None:
    """A 16-core AVX-512 Xeon's calibrated facts (PoCL 5.0): resnet18's 7x7 stride-2 stem
    would take 6 points by 4 vectors (24 accumulators), which ran 16% slower there than 4 by
    4 (`space.CPU_SIDES`)."""
    import dataclasses

    import tilec
    from tilec.plan.fuse import plan_kernels

    xeon = dataclasses.replace(
        CPU, vec_size=16, registers=32, max_regs=2048, goal_groups=64, compute_units=16,
        clock_mhz=2596, peak_gflops=1352.0, bandwidth_gbs=98.0, l1_bytes=49152,
        l2_bytes=2 << 20, muladd_vec=16, l1_gbs=1700.0, l2_gbs=750.0, launch_us=30.0,
        group_us=0.009, read_gbs=((64.0, 368.0), (128.0, 334.0), (256.0, 182.0),
                                  (512.0, 98.0)))
    src = """function (I[N, H, W, CI], F[KH, KW, CI, CO]) -> (O) {
      O[n, x0, x1, co : N, 112, 112, CO] =
          +(I[n, 2*x0 + k0 - 3, 2*x1 + k1 - 3, ci] * F[k0, k1, ci, co]);
    }"""
    prog = tilec.check_program(src, {"I": (1, 224, 224, 3), "F": (7, 7, 3, 64)}, "float32")
    stem = plan_kernels(prog).kernels[0].flat
    plan = search(stem, xeon, top_k=16)
    for tile, c in plan.top:
        extra = any(s and t not in candidates(r) for t, r, s in zip(
            tile, stem.ranges, stem.output.strides, strict=True))
        assert not extra or c.or_ // (4 * xeon.vec_size) <= 16, (tile, c.or_)
    assert plan.cost.or_ // (4 * xeon.vec_size) <= 16, plan.tile


def test_seed_search() -> None:
    flat = seed_flat()
    plan = search(flat, SEED_HW, post_ops=2, top_k=8)
    assert plan.strategy == "exhaustive"
    assert plan.candidates_scored + plan.pruned == 7 * 7 * 3 * 3 * 6 * 14 * 14
    assert plan.rejected_memory > 0
    assert len(plan.top) == 8 and plan.tile == plan.top[0][0]
    for tile, c in plan.top:
        assert c.ok and c.sm <= SEED_HW.max_mem and c.or_ <= SEED_HW.max_regs
        assert c == score(flat, tile, SEED_HW, 2)
    keys = [_rank_key(c) for _, c in plan.top]
    assert keys == sorted(keys)
    # At least as good as the seed's own choice (score 1, 23.04 flops/byte).
    assert plan.cost.score == 1.0 and plan.cost.flops_per_byte >= 23.04
    assert plan.layout().accumulators * plan.layout().total_threads == plan.layout().outputs


def test_search_is_deterministic() -> None:
    flat = seed_flat(4)
    a = search(flat, SEED_HW, post_ops=2)
    b = search(flat, SEED_HW, post_ops=2)
    assert a.top == b.top


def test_exhaustive_search_finds_brute_force_best() -> None:
    out = FlatTensor("O", (0, 12, 1), 0)
    a = FlatTensor("A", (1, 20, 0), 0)
    b = FlatTensor("B", (12, 0, 1), 0)
    flat = FlatContraction(("k", "m", "n"), (20, 6, 12), (out, a, b))
    hw = HwModel(name="small", kind="gpu", threads=16, mem_width=16, max_mem=600,
                 max_regs=256, goal_groups=4, goal_flops_per_byte=4.0, staging="local")
    plan = search(flat, hw)
    every = [score(flat, t, hw) for t in itertools.product(*map(candidates, flat.ranges))]
    ok = [c for c in every if c.ok]
    best = min(ok, key=lambda c: (_rank_key(c), c.wg, c.il))
    assert _rank_key(plan.cost) == _rank_key(best)
    # Pruned tiles are over regs; some of them are over memory too, which is checked first.
    assert plan.rejected_memory + plan.rejected_regs + plan.pruned == len(every) - len(ok)
    assert plan.rejected_regs <= sum(c.status == "over regs" for c in every)
    assert plan.candidates_scored + plan.pruned == len(every)


def test_beam_search_when_too_many_candidates() -> None:
    flat = seed_flat()
    plan = search(flat, SEED_HW, post_ops=2, limit=1000)
    assert plan.strategy == "beam"
    assert all(c.ok for _, c in plan.top)
    assert plan.cost.score == 1.0


def test_cpu_matmul_picks_a_vector_register_tile() -> None:
    for m, n, k in [(512, 512, 512), (256, 1024, 128), (1024, 1024, 1024)]:
        flat = matmul_flat(m, n, k)
        # The CPU score's ranking: the time model does not insist on an L1-sized chunk
        # (measured on PoCL, a 512 chunk ran as fast as one that fits L1).
        plan = search(flat, CPU, model="plaidml")
        tk, tm, tn = plan.tile
        assert tn % CPU.vec_size == 0  # the unit-stride output index fills whole vectors
        assert 4 <= tm <= 8 and 16 <= tn <= 32
        assert plan.cost.mr <= CPU.l1_bytes  # the reduction chunk's inputs fit L1
        assert tk >= 64 or tk == k
        assert plan.layout().vector_width == CPU.vec_size


def test_unfittable_model_raises() -> None:
    hw = HwModel(name="tiny", kind="gpu", threads=4, mem_width=16, max_mem=4,
                 max_regs=1, goal_groups=1, goal_flops_per_byte=1.0, staging="local")
    with pytest.raises(TileError, match="cannot fit this operation"):
        search(matmul_flat(8, 8, 8), hw)


def test_score_tile_checks_the_tile() -> None:
    flat = seed_flat()
    c = score_tile(flat, SEED_HW, [8, 32, 2, 3, 16, 2, 2], post_ops=2)
    assert c.score == 1.0
    by_name = score_tile(flat, SEED_HW, {"ci": 8, "co": 32, "i": 2, "j": 3, "n": 16, "x": 2,
                                         "y": 2}, post_ops=2)
    assert by_name == c
    with pytest.raises(TileError, match="has 3 sizes"):
        score_tile(flat, SEED_HW, [1, 2, 3])
    with pytest.raises(TileError, match="outside 1..3"):
        score_tile(flat, SEED_HW, [8, 32, 4, 3, 16, 2, 2])
    with pytest.raises(TileError, match="unknown index 'z'"):
        score_tile(flat, SEED_HW, {"z": 2})


def test_write_log_text_and_json_lines(tmp_path) -> None:
    plan = search(seed_flat(4), SEED_HW, post_ops=2, top_k=3)
    text = tmp_path / "cost.log"
    write_log(plan, text)
    lines = text.read_text().splitlines()
    assert lines[0].startswith("Computing cost for tile size: [")
    assert sum(ln.startswith("Computing cost") for ln in lines) == 3
    jl = tmp_path / "cost.jsonl"
    write_log(plan, jl)
    recs = [json.loads(ln) for ln in jl.read_text().splitlines()]
    assert len(recs) == 3 and all(r["version"] == 1 for r in recs)
    assert tuple(recs[0]["tile"].values()) == plan.tile
    assert set(recs[0]["tile"]) == set(plan.flat.names)
    buf = io.StringIO()
    search(seed_flat(4), SEED_HW, post_ops=2, top_k=2, log=buf)
    assert buf.getvalue().count("Computing cost") == 2
    with pytest.raises(TileError):
        write_log(plan, buf, fmt="xml")


# -- property: the search never keeps a tile the hardware cannot hold ---------------------------

@st.composite
def flats(draw: st.DrawFn) -> FlatContraction:
    k = draw(st.integers(1, 4))
    ranges = tuple(draw(st.integers(1, 24)) for _ in range(k))
    outs = draw(st.lists(st.booleans(), min_size=k, max_size=k))
    strides = [0] * k
    step = 1
    for j in range(k - 1, -1, -1):
        if outs[j]:
            strides[j] = step
            step *= ranges[j]
    tensors = [FlatTensor("O", tuple(strides), 0)]
    for name in "AB"[: draw(st.integers(1, 2))]:
        s = tuple(draw(st.sampled_from([0, 1, -1, 2, 3, 8, 24, 100])) for _ in range(k))
        tensors.append(FlatTensor(name, s, 0))
    return FlatContraction(tuple("abcd"[:k]), ranges, tuple(tensors))


@st.composite
def hw_models(draw: st.DrawFn) -> HwModel:
    kind = draw(st.sampled_from(["gpu", "cpu"]))
    l1 = draw(st.sampled_from([512, 4096, 32768]))
    return HwModel(
        name="random", kind=kind, threads=draw(st.sampled_from([1, 4, 32, 256])),
        mem_width=draw(st.sampled_from([4, 16, 64, 128])),
        max_mem=draw(st.integers(1, 8000)), max_regs=draw(st.integers(1, 8000)),
        goal_groups=draw(st.integers(1, 32)), goal_flops_per_byte=draw(st.floats(0.5, 50)),
        staging="global" if kind == "cpu" else draw(st.sampled_from(["local", "global"])),
        vec_size=draw(st.sampled_from([1, 4, 8, 16])),
        registers=draw(st.integers(3, 32)) if kind == "cpu" else 0,
        l1_bytes=l1, l2_bytes=l1 * 16)


@given(flats(), hw_models(), st.integers(0, 3), st.sampled_from([2_000_000, 50]))
@settings(max_examples=150, deadline=None)
def test_kept_tiles_always_fit(flat: FlatContraction, hw: HwModel, post_ops: int,
                               limit: int) -> None:
    try:
        plan = search(flat, hw, post_ops=post_ops, top_k=5, limit=limit)
    except TileError:
        ones = score(flat, (1,) * len(flat.ranges), hw, post_ops)
        assert not ones.ok
        return
    assert 1 <= len(plan.top) <= 5
    for tile, c in plan.top:
        assert c.ok and c.score >= 0
        assert c.sm <= hw.max_mem and c.or_ <= hw.max_regs
        assert all(1 <= t <= r for t, r in zip(tile, flat.ranges, strict=True))
        if hw.kind == "cpu":
            assert c.vregs <= hw.registers
    scores = np.array([c.score for _, c in plan.top])
    assert (np.diff(scores) <= 0).all()


def _conv_search(ci: int, co: int, size: int):
    """The H100 model's search for an N=1 3x3 'same' convolution (NCHW, as ONNX models
    have it), and the work-groups its chosen tile launches."""
    import tilec
    from tilec.plan.fuse import plan_kernels

    src = """function (D[N, CI, X, Y], K[CO, CI, I, J]) -> (O) {
      O[n, co, x, y : N, CO, X, Y] = +(D[n, ci, x+i-1, y+j-1] * K[co, ci, i, j]);
    }"""
    prog = tilec.check_program(src, {"D": (1, ci, size, size), "K": (co, ci, 3, 3)},
                               "float32")
    flat = plan_kernels(prog).kernels[0].flat
    plan = search(flat, HwModel.load("nvidia-h100"))
    out = flat.tensors[0].strides  # the output's: the indices work-groups are spread over
    groups = int(np.prod([-(-r // t) for r, t, s in zip(flat.ranges, plan.tile, out,
                                                        strict=True) if s]))
    return plan, groups


def test_gpu_convolution_with_a_small_image_fills_the_device() -> None:
    # resnet's last 3x3 layers: 512 -> 512 channels over 7x7.  Ranked by predicted time the
    # search once chose 4 work-groups of 28 accumulators (0.76 ms on an H200, where a tile of
    # 512 groups runs several times faster): a padded convolution is ranked by time only
    # where the model's best is a tile it is trusted with (`trust.time_ranks`).
    plan, groups = _conv_search(512, 512, 7)
    assert groups >= HwModel.load("nvidia-h100").compute_units, (plan.tile, groups)
    assert not plan.ranked_by_time


def test_gpu_convolution_ranked_by_time_where_its_best_fills_the_device() -> None:
    # vgg's 128 -> 256 channels at 56x56: the model's best tile (128 work-groups of 7x28x32)
    # ran 0.100 ms on an H200 where PlaidML's pick ran 0.320.
    plan, groups = _conv_search(128, 256, 56)
    assert plan.ranked_by_time
    assert 4 * groups >= 3 * HwModel.load("nvidia-h100").compute_units


def test_chosen_tiles_stage_no_more_than_local_memory() -> None:
    # The statistics' memory budget (max_mem) is PlaidML's; the device's local memory is the
    # hard limit on what the schedule stages (double-buffered where the loop is pipelined).
    import dataclasses

    hw = dataclasses.replace(HwModel.load("nvidia-h100"), local_mem_bytes=8192)
    flat = matmul_flat(512, 512, 512)
    for model in ("time", "plaidml"):
        _check_staging(flat, hw, search(flat, hw, top_k=4, model=model))


def _check_staging(flat, hw, plan) -> None:
    from tilec.plan.schedule import make_schedule

    assert plan.top
    for tile, _ in plan.top:
        s = make_schedule(flat, tile, hw)
        assert s.staged_bytes <= 8192, (tile, s.staged_bytes, s.pipeline)


def test_gpu_matmul_does_not_read_its_matrices_once_a_row() -> None:
    # A split kernel of one row (m=1) reads B through the cache, and every one of the 512
    # work-groups reads all of it again: its L2 traffic counts (`reread`).  Without it the
    # 512 matmul chose k=512 m=1 n=128 and ran 0.092 ms on an H200 against 0.047 for torch.
    from tilec.plan.schedule import make_schedule

    hw = HwModel.load("nvidia-h100")
    for n in (256, 512):
        flat = matmul_flat(n, n, n)
        tile = search(flat, hw).tile
        s = make_schedule(flat, tile, hw)
        assert all(st is not None for st in s.staged), (n, tile)


def test_cpu_pool_ranked_by_time() -> None:
    # PlaidML's score prices reuse between inputs; a pool has one input, and its tiles tied on
    # size alone (resnet18's max pool: 28 vectors, 0.35 ms, where the time model's first
    # choice ran 0.19 ms on Zen 4).
    import tilec
    from tilec.plan.fuse import plan_kernels

    cpu = HwModel.load("pocl-cpu")
    pool = """function (I[N, C, H, W]) -> (O) {
      O[n, c, x0, x1 : N, C, 56, 56] = >(I[n, c, 2*x0 + k0 - 1, 2*x1 + k1 - 1]), k0 < 3, k1 < 3;
    }"""
    flat = plan_kernels(tilec.check_program(pool, {"I": (1, 64, 112, 112)}, "float32")) \
        .kernels[0].flat
    assert search(flat, cpu).ranked_by_time
    assert not search(flat, cpu, model="plaidml").ranked_by_time


def test_repeated_layers_share_one_cached_search(tmp_path) -> None:
    # The same contraction over other tensors (a model's repeated block) is one search: the
    # second comes from the cache, with the same tiles; reading one tensor twice is another.
    from dataclasses import replace

    from tilec.plan.search import search_key

    flat = matmul_flat(64, 64, 64)
    names = {t.name: f"{t.name}_block2" for t in flat.tensors}
    other = replace(flat, tensors=tuple(replace(t, name=names[t.name]) for t in flat.tensors),
                    text=flat.text.replace("A", "A_block2"))
    first = search(flat, CPU, top_k=4, cache=tmp_path)
    assert len(list(tmp_path.rglob("*.json"))) == 1
    again = search(other, CPU, top_k=4, cache=tmp_path)
    assert len(list(tmp_path.rglob("*.json"))) == 1
    assert [t for t, _ in again.top] == [t for t, _ in first.top]
    assert again.flat is other
    a, b = flat.tensors[1].name, flat.tensors[2].name
    same = replace(flat, tensors=tuple(replace(t, name=a) if t.name == b else t
                                       for t in flat.tensors))
    args = (CPU, 0, "float32", 4, 0, 10**6, "time")
    assert search_key(same, *args) != search_key(flat, *args)
    assert search_key(other, *args) == search_key(flat, *args)


def test_a_search_asked_again_in_one_process_is_not_scored_again(tmp_path, monkeypatch) -> None:
    # The panel choice and code generation ask for the same searches: the second time, this
    # process's outcome is taken for the contraction asked for, with the costs and
    # predictions a read from the cache (another process) would score again.
    from dataclasses import replace

    import tilec.plan.search as s

    flat = matmul_flat(64, 48, 80)
    names = {t.name: f"{t.name}_again" for t in flat.tensors}
    other = replace(flat, tensors=tuple(replace(t, name=names[t.name]) for t in flat.tensors))
    first = search(flat, CPU, top_k=4, cache=tmp_path)
    calls = []
    real = s.score
    monkeypatch.setattr(s, "score", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = search(other, CPU, top_k=4, cache=tmp_path)
    assert not calls, "scored again"
    assert again.cached and again.flat is other and again.top == first.top
    s.forget()  # as a new process: the cache directory alone
    read = search(other, CPU, top_k=4, cache=tmp_path)
    assert calls and read.cached
    assert (read.top, read.predicted, read.ranked_by_time) == \
        (again.top, again.predicted, again.ranked_by_time)
    # Another cache directory (and none) knows nothing of them: searched again.
    calls.clear()
    assert search(other, CPU, top_k=4, cache=tmp_path / "elsewhere").cached is False and calls
    calls.clear()
    assert search(other, CPU, top_k=4).cached is False and calls


def test_search_cache_digest_covers_every_module_a_search_imports() -> None:
    # The cache key's code digest is read from the import statements, so the CPU scoring
    # split off `cost` (and anything split off later) invalidates cached searches when it
    # changes; a module outside the plan package, or not imported by a search, stays out.
    import tilec.plan.search as search_mod

    names = {m.__name__.rpartition(".")[2] for m in search_mod.search_modules()}
    assert {"search", "cost", "cost_cpu", "cost_record", "sweep", "predict", "predict_cpu",
            "schedule", "trust", "space", "flat", "hw", "layout"} <= names
    assert "chain" not in names and "fuse" not in names
    assert all(m.__name__.startswith("tilec.plan.") for m in search_mod.search_modules())


@given(flats(), hw_models(), st.integers(0, 3))
@settings(max_examples=120, deadline=None)
def test_output_tiles_over_registers_go_before_their_reduction_tiles(
        flat: FlatContraction, hw: HwModel, post_ops: int) -> None:
    """On a CPU the output tiles over the registers are dropped before the reduction tiles
    multiply them (`space._within_registers`): the same top tiles and the same tallies as
    scoring every tile."""
    from unittest import mock

    from tilec.plan import space

    def every(out_rows, *args):
        return out_rows

    def run():
        try:
            return search(flat, hw, post_ops=post_ops, top_k=5)
        except TileError as e:
            return str(e)

    filtered = run()
    with mock.patch.object(space, "_within_registers", every):
        scored = run()
    if isinstance(filtered, str) or isinstance(scored, str):
        assert filtered == scored
        return
    assert [t for t, _ in filtered.top] == [t for t, _ in scored.top]
    assert (filtered.candidates_scored, filtered.rejected_regs, filtered.pruned) == \
        (scored.candidates_scored, scored.rejected_regs, scored.pruned)


def _padded_conv() -> FlatContraction:
    """A 3x3 'same' convolution (constraints keep the window inside the image)."""
    from tilec.lang.api import check_program
    from tilec.plan.fuse import plan_kernels

    src = """function (D[N, X, Y, CI], K[I, J, CI, CO]) -> (O) {
      O[n, x, y, co : N, X, Y, CO] = +(D[n, x+i-1, y+j-1, ci] * K[i, j, ci, co]);
    }"""
    prog = check_program(src, {"D": (1, 14, 14, 32), "K": (3, 3, 32, 48)})
    return plan_kernels(prog).kernels[0].flat


@pytest.mark.parametrize("hw", [CPU, HwModel.load("nvidia-h100")], ids=["cpu", "gpu"])
def test_an_untrusted_time_ranking_reuses_the_pass_for_plaidmls_score(hw) -> None:
    """A padded window's search keeps the best by PlaidML's score in its timed pass
    (`ranked_tiles(by_score=...)`): the same top tiles and tallies as scoring again."""
    from unittest import mock

    from tilec.plan import search as search_module

    flat = _padded_conv()
    assert flat.constraints or flat.windowed
    once = search(flat, hw, post_ops=1)
    real = search_module.ranked_tiles

    def twice(cands, top_k, es, args, strategy, by_score=None):
        return real(cands, top_k, es, args, strategy)

    with mock.patch.object(search_module, "ranked_tiles", twice):
        again = search(flat, hw, post_ops=1)
    assert once.ranked_by_time == again.ranked_by_time
    assert [t for t, _ in once.top] == [t for t, _ in again.top]
    assert (once.candidates_scored, once.rejected_regs, once.pruned) == \
        (again.candidates_scored, again.rejected_regs, again.pruned)
