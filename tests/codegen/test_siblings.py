"""`codegen.siblings`: which kernels share a launch (device-free), the shared kernel's text,
and compiled graphs on the CPU device with launches shared and not, against numpy with their
outputs poisoned."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tilec.codegen.kernel_text import KernelArg, KernelSource
from tilec.codegen.siblings import (
    group_siblings,
    independent,
    joinable,
    merge,
    merge_siblings,
    settled,
    varying_tensors,
)
from tilec.config import Config
from tilec.graph import ops
from tilec.graph.builder import Graph
from tilec.runtime.share import canonical

from ..device import needs_device
from ..graph_refs import close, run

RNG = np.random.default_rng(11)


def rand(*shape):
    return RNG.uniform(-1.0, 1.0, size=shape).astype(np.float32)


def kernel(name, reads, writes, *, local=1, groups=4, kind="contraction", body=""):
    args = tuple(KernelArg(t, "in", "float32", 8) for t in reads) + \
        tuple(KernelArg(t, "out", "float32", 8) for t in writes)
    params = [f"__global const float* restrict b_{t}" for t in reads] + \
        [f"__global float* b_{t}" for t in writes]
    text = "\n".join([f"/* {name} */",
                      f"__kernel __attribute__((reqd_work_group_size({local}, 1, 1)))",
                      f"void {name}(", ",\n".join(f"    {p}" for p in params) + ")", "{",
                      "    int grp = get_group_id(0);",
                      body or f"    b_{writes[0]}[grp] = b_{reads[0]}[grp];", "}", ""])
    return KernelSource(name, kind, text, args, groups * local, local)


def test_independent_kernels_next_to_each_other_are_grouped():
    s = kernel("k_s", ["x", "w0"], ["s"])
    e1 = kernel("k_e1", ["s", "w1"], ["cat"])
    e3 = kernel("k_e3", ["s", "w3"], ["cat"])
    after = kernel("k_after", ["cat"], ["y"])
    sources = [s, e1, e3, after]
    varying = varying_tensors(sources, ["x", "w0", "w1", "w3"], ["w0", "w1", "w3"])
    assert varying == {"x", "s", "cat", "y"}
    # The two expands write one buffer: apart only where it is a concatenation's.
    assert group_siblings(sources, varying, slices={"cat"}) == [[0], [1, 2], [3]]
    assert group_siblings(sources, varying) == [[0], [1], [2], [3]]
    assert not independent(s, e1) and not independent(e3, after, {"cat"})


def test_kernels_of_constants_alone_go_first_and_keep_no_sibling_apart():
    # A filter's panels are made from a constant between the two expands: they run once
    # where the constants are bound, so the expand reading them still joins the one before.
    s = kernel("k_s", ["x", "w0"], ["s"])
    e1 = kernel("k_e1", ["s", "w1"], ["cat"])
    pack = kernel("k_pack", ["w3"], ["w3_panels"])
    e3 = kernel("k_e3", ["s", "w3_panels"], ["cat"])
    after = kernel("k_after", ["cat"], ["y"])
    sources = [s, e1, pack, e3, after]
    inputs, constants = ["x", "w0", "w1", "w3"], ["w0", "w1", "w3"]
    assert settled(sources, inputs, constants) == {2}
    varying = varying_tensors(sources, inputs, constants)
    assert group_siblings(sources, varying, {"cat"}) == [[0], [1], [2], [3], [4]]
    merged = merge_siblings(sources, inputs, constants, {"cat"})
    assert [m.name for m in merged] == ["k_pack", "k_s", "siblings_k_e1", "k_after"]
    # A constant some kernel writes (updated in place each call) settles nothing it feeds.
    bump = kernel("k_bump", ["x"], ["w3"])
    assert settled([bump, pack, e3], inputs, constants) == set()


def test_branches_emitted_whole_are_grouped_by_depth():
    # An inception block: four branches from x, emitted one after another; the heads share a
    # launch, then the second steps, each moved only past kernels it does not depend on.
    b1 = kernel("k_b1", ["x", "w1"], ["cat"])
    b2a = kernel("k_b2a", ["x", "w2"], ["t2"])
    b2b = kernel("k_b2b", ["t2", "w3"], ["cat"])
    b3a = kernel("k_b3a", ["x", "w4"], ["t3"])
    b3b = kernel("k_b3b", ["t3", "w5"], ["cat"])
    b4a = kernel("k_b4a", ["x"], ["t4"])
    b4b = kernel("k_b4b", ["t4", "w6"], ["cat"])
    tail = kernel("k_tail", ["cat"], ["y"])
    sources = [b1, b2a, b2b, b3a, b3b, b4a, b4b, tail]
    varying = varying_tensors(sources, ["x"] + [f"w{i}" for i in range(1, 7)],
                              [f"w{i}" for i in range(1, 7)])
    assert group_siblings(sources, varying, {"cat"}) == [[0, 1, 3, 5], [2, 4, 6], [7]]
    # A kernel that reads what one it would pass writes stays behind it.
    late = kernel("k_late", ["t2"], ["z"])
    assert group_siblings([b2a, b2b, late], varying | {"t2"}, {"cat"}) == [[0], [1, 2]]


def test_what_does_not_join():
    a = kernel("k_a", ["x"], ["p"])
    other_size = kernel("k_b", ["x"], ["q"], local=4)
    barrier = kernel("k_c", ["x"], ["r"], body="    barrier(CLK_GLOBAL_MEM_FENCE);")
    rows = kernel("k_d", ["x"], ["t"], kind="rows")
    free = kernel("k_e", ["x"], ["u"], local=1)
    assert joinable(a) and not joinable(barrier) and not joinable(rows)
    sources = [a, other_size, barrier, rows, free]
    # The last kernel joins the first, moved past three it does not depend on.
    assert group_siblings(sources, {"x"}) == [[0, 4], [1], [2], [3]]
    # A kernel of constants alone is settled once when they are bound: it stays alone.
    w = kernel("k_w", ["w"], ["wt"])
    assert group_siblings([a, w], varying_tensors([a, w], ["x", "w"], ["w"])) == [[0], [1]]
    assert group_siblings([a, free], {"x"}) == [[0, 1]]


def test_merged_text_runs_each_part_on_its_own_work_groups():
    a = kernel("k_a", ["x", "w"], ["p"], groups=3)
    b = kernel("k_b", ["x", "v"], ["q"], groups=5)
    m = merge([a, b])
    assert m.global_size == 8 and m.local_size == 1
    assert [x.tensor for x in m.args] == ["x", "w", "p", "x", "v", "q"]
    assert m.text.count("__kernel") == 1 and m.text.count("static inline void") == 2
    assert "int grp = ((size_t)get_group_id(0) - 0);" in m.text
    assert "int grp = ((size_t)get_group_id(0) - 3);" in m.text
    assert re.search(r"if \(g < 3\) siblings_k_a_part0\(a_x, a_w, a_p\);", m.text)
    assert "else siblings_k_a_part1(c_x, c_v, c_q);" in m.text
    # Two launches of the same kernels over other tensors are one function (`share`).
    a2 = kernel("k_a2", ["x2", "w2"], ["p2"], groups=3)
    b2 = kernel("k_b2", ["x2", "v2"], ["q2"], groups=5)
    m2 = merge([a2, b2])
    tensors = {"x", "w", "p", "v", "q", "x2", "w2", "p2", "v2", "q2"}
    assert canonical(m, tensors) == canonical(m2, tensors)
    assert canonical(m, tensors) != canonical(merge([b, a]), tensors)


def fire_graph(branches: int = 2, size: int = 9):
    """A fire module's shape: a squeeze 1x1 convolution read by `branches` convolutions
    (1x1 and padded 3x3, alternating) whose outputs are concatenated, then a 1x1
    convolution of the concatenation."""
    g = Graph("fire")
    x = g.input("x", (1, 8, size, size))
    s = ops.relu(ops.conv2d(x, g.constant(rand(6, 8, 1, 1)), g.constant(rand(6))))
    outs = []
    for i in range(branches):
        k = 1 if i % 2 == 0 else 3
        outs.append(ops.relu(ops.conv2d(s, g.constant(rand(8, 6, k, k)), g.constant(rand(8)),
                                        padding=k // 2)))
    cat = ops.concat(outs, axis=1)
    g.output("y", ops.conv2d(cat, g.constant(rand(4, 8 * branches, 1, 1))))
    return g, {"x": rand(1, 8, size, size)}


@needs_device
@pytest.mark.parametrize("branches", [2, 3])
def test_fire_module_shares_launches_on_the_cpu(branches):
    g, arrays = fire_graph(branches)
    want = g.evaluate(**arrays)
    exes = {}
    for on in (False, True):
        exe, outs = run(g, arrays, passes=True, config=Config(
            device="Portable", sibling_launches=on, use_disk_cache=False, chains=False,
            phase_launches=False))  # (phases: the whole call one launch, `test_phases`)
        close(outs["y"], want["y"], rtol=1e-4)
        exes[on] = exe
    off, on = exes[False].executable, exes[True].executable
    merged = [k for k in on.kernels if k.name.startswith("siblings_")]
    assert len(merged) == 1 and len(on.kernels) == len(off.kernels) - (branches - 1)
    # What is bound once stays settled at bind in both.
    assert set(on.hoisted) == set(off.hoisted)
    # Another input, another call: the shared launch computes it, not the last call's values.
    other = {"x": rand(1, 8, 9, 9)}
    close(exes[True].run(other)["y"], g.evaluate(**other)["y"], rtol=1e-4)


@needs_device
def test_shared_launches_run_their_parts_edge_tiles():
    # 13 x 13 images: rows in tiles that leave a partial one, whose code of its own
    # (`codegen.edge`) returns early and tells its work-groups by `get_group_id(0)`: both
    # must hold inside a part of a shared launch.
    g, arrays = fire_graph(2, size=13)
    want = g.evaluate(**arrays)
    exe, outs = run(g, arrays, passes=True, config=Config(
        device="Portable", sibling_launches=True, use_disk_cache=False, chains=False,
        phase_launches=False, tiles={"relu_1_acc": {"ci": 6, "co": 8, "x0": 1, "x1": 4}}))
    close(outs["y"], want["y"], rtol=1e-4)
    merged = [k for k in exe.executable.sources if k.name.startswith("siblings_")]
    assert merged and "with code of its own" in merged[0].text


@needs_device
def test_a_tile_compile_keeps_one_kernel_a_launch():
    # `.tile` programs say nothing of constants: their kernels keep their own launches, so
    # `tilec compile -o` writes the kernels as they were searched.
    import tilec

    src = """function (X[N, C], W1[C, D], W2[C, D]) -> (A, B) {
      A[n, d : N, D] = +(X[n, c] * W1[c, d]);
      B[n, d : N, D] = +(X[n, c] * W2[c, d]);
    }"""
    exe = tilec.compile(src, {"X": (8, 16), "W1": (16, 32), "W2": (16, 32)},
                        config=Config(device="Portable", use_disk_cache=False))
    assert not any(k.name.startswith("siblings_") for k in exe.kernels)
