"""Intermediate buffers are pooled by liveness; results stay right and memory goes down."""

from __future__ import annotations

import numpy as np

import tilec
from tilec.config import Config
from tilec.graph import ops

from ..device import needs_device

pytestmark = needs_device

CHAIN = """function (A[M, K], B[K, N], C[N, P]) -> (Y) {
  T1[m, n : M, N] = +(A[m, k] * B[k, n]);
  S1 = tanh(T1);
  T2[n : N] = >(S1[m, n]);
  S2 = S1 - T2;
  T3[m, p : M, P] = +(S2[m, n] * C[n, p]);
  S3 = relu(T3);
  T4[m, q : M, P] = +(S3[m, p] * C[n, p]), n < 2;
  Y = T4 * 0.5;
}"""


def test_chain_reuses_buffers_and_stays_correct():
    shapes = {"A": (17, 9), "B": (9, 23), "C": (23, 5)}
    # Buffers shared between kernels: one launch each (a chain keeps its temporaries in one
    # scratch buffer instead, `plan.chain`).
    exe = tilec.compile(CHAIN, shapes, validate=True, config=Config(chains=False))
    plan = exe.memory
    assert plan.slot_of, "temporaries should live in the pool"
    assert plan.peak_bytes < plan.unshared_bytes
    # Buffers that share a slot are never alive at once: no slot holds two tensors that one
    # kernel touches.
    for s in exe.sources:
        slots = [plan.slot_of[a.tensor] for a in s.args if a.tensor in plan.slot_of]
        assert len(slots) == len(set(slots)), s.name
    rng = np.random.default_rng(0)
    arrays = {n: rng.uniform(-1, 1, sh).astype(np.float32) for n, sh in shapes.items()}
    for _ in range(2):  # the second call runs over buffers the first one left dirty
        exe.run(arrays, poison=True)
        assert exe.last_validation.ok


def _cnn() -> tilec.Graph:
    rng = np.random.default_rng(1)
    g = tilec.Graph("cnn")
    x = g.input("x", (1, 3, 16, 16))
    w1 = g.constant(rng.uniform(-0.5, 0.5, (8, 3, 3, 3)).astype(np.float32))
    w2 = g.constant(rng.uniform(-0.5, 0.5, (16, 8, 3, 3)).astype(np.float32))
    fc = g.constant(rng.uniform(-0.5, 0.5, (16 * 4 * 4, 10)).astype(np.float32))
    y = ops.max_pool2d(ops.relu(ops.conv2d(x, w1, padding="same")), 2)
    y = ops.max_pool2d(ops.relu(ops.conv2d(y, w2, padding="same")), 2)
    y = ops.softmax(ops.matmul(ops.flatten(y), fc))
    g.output("y", y)
    return g


def test_example_cnn_peak_memory_with_and_without_reuse():
    g = _cnn()
    exe = g.compile()
    plan = exe.executable.memory
    assert plan.peak_bytes < plan.unshared_bytes
    x = np.random.default_rng(2).uniform(-1, 1, (1, 3, 16, 16)).astype(np.float32)
    got = exe.run({"x": x}, poison=True)["y"]
    np.testing.assert_allclose(got, g.evaluate(x=x)["y"], rtol=1e-4, atol=1e-5)
    print(plan.describe())


def test_bound_inputs_are_uploaded_once():
    exe = tilec.compile("function (A[N], W[N]) -> (B) { B = A * W; }", {"A": (8,), "W": (8,)})
    w = np.arange(1, 9, dtype=np.float32)
    exe.bind({"W": w})
    a = np.linspace(-1, 1, 8, dtype=np.float32)
    np.testing.assert_allclose(exe(A=a)["B"], a * w)
    np.testing.assert_allclose(exe(A=2 * a)["B"], 2 * a * w)
