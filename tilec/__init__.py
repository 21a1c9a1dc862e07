"""tilec: a compiler from PlaidML's Tile language to fused, tiled OpenCL kernels."""

from .api import check_program, evaluate, parse
from .compiler import Executable, compile
from .errors import TileError

__version__ = "0.1.0"

__all__ = ["Executable", "TileError", "__version__", "check_program", "compile", "evaluate",
           "parse"]
