"""GPU chains: dot-product stages whose rows lanes of work-items share (`plan.chain.lanes`,
`codegen.chain._lane_stage`), and repeating stages rolled into one loop (`codegen.roll`).
Kernels run on the CPU device with a GPU's model, against numpy and against the same
program without chains or with its chains written out, outputs poisoned first."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tilec.codegen.roll import Block, roll
from tilec.config import Config
from tilec.lang.reference import evaluate_program
from tilec.plan.chain import ChainKernel, chain_kernels, lane_batch, lane_rows, lanes
from tilec.plan.fuse import ContractionKernel, plan_kernels
from tilec.plan.hw import HwModel

from ..device import needs_device
from .test_chain import _run
from .test_placement import program

GPU = HwModel.load("nvidia-h100")
CPU = HwModel.load("pocl-cpu")
# PoCL runs work-groups of up to 4096 work-items, but 64 keep these tests quick; the lane
# counts and batches below are then the ones of a 64-work-item group.
GPU64 = dataclasses.replace(GPU, max_work_group_size=64)


def _rnn(steps: int, h: int, k: int | None = None) -> tuple[str, dict]:
    """A recurrent layer written out: H_t = tanh(0.05 U H_{t-1} + Z[t]) * 0.5 with Z = 1.5 X,
    from H_1 = tanh(0.05 W H_0 + Z[1]) * 0.5, H_0 = 2 X0 (k columns of W: a first step from a
    longer input when k > h).  (The slices read a computed tensor: a program input's plain
    copies stay alone; the 0.05 keeps the steps from amplifying rounding differences.)"""
    k = k or h
    lines = [f"function (X0[{k}], X[{steps + 1}, {h}], W[{h}, {k}], U[{h}, {h}]) -> (Y) {{",
             "  Z = X * 1.5;",
             "  H0 = X0 * 2.0;",
             f"  A1[n : {h}] = +(W[n, j] * H0[j]);",
             f"  S1[n : {h}] = =(Z[1, n]);",
             "  H1 = tanh(A1 * 0.05 + S1) * 0.5;"]
    for t in range(2, steps + 1):
        lines += [f"  A{t}[n : {h}] = +(U[n, j] * H{t - 1}[j]);",
                  f"  S{t}[n : {h}] = =(Z[{t}, n]);",
                  f"  H{t} = tanh(A{t} * 0.05 + S{t}) * 0.5;"]
    lines += [f"  Y = H{steps} * 2.0;", "}"]
    return "\n".join(lines), {"X0": (k,), "X": (steps + 1, h), "W": (h, k), "U": (h, h)}


def _stage(src: str, shapes: dict, name: str) -> tuple[ContractionKernel, object]:
    plan = plan_kernels(program(src, shapes))
    k = next(k for k in plan.kernels if isinstance(k, ContractionKernel) and
             k.op.output == name)
    return k, plan.program


@pytest.mark.parametrize("cols, want", [(128, 32), (256, 32), (64, 16), (40, 8), (16, 4),
                                        (12, 0), (7, 0)])
def test_lanes_a_row_follow_its_float4s(cols, want):
    src = f"function (A[96, {cols}], x[{cols}]) -> (y) {{ y[n : 96] = +(A[n, k] * x[k]); }}"
    k, prog = _stage(src, {"A": (96, cols), "x": (cols,)}, "y")
    assert lanes(k, prog, GPU) == want
    assert lanes(k, prog, CPU) == 0  # a CPU work-item reads its row in vectors itself
    if want:
        rows = lane_rows(k, prog, GPU, want)
        assert 1 <= rows <= min(want, 16)
        batch = lane_batch(k, prog, GPU, want)
        assert batch <= 256 and batch * (want + 1) * 4 <= GPU.local_mem_bytes // 2


def test_no_lanes_where_the_row_is_not_one_dot_product():
    shapes = {"A": (32, 64, 3), "x": (64, 3)}
    # Two reduction indices: the rows are not the whole sum.
    src = "function (A[32, 64, 3], x[64, 3]) -> (y) { y[n : 32] = +(A[n, k, c] * x[k, c]); }"
    k, prog = _stage(src, shapes, "y")
    assert lanes(k, prog, GPU) == 0
    # A constraint on the reduction (a triangle): points drop out of the rows.
    src = "function (A[32, 64], x[64]) -> (y) { y[n : 32] = +(A[n, k] * x[k]), k + n < 64; }"
    k, prog = _stage(src, {"A": (32, 64), "x": (64,)}, "y")
    assert lanes(k, prog, GPU) == 0
    # A max, not a sum of products.
    src = "function (A[32, 64]) -> (y) { y[n : 32] = >(A[n, k]); }"
    k, prog = _stage(src, {"A": (32, 64)}, "y")
    assert lanes(k, prog, GPU) == 0


def test_a_small_local_memory_takes_fewer_rows_a_batch():
    src = "function (A[256, 128], x[128]) -> (y) { y[n : 256] = +(A[n, k] * x[k]); }"
    k, prog = _stage(src, {"A": (256, 128), "x": (128,)}, "y")
    small = dataclasses.replace(GPU, local_mem_bytes=8192)
    assert lane_rows(k, prog, GPU, 32) == 16
    rows = lane_rows(k, prog, small, 32)
    assert rows < 16 and lane_batch(k, prog, small, 32) * 33 * 4 <= 4096


def test_chains_on_a_gpu_record_their_lane_stages():
    src, shapes = _rnn(6, 64)
    plan = plan_kernels(program(src, shapes))
    (c,) = [k for k in chain_kernels(plan, GPU).kernels if isinstance(k, ChainKernel)]
    assert len(c.lanes) == len(c.stages)
    dots = [s for s, n in zip(c.stages, c.lanes, strict=True) if n]
    assert dots and all(isinstance(s, ContractionKernel) and s.flat.agg == "+" for s in dots)
    assert "shared by lanes of a row" in c.note
    (c,) = [k for k in chain_kernels(plan, CPU).kernels if isinstance(k, ChainKernel)]
    assert not any(c.lanes)


# ---- rolling, on text -------------------------------------------------------------------

def _blocks(values, shape="y[{}] = x[{} + e] * 2.0f;"):
    return [Block(f"/* stage {i + 1} */", (shape.format(*v),)) for i, v in enumerate(values)]


def test_linear_repeats_roll_into_one_loop_that_restates_them():
    # A prefix, 5 passes of 2 stages whose literals move by (10, 3) and (10, 0) a pass, and
    # a last stage that breaks the pattern.
    vals = [(7, 7)]
    for t in range(5):
        vals += [(100 + 10 * t, 3 * t), (105 + 10 * t, 9)]
    vals += [(999, 1)]
    lines, _ = roll(_blocks(vals), {}, "b_s")
    text = "\n".join(lines)
    assert "for (int step = 0; step < 5; ++step) {" in text
    assert "y[(100 + 10 * step)] = x[(3 * step) + e] * 2.0f;" in text
    assert "y[(105 + 10 * step)] = x[9 + e] * 2.0f;" in text
    assert text.startswith("/* stage 1 */\ny[7] = x[7 + e]")
    assert text.rstrip().endswith("y[999] = x[1 + e] * 2.0f;")
    # Each pass of the loop, evaluated, is the text it replaces.
    for t in range(5):
        for j, v in enumerate(vals[1 + 2 * t:3 + 2 * t]):
            line = [ln for ln in lines if ln.strip().startswith("y[")][1 + j].strip()
            got = line.replace("step", str(t))
            want = _blocks([v])[0].lines[0]
            assert _evaluate_brackets(got) == want


def _evaluate_brackets(line: str) -> str:
    import re

    return re.sub(r"\(([\d +*]+)\)", lambda m: str(eval(m.group(1))), line)


def test_values_that_do_not_move_linearly_stay_written_out():
    vals = [(1, 0), (2, 0), (4, 0), (8, 0), (16, 0)]
    lines, _ = roll(_blocks(vals), {}, "b_s")
    assert not any("step" in ln for ln in lines)
    assert len(lines) == 2 * len(vals)


def test_scratch_tensors_that_move_get_their_pointer_in_the_loop():
    offsets = {"b_h0": 0, "b_h1": 16, "b_h2": 32, "b_h3": 48, "b_h4": 64, "b_w": 512}
    blocks = [Block(f"/* stage {t} */", (f"b_h{t + 1}[e] = b_w[e] * b_h{t}[e];",))
              for t in range(4)]
    lines, top = roll(blocks, offsets, "b_scratch")
    text = "\n".join(lines)
    assert "__global float* b_h1 = b_scratch + 16 + 16 * step;" in text
    assert "__global float* b_h0 = b_scratch + 16 * step;" in text
    assert "b_h1[e] = b_w[e] * b_h0[e];" in text
    assert top == {"b_w"}  # the one scratch tensor every pass reads: declared on top


def test_a_scratch_tensor_that_moves_in_one_stage_and_stays_in_another():
    # Pass t: stage A reads b_a (offset 0, fixed) into b_h{t} (moving); stage B reads the
    # fixed b_a and the moving b_h{t}.  In pass 0 both tensors are named b_a / b_h0, and b_a
    # also appears moving (b_a's offset + 16 t) in stage B as the same name in pass 0.
    offsets = {"b_a": 0, **{f"b_h{t}": 16 * (t + 1) for t in range(5)}}
    blocks = []
    for t in range(4):
        moving_a = "b_a" if t == 0 else f"b_h{t - 1}"
        blocks += [Block("/* A */", (f"b_h{t}[e] = b_a[e];",)),
                   Block("/* B */", (f"y[e] = {moving_a}[e] + b_a[e] + b_h{t}[e];",))]
    lines, top = roll(blocks, offsets, "b_s")
    text = "\n".join(lines)
    assert "step < 4" in text
    # b_a stays in some places and moves (by 16, from 0) in another: a pointer of its own.
    assert "__global float* b_a_1 = b_s + 16 * step;" in text
    assert "y[e] = b_a_1[e] + b_a[e] + b_h0[e];" in text
    assert "__global float* b_h0 = b_s + 16 + 16 * step;" in text
    assert "b_a" in top


def test_comments_and_local_names_do_not_stop_a_roll():
    blocks = [Block(f"/* stage {t} */", (f"/* from t{t} */ const float v_t{t} = x[{t}];",
                                          f"y[{t}] = v_t{t};")) for t in range(4)]
    lines, _ = roll(blocks, {}, "b_s")
    text = "\n".join(lines)
    assert "step < 4" in text and "x[step]" in text and "y[step] = v_t0;" in text


# ---- on the device -----------------------------------------------------------------------

def _compare(src, shapes, hw, seed=0):
    """The chained executable against numpy, the unchained one and the written-out chains."""
    exe, feed, got = _run(src, shapes, Config(chains=True), hw=hw, seed=seed)
    ref = evaluate_program(exe.program, feed)
    _, _, alone = _run(src, shapes, Config(chains=False), hw=hw, seed=seed)
    flat, _, out = _run(src, shapes, Config(chains=True, chain_loops=False), hw=hw, seed=seed)
    for name in ref:
        assert not np.isnan(got[name]).any(), name
        np.testing.assert_allclose(got[name], ref[name], rtol=2e-5, atol=2e-6)
        np.testing.assert_allclose(got[name], alone[name], rtol=2e-5, atol=2e-6)
        np.testing.assert_allclose(out[name], ref[name], rtol=2e-5, atol=2e-6)
    return exe, flat


@needs_device
@pytest.mark.parametrize("h, k", [(40, 40), (37, 37), (100, 40), (16, 64)])
def test_lane_stages_and_rolled_steps_match_numpy(h, k):
    """Rows of 40 (8 lanes, two float4s for some lanes), 37 (a scalar rest, a ragged last
    batch), 100 rows (two batches of 64) and a 64-long first row; 9 steps rolled."""
    src, shapes = _rnn(9, h, k)
    exe, flat = _compare(src, shapes, GPU64)
    (chain,) = [s for s in exe.sources if s.kind == "chain"]
    assert "work-items a row" in chain.text and "__local float red[" in chain.text
    assert "for (int step = 0; step <" in chain.text
    (written,) = [s for s in flat.sources if s.kind == "chain"]
    assert "step" not in written.text and len(written.text) > len(chain.text)


@needs_device
def test_lane_stages_side_by_side_reuse_the_partial_sums_safely():
    """Three lane stages in one phase (no global barrier between them): each writes the
    partial sums the one before is reading, after a local barrier."""
    src = """
    function (A[48, 64], B[48, 64], C[20, 64], x[64]) -> (P, Q, R) {
      P[n : 48] = +(A[n, k] * x[k]);
      Q[n : 48] = +(B[n, k] * x[k]);
      R[n : 20] = +(C[n, k] * x[k]);
    }"""
    shapes = {"A": (48, 64), "B": (48, 64), "C": (20, 64), "x": (64,)}
    exe, _ = _compare(src, shapes, GPU64, seed=3)
    (chain,) = [s for s in exe.sources if s.kind == "chain"]
    assert "barrier(CLK_GLOBAL" not in chain.text
    for stage in ("/* stage 2", "/* stage 3"):
        head = chain.text.split(stage)[1].split("const int ln", 1)[0]
        assert "barrier(CLK_LOCAL_MEM_FENCE);" in head


@needs_device
def test_an_lstm_on_a_gpu_model_rolls_its_steps():
    from tilec.graph import Graph, ops_rnn

    rng = np.random.default_rng(1)
    t, i, h = 10, 24, 32
    g = Graph()
    x = g.input("x", (t, 1, i))
    w = g.constant(rng.standard_normal((1, 4 * h, i)).astype(np.float32) * 0.2)
    r = g.constant(rng.standard_normal((1, 4 * h, h)).astype(np.float32) * 0.2)
    bias = g.constant(rng.standard_normal((1, 8 * h)).astype(np.float32) * 0.2)
    y, _, _ = ops_rnn.lstm(x, w, r, bias)
    g.output("y", y)
    feed = {"x": rng.standard_normal((t, 1, i)).astype(np.float32)}
    m = g.compile(device=None, hw=GPU64, quiet=True)
    texts = [s.text for s in m.executable.sources if s.kind == "chain"]
    assert texts and any("for (int step" in s for s in texts)
    assert any("work-items a row" in s for s in texts)
    got = m.run(feed, poison=True)["y"]
    np.testing.assert_allclose(got, m.reference(feed)["y"], rtol=1e-4, atol=1e-5)


def _random_recurrence(seed: int) -> tuple[str, dict, HwModel]:
    """A random recurrence of small products and elementwise steps (rows of 1 to 149, inputs
    of 4 to 139, forms mixed: a row-major product, a transposed one, two products a step),
    and a GPU model with 64, 128 or 256 work-items a group."""
    rng = np.random.default_rng(seed)
    hw = dataclasses.replace(GPU, max_work_group_size=int(rng.choice([64, 128, 256])))
    steps, h, k0 = int(rng.integers(3, 9)), int(rng.integers(1, 150)), int(rng.integers(4, 140))
    lines = ["  H0 = X * 0.5;", f"  A1[n : {h}] = +(W0[n, j] * H0[j]);",
             "  H1 = tanh(A1 * 0.05 + b);"]
    for t in range(2, steps + 1):
        form = int(rng.integers(0, 3))
        if form == 0:
            lines += [f"  A{t}[n : {h}] = +(U[n, j] * H{t - 1}[j]);",
                      f"  H{t} = tanh(A{t} * 0.05 + b);"]
        elif form == 1:
            lines += [f"  A{t}[n : {h}] = +(U[j, n] * H{t - 1}[j]);",
                      f"  H{t} = tanh(A{t} * 0.05) + H{t - 1} * 0.5;"]
        else:
            lines += [f"  A{t}[n : {h}] = +(U[n, j] * H{t - 1}[j]);",
                      f"  B{t}[n : {h}] = +(U[n, j] * H{t - 1}[j]);",
                      f"  H{t} = tanh(A{t} * 0.05) * 0.5 + tanh(B{t} * 0.03) * 0.5;"]
    src = (f"function (X[{k0}], W0[{h}, {k0}], U[{h}, {h}], b[{h}]) -> (Y) {{\n"
           + "\n".join(lines) + f"\n  Y = H{steps} * 2.0;\n}}")
    return src, {"X": (k0,), "W0": (h, k0), "U": (h, h), "b": (h,)}, hw


@needs_device
@pytest.mark.parametrize("seed", range(8))
def test_random_recurrences_on_gpu_models_match_numpy(seed):
    src, shapes, hw = _random_recurrence(seed)
    exe, feed, got = _run(src, shapes, Config(chains=True), hw=hw, seed=seed)
    ref = evaluate_program(exe.program, feed)
    assert any(k.kind == "chain" for k in exe.kernels), src
    np.testing.assert_allclose(got["Y"], ref["Y"], rtol=1e-4, atol=1e-5 * np.abs(ref["Y"]).max())
