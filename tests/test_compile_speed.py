"""Fast model compiles: kernels that differ only in names share one function of the program,
a graph compiled again comes from the whole-compile cache, and both give the numpy reference's
results with every written buffer poisoned.  No timings here (benchmarks/model_compile.py)."""

from __future__ import annotations

import numpy as np
import pytest

import tilec.compiler
from tilec.codegen.kernel_text import KernelArg, KernelSource
from tilec.config import Config
from tilec.graph import ops
from tilec.graph.builder import Graph
from tilec.runtime import compiled
from tilec.runtime.share import canonical, share_kernels

from .device import needs_device
from .graph_refs import close, conv_nchw, run

RNG = np.random.default_rng(11)


def rand(*shape):
    return RNG.uniform(-1.0, 1.0, size=shape).astype(np.float32)


def _kernel(name: str, a: str, b: str, body: str = "b_{b}[i] = 2.0f * b_{a}[i];") -> KernelSource:
    text = (f"/* {name}: {a} -> {b} */\n__kernel void {name}(__global const float* b_{a}, "
            f"__global float* b_{b}) {{\n    const int i = get_global_id(0);\n"
            f"    {body.format(a=a, b=b)}\n}}\n")
    args = (KernelArg(a, "in", "float32", 8), KernelArg(b, "out", "float32", 8))
    return KernelSource(name, "elementwise", text, args, 8, None)


def test_kernels_differing_in_names_and_comments_share_one_entry():
    tensors = {"X", "Y", "Z", "W"}
    one, two = _kernel("k_Y", "X", "Y"), _kernel("k_W", "Z", "W")
    assert canonical(one, tensors) == canonical(two, tensors)
    shared = share_kernels([one, two], tensors)
    assert shared.entries == {"k_Y": "k_Y", "k_W": "k_Y"} and shared.distinct == 1
    assert shared.text.count("__kernel") == 1 and "k_W" not in shared.text


def test_kernels_differing_in_code_stay_apart():
    tensors = {"X", "Y", "Z", "W"}
    one = _kernel("k_Y", "X", "Y")
    other = _kernel("k_W", "Z", "W", "b_{b}[i] = 3.0f * b_{a}[i];")
    swapped = _kernel("k_V", "Z", "W", "b_{b}[i] = 2.0f * b_{a}[i] + b_{b}[i];")
    shared = share_kernels([one, other, swapped], tensors)
    assert shared.distinct == 3
    # A name that is not a tensor's is not renamed: these differ.
    assert canonical(_kernel("k", "X", "Y"), {"X"}) != canonical(_kernel("k", "X", "W"), {"X"})


def test_names_with_lane_suffixes_are_renamed_as_their_tensors():
    # Epilogue values are named after their tensor with a lane or copy suffix (`v_Y_0`):
    # kernels that differ only in those still share, and the suffix is kept apart from the
    # name.
    body = "const float v_{b}_0 = 2.0f * b_{a}[i]; b_{b}[i] = v_{b}_0;"
    tensors = {"X", "Y", "Z", "W"}
    one, two = _kernel("k_Y", "X", "Y", body), _kernel("k_W", "Z", "W", body)
    assert canonical(one, tensors) == canonical(two, tensors)
    assert share_kernels([one, two], tensors).distinct == 1
    # A tensor whose name ends in a number is renamed whole, and code that differs apart
    # from names still keeps kernels apart.
    assert "v_$1_0" in canonical(one, tensors)
    assert "v_$1 " in canonical(_kernel("k", "X", "W_0", body.replace("v_{b}_0", "v_{b}")),
                                 {"X", "W", "W_0"})
    other = _kernel("k_V", "Z", "W", body.replace("2.0f", "3.0f"))
    assert share_kernels([one, other], tensors).distinct == 2


def _blocks(n: int, channels: int = 4, size: int = 6) -> tuple[Graph, dict, np.ndarray]:
    """`n` identical conv + bias + relu blocks with their own weights."""
    g = Graph("blocks")
    x = g.input("x", (1, channels, size, size))
    weights = []
    y = x
    for _ in range(n):
        w, b = rand(channels, channels, 3, 3), rand(channels)
        weights.append((w, b))
        y = ops.relu(ops.conv2d(y, g.constant(w), g.constant(b), padding="same"))
    g.output("y", y)
    xa = rand(1, channels, size, size)
    want = xa.astype(np.float64)
    for w, b in weights:
        want = np.maximum(conv_nchw(want, w, b, pads=(1, 1, 1, 1)), 0.0)
    return g, {"x": xa}, want


@needs_device
def test_repeated_blocks_build_one_kernel_and_match_numpy(tmp_path):
    g, arrays, want = _blocks(3)
    # (Without the filters' relaid copies, one per block: `plan.pack`.)
    # Halos off: with them the first block reads the input as given, the others a bordered
    # buffer, and the last writes the output without a border (three functions).
    # (Phase launches off: they would make the three one launch.)
    exe, outs = run(g, arrays, config=Config(cache_dir=tmp_path, pack_panels=False,
                                             chains=False, halos=False, phase_launches=False),
                    quiet=True)
    inner = exe.executable
    assert len(inner.kernels) == 3
    assert len(set(inner.entries.values())) == 1  # one function runs all three
    assert inner.source.count("__kernel") == 1
    close(outs["y"], want)


