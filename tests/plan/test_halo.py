"""Padded reads through a zero border (`plan.halo`): which reads are rewritten, how, and the
kernels they give against numpy (poisoned outputs, the border kept), with and without."""

from __future__ import annotations

import numpy as np
import pytest

from tilec import bundle
from tilec.compiler import compile as tile_compile
from tilec.config import Config
from tilec.lang.reference import random_array
from tilec.plan.fuse import ContractionKernel, plan_kernels, use_halos
from tilec.plan.halo import pad_reads
from tilec.plan.hw import HwModel

from ..device import needs_device
from .test_placement import program, run_case

CONV = """
function (X[N, C, H, W], K1[CO, C, I, J], K2[CO, CO, I, J]) -> (O) {
  A[n, co, x, y : N, CO, H, W] = +(X[n, ci, x + i - 1, y + j - 1] * K1[co, ci, i, j]);
  R = (A > 0 ? A : 0);
  B[n, co, x, y : N, CO, H, W] = +(R[n, ci, x + i - 1, y + j - 1] * K2[co, ci, i, j]);
  O = B + R;
}"""
CONV_SHAPES = {"X": (1, 8, 7, 9), "K1": (16, 8, 3, 3), "K2": (16, 16, 3, 3)}

# A strided window, a wider one (5x5, pad 2), a sum pool and a max pool of one tensor: the
# sums are rewritten, the max pool reads the same tensor where it lies, under its constraints.
MIXED = """
function (X[N, C, H, W], K[CO, C, I, J], L[CO, CO, I2, J2]) -> (S, P, Q, M) {
  R = (X > 0 ? X : 0);
  S[n, co, x, y : N, CO, 5, 6] = +(R[n, ci, 2*x + i - 1, 2*y + j - 1] * K[co, ci, i, j]);
  T = S * 0.5;
  P[n, co, x, y : N, CO, 5, 6] = +(T[n, ci, x + i - 2, y + j - 2] * L[co, ci, i, j]);
  Q[n, c, x, y : N, C, H, W] = +(R[n, c, x + i - 1, y + j - 1]), i < 3, j < 3;
  M[n, c, x, y : N, C, H, W] = >(R[n, c, x + i - 1, y + j - 1]), i < 3, j < 3;
}"""
MIXED_SHAPES = {"X": (1, 4, 9, 11), "K": (6, 4, 3, 3), "L": (6, 6, 5, 5)}


def test_a_padded_read_of_a_computed_tensor_reads_its_border():
    p = program(CONV, CONV_SHAPES)
    out, storage, halos = pad_reads(p, {})
    assert [h.tensor for h in halos] == ["R"]  # X is an input: it keeps its buffer
    (h,) = halos
    assert h.root == "R_halo" and h.lo == (0, 0, 1, 1) and h.hi == (0, 0, 1, 1)
    assert out.tensors["R_halo"].shape == (1, 16, 9, 11)
    s = storage["R"]
    assert s.root == "R_halo" and s.strides == (1584, 99, 11, 1) and s.offset == 11 + 1
    b = next(op for op in out.ops if op.output == "B")
    (read,) = [a for a in b.inputs if a.tensor == "R_halo"]
    assert [str(q) for q in read.idx[2:]] == ["i + x", "j + y"]
    # The original program is left as it was (the reference runs it).
    assert next(op for op in p.ops if op.output == "B").inputs[0].tensor == "R"


def test_the_kernel_tests_no_bounds_but_keeps_the_window_tiling():
    plan = plan_kernels(program(CONV, CONV_SHAPES), halos=True)
    b = next(k for k in plan.kernels if isinstance(k, ContractionKernel) and k.op.output == "B")
    assert not b.flat.constraints
    assert {b.flat.names[k] for k in b.flat.windowed} == {"i", "j", "x", "y"}
    a = next(k for k in plan.kernels if isinstance(k, ContractionKernel) and k.op.output == "A")
    assert a.flat.constraints and not a.flat.windowed  # reads the input X
    assert plan_kernels(program(CONV, CONV_SHAPES)).halos == ()  # off unless asked for


def test_only_sums_are_rewritten():
    out, storage, halos = pad_reads(program(MIXED, MIXED_SHAPES), {})
    assert sorted(h.tensor for h in halos) == ["R", "T"]
    m = next(op for op in out.ops if op.output == "M")
    assert m.inputs[0].tensor == "R"  # the max pool: a zero border would change its maximum
    q = next(op for op in out.ops if op.output == "Q")
    assert q.inputs[0].tensor == "R_halo"
    t = next(h for h in halos if h.tensor == "T")
    assert t.lo[2:] == (2, 2)


