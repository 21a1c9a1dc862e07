"""tilec: a compiler from PlaidML's Tile language to fused, tiled OpenCL kernels."""

from .bundle import load
from .compiler import Executable, compile
from .errors import TileError
from .graph import library as ops
from .graph.builder import Graph, GraphExecutable
from .lang.api import check_program, evaluate, parse
from .version import __version__

__all__ = ["Executable", "Graph", "GraphExecutable", "TileError", "__version__",
           "check_program", "compile", "evaluate", "load", "onnx", "ops", "parse"]


def __getattr__(name: str):
    # `tilec.onnx` without importing the importer (and its converters) for every user.
    if name == "onnx":
        import importlib

        return importlib.import_module(".onnx", __name__)
    raise AttributeError(f"module 'tilec' has no attribute {name!r}")
