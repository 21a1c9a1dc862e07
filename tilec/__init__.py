"""tilec: a compiler from PlaidML's Tile language to fused, tiled OpenCL kernels."""

from .api import check_program, evaluate, parse
from .errors import TileError

__version__ = "0.1.0"

__all__ = ["TileError", "__version__", "check_program", "evaluate", "parse"]
