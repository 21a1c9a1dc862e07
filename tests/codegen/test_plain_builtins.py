"""Contraction hot loops without OpenCL library calls (issue 14).  The PyPI PoCL 3.0 builds its
kernel library for the host's AVX-512 and kernels for znver3, so LLVM inlines no builtin into a
kernel: clamp(), vloadN/vstoreN and select() were calls, each spilling every accumulator to the
stack.  The kernels write them as plain C instead (clexpr.clamp, clexpr.vector_access, `?:`
on a lane mask).  Text rules here are device-free; the runs need that PoCL and skip without it."""

from __future__ import annotations

import dataclasses
import re
from types import SimpleNamespace

import pytest

import tilec
from tilec.codegen import clexpr
from tilec.codegen.generate import generate
from tilec.config import Config
from tilec.plan.fuse import plan_kernels
from tilec.plan.hw import HwModel
from tilec.plan.hw_device import from_device

from ..kernel_cases import CASES

CALLS = ("vload", "vstore", "clamp(", "select(")


def test_clamp_text():
    assert clexpr.clamp("g0_1", "0", "99") == "(g0_1 < 0 ? 0 : (g0_1 > 99 ? 99 : g0_1))"


def test_aligned_vector_access_text():
    assert clexpr.load("b_B", "o + 8", "float32", 8, aligned=True) == \
        "*((__global const float8*)(b_B + (o + 8)))"
    assert clexpr.store("b_C", "o", "a_0", "int32", 4, aligned=True) == \
        "*((__global int4*)(b_C + (o))) = a_0;"
    # Without alignment, and for types stored narrower than computed, the builtins stay.
    assert clexpr.load("b_B", "o", "float32", 8) == "vload8(0, b_B + (o))"
    assert clexpr.load("b_B", "o", "float16", 8, aligned=True).startswith("vload_half8(")
    assert clexpr.store("b_C", "o", "v", "int8", 4, aligned=True).startswith("vstore4(")


def contraction_texts(src: str, shapes: dict, hw: HwModel) -> list[str]:
    plan = plan_kernels(tilec.check_program(src, shapes, "float32"))
    sources, _ = generate(plan, hw, Config(use_disk_cache=False))
    return [s.text for s in sources if s.kind == "contraction"]


def avx2_cpu() -> HwModel:
    return dataclasses.replace(HwModel.load("pocl-cpu"), vec_size=8, registers=16)


MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }"


@pytest.mark.parametrize("n", [1024, 64])
def test_matmul_loop_has_no_library_calls(n):
    """Rows a multiple of the vector: B read and C written as aligned vectors, no clamp."""
    text, = contraction_texts(MATMUL, {"A": (n, n), "B": (n, n)}, avx2_cpu())
    assert not [c for c in CALLS if c in text], text
    # B's reads: from one pointer a loop pass (`Inputs.based_read`), at constant offsets.
    assert re.search(r"__global const float\* base1 = b_B \+ \(", text), text
    assert "*((__global const float8*)(base1 + (" in text
    assert "*((__global float8*)(b_C + (" in text


def test_padded_conv_loop_has_no_library_calls():
    """Masked loads: the mask declared once as an int and applied by a vector `?:`, the
    offset steered into the tensor by it (`steered_offset`) instead of clamped."""
    src, shapes = CASES["conv_same_relu"]
    texts = contraction_texts(src, shapes, avx2_cpu())
    assert texts and not any(c in t for t in texts for c in CALLS), texts
    assert any("const int m0_" in t for t in texts)


def test_padded_input_shared_by_the_lanes_is_masked_as_one_element():
    """Output channels as lanes (NCHW, filter relaid): the input pixel is one element every
    lane shares, read at its steered offset and masked before the broadcast.  A lane mask
    of it would be a loop-invariant vector holding a register through the reduction loop
    (one of 12 accumulators then lived on the stack on AVX2, and the kernel ran 1.5x
    slower on the PyPI PoCL)."""
    src, shapes = CASES["conv_nchw_pad_bias_relu"]
    text, = contraction_texts(src, shapes, avx2_cpu())
    assert "vector: 8 lanes along co" in text
    assert "const float e0_0_0 = b_I[" in text
    assert "const float8 x0_0_0 = ((float8)((m0_0_0) ? e0_0_0 : (float)(0)));" in text
    assert "(int8)(-(int)" not in text
    assert not [c for c in CALLS if c in text], text
    # GPU models keep the lane mask (the element form ran 2.2x slower on an H200).
    gpu = "\n".join(contraction_texts(*CASES["conv_bias_relu"], HwModel.load("nvidia-h100")))
    assert "const float e0_" not in gpu and "(int4)(-(int)" in gpu


def test_unaligned_vectors_read_through_an_element_aligned_type():
    """Vectors that start anywhere (an odd row length, an offset of 1) are read through a
    vector type the kernel declares with its element's alignment: one unaligned load, where
    vloadN is a library call; the clamp is gone (vector starts stay in bounds)."""
    src = "function (A[M, K], B[K, L]) -> (C) { C[m, n : M, 32] = +(A[m, k] * B[k, n + 1]); }"
    text, = contraction_texts(src, {"A": (16, 13), "B": (13, 33)}, avx2_cpu())
    assert "typedef float float8_u __attribute__((ext_vector_type(8), aligned(4)));" in text
    assert "__global const float* base1 = b_B + (1 + 33 * i_k + p_n_0);" in text
    assert "*((__global const float8_u*)(base1 + (0)))" in text
    assert "(__global const float8*)" not in text
    assert not [c for c in CALLS if c in text], text


def test_cpu_registers_follow_the_vector_width_kernels_get():
    """The PyPI PoCL on a Zen 4 prefers float16 but computes float16 wrongly (the probe caps
    vectors at 8): its kernels are compiled for znver3, AVX2, 16 vector registers."""
    queries = dict(name="pthread-AMD EPYC", type=2, max_compute_units=2,
                   max_work_group_size=4096, local_mem_size=1 << 20, local_mem_type=2,
                   global_mem_cacheline_size=64, global_mem_cache_size=1 << 25,
                   preferred_vector_width_float=16, max_clock_frequency=2596, version="")
    dev = SimpleNamespace(platform=SimpleNamespace(name="Fake", version="OpenCL 3.0"), **queries)
    assert (from_device(dev).registers, from_device(dev).vec_size) == (32, 16)
    assert (from_device(dev, max_vec=8).registers, from_device(dev, max_vec=8).vec_size) == \
        (16, 8)


def _pypi_pocl() -> str | None:
    """The name of the PyPI PoCL's CPU device ("pthread-" and the CPU's name), or None: the
    relocatable PoCL 3.0 build of pocl-binary-distribution ("RELOC" in its platform version;
    Debian's builds are not relocatable)."""
    try:
        import pyopencl as cl

        for p in cl.get_platforms():
            if "PoCL 3.0" in p.version and "RELOC" in p.version:
                return p.get_devices()[0].name
    except Exception:
        return None
    return None


PYPI_POCL = _pypi_pocl()


@pytest.mark.skipif(PYPI_POCL is None, reason="no PyPI PoCL device (pocl-binary-distribution)")
@pytest.mark.parametrize("name", ["matmul_odd", "conv_same_relu", "conv_strided", "maxpool",
                                  "depthwise", "softmax", "conv_nchw_pad_bias_relu"])
def test_cases_on_the_pypi_pocl(name):
    from .test_kernels import run_case

    src, shapes = CASES[name]
    run_case(src, shapes, device=PYPI_POCL, seed=3)
