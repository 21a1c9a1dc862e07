"""Bundles: one .tlc file that runs without parsing, searching or tuning, and falls back to the
kernel source when its binary does not fit the device."""

from __future__ import annotations

import hashlib
import json
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest

import tilec
from tilec.bundle import BundleError, BundleWarning, load, write_bundle
from tilec.cli.main import main
from tilec.compiler import compile as tile_compile
from tilec.config import Config
from tilec.errors import TileError
from tilec.lang.reference import evaluate_program, random_array
from tilec.tune.measure import tune

from .device import needs_device

pytestmark = needs_device

PROGRAM = ("// shapes: A=12x10 B=10x9\n"
           "function (A[M, K], B[K, N]) -> (C, D) {\n"
           "  C[m, n : M, N] = +(A[m, k] * B[k, n]);\n"
           "  D = exp(C * 0.1) + 1;\n"
           "}\n")
SHAPES = {"A": (12, 10), "B": (10, 9)}


@pytest.fixture(scope="module")
def compiled():
    return tile_compile(PROGRAM, SHAPES, config=Config(use_tuning_records=False))


@pytest.fixture
def bundle(tmp_path, compiled) -> Path:
    path = tmp_path / "mm.tlc"
    summary = write_bundle(compiled, path)
    assert "binary" in summary and "0 tuning records" in summary
    return path


def arrays(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: random_array(rng, s, "float32") for n, s in SHAPES.items()}


def assert_runs(exe) -> None:
    a = arrays()
    outs = exe.run(a, poison=True)
    ref = evaluate_program(tilec.check_program(PROGRAM, SHAPES), a)
    for name in ("C", "D"):
        np.testing.assert_allclose(outs[name], ref[name], rtol=1e-4, atol=1e-5)


def rewrite(path: Path, *, meta=None, binary: bytes | None = None, fix_sum: bool = True):
    """Replace the bundle's metadata fields and/or binary (keeping or breaking its checksum)."""
    with zipfile.ZipFile(path) as z:
        files = {n: z.read(n) for n in z.namelist()}
    m = json.loads(files["bundle.json"])
    for key, value in (meta or {}).items():
        m[key] = value
    if binary is not None:
        files["program.bin"] = binary
        if fix_sum:
            m["binary"]["sha256"] = hashlib.sha256(binary).hexdigest()
    files["bundle.json"] = json.dumps(m).encode()
    with zipfile.ZipFile(path, "w") as z:
        for n, data in files.items():
            z.writestr(n, data)


def test_bundle_loads_from_its_binary_and_runs(bundle, compiled):
    with warnings.catch_warnings():
        warnings.simplefilter("error", BundleWarning)
        exe = tilec.load(bundle)
    assert exe.from_binary and exe.fallback_reason == ""
    assert [k.name for k in exe.kernels] == [k.name for k in compiled.kernels]
    assert exe.source == compiled.source
    assert_runs(exe)
    assert set(exe.last_timings) == {k.name for k in exe.kernels}


def test_loading_neither_parses_nor_searches(bundle, monkeypatch):
    import sys

    import tilec.lang.api
    import tilec.plan.search

    def forbidden(*args, **kwargs):
        raise AssertionError("load must not parse, check or search")

    monkeypatch.setattr(tilec.lang.api, "parse", forbidden)
    monkeypatch.setattr(tilec.lang.api, "check_program", forbidden)
    monkeypatch.setattr(tilec.plan.search, "search", forbidden)
    # The modules themselves: the package's `parse` name is the API function.
    monkeypatch.setattr(sys.modules["tilec.lang.parse"], "parse", forbidden)
    monkeypatch.setattr(sys.modules["tilec.lang.check"], "check", forbidden)
    exe = load(bundle)
    outs = exe(**arrays())
    assert outs["C"].shape == (12, 9) and np.isfinite(outs["D"]).all()


def test_falls_back_to_source_on_another_device(bundle):
    with zipfile.ZipFile(bundle) as z:
        device = json.loads(z.read("bundle.json"))["device"]
    rewrite(bundle, meta={"device": {**device, "driver": "some other driver"}})
    with pytest.warns(BundleWarning, match="built for .*driver"):
        exe = load(bundle)
    assert not exe.from_binary
    assert_runs(exe)


def test_falls_back_when_the_driver_refuses_the_binary(bundle):
    rewrite(bundle, binary=b"not a device binary")
    with pytest.warns(BundleWarning, match="refused"):
        exe = load(bundle)
    assert not exe.from_binary
    assert_runs(exe)


