"""`codegen.phases`: which kernels share a phase launch and the launch's text (device-free);
the barrier across work-groups on the CPU device (a kernel reading what other work-groups
wrote before it, its stop when they cannot all run); compiled graphs with phase launches and
without, against numpy with their outputs poisoned."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import numpy as np
import pytest

from tilec.codegen import phases
from tilec.codegen.phases import (
    ABORT_INDEX,
    GRID_SYNC,
    MAX_ARGS,
    SMALL_RUN_S,
    SYNC_INTS,
    fuse,
    fuse_phases,
    one_core_seconds,
    phase_member,
    phase_runs,
)
from tilec.codegen.siblings import merge
from tilec.config import Config
from tilec.errors import DeviceError
from tilec.graph import ops
from tilec.graph.builder import Graph
from tilec.graph.ops_norm import layer_norm
from tilec.plan.hw import HwModel
from tilec.runtime.share import canonical

from ..device import CPU, needs_device
from ..graph_refs import close, run
from .test_siblings import fire_graph, kernel

RNG = np.random.default_rng(5)
TENSORS = {"x", "y", "z", "w", "v", "u", "p", "q", "cat", "a", "b"}


def rand(*shape):
    return RNG.uniform(-1.0, 1.0, size=shape).astype(np.float32)


def digest(source):
    return hashlib.sha256(canonical(source, TENSORS).encode()).hexdigest()


def test_runs_are_consecutive_members_apart_from_settled_kernels_and_row_kernels():
    a = kernel("k_a", ["x"], ["y"])
    b = kernel("k_b", ["y"], ["z"])
    rows = kernel("k_rows", ["z"], ["w"], local=4)  # a work-group of 4: not a phase
    c = kernel("k_c", ["w"], ["v"])
    d = kernel("k_d", ["v"], ["u"])
    e = kernel("k_e", ["u"], ["p"])
    sources = [a, b, rows, c, d, e]
    assert phase_runs(sources, fixed=()) == [[0, 1], [3, 4, 5]]
    # A kernel settled by the constants (run once, at bind) joins none.
    assert phase_runs(sources, fixed={3}) == [[0, 1], [4, 5]]
    hw = HwModel.load("pocl-cpu")
    fused = fuse_phases(sources, (), digest, hw, units=2)
    assert [s.kind for s in fused] == ["phases", "contraction", "phases"]
    assert fused[0].members == (a, b) and fused[2].members == (c, d, e)
    # Kernels of a few elements: one core does them sooner than its threads wake and meet.
    assert one_core_seconds([a, b], hw) < SMALL_RUN_S and fused[0].global_size == 1
    big = [replace(k, flops=10**9) for k in (a, b)]
    assert fuse_phases(big, (), digest, hw, units=2)[0].global_size == 2


def test_work_items_that_ask_only_their_global_index_are_units_of_a_phase():
    # A CPU row kernel: a work-group of 4 rows, one work-item a row, no barrier.
    rows = kernel("k_rows", ["x"], ["y"], local=4, groups=3, kind="row",
                  body="    const int row = get_global_id(0);\n    if (row >= 10) return;\n"
                       "    b_y[row] = b_x[row];")
    rows = replace(rows, text=rows.text.replace("    int grp = get_group_id(0);\n", ""))
    assert phase_member(rows)
    lanes = kernel("k_lanes", ["x"], ["y"], local=4, kind="row",
                   body="    b_y[get_global_id(0)] = b_x[get_local_id(0)];")
    shared = kernel("k_shared", ["x"], ["y"], local=4,
                    body="    __local float t[4];\n    t[0] = b_x[0];\n    b_y[0] = t[0];")
    assert not phase_member(lanes) and not phase_member(shared)
    f = fuse([rows, kernel("k_after", ["y"], ["z"], groups=12)], digest, groups=2)
    assert "const int row = tilec_g;" in f.text and "blk < 12;" in f.text  # 3 x 4 rows
    # A work-item's few operations are inlined into the loop over a block of them, and the
    # blocks are a quarter of a work-group's share (one element a block would mean an
    # atomic a few operations: an SE block's 401,408-element product ran 1.27x slower).
    assert "static inline void phases_k_rows_f0(" in f.text
    assert "tilec_units(12, groups)" in f.text and "tilec_block(12, groups)" in f.text


def test_runs_stop_at_the_arguments_a_launch_can_take():
    chain = [kernel(f"k{i}", [f"t{i}", f"w{i}"], [f"t{i + 1}"]) for i in range(100)]
    runs = phase_runs(chain, fixed=())
    assert sum(len(r) for r in runs) == 100 and len(runs) > 1
    for r in runs:
        tensors = {a.tensor for i in r for a in chain[i].args}
        assert len(tensors) + 1 <= MAX_ARGS  # the sync buffer is one more


def test_fused_text_declares_each_tensor_once_and_writes_same_kernels_once():
    a = kernel("k_a", ["x"], ["y"], groups=3)
    b = kernel("k_b", ["y"], ["z"], groups=5, body="    b_z[grp] = b_y[4 - grp] + 1.0f;")
    a2 = kernel("k_a2", ["z"], ["w"], groups=3)  # k_a's text over other tensors
    f = fuse([a, b, a2], digest, groups=2)
    assert f.global_size == 2 and f.local_size == 1 and f.members == (a, b, a2)
    assert [(x.tensor, x.role) for x in f.args] == [
        ("x", "in"), ("y", "out"), ("z", "out"), ("w", "out"), (GRID_SYNC, "sync", )]
    # The launch's parameters: neither const nor restrict (a later phase reads what an
    # earlier one wrote through another parameter); the members keep theirs.
    assert "    __global float* b_x,\n    __global float* b_y," in f.text
    assert "static void phases_k_a_f0(\n    __global const float* restrict b_x" in f.text
    assert f.text.count("static void phases_k_a_f") == 2  # k_a and k_a2 share one
    assert "phases_k_a_f0(b_z, b_w, g);" in f.text and "phases_k_a_f1(b_y, b_z, g);" in f.text
    # Between phases, and at the end (which resets the counter of blocks dealt).
    assert f.text.count("tilec_grid_sync(tilec_sync, (int)groups)") == 3
    assert "int grp = tilec_g;" in f.text and "get_group_id(0);\n    int grp" not in f.text
    assert f.text.count("__kernel") == 1


def test_small_kernels_run_on_the_first_work_group_with_one_barrier_after_them():
    a = kernel("k_a", ["x"], ["y"], groups=8)
    b = kernel("k_b", ["y"], ["z"], groups=3, body="    b_z[grp] = b_y[7 - grp];")
    c = kernel("k_c", ["z"], ["w"], groups=3, body="    b_w[grp] = -b_z[2 - grp];")
    d = kernel("k_d", ["w"], ["v"], groups=8, body="    b_v[grp] = 2.0f * b_w[grp % 3];")
    f = fuse([a, b, c, d], digest, groups=4, serial=[False, True, True, False])
    body = f.text[f.text.index("__kernel"):]
    assert body.count("tilec_grid_sync(") == 3  # after a, after b and c, at the end
    assert "if (get_group_id(0) == 0) {" in body and "for (size_t g = 0; g < 3; ++g)" in body
    assert body.index("phases_k_a_f1(b_y, b_z, g);") < body.index("phases_k_a_f2(b_z, b_w, g);")


def test_a_phase_of_siblings_runs_their_parts_on_its_work_groups():
    s1 = kernel("k_s1", ["x"], ["p"], groups=3)
    s2 = kernel("k_s2", ["x"], ["q"], groups=5, body="    b_q[grp] = -b_x[grp];")
    after = kernel("k_after", ["p"], ["y"])  # s1's text: its function
    f = fuse([merge([s1, s2]), after], digest, groups=4)
    assert "if (g < 3) phases_siblings_k_s1_f0(b_x, b_p, g);" in f.text
    assert "else phases_siblings_k_s1_f1(b_x, b_q, g - 3);" in f.text
    assert "blk < 8; blk = tilec_next" in f.text  # the siblings' 3 + 5 work-groups
    assert "phases_siblings_k_s1_f0(b_p, b_y, g);" in f.text


def _build(text, options=()):
    import pyopencl as cl

    from tilec.runtime.device import Runtime

    rt = Runtime.get(CPU)
    return rt, cl.Program(rt.context, text).build(options=list(options))


def _chain(n, serial=None):
    """Three phases, each reading elements other work-groups wrote in the one before
    (`serial`: which the first work-group runs alone)."""
    a = kernel("k_a", ["x"], ["y"], groups=n, body="    b_y[grp] = 2.0f * b_x[grp];")
    b = kernel("k_b", ["y"], ["z"], groups=n,
               body=f"    b_z[grp] = b_y[{n - 1} - grp] + b_y[(grp + 7) % {n}];")
    c = kernel("k_c", ["z", "y"], ["w"], groups=n,
               body=f"    b_w[grp] = b_z[(grp * 5) % {n}] * b_y[grp];")
    return fuse([a, b, c], digest, groups=64, serial=serial)


def _args(rt, cl, x, n):
    mf = cl.mem_flags
    bufs = {"x": cl.Buffer(rt.context, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=x)}
    for t in ("y", "z", "w"):
        bufs[t] = cl.Buffer(rt.context, mf.READ_WRITE | mf.COPY_HOST_PTR,
                            hostbuf=np.full(n, np.nan, np.float32))
    bufs[GRID_SYNC] = cl.Buffer(rt.context, mf.READ_WRITE | mf.COPY_HOST_PTR,
                                hostbuf=np.zeros(SYNC_INTS, np.int32))
    return bufs


@needs_device
@pytest.mark.parametrize("serial", [None, [False, True, False], [True, True, False]])
def test_work_groups_see_what_the_others_wrote_in_the_phase_before(serial):
    import pyopencl as cl

    n = 1031
    f = _chain(n, serial)
    rt, prg = _build(f.text)
    kernel_ = getattr(prg, f.name)
    x = rand(n)
    y = 2 * x
    z = y[::-1] + y[(np.arange(n) + 7) % n]
    want = z[(np.arange(n) * 5) % n] * y
    bufs = _args(rt, cl, x, n)
    kernel_.set_args(*[bufs[a.tensor] for a in f.args])
    for _ in range(20):  # every call a race the barrier must win
        for t in ("y", "z", "w"):  # poisoned each call: no earlier call's values to read
            cl.enqueue_fill_buffer(rt.queue, bufs[t], np.float32(np.nan), 0, 4 * n)
        cl.enqueue_nd_range_kernel(rt.queue, kernel_, (rt.compute_units,), (1,))
        got = np.empty(n, np.float32)
        cl.enqueue_copy(rt.queue, got, bufs["w"])
        np.testing.assert_allclose(got, want, rtol=1e-6)
    flags = np.empty(SYNC_INTS, np.int32)
    cl.enqueue_copy(rt.queue, flags, bufs[GRID_SYNC])
    # A barrier between the phases (small ones in a row: one) and one at the end a call,
    # every count reset.
    barriers = {None: 3, False: 3, True: 2}[serial and serial[0]]
    assert flags[0] == 0 and flags[16] == 20 * barriers and flags[48] == 0
    assert flags[ABORT_INDEX] == 0


@needs_device
def test_a_launch_whose_work_groups_cannot_all_run_stops_and_says_so():
    # One work-group more than the driver's threads: the first ones wait at the barrier for
    # one that has no thread.  They give up after the spin limit (lowered here), raise the
    # flag, and the launch ends instead of hanging.
    import pyopencl as cl

    n = 64
    f = _chain(n)
    rt, prg = _build(f.text, ["-DTILEC_SPIN_LIMIT=200000"])
    kernel_ = getattr(prg, f.name)
    bufs = _args(rt, cl, rand(n), n)
    kernel_.set_args(*[bufs[a.tensor] for a in f.args])
    cl.enqueue_nd_range_kernel(rt.queue, kernel_, (rt.compute_units + 1,), (1,))
    flags = np.empty(SYNC_INTS, np.int32)
    cl.enqueue_copy(rt.queue, flags, bufs[GRID_SYNC])
    assert flags[ABORT_INDEX] == 1


def mlp_graph():
    g = Graph("mlp")
    x = g.input("x", (4, 24))
    h = x
    for _ in range(4):  # a normalization's rows between the products
        h = ops.relu(ops.matmul(h, g.constant(rand(24, 24))) + g.constant(rand(24)))
        h = layer_norm(h, g.constant(rand(24)), g.constant(rand(24)), axis=-1)
    g.output("y", ops.softmax(ops.matmul(h, g.constant(rand(24, 10))), axis=-1))
    return g, {"x": rand(4, 24)}


@needs_device
@pytest.mark.parametrize("graph", [fire_graph, mlp_graph])
@pytest.mark.parametrize("one_group", [True, False])
def test_graphs_run_in_phase_launches_on_the_cpu(graph, one_group, monkeypatch):
    # These graphs are small enough for one work-group (`SMALL_RUN_S`); at 0 s they take
    # one a compute unit, meeting at the barriers.
    if not one_group:
        monkeypatch.setattr(phases, "SMALL_RUN_S", 0.0)
    g, arrays = graph()
    want = g.evaluate(**arrays)
    exes = {}
    for on in (False, True):
        exe, outs = run(g, arrays, passes=True, config=Config(
            device=CPU, phase_launches=on, use_disk_cache=False, chains=False))
        close(outs["y"], want["y"], rtol=1e-4)
        exes[on] = exe.executable
    off, on = exes[False], exes[True]
    fused = [k for k in on.kernels if k.kind == "phases"]
    assert fused and not any(k.kind == "phases" for k in off.kernels)
    assert {k.global_size for k in fused} == ({1} if one_group else {on.runtime.compute_units})
    assert len(on.kernels) < len(off.kernels)
    assert set(on.hoisted) == set(off.hoisted)  # what bind settles stays out of the launch
    for _ in range(3):  # other inputs, other calls: computed anew each time
        other = {n: rand(*a.shape) for n, a in arrays.items()}
        close(exes[True].run(other, poison=True)["y"], g.evaluate(**other)["y"], rtol=1e-4)


@needs_device
def test_a_call_whose_phase_launch_stopped_is_refused_and_the_next_one_runs():
    g, arrays = mlp_graph()
    exe, _ = run(g, arrays, passes=True, config=Config(device=CPU, use_disk_cache=False,
                                                       chains=False))
    inner = exe.executable
    assert any(k.kind == "phases" for k in inner.kernels)
    inner._phase_checks = 1
    # The flag as a launch that gave up leaves it: every work-group leaves at its barrier.
    flags = np.zeros(SYNC_INTS, np.int32)
    flags[ABORT_INDEX] = 1
    inner.runtime.write(inner._buffer(GRID_SYNC), flags)
    with pytest.raises(DeviceError, match="phase launch"):
        exe.run(arrays)
    inner._phase_checks = 1
    close(exe.run(arrays, poison=True)["y"], g.evaluate(**arrays)["y"], rtol=1e-4)


@needs_device
def test_a_bundle_keeps_its_phase_launches_and_a_device_that_cannot_run_them_refuses_it(
        tmp_path, monkeypatch):
    import tilec.bundle as bundles

    monkeypatch.setattr(phases, "SMALL_RUN_S", 0.0)  # a launch of every compute unit
    g, arrays = mlp_graph()
    exe, _ = run(g, arrays, passes=True, config=Config(device=CPU, use_disk_cache=False,
                                                       chains=False))
    inner = exe.executable
    assert any(k.kind == "phases" for k in inner.kernels)
    path = tmp_path / "mlp.tlc"
    bundles.write_bundle(inner, path)
    loaded = bundles.load(path, config=Config(device=CPU))
    feed = {**inner._bound, **arrays}  # a bundle takes the weights as inputs
    close(loaded.run(feed, poison=True)["y"], g.evaluate(**arrays)["y"], rtol=1e-4)
    monkeypatch.setattr(bundles, "runs_groups_at_once", lambda runtime: False)
    with pytest.raises(DeviceError, match="phase launches"):
        bundles.load(path, config=Config(device=CPU))


@needs_device
def test_a_phase_launch_the_driver_refuses_falls_back_to_separate_launches(monkeypatch):
    import tilec.compiler as compiler
    from tilec.errors import TileWarning

    real = compiler.fuse_phases

    def broken(*args, **kwargs):  # a phase launch whose text the driver cannot build
        return [replace(s, text=s.text + "\n#error a broken phase launch\n")
                if s.kind == "phases" else s for s in real(*args, **kwargs)]

    monkeypatch.setattr(compiler, "fuse_phases", broken)
    g, arrays = mlp_graph()
    with pytest.warns(TileWarning, match="separate launches"):
        exe, outs = run(g, arrays, passes=True,
                        config=Config(device=CPU, use_disk_cache=False, chains=False))
    close(outs["y"], g.evaluate(**arrays)["y"], rtol=1e-4)
    assert not any(k.kind == "phases" for k in exe.executable.kernels)


_CONCURRENT = """
import sys, threading
import numpy as np
sys.path[:0] = [{root!r}]
from tests.codegen.test_phases import mlp_graph
from tests.graph_refs import close
from tilec.config import Config
from tilec.codegen import phases
phases.SMALL_RUN_S = 0.0
label = {label!r}
g, arrays = mlp_graph()
want = g.evaluate(**arrays)["y"]
# Two runtimes (two contexts and queues) on one device: their launches may overlap.
exes = [g.compile(passes=True, config=Config(device=spec, use_disk_cache=False, chains=False))
        for spec in (label, label.upper())]
assert all(any(k.kind == "phases" for k in e.executable.kernels) for e in exes)
errors = []
def calls(exe):
    try:
        for _ in range(30):
            close(exe.run(arrays, poison=True)["y"], want, rtol=1e-4)
    except Exception as e:
        errors.append(repr(e))
threads = [threading.Thread(target=calls, args=(e,)) for e in exes]
for t in threads: t.start()
for t in threads: t.join()
print("errors", errors)
sys.exit(1 if errors else 0)
"""


@needs_device
def test_phase_launches_of_two_queues_at_once_finish_and_agree():
    # In a child process with a time limit: a launch whose work-groups wait for threads another
    # launch holds would never end.
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    code = _CONCURRENT.format(root=root, label=CPU)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=240, cwd=root)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
