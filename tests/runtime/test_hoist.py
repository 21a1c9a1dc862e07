"""Kernels that read bound inputs alone run once, at bind time, and the calls skip them."""

from __future__ import annotations

import numpy as np

import tilec
from tilec.config import Config
from tilec.graph import ops
from tilec.runtime.hoist import hoistable
from tilec.runtime.launch import KernelInfo

from ..device import CPU, needs_device


def _k(name: str, reads: tuple[str, ...], writes: tuple[str, ...]) -> KernelInfo:
    return KernelInfo(name, "contraction", 1, None, {}, "", 0, reads + writes, writes)


def test_a_chain_from_weights_is_hoisted_and_stops_at_the_first_per_call_input():
    ks = [_k("copy", ("W",), ("Wt",)), _k("scale", ("Wt", "S"), ("Ws",)),
          _k("conv", ("X", "Ws"), ("Y",)), _k("relu", ("Y",), ("R",))]
    chosen, deps = hoistable(ks, {"W", "S"})
    assert chosen == {"copy", "scale"}
    assert deps == {"W", "S"}
    assert hoistable(ks, set()) == (set(), set())
    # A weight that is not bound makes everything that reads it per call.
    assert hoistable(ks, {"W"})[0] == {"copy"}


def test_a_tensor_another_kernel_also_writes_keeps_every_writer_per_call():
    # `init` reads nothing, but `acc` accumulates per-call data into the same tensor: running
    # `init` once would leave the second call accumulating onto the first one's sum.
    ks = [_k("init", (), ("O",)), _k("acc", ("X", "W"), ("O",)), _k("copy", ("W",), ("Wt",))]
    assert hoistable(ks, {"W"})[0] == {"copy"}
    # A bound input a kernel updates in place is no constant: its readers stay per call.
    ks = [_k("bump", ("X",), ("W",)), _k("copy", ("W",), ("Wt",))]
    assert hoistable(ks, {"W"})[0] == set()


def _conv_graph(rng) -> tilec.Graph:
    g = tilec.Graph("hoist")
    x = g.input("x", (1, 5, 9, 11))
    w = g.constant(rng.uniform(-1, 1, (12, 5, 3, 3)).astype(np.float32))
    b = g.constant(rng.uniform(-1, 1, (12,)).astype(np.float32))
    scale = g.constant(rng.uniform(0.5, 1.5, (12,)).astype(np.float32))
    # A weight scaled by a per-channel constant (a folded normalization) feeds the conv.
    ws = ops.mul(w, ops.reshape(scale, (12, 1, 1, 1)))
    g.output("y", ops.relu(ops.add(ops.conv2d(x, ws, padding="same"),
                                   ops.reshape(b, (1, 12, 1, 1)))))
    return g


@needs_device
def test_graph_constants_computed_once_and_every_call_matches_numpy():
    rng = np.random.default_rng(3)
    g = _conv_graph(rng)
    # A CPU device: there the scaled filter is its own kernel, relaid for the convolution's
    # vectors (on the H200 the scale is fused into the per-call convolution: nothing to hoist).
    exe = g.compile(config=Config(device=CPU))
    assert exe.hoisted, "the scaled weight depends on constants alone"
    per_call = [k.name for k in exe.kernels if k.name not in exe.hoisted]
    assert per_call, "the convolution reads the input"
    for _ in range(3):  # later calls run over buffers the earlier ones left dirty
        x = rng.uniform(-1, 1, (1, 5, 9, 11)).astype(np.float32)
        got = exe.run({"x": x}, poison=True)["y"]
        assert set(exe.last_timings) == set(per_call)
        np.testing.assert_allclose(got, g.evaluate(x=x)["y"], rtol=1e-4, atol=1e-5)
    # Results computed at bind keep their own buffers: no pooled temporary overwrites them.
    plan = exe.executable.memory
    for k in exe.kernels:
        if k.name in exe.hoisted:
            assert not set(k.writes) & set(plan.slot_of), k.name


