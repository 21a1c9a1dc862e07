"""Split-K (`plan.splitk`): a sum as partial sums over parts of one reduction index and their
sum.  The rewritten programs are checked against the program as written by the numpy
reference (device-free) and, compiled, on the CPU device with its own model (parts forced)
and with a GPU's (parts chosen), outputs poisoned first."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tilec import check_program
from tilec.codegen.generate import split_k
from tilec.compiler import compile as tile_compile
from tilec.config import Config
from tilec.lang import ir
from tilec.lang.reference import evaluate_program
from tilec.plan.hw import HwModel

from ..device import needs_device

GPU = HwModel.load("nvidia-h100")
CPU = HwModel.load("pocl-cpu")
OFF_DISK = Config(use_disk_cache=False)

CONV = """function (X[N, CI, H, H], W[CO, CI, 3, 3], B[CO, 1, 1]) -> (Y) {
  A[n, co, x, y : N, CO, H, H] = +(X[n, ci, x + i - 1, y + j - 1] * W[co, ci, i, j]);
  Y = relu(A + B);
}"""
MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }"


def conv(n: int, ci: int, co: int, h: int) -> tuple[str, dict]:
    src = (CONV.replace("N, CI", f"{n}, {ci}").replace("CO, CI", f"{co}, {ci}")
           .replace("H, H]", f"{h}, {h}]").replace("N, CO", f"{n}, {co}")
           .replace("B[CO", f"B[{co}"))
    return src, {"X": (n, ci, h, h), "W": (co, ci, 3, 3), "B": (co, 1, 1)}


def matmul(m: int, k: int, n: int) -> tuple[str, dict]:
    src = MATMUL.replace("A[M, K]", f"A[{m}, {k}]").replace("B[K, N]", f"B[{k}, {n}]") \
        .replace(": M, N", f": {m}, {n}")
    return src, {"A": (m, k), "B": (k, n)}


def _random(program: ir.Program, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(program.tensors[n].shape).astype(np.float32)
            for n in program.inputs}


def _same_sums(before: ir.Program, after: ir.Program) -> None:
    feed = _random(before)
    want, got = evaluate_program(before, feed), evaluate_program(after, feed)
    for name in before.outputs:
        _close(got[name], want[name])


def _close(got, want) -> None:
    """Within float32 rounding of sums of thousands of terms: relative to the largest
    output (a wrong part, or a part missed, is off by whole terms)."""
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-6 * float(np.abs(want).max()))


@pytest.mark.parametrize("parts", [2, 4, 8])
def test_forced_parts_sum_what_the_program_as_written_sums(parts):
    src, shapes = conv(1, 16, 8, 5)
    program = check_program(src, shapes)
    after, splits = split_k(program, CPU, dataclasses.replace(OFF_DISK, split_k=parts))
    assert [(s.output, s.index, s.parts) for s in splits] == [("A", "ci", parts)]
    ops = [op for op in after.ops if isinstance(op, ir.Contraction)]
    assert [op.output for op in ops] == ["A_parts", "A"]
    assert after.tensors["A_parts"].shape == (parts, 1, 8, 5, 5)
    # The parts' statement keeps the padding constraints and bounds its chunk of ci.
    assert ops[0].text.endswith(f"ci < {16 // parts}")
    assert "ci + " in ops[0].text and f"{16 // parts}*part" in ops[0].text
    _same_sums(program, after)


def test_a_strided_reduction_index_and_a_matrix_product_split_alike():
    src = """function (I[2, 40], F[4, 12]) -> (O) {
      O[n, k : 2, 4] = +(I[n, 3*c + 1] * F[k, c]);
    }"""
    program = check_program(src, {"I": (2, 40), "F": (4, 12)})
    after, splits = split_k(program, CPU, dataclasses.replace(OFF_DISK, split_k=3))
    assert [s.index for s in splits] == ["c"]
    _same_sums(program, after)
    src, shapes = matmul(3, 64, 5)
    program = check_program(src, shapes)
    after, splits = split_k(program, CPU, dataclasses.replace(OFF_DISK, split_k=4))
    assert [s.index for s in splits] == ["k"]
    _same_sums(program, after)


@pytest.mark.parametrize("src, shapes", [
    # a max is not split (only sums are)
    ("function (I[4, 64]) -> (O) { O[n : 4] = >(I[n, k]); }", {"I": (4, 64)}),
    # the only reduction index is in a constraint
    ("function (I[4, 64]) -> (O) { O[n : 4] = +(I[n, k]), k < 40; }", {"I": (4, 64)}),
    # the output index is not plain
    ("function (I[4, 64]) -> (O) { O[2*n : 8] = +(I[n, k]); }", {"I": (4, 64)}),
    # no reduction at all
    ("function (I[4, 64]) -> (O) { O[n, k : 4, 64] = +(I[n, k]); }", {"I": (4, 64)}),
])
def test_what_is_not_split(src, shapes):
    program = check_program(src, shapes)
    after, splits = split_k(program, GPU, dataclasses.replace(OFF_DISK, split_k=4))
    assert splits == () and after is program


def test_parts_that_do_not_divide_the_range_leave_it_as_written():
    src, shapes = conv(1, 12, 8, 5)
    program = check_program(src, shapes)
    _, splits = split_k(program, CPU, dataclasses.replace(OFF_DISK, split_k=8))
    assert splits == ()


def test_a_gpu_model_splits_a_long_sum_with_few_outputs():
    """VGG's 512-channel 3x3 convolution at 14x14, batch 1: 100K outputs of 4608
    multiply-adds; the split's both kernels are predicted, the parts divide 512."""
    src, shapes = conv(1, 512, 512, 14)
    program = check_program(src, shapes)
    after, splits = split_k(program, GPU, OFF_DISK)
    assert len(splits) == 1
    s = splits[0]
    assert s.index == "ci" and s.parts >= 2 and 512 % s.parts == 0 and s.seconds > 0
    assert "split-K: A's sum over ci in" in s.describe()
    assert after.tensors["A_parts"].shape == (s.parts, 1, 512, 14, 14)


