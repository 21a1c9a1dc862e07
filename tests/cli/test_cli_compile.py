"""`tilec compile`, `tilec run`, `tilec explain` and `tilec devices` from the command line."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tilec.cli.main import main

from ..device import needs_device

ROOT = Path(__file__).resolve().parents[2]
SEED = str(ROOT / "examples" / "seed_conv.tile")
MATMUL = str(ROOT / "examples" / "matmul.tile")

device = needs_device


def test_explain_seed_tile_reproduces_the_seed(capsys):
    rc = main(["explain", SEED, "--hw", "seed-example", "--tile",
               "ci=8,co=32,i=2,j=3,n=16,x=2,y=2"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "off                   0    -14400         0" in out
    assert "0 <= i + x - 1 < 224" in out and "0 <= j + y - 1 < 224" in out
    assert ("Compute score: to=236760072192 wg=50176 il=16 sm=12648 or=8192 mr=12288 mw=8192 "
            "op=256 rp=0 tu=256") in out
    assert "flops_per_byte=23.04 occupancy=20" in out
    for row in (" i_x         3     14336         1", " j_y         4        64       393",
                "  ci         8         1        49", "   n        16   3211264         3",
                " j_i         6      4096       265", "  ci         8         1        33",
                "  co        32        64         1"):
        assert row in out
    assert "256 threads, 2048 outputs, 8 accumulators each" in out


def test_explain_search_and_cost_log(tmp_path, capsys):
    log = tmp_path / "log.jsonl"
    rc = main(["explain", SEED, "--hw", "seed-example", "--top", "3", "--cost-log", str(log)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "search scored" in out and "over memory" in out
    assert out.count("Computing cost for tile size:") == 3
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 3
    assert all(r["version"] == 1 and set(r["tile"]) == {"ci", "co", "i", "j", "n", "x", "y"}
               for r in records)
    assert records[0]["score"] == 1


def test_explain_bad_tile_is_a_clear_error(capsys):
    rc = main(["explain", SEED, "--hw", "seed-example", "--tile", "q=3"])
    err = capsys.readouterr().err
    assert rc == 1 and "unknown index 'q'" in err


@device
def test_compile_writes_source_and_manifest(tmp_path, capsys):
    cl, man = tmp_path / "mm.cl", tmp_path / "mm.json"
    rc = main(["compile", MATMUL, "--shape", "A=37x53", "--shape", "B=53x29", "-o", str(cl),
               "--manifest", str(man)])
    assert rc == 0
    text = cl.read_text()
    assert "__kernel" in text and "contract_C" in text and "C[m, n : M, N]" in text
    m = json.loads(man.read_text())
    assert m["inputs"] == ["A", "B"] and m["outputs"] == ["C"]
    (k,) = m["kernels"]
    assert k["name"] == "contract_C" and [a["tensor"] for a in k["args"]] == ["A", "B", "C"]
    assert k["args"][2]["access"] == "write" and k["args"][2]["elements"] == 37 * 29
    assert {b["tensor"]: b["bytes"] for b in m["buffers"]} == {"A": 37 * 53 * 4,
                                                               "B": 53 * 29 * 4,
                                                               "C": 37 * 29 * 4}
    assert k["global_size"][0] % k["local_size"][0] == 0


@device
def test_run_validates(capsys):
    rc = main(["run", str(ROOT / "examples" / "softmax.tile"), "--shape", "X=9x100",
               "--validate", "--repeat", "2"])
    out = capsys.readouterr().out
    assert rc == 0 and "validation: ok" in out
    assert "rows_Y" in out  # the softmax chain is one row-fused kernel


@device
def test_run_with_inputs_and_save(tmp_path, capsys):
    import numpy as np

    rng = np.random.default_rng(3)
    a = rng.uniform(-1, 1, (5, 7)).astype(np.float32)
    b = rng.uniform(-1, 1, (7, 3)).astype(np.float32)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    rc = main(["run", MATMUL, "--input", f"A={tmp_path / 'a.npy'}", "--input",
               f"B={tmp_path / 'b.npy'}", "--save", str(tmp_path / "out"), "--validate"])
    assert rc == 0
    c = np.load(tmp_path / "out" / "C.npy")
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


@device
def test_unknown_device_is_a_clear_error(capsys):
    rc = main(["run", MATMUL, "--device", "no-such-device-xyz"])
    err = capsys.readouterr().err
    assert rc == 1 and "no OpenCL device matches 'no-such-device-xyz'" in err


@device
def test_devices_lists_models(capsys):
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "cost model: threads" in out


def test_bench_passes_arguments_to_the_suite(capfd):
    rc = main(["bench", "--", "--help"])
    assert rc == 0
    assert "--repeat" in capfd.readouterr().out


def test_explain_row_fused_kernel(capsys):
    rc = main(["explain", str(ROOT / "examples" / "softmax.tile"), "--shape", "X=64x1000",
               "--hw", "nvidia-h100"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "== rows_Y: row-fused, 4 statement(s); 64 rows of 1000 elements" in out
    # The shape the time model predicts fastest, with its prediction and the runners-up.
    assert re.search(r"\b(32|64|128|256) threads a row", out) and "not stored: E" in out
    assert "predicted" in out and "next:" in out


def test_explain_an_onnx_models_kernels(tmp_path, capsys):
    """A model's cost log: its kernels as `compile` plans them, the weights bound (no device:
    a shipped CPU model)."""
    import numpy as np
    import pytest

    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((32, 8, 3, 3)).astype(np.float32), "W")
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 14, 14])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 14, 14])], [w])
    path = tmp_path / "conv.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    rc = main(["explain", str(path), "--hw", "pocl-cpu", "--top", "1"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "hardware model: pocl-cpu" in out
    conv = [line for line in out.splitlines() if line.startswith("== contract_")]
    assert conv and any("+(" in line and "W" in line for line in conv)
    assert "Search: tile [" in out and "predicted" in out
    assert main(["explain", str(tmp_path / "missing.onnx"), "--hw", "pocl-cpu"]) == 1
    assert "missing.onnx" in capsys.readouterr().err