@needs_device
def test_a_weight_computed_from_constants_is_relaid_however_slow_a_launch():
    """The scaled weight is computed once, where the constants are bound, so relaying it for
    output-channel vectors costs no call a launch: the choice must not depend on the launch
    cost a busy machine's calibration measured (at 20 us and more the copy's launch had
    outweighed the gain, the scale was fused into every call's convolution, nothing hoisted)."""
    import dataclasses

    from tilec.runtime.device import Runtime
    from tilec.runtime.device_model import hw_model_for

    rng = np.random.default_rng(5)
    g = _conv_graph(rng)
    config = Config()
    slow = dataclasses.replace(hw_model_for(None, config, Runtime.get(config.device)),
                               launch_us=1000.0)
    exe = g.compile(hw=slow)
    assert "contract_mul_t" in exe.hoisted
    x = rng.uniform(-1, 1, (1, 5, 9, 11)).astype(np.float32)
    got = exe.run({"x": x}, poison=True)["y"]
    np.testing.assert_allclose(got, g.evaluate(x=x)["y"], rtol=1e-4, atol=1e-5)


@needs_device
def test_a_call_giving_a_bound_input_reruns_the_kernels_that_read_it():
    src = """function (A[M, K], W[N, K]) -> (C) {
      Wt[k, n : K, N] = =(W[n, k]);
      C[m, n : M, N] = +(A[m, k] * Wt[k, n]);
    }"""
    exe = tilec.compile(src, {"A": (7, 13), "W": (10, 13)})
    rng = np.random.default_rng(4)
    w = rng.uniform(-1, 1, (10, 13)).astype(np.float32)
    exe.bind({"W": w})
    assert len(exe.hoisted) == 1
    a = rng.uniform(-1, 1, (7, 13)).astype(np.float32)
    np.testing.assert_allclose(exe.run({"A": a}, poison=True)["C"], a @ w.T, rtol=1e-5,
                               atol=1e-5)
    w2 = rng.uniform(-1, 1, (10, 13)).astype(np.float32)
    np.testing.assert_allclose(exe.run({"A": a, "W": w2}, poison=True)["C"], a @ w2.T,
                               rtol=1e-5, atol=1e-5)
    assert len(exe.last_timings) == 2  # the copy ran again
    # The value given last is the binding now, on the device and for validation alike.
    np.testing.assert_allclose(exe.run({"A": a}, poison=True)["C"], a @ w2.T, rtol=1e-5,
                               atol=1e-5)


@needs_device
def test_a_bound_copy_is_settled_on_the_host_and_a_copy_of_a_device_result_is_launched():
    # Wt copies a bound input: numpy computes it at bind, its kernel is never launched there
    # (PoCL would generate its code for that one launch).  Vt copies what a kernel computed
    # from bound inputs on the device: it is launched.  Both agree with numpy afterwards.
    src = """function (A[M, K], W[N, K], S[N, K]) -> (C, D) {
      Wt[k, n : K, N] = =(W[n, k]);
      C[m, n : M, N] = +(A[m, k] * Wt[k, n]);
      V = W * 2.5 + S;
      Vt[k, n : K, N] = =(V[n, k]);
      D[m, n : M, N] = +(A[m, k] * Vt[k, n]);
    }"""
    exe = tilec.compile(src, {"A": (7, 13), "W": (10, 13), "S": (10, 13)},
                        config=Config(chains=False))  # which kernel runs where: one each
    rng = np.random.default_rng(5)
    w = rng.uniform(-1, 1, (10, 13)).astype(np.float32)
    s = rng.uniform(-1, 1, (10, 13)).astype(np.float32)
    exe.bind({"W": w, "S": s})
    copies = {k.name for k in exe.kernels if k.name in exe.hoisted and "Wt" in k.writes}
    assert copies, "the copy of W depends on bound inputs alone"
    assert not copies & set(exe.bind_timings), "the bound copy was launched"
    assert any("Vt" in k.writes and k.name in exe.bind_timings for k in exe.kernels), \
        "a copy of a device result must run on the device"
    a = rng.uniform(-1, 1, (7, 13)).astype(np.float32)
    out = exe.run({"A": a}, poison=True)
    assert not set(exe.hoisted) & set(exe.last_timings)
    np.testing.assert_allclose(out["C"], a @ w.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["D"], a @ (w * 2.5 + s).T, rtol=1e-5, atol=1e-5)