@pytest.mark.parametrize("hw, src_shapes, config", [
    (CPU, conv(1, 512, 512, 14), OFF_DISK),  # CPUs: never by themselves
    (GPU, conv(1, 512, 512, 14), dataclasses.replace(OFF_DISK, split_k=False)),
    (GPU, conv(1, 512, 512, 14),  # a forced tile names the indices as written
     dataclasses.replace(OFF_DISK, tiles={"A": {"ci": 8}})),
    (GPU, conv(32, 64, 64, 56), OFF_DISK),  # 6.4M outputs keep the device busy
    (GPU, matmul(2048, 2048, 2048), OFF_DISK),
])
def test_where_compile_does_not_split(hw, src_shapes, config):
    src, shapes = src_shapes
    program = check_program(src, shapes)
    after, splits = split_k(program, hw, config)
    assert splits == () and after is program


def _compiled_against_as_written(src, shapes, config, hw=None, seed=0):
    exe = tile_compile(src, shapes, config=config, hw=hw)
    as_written = check_program(src, shapes)
    feed = _random(as_written, seed)
    got = exe.run(feed, poison=True)
    want = evaluate_program(as_written, feed)
    plain = tile_compile(src, shapes, config=dataclasses.replace(config, split_k=False), hw=hw)
    alone = plain.run(feed, poison=True)
    for name in as_written.outputs:
        assert not np.isnan(got[name]).any()
        _close(got[name], want[name])
        _close(got[name], alone[name])
    return exe


@needs_device
@pytest.mark.parametrize("parts", [2, 4])
def test_split_kernels_on_the_cpu_device_match_numpy(parts):
    src, shapes = conv(2, 16, 12, 6)
    exe = _compiled_against_as_written(src, shapes, dataclasses.replace(OFF_DISK, split_k=parts))
    assert [s.parts for s in exe.splits] == [parts]
    assert [k.name for k in exe.kernels][-2:] == ["contract_A_parts", "contract_A"]