def test_rows_start_aligned_where_it_costs_little():
    shapes = {"X": (1, 4, 6, 56), "K1": (4, 4, 3, 3), "K2": (4, 4, 3, 3)}
    (h,) = pad_reads(program(CONV, shapes), {})[2]
    assert h.lo[3] == 8 and (8 + 56 + h.hi[3]) % 8 == 0  # rows of 72, each on 32 bytes
    (h,) = pad_reads(program(CONV, CONV_SHAPES), {})[2]
    assert h.lo[3] == 1  # 9 wide: aligning would double the rows


def test_a_tensor_read_as_a_default_or_gathered_is_left_alone():
    text = """
function (X[N, C], K[C, J]) -> (O, G) {
  R = X * 2;
  O[n, c : N, C] = +(R[n, c + j - 1] * K[c, j]);
  G = reshape(R, N * C);
}"""
    out, _, halos = pad_reads(program(text, {"X": (2, 8), "K": (8, 3)}), {})
    assert halos == () and out.ops[1].inputs[0].tensor == "R"


@needs_device
@pytest.mark.parametrize("halos", [False, True])
@pytest.mark.parametrize("case", ["conv", "mixed"])
def test_against_numpy_with_poisoned_buffers(case, halos):
    text, shapes = (CONV, CONV_SHAPES) if case == "conv" else (MIXED, MIXED_SHAPES)
    exe = run_case(text, shapes, hw="pocl-cpu", halos=halos)
    assert bool(exe.plan.halos) == halos
    # A second call (the border was filled once, when the buffer was made) and a third
    # after poisoning again: the same results.
    rng = np.random.default_rng(3)
    arrays = {n: random_array(rng, exe.program.tensors[n].shape, "float32")
              for n in exe.program.inputs}
    first = exe.run(arrays)
    again = exe.run(arrays, poison=True)
    for name in first:
        np.testing.assert_array_equal(first[name], again[name])
    assert exe.check(exe._inputs(arrays), again).ok


@needs_device
def test_halo_kernels_agree_with_the_constrained_ones():
    """Every transformed kernel against the untransformed one, on the same inputs."""
    cfg = dict(hw="pocl-cpu", use_disk_cache=False)
    plain = tile_compile(MIXED, MIXED_SHAPES, config=Config(halos=False, **cfg))
    padded = tile_compile(MIXED, MIXED_SHAPES, config=Config(halos=True, **cfg))
    assert any("_halo" in s.text for s in padded.sources)
    assert not any("_halo" in s.text for s in plain.sources)
    rng = np.random.default_rng(5)
    arrays = {n: random_array(rng, MIXED_SHAPES[n], "float32") for n in MIXED_SHAPES}
    a, b = plain.run(arrays, poison=True), padded.run(arrays, poison=True)
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-5, atol=1e-5)


@needs_device
def test_a_bundle_keeps_the_border(tmp_path):
    exe = tile_compile(CONV, CONV_SHAPES, config=Config(hw="pocl-cpu", halos=True,
                                                        use_disk_cache=False))
    path = tmp_path / "conv.tlc"
    bundle.write_bundle(exe, path)
    loaded = bundle.load(path)
    assert set(loaded.halos) == {"R_halo"}
    rng = np.random.default_rng(1)
    arrays = {n: random_array(rng, CONV_SHAPES[n], "float32") for n in CONV_SHAPES}
    ref = exe.run(arrays)
    out = loaded.run(arrays, poison=True)
    np.testing.assert_allclose(out["O"], ref["O"], rtol=1e-5, atol=1e-5)


def test_halos_are_the_default_on_cpus():
    cpu, gpu = HwModel.load("pocl-cpu"), HwModel.load("nvidia-h100")
    assert use_halos(Config(), cpu) and not use_halos(Config(), gpu)
    assert not use_halos(Config(halos=False), cpu) and use_halos(Config(halos=True), gpu)


@needs_device
def test_tuning_keeps_the_border(tmp_path):
    """`tilec tune` plans as compile does (halos on a CPU): each candidate of the kernel that
    reads the border is run with the border filled and the rest poisoned, and passes; the
    record it keeps is the one compile then uses."""
    from tilec.tune.measure import tune

    config = Config(hw="pocl-cpu", cache_dir=tmp_path, records_path=tmp_path / "r.jsonl")
    report = tune(CONV, CONV_SHAPES, config=config, top_k=3)
    (k,) = [k for k in report.kernels if k.kernel == "contract_B"]
    assert k.results and all(m.status == "ok" for m in k.results), k.results
    exe = tile_compile(CONV, CONV_SHAPES, config=config)
    assert exe.plan.halos and "contract_B" in exe.tuned
    rng = np.random.default_rng(7)
    arrays = {n: random_array(rng, CONV_SHAPES[n], "float32") for n in CONV_SHAPES}
    assert exe.check(exe._inputs(arrays), exe.run(arrays, poison=True)).ok
