"""The progress display: shown on a terminal (or when forced), quiet off a terminal, with
`quiet=True` and with `--quiet` on the commands that compile or tune."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest

from tilec.cli.main import main
from tilec.config import Config
from tilec.graph import ops
from tilec.graph.builder import Graph
from tilec.runtime import progress

from .device import needs_device


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_quiet_off_a_terminal_and_with_quiet():
    assert not progress.wanted(stream=io.StringIO())
    assert not progress.wanted(quiet=True, stream=Terminal())
    assert progress.wanted(stream=Terminal())
    assert progress.wanted(quiet=True, stream=io.StringIO(), force=True)


def test_nothing_is_written_off_a_terminal():
    out = io.StringIO()
    with progress.Progress(3, "compiling", stream=out) as bar:
        for i in range(3):
            bar.step(f"stage {i}")
    assert out.getvalue() == "" and bar.done == 3


def test_a_forced_bar_is_drawn():
    out = io.StringIO()
    with progress.Progress(2, "compiling resnet", stream=out, force=True) as bar:
        bar.step("parse")
        bar.add(1)
        bar.step("build", 2)
    text = out.getvalue()
    assert "compiling resnet" in text


def test_a_bar_waits_before_it_shows():
    out = Terminal()
    with progress.Progress(2, "quick", stream=out, delay=60.0) as bar:
        bar.step("done", 2)
    assert out.getvalue() == ""  # finished before the delay: nothing drawn


def test_the_tune_callback_form():
    out = io.StringIO()
    bar = progress.Progress(0, "tuning", stream=out, force=True)
    bar(1, 4, "C ci=8 local=auto")
    bar(2, 5, "C ci=16 local=auto")
    assert (bar.done, bar.total) == (2, 5)
    bar.close()
    assert "tuning" in out.getvalue()


GRAPH_PY = """
import numpy as np
import tilec
from tilec import ops

def graph():
    g = tilec.Graph("tiny")
    x = g.input("x", (1, 2, 5, 5))
    w = g.constant(np.full((3, 2, 3, 3), 0.1, np.float32))
    g.output("y", ops.relu(ops.conv2d(x, w, padding="same")))
    return g
"""


def as_terminal(monkeypatch) -> Terminal:
    """stderr as a terminal, and bars that show at once.  Called in the test's body: pytest
    puts its own capture back on sys.stderr after fixtures are set up."""
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    return term


@needs_device
@pytest.mark.parametrize("quiet", [False, True])
def test_graph_command_shows_progress_on_a_terminal_unless_quiet(tmp_path, quiet, monkeypatch):
    terminal = as_terminal(monkeypatch)
    monkeypatch.setenv("TILEC_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "tiny.py"
    path.write_text(GRAPH_PY)
    assert main(["graph", str(path), "--run"] + (["--quiet"] if quiet else [])) == 0
    shown = "compiling" in terminal.getvalue()
    assert shown != quiet


@needs_device
def test_graph_compile_is_quiet_off_a_terminal_and_with_quiet(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    g = Graph("tiny")
    x = g.input("x", (4, 4))
    g.output("y", ops.relu(x))
    g.compile(config=Config(cache_dir=tmp_path))  # stderr is captured: not a terminal
    assert "compiling" not in capsys.readouterr().err
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    g.compile(config=Config(cache_dir=tmp_path), quiet=True)
    assert term.getvalue() == ""
    g.compile(config=Config(cache_dir=tmp_path))
    assert "compiling tiny" in term.getvalue()
    exe = g.compile(config=Config(cache_dir=tmp_path), quiet=True)
    np.testing.assert_array_equal(exe(x=np.full((4, 4), -1.0, np.float32))["y"], 0.0)


@needs_device
@pytest.mark.parametrize("quiet", [False, True])
def test_onnx_load_progress(tmp_path, quiet, monkeypatch):
    terminal = as_terminal(monkeypatch)
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    import tilec.onnx

    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "relu_model",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    exe = tilec.onnx.load(model, config=Config(cache_dir=tmp_path), quiet=quiet)
    assert ("compiling relu_model" in terminal.getvalue()) != quiet
    np.testing.assert_array_equal(exe(x=-np.ones((2, 3), np.float32))["y"], 0.0)