@needs_device
def test_split_kernels_with_a_gpu_model_match_numpy():
    """Parts chosen by the GPU model's time model, built and run on the CPU device, with the
    bias and ReLU fused into the sum of the parts; and a matrix product with a long K."""
    src, shapes = conv(1, 256, 128, 14)
    exe = _compiled_against_as_written(src, shapes, OFF_DISK, hw=GPU, seed=1)
    assert len(exe.splits) == 1 and exe.splits[0].parts >= 2
    sums = [k for k in exe.plan.kernels if getattr(k, "name", "") == "contract_A"]
    assert sums and [p.output for p in sums[0].post_ops] == ["Y"]
    src, shapes = matmul(64, 16384, 64)
    exe = _compiled_against_as_written(src, shapes, OFF_DISK, hw=GPU, seed=2)
    assert len(exe.splits) == 1


def test_the_command_line_explains_a_split_and_refuses_one_part(tmp_path, capsys, monkeypatch):
    from tilec.cli.main import main

    monkeypatch.setenv("TILEC_CACHE_DIR", str(tmp_path / "cache"))
    src, shapes = conv(1, 512, 512, 14)
    path = tmp_path / "c.tile"
    path.write_text(src)
    args = ["explain", str(path), "--hw", "nvidia-h100"] + \
        [a for n, s in shapes.items() for a in ("--shape", f"{n}={'x'.join(map(str, s))}")]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "split-K: A's sum over ci in" in out and "== contract_A_parts:" in out
    assert main(args[:2] + ["--split-k", "1"]) != 0
    err = capsys.readouterr().err
    assert err.startswith("error: --split-k: expected auto, off or a number of parts")


def test_layers_alike_share_one_decision_and_small_sums_are_not_weighed():
    """Two convolutions alike but for their tensors' names split alike, each into its own
    parts tensor; a sum whose work is a fraction of a launch is left as written."""
    src = """function (X[1, 512, 14, 14], W[512, 512, 3, 3], V[512, 512, 3, 3],
                       S[4, 64], T[64, 4]) -> (Y, Z, P) {
      A[n, co, x, y : 1, 512, 14, 14] = +(X[n, ci, x + i - 1, y + j - 1] * W[co, ci, i, j]);
      Y = relu(A);
      B[n, co, x, y : 1, 512, 14, 14] = +(Y[n, ci, x + i - 1, y + j - 1] * V[co, ci, i, j]);
      Z = relu(B);
      P[m, n : 4, 4] = +(S[m, k] * T[k, n]);
    }"""
    shapes = {"X": (1, 512, 14, 14), "W": (512, 512, 3, 3), "V": (512, 512, 3, 3),
              "S": (4, 64), "T": (64, 4)}
    program = check_program(src, shapes)
    after, splits = split_k(program, GPU, OFF_DISK)
    assert [s.output for s in splits] == ["A", "B"]
    assert splits[0].parts == splits[1].parts and splits[0].seconds == splits[1].seconds
    assert {"A_parts", "B_parts"} <= set(after.tensors)
    _same_sums(program, after)


def test_worker_processes_weigh_contractions_as_this_one_does():
    src, shapes = conv(1, 512, 512, 14)
    body = src.split("{", 1)[1].rsplit("}", 1)[0]
    # Four layers of different widths: four decisions, enough for the worker processes.
    lines, ins, outs = [], [], []
    for k, co in enumerate((512, 256, 128, 64)):
        lines.append(body.replace("A[", f"A{k}[").replace("W[", f"W{k}[")
                     .replace("B[", f"B{k}[").replace("Y =", f"Y{k} =")
                     .replace("A + B", f"A{k} + B{k}")
                     .replace(", 512, 14, 14] = +", f", {co}, 14, 14] = +"))
        ins += [f"W{k}[{co}, 512, 3, 3]", f"B{k}[{co}, 1, 1]"]
        outs.append(f"Y{k}")
        shapes |= {f"W{k}": (co, 512, 3, 3), f"B{k}": (co, 1, 1)}
    text = f"function (X[1, 512, 14, 14], {', '.join(ins)}) -> ({', '.join(outs)}) {{" + \
        "".join(lines) + "}"
    shapes = {k: v for k, v in shapes.items() if k not in ("W", "B")}
    program = check_program(text, shapes)
    here = split_k(program, GPU, dataclasses.replace(OFF_DISK, search_workers=0))
    there = split_k(program, GPU, dataclasses.replace(OFF_DISK, search_workers=2))
    assert here == there and len(here[1]) == 4


