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
def test_inputs_are_read_in_place_aligned_or_through_an_aligned_copy():
    rt = Runtime.get(None)
    if not rt.host_unified:
        pytest.skip("the default device has memory of its own")
    exe = tilec.compile(SRC, {"A": (24, 40), "B": (40, 16)})
    rng = np.random.default_rng(5)
    b = rng.standard_normal((40, 16)).astype(np.float32)
    aligned = aligned_empty((24, 40), np.float32, rt.host_align)
    aligned[...] = rng.standard_normal((24, 40))
    wide = rng.standard_normal(24 * 40 + 1).astype(np.float32)
    misaligned = wide[1:].reshape(24, 40)  # 4 bytes past an allocation's start
    assert misaligned.ctypes.data % rt.host_align
    transposed = np.ascontiguousarray(rng.standard_normal((40, 24)).astype(np.float32)).T
    for i, a in enumerate((aligned, misaligned, transposed, aligned * -1)):
        before = a.copy()
        outs = exe.run({"A": a, "B": b}, poison=True)
        ref = _reference(a, b)
        for name in ("R", "S"):
            np.testing.assert_allclose(outs[name], ref[name], rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(a, before)  # the caller's array as it was
        assert "A" in exe._lent and "B" in exe._lent
        # The aligned array is read in place; the others through the aligned copy.
        assert ("A" in exe._staging) == (i > 0)


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

    la = Launcher()
    la.runtime = FakeRuntime()
    la.inputs, la.outputs = ("X", "Y", "Z"), ("Z", "O")
    la.kernels, la.halos, la.memory = kernels, {}, None
    la._bound, la._readers = {}, None
    return la


def _kernel(name: str, args: tuple[str, ...], writes: tuple[str, ...]) -> KernelInfo:
    return KernelInfo(name, "contraction", 1, None, {}, "", 0, args, writes)


def test_only_inputs_no_kernel_writes_are_lent():
    kernels = [_kernel("k0", ("X", "Y", "T"), ("T",)), _kernel("k1", ("T", "Y", "O"), ("O", "Y")),
               _kernel("k2", ("X", "T", "Z"), ("Z",))]
    la = _launcher(kernels)
    # Y is updated in place and Z is an output: both keep buffers of their own.
    assert la._lendable() == {"X": [("k0", 0), ("k2", 0)]}
    la._bound = {"X": np.zeros(1)}
    assert la._lendable() == {}
    assert _launcher(kernels, unified=False)._lendable() == {}
