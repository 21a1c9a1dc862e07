"""tilec: a compiler from PlaidML's Tile language to fused, tiled OpenCL kernels."""

from .errors import TileError
from .version import __version__

__all__ = ["Executable", "Graph", "GraphExecutable", "TileError", "__version__",
           "aligned_empty", "check_program", "compile", "evaluate", "load", "onnx", "ops", "parse"]

# The API's names, imported at first use: a process that needs one stage only (a build
# worker searching tiles imports tilec.plan.search: 0.06 s, against 0.31 s with the whole
# compiler) does not load the others, nor `tilec.onnx`'s importer and converters.
_LAZY = {"load": (".bundle", "load"), "Executable": (".compiler", "Executable"),
         "aligned_empty": (".runtime.host_io", "aligned_empty"),
         "compile": (".compiler", "compile"), "ops": (".graph.library", None),
         "Graph": (".graph.builder", "Graph"),
         "GraphExecutable": (".graph.builder", "GraphExecutable"),
         "check_program": (".lang.api", "check_program"), "evaluate": (".lang.api", "evaluate"),
         "parse": (".lang.api", "parse"), "onnx": (".onnx", None)}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'tilec' has no attribute {name!r}")
    import importlib

    module, attr = _LAZY[name]
    value = importlib.import_module(module, __name__)
    if attr is not None:
        value = getattr(value, attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