@needs_device
def test_an_input_only_host_kernels_read_is_uploaded_when_the_device_needs_it():
    # W is read by its copy alone, which bind settles on the host: W is not uploaded.  A call
    # giving S runs every bound kernel again on the device, the copy of W included: W's
    # buffer must hold W by then.
    src = """function (A[M, K], W[N, K], S[N, K]) -> (C, D) {
      Wt[k, n : K, N] = =(W[n, k]);
      C[m, n : M, N] = +(A[m, k] * Wt[k, n]);
      V = S * 2.5 + 1.0;
      Vt[k, n : K, N] = =(V[n, k]);
      D[m, n : M, N] = +(A[m, k] * Vt[k, n]);
    }"""
    exe = tilec.compile(src, {"A": (7, 13), "W": (10, 13), "S": (10, 13)},
                        config=Config(chains=False))
    rng = np.random.default_rng(6)
    w = rng.uniform(-1, 1, (10, 13)).astype(np.float32)
    s = rng.uniform(-1, 1, (10, 13)).astype(np.float32)
    exe.bind({"W": w.T.copy().T, "S": s})  # W given as a view in another order
    assert "W" not in exe._buffers, "W was uploaded though only the host reads it"
    assert "S" in exe._buffers
    a = rng.uniform(-1, 1, (7, 13)).astype(np.float32)
    out = exe.run({"A": a}, poison=True)
    np.testing.assert_allclose(out["C"], a @ w.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["D"], a @ (s * 2.5 + 1.0).T, rtol=1e-5, atol=1e-5)
    s2 = rng.uniform(-1, 1, (10, 13)).astype(np.float32)
    out = exe.run({"A": a, "S": s2}, poison=True)
    assert set(exe.hoisted) <= set(exe.last_timings), "the bound kernels ran again"
    np.testing.assert_allclose(out["C"], a @ w.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["D"], a @ (s2 * 2.5 + 1.0).T, rtol=1e-5, atol=1e-5)


@needs_device
def test_arguments_are_set_once_and_again_after_bind_moves_buffers(monkeypatch):
    """A kernel's arguments are set at its first launch only (a model's call launches dozens
    of kernels); `bind` moves what it computes out of the buffer pool, and the kernels that
    read or write those buffers get their arguments set again."""
    src = """function (A[M, K], W[N, K]) -> (C) {
      Wt[k, n : K, N] = =(W[n, k]);
      T[m, n : M, N] = +(A[m, k] * Wt[k, n]);
      C = T * 2.0;
    }"""
    exe = tilec.compile(src, {"A": (7, 13), "W": (10, 13)})
    rt = exe.runtime
    real = type(rt).launch
    set_for: list[bool] = []

    def launch(self, kernel, global_size, local_size, args):
        set_for.append(args is not None)
        return real(self, kernel, global_size, local_size, args)

    monkeypatch.setattr(type(rt), "launch", launch)
    rng = np.random.default_rng(6)
    w = rng.uniform(-1, 1, (10, 13)).astype(np.float32)
    for _ in range(3):
        a = rng.uniform(-1, 1, (7, 13)).astype(np.float32)
        got = exe.run({"A": a, "W": w}, poison=True)["C"]
        np.testing.assert_allclose(got, 2 * a @ w.T, rtol=1e-5, atol=1e-5)
    launches = len(exe.kernels)
    assert set_for == [True] * launches + [False] * (2 * launches)
    set_for.clear()
    exe.bind({"W": w})
    a = rng.uniform(-1, 1, (7, 13)).astype(np.float32)
    np.testing.assert_allclose(exe.run({"A": a}, poison=True)["C"], 2 * a @ w.T, rtol=1e-5,
                               atol=1e-5)
    assert any(set_for)  # set again for the moved buffers
