"""A call's inputs and outputs in the caller's memory on CPU devices (`runtime.host_io`):
every result against numpy, outputs poisoned, with and without in-place buffers."""

from __future__ import annotations

import numpy as np
import pytest

import tilec
from tilec.config import Config
from tilec.graph import ops, ops_math
from tilec.runtime import host_io

from ..device import CPU, needs_device

MATMUL_RELU = """function (A[M, K], B[K, N]) -> (C, R) {
  C[m, n : M, N] = +(A[m, k] * B[k, n]);
  R = (C > 0 ? C : 0);
}"""
SHAPES = {"A": (33, 70), "B": (70, 45)}


def _inputs(rng, aligned: bool) -> dict[str, np.ndarray]:
    out = {}
    for name, shape in SHAPES.items():
        values = rng.uniform(-1, 1, shape).astype(np.float32)
        if aligned:
            arr = tilec.aligned_empty(shape, np.float32)
        else:  # one float past an aligned start: never at the driver's alignment
            arr = tilec.aligned_empty((values.size + 1,), np.float32)[1:].reshape(shape)
        arr[...] = values
        out[name] = arr
    return out


def test_aligned_empty_starts_at_the_alignment_and_has_the_shape():
    for align in (64, 128, 4096):
        a = host_io.aligned_empty((3, 5, 7), "float16", align)
        assert a.shape == (3, 5, 7) and a.dtype == np.float16 and a.flags.c_contiguous
        assert host_io.address(a) % align == 0
        assert host_io.address(a) == a.ctypes.data
    assert host_io.aligned_empty((0, 4)).size == 0


def _cpu_exe(**config):
    return tilec.compile(MATMUL_RELU, SHAPES, config=Config(device=CPU, **config))


@needs_device
@pytest.mark.skipif(CPU is None, reason="no CPU OpenCL device")
@pytest.mark.parametrize("aligned", [True, False])
def test_calls_in_place_match_numpy_and_copies(aligned):
    rng = np.random.default_rng(11)
    exe, copies = _cpu_exe(), _cpu_exe(host_io=False)
    if not exe.runtime.shares_host_memory:
        pytest.skip("the CPU device does not report memory shared with the host")
    assert exe._host_io and not copies._host_io
    kept = []
    for _ in range(3):
        arrays = _inputs(rng, aligned)
        a, b = (arrays[n].copy() for n in ("A", "B"))
        # Aligned inputs are read where they are; the others are copied as before.
        assert set(exe._in_place(arrays)) == ({"A", "B"} if aligned else set())
        got = exe.run(arrays, poison=True)
        ref = copies.run(arrays, poison=True)
        want = a @ b
        for name, expect in (("C", want), ("R", np.maximum(want, 0))):
            np.testing.assert_allclose(got[name], expect, rtol=1e-5, atol=1e-5)
            np.testing.assert_array_equal(got[name], ref[name])
            # The output is an array of its own, at the driver's alignment.
            assert host_io.address(got[name]) % exe.runtime.base_align == 0
        # The inputs are read, never written.
        np.testing.assert_array_equal(arrays["A"], a)
        np.testing.assert_array_equal(arrays["B"], b)
        kept.append((got, want))
    # A later call writes new arrays: what an earlier call returned stays as it was.
    for got, want in kept:
        np.testing.assert_allclose(got["C"], want, rtol=1e-5, atol=1e-5)


@needs_device
@pytest.mark.skipif(CPU is None, reason="no CPU OpenCL device")
def test_an_input_changed_after_a_call_is_read_anew_and_leaves_the_outputs():
    rng = np.random.default_rng(12)
    exe = _cpu_exe()
    arrays = _inputs(rng, True)
    frozen = _inputs(np.random.default_rng(2), True)
    for a in frozen.values():
        a.flags.writeable = False  # a read-only input (a bundle's weights) is read in place
    assert set(exe._in_place(frozen)) == {"A", "B"}
    np.testing.assert_allclose(exe.run(frozen, poison=True)["C"], frozen["A"] @ frozen["B"],
                               rtol=1e-5, atol=1e-5)
    first = exe.run(arrays, poison=True)["C"].copy()
    out = exe.run(arrays)["C"]
    arrays["A"][...] = rng.uniform(-1, 1, SHAPES["A"]).astype(np.float32)
    np.testing.assert_array_equal(out, first)  # the input's change reaches no output
    np.testing.assert_allclose(exe.run(arrays, poison=True)["C"], arrays["A"] @ arrays["B"],
                               rtol=1e-5, atol=1e-5)
    # Repeats of one call (benchmarks) and a copy-path call in between agree.
    copied = _inputs(np.random.default_rng(1), False)
    np.testing.assert_allclose(exe.run(copied, poison=True)["C"], copied["A"] @ copied["B"],
                               rtol=1e-5, atol=1e-5)
    again = exe.run(arrays, repeat=3, poison=True)["C"]
    np.testing.assert_allclose(again, arrays["A"] @ arrays["B"], rtol=1e-5, atol=1e-5)


@needs_device
@pytest.mark.skipif(CPU is None, reason="no CPU OpenCL device")
def test_a_graph_with_constants_an_output_of_constants_alone_and_a_bool_output():
    """Outputs a bound kernel computed once keep their buffers (not made anew each call);
    a per-call output read by a later kernel and a bool output are written in place."""
    rng = np.random.default_rng(13)
    g = tilec.Graph("io")
    x = g.input("x", (2, 6, 8))
    w = g.constant(rng.uniform(-1, 1, (8, 5)).astype(np.float32))
    scale = g.constant(rng.uniform(0.5, 1.5, (8, 5)).astype(np.float32))
    ws = ops.mul(w, scale)
    y = ops.matmul(x, ws)
    g.output("ws", ws)
    g.output("y", y)
    g.output("pos", ops_math.greater(ops.relu(y), 0.1))
    exe = g.compile(config=Config(device=CPU))
    for _ in range(3):
        xv = host_io.aligned_empty((2, 6, 8))
        xv[...] = rng.uniform(-1, 1, (2, 6, 8))
        got = exe(x=xv)
        ref = g.evaluate(x=xv.copy())
        for name in ("ws", "y"):
            np.testing.assert_allclose(got[name], ref[name], rtol=1e-5, atol=1e-5)
        assert got["pos"].dtype == np.bool_
        np.testing.assert_array_equal(got["pos"], ref["pos"])


@needs_device
@pytest.mark.skipif(CPU is None, reason="no CPU OpenCL device")
def test_an_output_let_go_is_written_again_and_one_held_is_left_alone():
    rng = np.random.default_rng(14)
    exe = _cpu_exe()
    if not exe._host_io:
        pytest.skip("the CPU device does not report memory shared with the host")
    arrays = _inputs(rng, False)
    want = arrays["A"] @ arrays["B"]
    first = exe.run(arrays, poison=True)["C"]
    where = host_io.address(first)
    held = first.reshape(-1)[3:]  # a view the caller keeps, the array itself dropped
    del first
    second = exe.run(arrays, poison=True)["C"]
    assert host_io.address(second) != where, "memory a view still shows was written again"
    np.testing.assert_allclose(held, want.reshape(-1)[3:], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(second, want, rtol=1e-5, atol=1e-5)
    where = host_io.address(second)
    del second, held
    arrays = _inputs(rng, False)
    third = exe.run(arrays, poison=True)["C"]
    assert host_io.address(third) == where, "memory nobody holds is used again"
    np.testing.assert_allclose(third, arrays["A"] @ arrays["B"], rtol=1e-5, atol=1e-5)
