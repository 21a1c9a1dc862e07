"""A call's inputs on a device that shares host memory: the kernels read them where they lie
(aligned arrays in place, others through an aligned copy), every call its own arrays."""

from __future__ import annotations

import numpy as np
import pytest

import tilec
from tilec.runtime.device import Runtime
from tilec.runtime.launch import KernelInfo, Launcher, aligned_empty

from ..device import needs_device

SRC = ("function (A[M, K], B[K, N]) -> (R, S) {"
       " C[m, n : M, N] = +(A[m, k] * B[k, n]); R = relu(C); S = A * 2; }")


def _reference(a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    return {"R": np.maximum(a.astype(np.float64) @ b, 0), "S": a * 2}


@needs_device
def test_inputs_are_read_in_place_or_through_a_copy_aligned_as_the_kernels_read():
    rt = Runtime.get(None)
    if not rt.host_unified:
        pytest.skip("the default device has memory of its own")
    exe = tilec.compile(SRC, {"A": (24, 40), "B": (40, 16)})
    rng = np.random.default_rng(5)
    # B's rows are read as 16-float vectors the kernel takes as aligned; A element by element.
    assert [dict(zip(k.args, k.arg_align, strict=True)).get("B") for k in exe.kernels
            if "B" in k.args] == [64]
    aligned_b = aligned_empty((40, 16), np.float32, 64)
    aligned_b[...] = rng.standard_normal((40, 16))
    wide = rng.standard_normal(24 * 40 + 16 * 40 + 1).astype(np.float32)
    misaligned_a = wide[1:24 * 40 + 1].reshape(24, 40)  # 4 bytes past an allocation's start
    misaligned_b = wide[24 * 40 + 1:].reshape(40, 16)
    assert misaligned_b.ctypes.data % 64
    transposed_a = np.ascontiguousarray(rng.standard_normal((40, 24)).astype(np.float32)).T
    for a, b in ((misaligned_a, aligned_b), (transposed_a, misaligned_b),
                 (misaligned_a * -1, aligned_b * 2)):
        before = a.copy(), b.copy()
        exe._staging.clear()
        outs = exe.run({"A": a, "B": b}, poison=True)
        ref = _reference(a, b)
        for name in ("R", "S"):
            np.testing.assert_allclose(outs[name], ref[name], rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(a, before[0])  # the caller's arrays as they were
        np.testing.assert_array_equal(b, before[1])
        assert "A" in exe._lent and "B" in exe._lent
        # A is read in place; B through the aligned copy where it is not aligned.
        assert "A" not in exe._staging
        assert ("B" in exe._staging) == bool(b.ctypes.data % 64)


@needs_device
def test_a_bound_input_keeps_its_buffer_and_a_given_one_is_lent():
    rt = Runtime.get(None)
    if not rt.host_unified:
        pytest.skip("the default device has memory of its own")
    exe = tilec.compile(SRC, {"A": (24, 40), "B": (40, 16)})
    rng = np.random.default_rng(6)
    a = rng.standard_normal((24, 40)).astype(np.float32)
    b = rng.standard_normal((40, 16)).astype(np.float32)
    exe.bind({"B": b})
    for scale in (1.0, -3.0):
        outs = exe.run({"A": a * scale}, poison=True)
        ref = _reference(a * scale, b)
        np.testing.assert_allclose(outs["R"], ref["R"], rtol=1e-4, atol=1e-4)
        assert "B" not in exe._lent and "A" in exe._lent


def _launcher(kernels: list[KernelInfo], unified: bool = True) -> Launcher:
    class FakeRuntime:
        host_unified = unified
        host_align = 128

    la = Launcher()
    la.runtime = FakeRuntime()
    la.inputs, la.outputs = ("X", "Y", "Z"), ("Z", "O")
    la.kernels, la.halos, la.memory = kernels, {}, None
    la._bound, la._readers, la._align = {}, None, {}
    return la


def _kernel(name: str, args: tuple[str, ...], writes: tuple[str, ...]) -> KernelInfo:
    return KernelInfo(name, "contraction", 1, None, {}, "", 0, args, writes)


def test_only_inputs_no_kernel_writes_are_lent():
    kernels = [_kernel("k0", ("X", "Y", "T"), ("T",)), _kernel("k1", ("T", "Y", "O"), ("O", "Y")),
               _kernel("k2", ("X", "T", "Z"), ("Z",))]
    la = _launcher(kernels)
    # Y is updated in place and Z is an output: both keep buffers of their own.
    assert la._lendable() == {"X": [("k0", 0), ("k2", 0)]}
    assert la._align == {"X": 128}  # kernels whose needs are not known: the device's own
    la._bound = {"X": np.zeros(1)}
    assert la._lendable() == {}
    assert _launcher(kernels, unified=False)._lendable() == {}


def test_the_alignment_a_kernel_assumes_of_each_buffer():
    from tilec.codegen.clexpr import aligned_reads

    text = ("__kernel void k(__global const float* restrict b_A, __global const float* "
            "restrict b_B, __global float* b_C) {\n"
            "    __global const float* base1 = b_B + (16 * i);\n"
            "    __global const float* base2 = base1 + 3;\n"
            "    const float16 x = *((__global const float16*)(base2 + (0)));\n"
            "    const float16 y = *((__global const float16_u*)(b_A + (0)));\n"
            "    *((__global float8*)(b_C + (o))) = v;\n}\n")
    # Through a pointer declared from B; A's vector is an unaligned type; C is written.
    assert aligned_reads(text) == {"b_B": 64, "b_C": 32}
    # A vector through a pointer of unknown origin, or a cast of another form: every buffer.
    assert aligned_reads(text.replace("base2 + (0)", "q + (0)")) == dict.fromkeys(
        ("b_A", "b_B", "b_C"), 64)
    assert set(aligned_reads(text + "float4 z = ((__global const float4*)b_A)[3];").values()) \
        == {128}
