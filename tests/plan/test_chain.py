"""Chains of small kernels run by one work-group (`plan.chain`, `codegen.chain`): which
kernels join, where the barriers go, what stays in the scratch buffer, and the chained kernels
against numpy and against the same program without chains (poisoned outputs)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tilec.compiler import compile as tile_compile
from tilec.config import Config
from tilec.lang.reference import evaluate_program
from tilec.plan.chain import MAX_ARGS, ChainKernel, chain_kernels
from tilec.plan.fuse import plan_kernels
from tilec.plan.hw import HwModel

from ..device import needs_device
from .test_placement import program

HW = HwModel.load("nvidia-h100")
CPU = HwModel.load("pocl-cpu")

# Independent small stages side by side (one phase), then stages that read them: sums of
# products, a max with a window under constraints, a default, post-ops reading other tensors,
# an integer tensor and a reduction to a scalar.
SMALL = """
function (X[5, 7], W[9, 7], V[9], M[4, 9], D[9, 6], I[9]) -> (Y, Z, P, Q, S, J) {
  A[i, j : 5, 9] = +(X[i, k] * W[j, k]);
  B = X * 2.0;
  C[i, j : 5, 9] = +(B[i, k] * W[j, k]);
  Y = tanh(A + V) * C;
  Z[i, j : 4, 5] = +(M[i, k] * Y[j, k]);
  P[j, x : 9, 6] = >(D[j, x + t - 1]), t < 3;
  Q[j, x : 9, 6] = +(D[j, 2 * x + t - 2]), t < 2;
  S[] = +(Y[i, j]);
  J = I * 3 + 1;
}"""
SMALL_SHAPES = {"X": (5, 7), "W": (9, 7), "V": (9,), "M": (4, 9), "D": (9, 6), "I": (9,)}


def _random(prog, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for n in prog.inputs:
        t = prog.tensors[n]
        if t.dtype.startswith("int"):
            out[n] = rng.integers(-50, 50, t.shape).astype(t.dtype)
        else:
            v = rng.uniform(0.25, 2.0, t.shape) * rng.choice([-1, 1], t.shape)
            out[n] = v.astype(t.dtype)
    return out


def _chained(src, shapes, hw=HW, dtypes=None):
    p = program(src, shapes) if dtypes is None else _program(src, shapes, dtypes)
    plan = plan_kernels(p)
    return plan, chain_kernels(plan, hw)


def _program(src, shapes, dtypes):
    from tilec.lang.api import check_program

    return check_program(src, shapes, dtypes)


def test_small_kernels_become_one_chain_with_barriers_only_where_needed():
    plan, chained = _chained(SMALL, SMALL_SHAPES, dtypes={"I": "int32"})
    chains = [k for k in chained.kernels if isinstance(k, ChainKernel)]
    assert len(chains) == 1 and len(chained.kernels) < len(plan.kernels)
    (c,) = chains
    assert [s.name for s in c.stages] == [k.name for k in plan.kernels
                                          if k.name in {s.name for s in c.stages}]
    assert not c.barriers[0]
    names = [s.name for s in c.stages]
    written: dict[str, int] = {}
    last = 0
    for i, s in enumerate(c.stages):
        if c.barriers[i]:
            last = i
        # Every stage that reads what an earlier stage of the chain wrote has a barrier
        # between them.
        for r in _reads_of(s):
            if r in written:
                assert written[r] < last, (names[i], r)
        for w in s.writes:
            written[w] = i
    # The chain's own temporaries live in the scratch tensor, at distinct aligned offsets.
    assert c.scratch in chained.program.tensors
    offs = [o for _, o in c.inner]
    assert all(o % 16 == 0 for o in offs) and len(set(offs)) == len(offs)
    for n, _ in c.inner:
        assert n not in chained.program.outputs and n not in chained.program.inputs
    # Outputs are written where the program keeps them, never in the scratch.
    assert set(chained.program.outputs) & {n for n, _ in c.inner} == set()


def _reads_of(k):
    from tilec.plan.fuse import _reads

    return _reads(k)


def test_large_kernels_stay_alone():
    src = """
    function (A[512, 512], B[512, 512]) -> (C) {
      T[i, j : 512, 512] = +(A[i, k] * B[k, j]);
      U = T * 2.0;
      C[i, j : 512, 512] = +(U[i, k] * B[k, j]);
    }"""
    plan, chained = _chained(src, {"A": (512, 512), "B": (512, 512)})
    assert chained.kernels == plan.kernels


def test_a_gpu_does_not_chain_a_kernel_with_many_elements_a_work_item():
    """A 16384-element copy costs one L2 trip a pass on a GPU: 64 passes, more than a launch."""
    src = """
    function (A[64, 256]) -> (C) {
      T[j, i : 256, 64] = =(A[i, j]);
      U = T * 2.0;
      C = U + 1.0;
    }"""
    _, gpu = _chained(src, {"A": (64, 256)}, HW)
    assert not any(isinstance(k, ChainKernel) for k in gpu.kernels)


def test_the_argument_limit_splits_a_long_run():
    lines = ["function (X[4, 4]) -> (Y) {", "  A0 = X * 1.5;"]
    n = 3 * MAX_ARGS
    # Each step reads a fresh input: the run needs more arguments than one chain may take.
    ins = ", ".join(f"W{i}[4, 4]" for i in range(n))
    lines[0] = f"function (X[4, 4], {ins}) -> (Y) {{"
    for i in range(1, n):
        lines.append(f"  A{i}[a, b : 4, 4] = +(A{i - 1}[a, k] * W{i}[k, b]);")
    lines.append(f"  Y = A{n - 1} + 0.5;")
    lines.append("}")
    shapes = {"X": (4, 4), **{f"W{i}": (4, 4) for i in range(n)}}
    _, chained = _chained("\n".join(lines), shapes)
    chains = [k for k in chained.kernels if isinstance(k, ChainKernel)]
    assert len(chains) >= 3
    from tilec.codegen.chain import chain_source

    for c in chains:
        src = chain_source(c, chained, HW)
        assert len(src.args) <= MAX_ARGS + 1  # the scratch buffer besides


def test_the_chain_text_names_its_stages_and_declares_scratch_tensors():
    from tilec.codegen.chain import chain_source

    _, chained = _chained(SMALL, SMALL_SHAPES, dtypes={"I": "int32"})
    (c,) = [k for k in chained.kernels if isinstance(k, ChainKernel)]
    text = chain_source(c, chained, HW).text
    assert "reqd_work_group_size(256, 1, 1)" in text
    assert text.count("/* stage ") == len(c.stages)
    assert text.count("barrier(CLK_GLOBAL_MEM_FENCE)") == sum(c.barriers)
    for n, off in c.inner:
        assert f"__global float* b_{n} = b_{c.scratch} + {off};" in text
    assert "% 256" not in text.split("for (int", 1)[1].split(";")[0]  # the start is a select


def _run(src, shapes, config, dtypes=None, seed=0, hw=None):
    exe = tile_compile(src, shapes, dtype=dtypes or "float32", config=config, hw=hw)
    feed = _random(exe.program, seed)
    got = exe.run(feed, poison=True)
    return exe, feed, got


@needs_device
@pytest.mark.parametrize("device_hw", ["cpu", "gpu-model"])
def test_chained_kernels_match_numpy_and_the_unchained_ones(device_hw):
    """On the CPU device, with its own model and with a GPU's (256 work-items, no vector
    dot products): every output against the reference and against separate kernels."""
    hw = None if device_hw == "cpu" else dataclasses.replace(HW, max_work_group_size=64)
    dtypes = {n: "float32" for n in SMALL_SHAPES} | {"I": "int32"}
    exe, feed, got = _run(SMALL, SMALL_SHAPES, Config(chains=True), dtypes, hw=hw)
    assert any(k.kind == "chain" for k in exe.kernels)
    ref = evaluate_program(exe.program, feed)
    plain, _, alone = _run(SMALL, SMALL_SHAPES, Config(chains=False), dtypes, hw=hw)
    assert not any(k.kind == "chain" for k in plain.kernels)
    for name in ref:
        assert not np.isnan(got[name]).any(), name
        np.testing.assert_allclose(got[name], ref[name], rtol=2e-5, atol=1e-5)
        np.testing.assert_allclose(got[name], alone[name], rtol=2e-5, atol=1e-5)
    again = exe.run(feed)  # the scratch and the pool buffers are reused between calls
    for name in ref:
        np.testing.assert_allclose(again[name], got[name], rtol=0, atol=0)


@needs_device
@pytest.mark.parametrize("counts", [(18, 90, 18), (1, 63, 64, 65), (200, 7, 130, 3)])
def test_stages_sharing_a_phase_cover_every_element(counts):
    """Independent stages of one phase start where the previous one's elements left the
    work-items (wrapping around the group), and a barrier follows: every element of every
    stage is written once whatever the counts (64 work-items on the CPU device)."""
    ins = ", ".join(f"X{i}[{n}]" for i, n in enumerate(counts))
    outs = ", ".join(f"Y{i}" for i in range(len(counts)))
    body = [f"  A{i} = X{i} * {i + 2}.0;" for i in range(len(counts))]
    body += [f"  Y{i} = A{i} + 1.0;" for i in range(len(counts))]
    src = f"function ({ins}) -> ({outs}) {{\n" + "\n".join(body) + "\n}"
    shapes = {f"X{i}": (n,) for i, n in enumerate(counts)}
    exe, feed, got = _run(src, shapes, Config(chains=True))
    assert [k.kind for k in exe.kernels] == ["chain"]
    text = exe.sources[0].text
    assert "barrier(" in text
    for i in range(len(counts)):
        np.testing.assert_allclose(got[f"Y{i}"], feed[f"X{i}"] * (i + 2) + 1.0, rtol=1e-6)


@needs_device
def test_a_product_sharing_a_phase_with_more_elements_than_work_items():
    """A product of 90 elements after an 18-element stage in one phase, a barrier after it:
    work-items 18..43 take two elements each.  (Started as `(lid + 46) % 64`, PoCL 3.0 left
    the second ones undone.)"""
    src = """
    function (X[3, 6], Y[15, 7], W[6, 7]) -> (A, B, C) {
      A = X * 2.0;
      B[m, n : 15, 6] = +(Y[m, k] * W[n, k]);
      C = A + 1.0;
    }"""
    shapes = {"X": (3, 6), "Y": (15, 7), "W": (6, 7)}
    exe, feed, got = _run(src, shapes, Config(chains=True))
    assert [k.kind for k in exe.kernels] == ["chain"]
    ref = evaluate_program(exe.program, feed)
    for name in ref:
        np.testing.assert_allclose(got[name], ref[name], rtol=2e-5, atol=1e-5)
