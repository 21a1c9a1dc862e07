"""benchmarks/tile_sweep.py sweeps the kernel compile builds: a program planned as compile
plans it (here an NCHW convolution whose filter is relaid), each tile validated and timed."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NCHW = """function (D[N, CI, X, Y], W[CO, CI, I, J], B[CO, U, V]) -> (R) {
  O[n, co, x, y : N, CO, X, Y] = +(D[n, ci, x+i-1, y+j-1] * W[co, ci, i, j]);
  R = relu(O + B);
}"""


def _sweep_module():
    path = ROOT / "benchmarks" / "tile_sweep.py"
    spec = importlib.util.spec_from_file_location("tile_sweep", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_sweep_times_the_relaid_kernel_compile_builds(tmp_path, monkeypatch, capsys):
    src = tmp_path / "conv.tile"
    src.write_text(NCHW)
    out = tmp_path / "sweep.jsonl"
    monkeypatch.setattr(sys, "argv", [
        "tile_sweep.py", str(src), "--shape", "D=1x16x14x14", "--shape", "W=64x16x3x3",
        "--shape", "B=64x1x1", "--device", "Portable Computing Language", "--top", "3",
        "--random", "1", "--repeat", "2", "--json", str(out)])
    assert _sweep_module().main() == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    err = capsys.readouterr().err
    assert rows and "failed" not in err
    # The tiles are those of the contraction compile builds, reading the filter relaid with
    # its output channels last, whole or in panels of the tile's channels (the as-written
    # contraction would have them first).
    from tilec.config import Config
    from tilec.tune.measure import Prepared

    # Large enough that the relaid filter wins even where a launch is measured at 100 us (a
    # calibration made while the machine is busy): on 1x8x6x6 the copy's launch could decide.
    prep = Prepared(NCHW, {"D": (1, 16, 14, 14), "W": (64, 16, 3, 3), "B": (64, 1, 1)},
                    config=Config(device="Portable Computing Language",
                                  use_tuning_records=False))
    assert {"W_t", "W_panels"} & set(prep.program.tensors)
    kernel = prep.kernel("contract_O")
    assert all(list(r["tile"]) == list(kernel.flat.names) for r in rows)
    chosen = [r for r in rows if r["chosen"]]
    assert len(chosen) == 1
    assert tuple(chosen[0]["tile"].values()) == tuple(prep.searches["contract_O"].top[0][0])
    assert all(r["measured_s"] > 0 for r in rows)