def test_half_precision_sums_stay_whole():
    src, shapes = matmul(8, 4096, 8)
    program = check_program(src, shapes, "float16")
    after, splits = split_k(program, GPU, dataclasses.replace(OFF_DISK, split_k=4))
    assert splits == () and after is program


@needs_device
def test_tuning_plans_the_split_kernels_compile_builds():
    """`tilec tune` times the kernels a compile would build (its records are looked up by
    those kernels), so it plans the split too."""
    from tilec.tune.measure import Prepared

    src, shapes = conv(1, 512, 512, 14)
    prepared = Prepared(src, shapes, config=OFF_DISK, hw=GPU)
    names = [k.name for k in prepared.plan.kernels]
    exe = tile_compile(src, shapes, config=OFF_DISK, hw=GPU)
    assert "contract_A_parts" in names and names == [k.name for k in exe.plan.kernels]


def _random_sum(seed: int) -> tuple[str, dict, int]:
    """A random sum of products that can be split: two output indices, a split index k with
    a stride and an offset in one operand, sometimes a padded 3-point window along j (its
    constraint on j and r), sometimes a post-op; and a part count that divides k's range."""
    rng = np.random.default_rng(seed)
    m, n = int(rng.integers(1, 9)), int(rng.integers(1, 7))
    parts = int(rng.choice([2, 3, 4]))
    kk = parts * int(rng.integers(2, 7))
    stride, off = int(rng.integers(1, 3)), int(rng.integers(0, 3))
    window = bool(rng.integers(0, 2))
    width = stride * (kk - 1) + off + 1
    if window:  # a padded 3-point window along j, as a convolution's x: j + r - 1 < n
        read = f"A[m, {stride}*k + {off}, j + r - 1]"
        cons, wread = f", j + r - 1 < {n}", "W[k, r]"
        adims, wdims = (m, width, n), (kk, 3)
    else:
        read = f"A[m, {stride}*k + {off}]"
        cons, wread = "", "W[k, j]"
        adims, wdims = (m, width), (kk, n)
    post = ["", "  Y = relu(C);\n", "  Y = C * 2 + E;\n"][int(rng.integers(0, 3))]
    outs, ins = ("Y" if post else "C"), ["A", "W"] + (["E"] if "E" in post else [])
    shapes = {"A": adims, "W": wdims, "E": (m, n)}
    src = (f"function ({', '.join(f'{t}[{chr(44).join(map(str, shapes[t]))}]' for t in ins)})"
           f" -> ({outs}) {{\n  C[m, j : {m}, {n}] = +({read} * {wread}){cons};\n{post}}}")
    return src, {t: shapes[t] for t in ins}, parts


@needs_device
@pytest.mark.parametrize("seed", range(12))
def test_random_sums_split_in_parts_match_numpy(seed):
    """Random splittable sums (`_random_sum`) compiled with their parts forced, on the CPU
    device and with a GPU model, against the numpy reference of the program as written and
    the program compiled without the split, outputs poisoned first."""
    src, shapes, parts = _random_sum(seed)
    hw = GPU if seed % 2 else None
    exe = _compiled_against_as_written(src, shapes,
                                       dataclasses.replace(OFF_DISK, split_k=parts), hw=hw,
                                       seed=seed)
    assert [s.parts for s in exe.splits] == [parts], src


@needs_device
def test_compile_on_the_command_line_says_what_it_split(tmp_path, capsys, monkeypatch):
    from tilec.cli.main import main

    monkeypatch.setenv("TILEC_CACHE_DIR", str(tmp_path / "cache"))
    src, shapes = conv(1, 16, 8, 5)
    path = tmp_path / "c.tile"
    path.write_text(src)
    args = [a for n, s in shapes.items() for a in ("--shape", f"{n}={'x'.join(map(str, s))}")]
    assert main(["compile", str(path), "--split-k", "4", "-o", str(tmp_path / "c.cl"),
                 "--quiet", *args]) == 0
    assert "split-K: A's sum over ci in 4 parts (as configured)" in capsys.readouterr().out
    assert "A_parts[part, n, co, x, y : 4, 1, 8, 5, 5]" in (tmp_path / "c.cl").read_text()
