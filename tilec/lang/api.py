"""The public entry points: parse, check and evaluate Tile text."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..errors import Source, TileError
from . import ast, ir
from .check import check as _check
from .check import normalize_dtype
from .parse import parse as _parse
from .source import default_shapes


def parse(source: str | Source, name: str = "<string>") -> ast.Function:
    """Parse Tile text into its syntax tree (`TileSyntaxError` on bad text)."""
    if isinstance(source, Source):
        return _parse(source.text, source.name)
    return _parse(source, name)


def check_program(source: str | Source | ast.Function,
                  shapes: Mapping[str, Sequence[int]] | None = None,
                  dtype: str | Mapping[str, str] = "float32",
                  values: Mapping[str, int] | None = None) -> ir.Program:
    """Parse (if needed) and check a program for inputs of the given shapes.  Without shapes,
    the file's `// shapes:` comment is used.  `values` fixes 0-d integer inputs used as
    sizes."""
    fn = source if isinstance(source, ast.Function) else parse(source)
    if shapes is None:
        shapes = default_shapes(fn.source)
    return _check(fn, shapes, dtype, values)


def evaluate(source: str | Source | ast.Function | ir.Program,
             **arrays: np.ndarray) -> dict[str, np.ndarray]:
    """Compute every output of a Tile program with numpy (the reference every kernel is
    compared with).  Shapes and element types come from the arrays."""
    from .reference import evaluate_program

    if isinstance(source, ir.Program):
        program = source
    else:
        arrs = {k: np.asarray(v) for k, v in arrays.items()}
        dtypes = {k: normalize_dtype(a.dtype, f"array {k}") for k, a in arrs.items()}
        # 0-d integer arrays may stand for sizes (PlaidML's integer parameters): their values
        # are known here.
        values = {k: int(a) for k, a in arrs.items()
                  if a.shape == () and dtypes[k] in ir.INT_DTYPES}
        program = check_program(source, {k: a.shape for k, a in arrs.items()}, dtypes, values)
    return evaluate_program(program, arrays)


__all__ = ["parse", "check_program", "evaluate", "TileError"]
