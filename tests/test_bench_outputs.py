"""Where the benchmark suites write their figures: a run of part of a suite (`--only`,
`--skip`) must not replace the committed whole-suite figures."""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from argparse import Namespace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _harness(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # its sibling modules
    spec = importlib.util.spec_from_file_location("harness", ROOT / "benchmarks" / "harness.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "harness", mod)  # its dataclasses look themselves up
    spec.loader.exec_module(mod)
    return mod


def test_partial_runs_write_beside_the_temporary_files(tmp_path, monkeypatch):
    h = _harness(monkeypatch)
    whole = h.output_paths(Namespace(only=None, skip=None, json=None, png=None), "cpu", tmp_path)
    assert whole == (tmp_path / "results-cpu.json", tmp_path / "roofline-cpu.png")
    for only, skip in (("matmul", None), (None, "conv")):
        js, png = h.output_paths(Namespace(only=only, skip=skip, json=None, png=None), "cpu",
                                 tmp_path)
        assert js.parent == png.parent == Path(tempfile.gettempdir()) / "tilec-bench"
        assert js.name == "results-cpu.json" and js.parent != tmp_path
    given = h.output_paths(Namespace(only="matmul", json=str(tmp_path / "a.json"),
                                     png=str(tmp_path / "a.png")), "gpu", tmp_path)
    assert given == (tmp_path / "a.json", tmp_path / "a.png")