def test_a_damaged_binary_never_reaches_the_driver(bundle):
    with zipfile.ZipFile(bundle) as z:
        good = z.read("program.bin")
    flipped = good[:64] + bytes([good[64] ^ 0xFF]) + good[65:]  # PoCL would crash on this
    rewrite(bundle, binary=flipped, fix_sum=False)
    with pytest.warns(BundleWarning, match="checksum"):
        exe = load(bundle)
    assert not exe.from_binary
    assert_runs(exe)


def test_unreadable_bundles(tmp_path, bundle):
    junk = tmp_path / "junk.tlc"
    junk.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(BundleError, match="not a readable"):
        load(junk)
    with pytest.raises(TileError, match="no bundle"):
        load(tmp_path / "missing.tlc")
    rewrite(bundle, meta={"version": 99})
    with pytest.raises(BundleError, match="version 99"):
        load(bundle)


def test_validate_checks_against_the_reference(bundle):
    exe = load(bundle, validate=True)
    exe(**arrays(1))
    assert exe.last_validation is not None and exe.last_validation.ok
    with pytest.raises(TileError, match="shape"):
        exe(A=np.zeros((3, 3), np.float32), B=arrays()["B"])


def test_bundle_carries_the_tuning_records(tmp_path):
    config = Config(records_path=tmp_path / "r.jsonl")
    tune(PROGRAM, SHAPES, config=config, top_k=2, timer=lambda c: 1e-3 / (1 + c.rank))
    exe = tile_compile(PROGRAM, SHAPES, config=config)
    assert "contract_C" in exe.tuned
    path = tmp_path / "tuned.tlc"
    assert "tuning record" in write_bundle(exe, path)
    loaded = load(path)
    assert loaded.tuned["contract_C"] == exe.tuned["contract_C"]
    assert loaded.kernels[0].tile == exe.kernels[0].tile
    assert_runs(loaded)


def test_cli_compile_writes_a_bundle(tmp_path, capsys):
    prog = tmp_path / "mm.tile"
    prog.write_text(PROGRAM)
    out = tmp_path / "mm.tlc"
    assert main(["compile", str(prog), "-o", str(tmp_path / "mm.cl"), "--bundle", str(out),
                 "--no-records"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert_runs(tilec.load(out))


def test_cli_runs_a_bundle_and_refuses_options_that_would_change_it(tmp_path, capsys):
    prog, out = tmp_path / "mm.tile", tmp_path / "mm.tlc"
    prog.write_text(PROGRAM)
    assert main(["compile", str(prog), "-o", str(tmp_path / "mm.cl"), "--bundle", str(out),
                 "--no-records"]) == 0
    capsys.readouterr()
    save = tmp_path / "outs"
    assert main(["run", str(out), "--validate", "--repeat", "2", "--seed", "4",
                 "--save", str(save)]) == 0
    text = capsys.readouterr().out
    assert f"bundle {out} (its device binary)" in text and "validation: ok" in text
    # The saved outputs are the program's on the inputs the run drew (poisoned first).
    exe = tilec.load(out)
    rng = np.random.default_rng(4)
    arrays = {n: random_array(rng, exe.program.tensors[n].shape, "float32")
              for n in exe.program.inputs}
    ref = tilec.evaluate(PROGRAM, **arrays)
    assert set(ref) == {"C", "D"}
    for name, want in ref.items():
        np.testing.assert_allclose(np.load(save / f"{name}.npy"), want, rtol=1e-4, atol=1e-4)
    for extra in (["--shape", "A=2x2"], ["--tile", "m=2"], ["--hw", "pocl-cpu"],
                  ["--dtype", "float16"]):
        assert main(["run", str(out), *extra]) != 0
        assert "cannot change a bundle" in capsys.readouterr().err


def test_a_local_size_the_device_cannot_launch_goes_back_to_the_driver(tmp_path):
    src = "function (X[R, C], Y[R, C]) -> (Z) { Z = X * Y + X; }"
    shapes = {"X": (10, 13), "Y": (10, 13)}
    path = tmp_path / "ew.tlc"
    write_bundle(tile_compile(src, shapes, config=Config(use_tuning_records=False)), path)
    with zipfile.ZipFile(path) as z:
        manifest = json.loads(z.read("bundle.json"))["manifest"]
    (kernel,) = manifest["kernels"]
    kernel.update(local_size=[1 << 30], global_size=[1 << 30])  # tuned on a larger device
    rewrite(path, meta={"manifest": manifest})
    exe = load(path)
    assert exe.kernels[0].local_size is None and exe.kernels[0].global_size == 130
    rng = np.random.default_rng(0)
    x, y = (random_array(rng, (10, 13), "float32") for _ in range(2))
    np.testing.assert_allclose(exe(X=x, Y=y)["Z"], x * y + x, rtol=1e-5, atol=1e-6)
