"""A search's runners-up, scored when first read.

A search keeps its top tiles (`search.TiledPlan.top`) with their statistics and, under the
time model, their predictions (`TiledPlan.predicted`).  A compile reads the first tile's
alone (its cost log in the kernel's header); `tilec explain`, tuning and the register recount
read the others.  Scoring all 8 at every search took about an eighth of the time of
resnet50's 164 searches on a 2-core Zen 3 (0.3-0.4 s of its cold load), so the others are
scored on first use: `Rows` holds the first row and the recipe for the rest."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any


class Rows(Sequence):
    """A tuple-like sequence whose first row is given and whose others `make(*args)` returns
    (all rows, the first included) when any of them is first read.  It compares equal to a
    tuple of the same rows, and pickles as the recipe (module-level functions only), so a
    plan kept on disk stays unscored until read."""

    def __init__(self, first: Any, count: int, make: Callable[..., Sequence], args: tuple):
        self._first, self._count, self._make, self._args = first, count, make, args
        self._all: tuple | None = None

    def _rows(self) -> tuple:
        if self._all is None:
            rows = tuple(self._make(*self._args))
            if len(rows) != self._count:
                raise ValueError(f"{len(rows)} rows made where {self._count} were expected")
            self._all = (self._first, *rows[1:])
        return self._all

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, i):
        if isinstance(i, int) and i in (0, -self._count) and self._count:
            return self._first
        return self._rows()[i]

    def __iter__(self) -> Iterator:
        return iter(self._rows())

    def __eq__(self, other) -> bool:
        if isinstance(other, (Rows, tuple)):
            return len(other) == self._count and tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        shown = "..." if self._all is None else ", ".join(map(repr, self._all))
        return f"Rows({self._count}: {shown})"

    def __reduce__(self):
        if self._all is not None:
            return (tuple, (self._all,))
        return (Rows, (self._first, self._count, self._make, self._args))


def rows(first: Any, count: int, make: Callable[..., Sequence], args: tuple) -> Sequence:
    """`Rows`, or a plain tuple where there is nothing to defer (one row, or none)."""
    if count == 0:
        return ()
    if count == 1:
        return (first,)
    return Rows(first, count, make, args)
