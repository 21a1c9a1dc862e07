"""Device errors a user can meet are TileErrors that say what to do."""

from __future__ import annotations

import pytest

import tilec
from tilec.errors import BuildError, DeviceError, TileError
from tilec.runtime.device import Runtime

from ..device import needs_device

pytestmark = needs_device


def test_build_error_shows_log_and_generated_line():
    rt = Runtime.get(None)
    src = "__kernel void k(__global float* a) {\n    a[0] = undefined_name + 1.0f;\n}\n"
    with pytest.raises(BuildError) as e:
        rt.build(src)
    text = str(e.value)
    assert "rejected a generated kernel" in text
    assert "undefined_name" in text


def test_buffer_larger_than_device_refused_before_allocation():
    rt = Runtime.get(None)
    n = int(rt.max_alloc // 4) + 1024
    src = "function (A[N]) -> (B) { B = A * 2; }"
    with pytest.raises(DeviceError, match="needs .* bytes, more than one allocation"):
        tilec.compile(src, {"A": (n,)})


def test_wrong_input_shape_at_call():
    exe = tilec.compile("function (A[N]) -> (B) { B = A * 2; }", {"A": (8,)})
    import numpy as np

    with pytest.raises(TileError, match="compiled for \\[8\\]"):
        exe(A=np.ones(9, np.float32))
    with pytest.raises(TileError, match="no array given for input A"):
        exe()


def test_validate_flag_checks_every_call():
    import numpy as np

    exe = tilec.compile("function (A[N]) -> (B) { B = exp(A) * 2; }", {"A": (64,)},
                        validate=True)
    exe(A=np.linspace(-1, 1, 64, dtype=np.float32))
    assert exe.last_validation is not None and exe.last_validation.ok


def test_threads_capped_by_device_and_kernel_limits(monkeypatch):
    import dataclasses

    import numpy as np

    from tilec.plan.hw import HwModel

    rt = Runtime.get(None)
    big = dataclasses.replace(HwModel.load("nvidia-h100"), threads=2 * rt.max_wg)
    src = "function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }"
    exe = tilec.compile(src, {"A": (64, 48), "B": (48, 64)}, hw=big, validate=True)
    assert all(k.local_size is None or k.local_size <= rt.max_wg for k in exe.kernels)
    rng = np.random.default_rng(0)
    exe(A=rng.uniform(-1, 1, (64, 48)), B=rng.uniform(-1, 1, (48, 64)))

    # A driver that allows only 32 work-items for these kernels: tilec plans fewer threads.
    monkeypatch.setattr(Runtime, "max_work_group", lambda self, kernel: 32)
    exe = tilec.compile(src, {"A": (64, 48), "B": (48, 64)}, hw="nvidia-h100", validate=True)
    assert all(k.local_size is None or k.local_size <= 32 for k in exe.kernels)
    exe(A=rng.uniform(-1, 1, (64, 48)), B=rng.uniform(-1, 1, (48, 64)))
    assert exe.last_validation.ok


def test_scalar_input_validates():
    import numpy as np

    exe = tilec.compile("function (A[N], S) -> (B) { B = A * S; }", {"A": (4,)}, validate=True)
    out = exe(A=np.arange(4, dtype=np.float32), S=np.float32(2.5))["B"]
    np.testing.assert_allclose(out, np.arange(4) * 2.5)
    assert exe.last_validation.ok


def test_named_model_vectors_capped_on_a_device_that_computes_them_wrongly():
    # A device whose probe saw only 4-wide vectors computed right: a named model planning 8
    # gets 4 (with a warning), and an explicit wider vector width is refused.
    import types
    import warnings

    from tilec.config import Config
    from tilec.errors import TileError, TileWarning
    from tilec.runtime.device_model import hw_model_for

    fake = types.SimpleNamespace(vector_limit=4, info=types.SimpleNamespace(label="probe: cpu"))
    with pytest.warns(TileWarning, match="computes vectors wider than 4 wrongly"):
        model = hw_model_for("pocl-cpu", Config(), fake)
    assert model.vec_size == 4 and "capped at 4" in model.source
    with pytest.raises(TileError, match="vector width 8: probe: cpu computes vectors wider"):
        hw_model_for("pocl-cpu", Config(vector_width=8), fake)
    fine = types.SimpleNamespace(vector_limit=16, info=fake.info)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert hw_model_for("pocl-cpu", Config(), fine).vec_size == 8


def test_build_errors_come_before_a_long_log_of_warnings():
    # NVIDIA's compiler writes a warning for each kernel first; the error must survive the cut.
    from tilec.runtime.build_log import explain_build

    log = "\n".join(f"(): Warning: Function k{i} is a kernel, so overriding noinline attribute."
                    for i in range(200))
    log += "\n<kernel>:3:9: error: use of undeclared identifier 'q'"
    text = explain_build(log, "__kernel void k0() {\n  int a;\n  a = q;\n}\n")
    assert "3:9: error: use of undeclared identifier 'q'" in text
    assert "generated line 3:\n    a = q;" in text
    assert "200 other lines of the log left out" in text


def test_kernel_times_read_from_the_last_calls_events_when_asked(monkeypatch):
    """A call keeps its events; `last_timings` reads them once, for that call's kernels."""
    import numpy as np

    from tilec.runtime import launch

    src = ("function (A[M, K], B[K, N]) -> (R) {"
           " C[m, n : M, N] = +(A[m, k] * B[k, n]); R = relu(C); }")
    exe = tilec.compile(src, {"A": (32, 48), "B": (48, 16)})
    rng = np.random.default_rng(3)
    arrays = {"A": rng.standard_normal((32, 48)).astype(np.float32),
              "B": rng.standard_normal((48, 16)).astype(np.float32)}
    reads = []
    real = launch.event_seconds
    monkeypatch.setattr(launch, "event_seconds", lambda ev: reads.append(ev) or real(ev))
    outs = exe.run(arrays, poison=True)
    assert exe.check(exe._inputs(arrays), outs).ok
    assert reads == []  # nothing read during the call
    times = exe.last_timings
    assert set(times) == {k.name for k in exe.kernels} and all(t > 0 for t in times.values())
    assert len(reads) == len(exe.kernels)
    assert exe.last_timings is times and len(reads) == len(exe.kernels)  # read once
    exe.run(arrays, repeat=3)
    assert len(exe.last_timings) == len(exe.kernels)
    assert len(reads) == 4 * len(exe.kernels)  # three rounds, their medians


@needs_device
def test_calls_queue_their_copies_with_their_kernels():
    # Inputs go up and outputs come down in the kernels' queue (no blocking copies): each
    # call returns its own inputs' results, a call refused for a missing input leaves the
    # queue as it was, and the arrays returned are the caller's to keep.
    import numpy as np

    exe = tilec.compile("function (A[N], B[N]) -> (C) { C = A * B + 1; }", {"A": (64,), "B": (64,)})
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal(64).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    first = exe.run({"A": a, "B": b}, poison=True)["C"]
    second = exe.run({"A": b, "B": a * 2}, poison=True)["C"]
    np.testing.assert_allclose(first, a * b + 1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(second, b * a * 2 + 1, rtol=1e-5, atol=1e-6)
    with pytest.raises(TileError, match="no array given for input B"):
        exe.run({"A": a})
    third = exe.run({"A": a, "B": b})["C"]
    np.testing.assert_allclose(third, first, rtol=0)
    np.testing.assert_allclose(first, a * b + 1, rtol=1e-5, atol=1e-6)  # not overwritten later


def test_pocl_threads_are_pinned_only_where_unset_and_every_cpu_is_allowed(monkeypatch):
    import os

    from tilec.runtime import device

    cpus = os.cpu_count() or 1
    monkeypatch.delenv("POCL_AFFINITY", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    device._pin_pool_threads()
    assert os.environ["POCL_AFFINITY"] == "1"
    # The user's word stands.
    monkeypatch.setenv("POCL_AFFINITY", "0")
    device._pin_pool_threads()
    assert os.environ["POCL_AFFINITY"] == "0"
    # A process kept off some CPUs: PoCL would pin thread i to CPU i, which it may not use.
    monkeypatch.delenv("POCL_AFFINITY")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(1, cpus + 1)),
                        raising=False)
    device._pin_pool_threads()
    assert "POCL_AFFINITY" not in os.environ
