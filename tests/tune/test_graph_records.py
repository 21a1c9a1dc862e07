"""A graph tuned with `tilec tune` is compiled from its records: the tuner plans the kernels
as `compile` plans them, weights packed in panels included, and the correction fitted from
the records does not change which kernels there are."""

from __future__ import annotations

import numpy as np
import pytest

from tilec.cli.graph import load_graph
from tilec.cli.main import main
from tilec.config import Config
from tilec.graph.builder import GraphExecutable
from tilec.plan.fuse import ContractionKernel
from tilec.tune import correction

from ..device import needs_device

SCRIPT = """import numpy as np
import tilec
from tilec import ops

def graph():
    g = tilec.Graph('mlp')
    x = g.input('x', (512, 96))
    w = g.constant(np.random.default_rng(3).standard_normal((96, 1024)).astype(np.float32))
    g.output('y', ops.relu(ops.matmul(x, w)))
    return g
"""


@needs_device
@pytest.mark.parametrize("factors", [None, {"launch": 10.0, "compute": 0.1, "DRAM": 10.0},
                                     {"launch": 0.1, "compute": 10.0, "L1": 0.1}])
def test_a_tuned_graph_finds_a_record_for_every_kernel(tmp_path, capsys, monkeypatch, factors):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    script = tmp_path / "g.py"
    script.write_text(SCRIPT)
    records = tmp_path / "r.jsonl"
    assert main(["tune", str(script), "--top-k", "2", "--repeat", "1", "--warmup", "0",
                 "--records", str(records), "--quiet"]) == 0
    assert "records appended" in capsys.readouterr().out
    if factors is not None:  # however the records correct the model
        monkeypatch.setattr(correction, "fit", lambda recs, device: dict(factors))
    graph = load_graph(str(script), {}, {}).optimized()
    exe = GraphExecutable.build(graph, config=Config(records_path=records), validate=True)
    compiled = exe.executable
    names = {k.name for k in compiled.plan.kernels if isinstance(k, ContractionKernel)}
    if compiled.hw.kind == "cpu":
        # The weight is wider than any register tile: packed in panels by its own kernel.
        assert any("panels" in n for n in names), names
    assert names and set(compiled.tuned) >= names, (names, set(compiled.tuned))
    x = np.random.default_rng(0).standard_normal((512, 96)).astype(np.float32)
    w = np.random.default_rng(3).standard_normal((96, 1024)).astype(np.float32)
    out = exe(x=x)["y"]
    np.testing.assert_allclose(out, np.maximum(x @ w, 0), rtol=1e-4, atol=1e-4)


@needs_device
def test_a_program_with_a_0d_input_is_tuned(tmp_path):
    """A model's scalar constants are 0-d inputs: the bench keeps them 0-d (the reference
    refused the 1-d copy `ascontiguousarray` made, and every kernel of such a model failed)."""
    from tilec.compiler import compile as tile_compile
    from tilec.tune.measure import tune

    src = ("function (A[M, K], B[K, N], S[]) -> (D) {\n"
           "  C[m, n : M, N] = +(A[m, k] * B[k, n]);\n  D = C * S;\n}\n")
    shapes = {"A": (16, 32), "B": (32, 24), "S": ()}
    config = Config(records_path=tmp_path / "r.jsonl")
    report = tune(src, shapes, config=config, top_k=2, repeat=1, warmup=0, quiet=True)
    assert report.kernels and all(k.record is not None for k in report.kernels), \
        [(k.kernel, [m.status for m in k.results]) for k in report.kernels]
    exe = tile_compile(src, shapes, config=config, validate=True)
    assert set(exe.tuned) == {k.kernel for k in report.kernels}
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((16, 32), np.float32), rng.standard_normal((32, 24), np.float32)
    s = np.float32(1.5)
    out = exe(A=a, B=b, S=np.asarray(s))["D"]
    np.testing.assert_allclose(out, (a @ b) * s, rtol=1e-5, atol=1e-5)
