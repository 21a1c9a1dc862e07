"""The PlaidML Tile corpus: every Tile program in PlaidML 0.7.0's op library (plaidml/op.py,
plaidml/keras/backend.py, and the tile.py programs they use), instantiated with concrete
parameters, with numpy oracles written from each op's meaning.  See SOURCES.md.

`Case`, the oracle conventions and the input generators are documented in case.py.
"""

from __future__ import annotations

from . import corpus_conv, corpus_keras, corpus_onnx, corpus_op, corpus_op2, corpus_tile
from .case import Case, check_case, compare, make_inputs

__all__ = ["CASES", "Case", "check_case", "compare", "make_inputs", "programs"]


def _collect() -> list[Case]:
    cases = (corpus_op.cases() + corpus_op2.cases() + corpus_conv.cases() + corpus_keras.cases()
             + corpus_tile.cases() + corpus_onnx.cases())
    names = [c.name for c in cases]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise RuntimeError(f"duplicate case names: {dup}")
    return cases


CASES: list[Case] = _collect()


def programs(cases=None) -> dict[str, list[Case]]:
    """Cases grouped by the PlaidML class/function that generates their text (`origin`)."""
    out: dict[str, list[Case]] = {}
    for c in cases if cases is not None else CASES:
        out.setdefault(c.origin, []).append(c)
    return out
