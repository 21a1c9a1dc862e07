"""benchmarks/fit_cpu.py fits the CPU time model's coefficients to `tile_sweep.py --save` sweeps:
a saved sweep predicts again exactly what the sweep printed, and a fit to times made by known
coefficients finds times that match them."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import pickle
import sys
from pathlib import Path

import numpy as np

from tilec.plan.cost import score_many
from tilec.plan.hw import HwModel
from tilec.plan.predict_cpu import DEFAULT, predict_many_cpu

from ..flats import matmul_flat, seed_flat

ROOT = Path(__file__).resolve().parents[2]


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_a_saved_sweep_predicts_what_the_sweep_printed(tmp_path, monkeypatch):
    src = tmp_path / "mm.tile"
    src.write_text((ROOT / "examples" / "matmul.tile").read_text())
    out, saved = tmp_path / "sweep.jsonl", tmp_path / "sweep.pkl"
    monkeypatch.setattr(sys, "argv", [
        "tile_sweep.py", str(src), "--shape", "A=48x64", "--shape", "B=64x40", "--device",
        "Portable Computing Language", "--top", "3", "--random", "2", "--repeat", "2",
        "--json", str(out), "--save", str(saved)])
    assert _module("tile_sweep").main() == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    data = pickle.loads(saved.read_bytes())
    assert data["tiles"] == [tuple(r["tile"].values()) for r in rows]
    assert data["measured_s"] == [r["measured_s"] for r in rows]
    assert "A=48x64" in data["name"] and data["cpu"]
    sweep = _module("fit_cpu").load(str(saved))
    again = sweep.predict(DEFAULT)
    want = np.array([r["predicted_s"] for r in rows])
    assert np.allclose(again, want, rtol=1e-9)


def test_the_fit_finds_coefficients_that_reproduce_known_times():
    fit_cpu = _module("fit_cpu")
    hw_a = HwModel.load("pocl-cpu")
    hw_b = dataclasses.replace(hw_a, name="other-cpu", peak_gflops=900.0, bandwidth_gbs=90.0,
                               compute_units=16, registers=32, vec_size=16)
    truth = dataclasses.replace(DEFAULT, latency=6.0, load_issue=0.6, tile=60.0, chunk=3.0)
    rng = np.random.default_rng(1)
    sweeps = []
    for cpu, hw in (("cpu a", hw_a), ("cpu b", hw_b)):
        for flat in (matmul_flat(256, 256, 256), seed_flat(1)):
            from tilec.plan.search import search
            top = [t for t, _ in search(flat, hw, top_k=64).top]
            tiles = np.asarray([top[i] for i in sorted(rng.choice(len(top), 24, False))])
            stats = score_many(flat, tiles, hw)
            measured = predict_many_cpu(flat, tiles, hw, stats, coeff=truth)["time"]
            ok = np.isfinite(measured)
            sweeps.append(fit_cpu.Sweep(f"{cpu} {flat.names}", cpu, flat, hw, tiles[ok],
                                        score_many(flat, tiles[ok], hw), measured[ok]))
    before = fit_cpu.objective(sweeps, DEFAULT)
    fitted = fit_cpu.fit(sweeps, DEFAULT, rounds=3)
    after = fit_cpu.objective(sweeps, fitted)
    assert after < 0.5 * before
    # The fitted times, not only the objective: each sweep's median miss shrinks.
    for s in sweeps:
        assert fit_cpu.grade(s, fitted)["log"] <= fit_cpu.grade(s, DEFAULT)["log"] + 1e-9