@needs_device
def test_a_graph_compiled_again_comes_from_the_cache(tmp_path, monkeypatch):
    g, arrays, want = _blocks(2)
    cfg = Config(cache_dir=tmp_path, use_tuning_records=False)
    first, outs = run(g, arrays, config=cfg, quiet=True)
    assert list((tmp_path / "compiled").glob("*.pkl"))

    def no_parse(*a, **k):
        raise AssertionError("a cached compile parsed the program again")

    monkeypatch.setattr(tilec.compiler, "check_program", no_parse)
    second, again = run(g, arrays, config=cfg, quiet=True)
    assert second.executable.source == first.executable.source
    assert [k.name for k in second.kernels] == [k.name for k in first.kernels]
    close(again["y"], want)


@needs_device
@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_a_damaged_cache_entry_is_compiled_again(tmp_path, damage):
    g, arrays, want = _blocks(2)
    cfg = Config(cache_dir=tmp_path, use_tuning_records=False)
    run(g, arrays, config=cfg, quiet=True)
    (entry,) = (tmp_path / "compiled").glob("*.pkl")
    data = entry.read_bytes()
    entry.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"\x80junk" * 50)
    _, outs = run(g, arrays, config=cfg, quiet=True)
    close(outs["y"], want)
    assert compiled.load(cfg, entry.stem) is not None  # written anew


@needs_device
def test_no_disk_cache_keeps_no_compiles(tmp_path):
    g, arrays, want = _blocks(2)
    _, outs = run(g, arrays, config=Config(cache_dir=tmp_path, use_disk_cache=False),
                  quiet=True)
    close(outs["y"], want)
    assert not (tmp_path / "compiled").exists()


def test_the_key_follows_what_is_compiled():
    from dataclasses import replace

    from tilec.runtime.device import DeviceInfo

    class Rt:
        info = DeviceInfo("platform", "1.0", "device", "1.0", "driver", "cpu", 16)
        max_wg, vector_limit = 256, 16

    class Fewer(Rt):  # the same CPU driven by 8 threads (POCL_CPU_MAX_CU_COUNT=8)
        info = replace(Rt.info, compute_units=8)

    base = dict(source="function (A[N]) -> (B) { B = A; }", shapes={"A": (4,)},
                dtype="float32", values=None, config=Config(), model="hw", runtime=Rt())
    k = compiled.key(**base)
    assert k != compiled.key(**{**base, "runtime": Fewer()})
    assert k == compiled.key(**{**base, "config": Config(cache_dir="/elsewhere", rtol=0.1)})
    assert k != compiled.key(**{**base, "shapes": {"A": (5,)}})
    assert k != compiled.key(**{**base, "config": Config(row_fusion=False)})
    assert k != compiled.key(**{**base, "model": "another hw"})


@needs_device
@pytest.mark.parametrize("halos", [False, None])
def test_resnet_shaped_model_shares_kernels_and_matches_onnxruntime(tmp_path, halos):
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    import tilec.onnx

    from .models import input_array, tiny_resnet

    model = tiny_resnet()
    x = input_array(model)
    # Chains off: this small model's kernels are short enough (channels-last on a CPU) to
    # run as one chain kernel, which leaves nothing to share.
    exe = tilec.onnx.load(model, config=Config(cache_dir=tmp_path, chains=False, halos=halos,
                                               phase_launches=False), quiet=True)
    got = exe.run({"input": x}, poison=True)["output"]
    inner = exe.last.executable
    assert len(set(inner.entries.values())) < len(inner.kernels)
    # The repeated block's convolutions (bias and relu fused, epilogue values named after
    # their tensors) run one function.  With halos (the CPU default) the first block's
    # second convolution writes a border the next block reads, the second block's one the
    # next stage's (a stride-2 window: another border), so only the first convolutions
    # share.
    assert bool(inner.plan.halos) == (halos is None)
    for conv in ("relu_Relu", "conv2_Conv") if halos is False else ("relu_Relu",):
        first = inner.entries[f"contract_T_layer1_layer1_0_{conv}_output_0_acc"]
        assert inner.entries[f"contract_T_layer1_layer1_1_{conv}_output_0_acc"] == first
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (ref,) = sess.run(None, {"input": x})
    np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-3 * max(1.0, np.abs(ref).max()))


@needs_device
def test_cache_info_and_clear_cover_whole_compiles(tmp_path, monkeypatch, capsys):
    from tilec.cli.main import main

    g, arrays, _ = _blocks(2)
    run(g, arrays, config=Config(cache_dir=tmp_path), quiet=True)
    assert list((tmp_path / "compiled").glob("*.pkl"))
    monkeypatch.setenv("TILEC_CACHE_DIR", str(tmp_path))
    assert main(["cache", "info"]) == 0
    assert "compiled:" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    assert not list((tmp_path / "compiled").glob("*.pkl"))
