"""Tile-size search: enumerate candidate tiles, score them with the cost model, keep the best.

Candidates per index are the powers of two up to its range, the divisors of the range, and the
range itself (on CPU models an output index of a convolution also takes the register-tile sides
`space.CPU_SIDES`).  When the full cartesian product has at most `limit` (2 million) tiles it is
scored whole; otherwise only powers of two and the full range are kept; if that is still too
many, a best-first beam search climbs from the all-1 tile, moving one index at a time to its next
candidate (PlaidML's doubling search, a generation at a time so it can be vectorised).

Before scoring, output sub-tiles that cannot fit the registers are dropped: each thread holds
prod_out ceil(tile/threads) accumulators and the threads share at most `threads`, so
or >= prod_out tile * es; on a CPU (one work-item per tile) the accumulators alone need
prod_out tile / vec_size vector registers.  These are counted in `pruned`.

Ranking (deterministic), with the time model (`predict`; GPU models with a peak and a
bandwidth, unless `model="plaidml"`): shorter predicted time first, then as below.  With
PlaidML's model (CPU models, or asked for): higher score; then higher flops_per_byte (the
seed's tie rule); then fewer L2 bytes (CPU models); then fewer work-groups (a larger output
tile); then fewer inner loops (a larger reduction chunk); then less local memory and fewer
accumulator bytes; then the tile itself, lexicographically smaller first.  A rejected tile
("over memory"/"over regs") is never returned.
"""

from __future__ import annotations

import os
import re
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING

import numpy as np

from ..errors import TileError
from .cost import Cost, score, score_many
from .costlog import json_lines, log_text, write_log
from .flat import FlatContraction
from .layout import Layout, layout
from .predict import can_predict, explain_line, predict_many
from .runners import rows
from .space import (
    candidates,
    count,
    cpu_candidates,
    pow2_candidates,
    ranked_tiles,
    slides,
)
from .trust import staged_fits, time_ranks

__all__ = ["TiledPlan", "candidates", "forget", "json_lines", "log_text", "score_tile", "search",
           "search_key", "tile_log", "write_log"]

if TYPE_CHECKING:
    from .hw import HwModel

LIMIT = 2_000_000


@dataclass(frozen=True)
class TiledPlan:
    """The chosen tile of one contraction on one hardware model, with the runners-up."""

    flat: FlatContraction
    tile: tuple[int, ...]
    cost: Cost
    # Best first, the chosen one included; the runners-up scored when first read (`runners`).
    top: Sequence[tuple[tuple[int, ...], Cost]]
    candidates_scored: int
    rejected_memory: int
    rejected_regs: int
    seconds: float
    pruned: int = 0  # skipped before scoring: provably over regs (or `space.CPU_SIDE_ACC`)
    strategy: str = "exhaustive"  # "exhaustive", "pow2" or "beam"
    hw: HwModel | None = None
    post_ops: int = 0
    dtype: str = "float32"
    cached: bool = False  # the outcome of an earlier process's search, read from the cache
    # Per tile of `top` (time model only): predicted seconds and the cost-log line saying why.
    predicted: Sequence[tuple[float, str]] = ()

    ranked_by_time: bool = False  # the time model ranked `top` (else PlaidML's score did)

    @property
    def model(self) -> str:
        """What ranked `top`: "time" (predicted time) or "plaidml" (PlaidML's score)."""
        return "time" if self.ranked_by_time else "plaidml"

    def log_lines(self, row: int = 0) -> list[str]:
        """The cost log of top tile `row`: PlaidML's statistics, then the prediction."""
        lines = self.top[row][1].log_text().splitlines()
        if self.predicted:
            lines.append(self.predicted[row][1])
        return lines

    @property
    def costs(self) -> tuple[Cost, ...]:
        return tuple(c for _, c in self.top)

    def layout(self) -> Layout:
        if self.hw is None:
            raise TileError("this plan has no hardware model to lay its tile out for")
        return layout(self.flat, self.tile, self.hw, self.dtype)

    def describe(self) -> str:
        tile = ", ".join(f"{n}: {t}" for n, t in zip(self.flat.names, self.tile, strict=True))
        pred = f"predicted {self.predicted[0][0] * 1e6:.1f} us, " if self.predicted else ""
        pred += "ranked by predicted time; " if self.ranked_by_time else ""
        return (f"tile [{tile}] {pred}score {self.cost.score:g} "
                f"(flops_per_byte {self.cost.flops_per_byte:g}); {self.strategy} search scored "
                f"{self.candidates_scored} tiles in {self.seconds:.3f} s "
                f"({self.rejected_memory} over memory, {self.rejected_regs} over regs, "
                f"{self.pruned} pruned)" + ("; read from the search cache" if self.cached else ""))


def search(flat: FlatContraction, hw: HwModel, post_ops: int = 0, dtype: str = "float32",
           top_k: int = 8, log: str | os.PathLike[str] | IO[str] | None = None, *,
           post_inputs: int = 0, limit: int = LIMIT, cache: Path | None = None,
           model: str = "time") -> TiledPlan:
    """Find the best tile: the shortest predicted time (`model="time"`, where the hardware
    model can predict one and the contraction has no constraints) or PlaidML's highest score
    (`model="plaidml"`, and the other cases).  `log` (a path or
    text stream) receives the top tiles' cost log: text in the seed's format, or JSON lines when
    the path ends in .jsonl/.json.  `cache` (a directory) keeps the outcome for later processes:
    the same contraction on the same hardware model, scored by the same code, is not searched
    twice."""
    if model not in ("time", "plaidml"):
        raise TileError(f"unknown cost model {model!r} (expected 'time' or 'plaidml')")
    # Predictions go in the cost log wherever the model can make them, and rank the tiles of
    # contractions without constraints; a padded convolution's only where the predicted best
    # is a tile the model is trusted with (`trust.time_ranks`), elsewhere PlaidML's score.
    logged = model == "time" and can_predict(hw)
    start = time.perf_counter()
    top_k = max(1, top_k)
    key = path = slot = None
    if cache is not None:
        key = search_key(flat, hw, post_ops, dtype, top_k, post_inputs, limit, model)
        path = Path(cache) / key[:2] / f"{key}.json"
        slot = (str(cache), key)
        hit = _RECENT.get(slot)
        plan = replace(hit, flat=flat, cached=True) if hit is not None else \
            _from_cache(path, key, flat, hw, post_ops, dtype, post_inputs, logged)
        if plan is not None:
            _remember(slot, plan)
            if log is not None:
                write_log(plan, log)
            return plan
    es = hw.elem_size(dtype)
    cands = [candidates(r) for r in flat.ranges]
    if hw.kind == "cpu" and len(flat.inputs) > 1 and slides(flat):
        # One work-item a tile: the output sides of a sum of products over a sliding window
        # (a convolution) are its register tile's sides (`space.CPU_SIDES`: where they pay).
        for k in flat.out_indices:
            cands[k] = cpu_candidates(flat.ranges[k])
    strategy = "exhaustive"
    if count(cands) > limit:
        cands = [pow2_candidates(r) for r in flat.ranges]
        strategy = "pow2"
    if count(cands) > limit:
        strategy = "beam"
    timed = logged
    window = flat.constraints or flat.windowed  # a padded window, bordered or not
    # Where the times may not be trusted (a padded window), the same pass keeps the best by
    # PlaidML's score too: a third of a model's search time went to scoring them again.
    by_score: list = [] if window else None  # type: ignore[assignment]
    best, tally = ranked_tiles(cands, top_k, es, (flat, hw, post_ops, dtype, post_inputs, True),
                                strategy, by_score) if logged else (None, None)
    if logged and window and not (best.shape[0] and time_ranks(flat, best[0], hw)):
        timed = False
    if not timed:
        if by_score:
            best, tally = by_score
        else:
            best, tally = ranked_tiles(cands, top_k, es,
                                        (flat, hw, post_ops, dtype, post_inputs, False),
                                        strategy)
    best = best[[staged_fits(flat, row, hw) for row in best]] if best.shape[0] else best
    if best.shape[0] == 0:
        ones = tuple(1 for _ in flat.ranges)
        fallback = score(flat, ones, hw, post_ops, dtype, post_inputs=post_inputs)
        if not fallback.ok:
            raise TileError(_no_fit_message(flat, hw, fallback))
        best = np.asarray([ones], np.int64)
    tiles = tuple(tuple(int(t) for t in row) for row in best[:top_k])
    top, predicted = _ranked(flat, tiles, hw, post_ops, dtype, post_inputs, logged)
    plan = TiledPlan(flat=flat, tile=top[0][0], cost=top[0][1], top=top,
                     candidates_scored=tally[0], rejected_memory=tally[1],
                     rejected_regs=tally[2], pruned=tally[3],
                     seconds=time.perf_counter() - start, strategy=strategy, hw=hw,
                     post_ops=post_ops, dtype=dtype, ranked_by_time=timed,
                     predicted=predicted)
    if slot is not None:
        from .. import memo

        _remember(slot, plan)
        memo.write_json(path, key, {
            "top": [list(t) for t in tiles], "tally": list(tally), "strategy": strategy,
            "seconds": plan.seconds, "ranked_by_time": timed})
    if log is not None:
        write_log(plan, log)
    return plan


def _ranked(flat: FlatContraction, tiles: tuple[tuple[int, ...], ...], hw: HwModel,
            post_ops: int, dtype: str, post_inputs: int, timed: bool):
    """A search's top tiles with their costs, and their predictions (time model): the first
    tile's now, the others' when first read (`runners`)."""
    first = (tiles[0], score(flat, tiles[0], hw, post_ops, dtype, post_inputs=post_inputs))
    top = rows(first, len(tiles), _scored, (flat, tiles, hw, post_ops, dtype, post_inputs))
    said = _predictions(flat, hw, (first,), post_ops, dtype, post_inputs, timed)
    if not said:
        return top, ()
    return top, rows(said[0], len(tiles), _predictions,
                     (flat, hw, tuple((t, None) for t in tiles), post_ops, dtype,
                      post_inputs, timed))


def _scored(flat: FlatContraction, tiles, hw: HwModel, post_ops: int, dtype: str,
            post_inputs: int) -> tuple:
    return tuple((t, score(flat, t, hw, post_ops, dtype, post_inputs=post_inputs))
                 for t in tiles)


def _predictions(flat: FlatContraction, hw: HwModel, top, post_ops: int, dtype: str,
                 post_inputs: int, timed: bool) -> tuple[tuple[float, str], ...]:
    if not timed or not top:
        return ()
    tiles = np.asarray([t for t, _ in top], np.int64)
    stats = score_many(flat, tiles, hw, post_ops, dtype, post_inputs=post_inputs)
    pred = predict_many(flat, tiles, hw, stats, dtype)
    return tuple((float(pred["time"][i]), explain_line(pred, i)) for i in range(len(top)))


_CODE_DIGEST: list[str] = []

# This process's outcomes by (cache directory, key), newest last: a model compile asks for
# the same search again (the panel choice, then code generation; repeated layers), and reading
# it back from the cache re-scores its top tiles (resnet50 cold: 78 of 164 searches, 0.9 s on
# 2 cores).  What a key names does not depend on tensor names (`search_key`), nor do the
# costs and predictions a plan holds: a hit takes the contraction asked for and keeps the
# rest.  `forget` empties it (`tilec cache clear` does).
_RECENT: OrderedDict[tuple[str, str], TiledPlan] = OrderedDict()
RECENT_SIZE = 4096


def _remember(key: tuple[str, str], plan: TiledPlan) -> None:
    _RECENT[key] = plan
    _RECENT.move_to_end(key)
    while len(_RECENT) > RECENT_SIZE:
        _RECENT.popitem(last=False)


def forget() -> None:
    """Drop this process's search outcomes: the next search of each reads the cache
    directory again, as a new process would."""
    _RECENT.clear()


def search_modules() -> list:
    """The modules of this package a search's outcome depends on: this one and every module
    it imports, directly or not, within `tilec.plan` (read from their import statements, so
    that a module split off later is not left out of the cache's code digest, as the CPU
    scoring once was)."""
    import importlib

    package = __name__.rpartition(".")[0]
    seen: dict[str, object] = {}
    todo = [__name__]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        module = importlib.import_module(name)
        seen[name] = module
        text = Path(module.__file__).read_text()
        todo += [f"{package}.{m}" for m in _FROM_MODULE.findall(text)]  # from .cost import
        for names in _FROM_PACKAGE.findall(text):  # from . import cost, flat as flat_mod
            todo += [f"{package}.{n.split()[0]}" for n in names.split(",") if n.strip()]
    return [seen[n] for n in sorted(seen)]


# Relative imports as the package writes them (a regex: parsing every module costs a cold
# compile 70 ms).
_FROM_MODULE = re.compile(r"^\s*from \.(\w+) import", re.M)
_FROM_PACKAGE = re.compile(r"^\s*from \. import \(?([\w\s,]+?)\)?\s*$", re.M)


def search_key(flat: FlatContraction, hw: HwModel, post_ops: int = 0, dtype: str = "float32",
               top_k: int = 8, post_inputs: int = 0, limit: int = LIMIT,
               model: str = "time") -> str:
    """What `search` with these arguments keeps its outcome under in the cache: two
    searches with the same key have the same outcome."""
    from dataclasses import fields, replace

    from .. import memo

    timed = model == "time" and can_predict(hw)
    top_k = max(1, top_k)

    if not _CODE_DIGEST:
        _CODE_DIGEST.append(memo.module_digest(*search_modules()))
    # Tensors named by first appearance and the statement's text left out: a model's repeated
    # layers (the same contraction over other tensors) share one search, whose outcome does
    # not depend on names (a cached outcome is scored again on the contraction asked for).
    alias: dict[str, str] = {}
    tensors = tuple(replace(t, name=alias.setdefault(t.name, f"#{len(alias)}"))
                    for t in flat.tensors)
    contraction = [(f.name, tensors if f.name == "tensors" else getattr(flat, f.name))
                   for f in fields(flat) if f.name not in ("extra", "text")]
    return memo.digest("search", _CODE_DIGEST[0], repr(contraction), repr(hw), post_ops, dtype,
                       top_k, post_inputs, limit, timed)


def _from_cache(path: Path, key: str, flat: FlatContraction, hw: HwModel, post_ops: int,
                dtype: str, post_inputs: int, logged: bool) -> TiledPlan | None:
    from .. import memo

    found = memo.read_json(path, key)
    try:
        tiles = [tuple(int(t) for t in row) for row in found["top"]]
        tally = tuple(int(n) for n in found["tally"])
        strategy = str(found["strategy"])
        seconds = float(found["seconds"])
        by_time = bool(found.get("ranked_by_time", False))
        if not tiles or len(tally) != 4 or any(
                len(t) != len(flat.ranges) or not all(1 <= a <= r for a, r in
                                                      zip(t, flat.ranges, strict=True))
                for t in tiles):
            return None
    except (TypeError, KeyError, ValueError):
        return None
    top, predicted = _ranked(flat, tuple(tiles), hw, post_ops, dtype, post_inputs, logged)
    return TiledPlan(flat=flat, tile=top[0][0], cost=top[0][1], top=top,
                     candidates_scored=tally[0], rejected_memory=tally[1],
                     rejected_regs=tally[2], pruned=tally[3],
                     seconds=seconds, strategy=strategy, hw=hw, post_ops=post_ops, dtype=dtype,
                     cached=True, ranked_by_time=by_time, predicted=predicted)


def tile_log(flat: FlatContraction, hw: HwModel, tile: Sequence[int] | Mapping[str, int],
             post_ops: int = 0, dtype: str = "float32", model: str = "time") -> tuple[Cost,
                                                                                   list[str]]:
    """A given tile's cost and its cost-log lines (with the predicted time under the time
    model, where the hardware model can predict one)."""
    cost = score_tile(flat, hw, tile, post_ops, dtype)
    lines = cost.log_text().splitlines()
    if model == "time" and can_predict(hw) and cost.ok:
        lines += [line for _, line in _predictions(flat, hw, ((cost.tile, cost),), post_ops,
                                                    dtype, 0, True)]
    return cost, lines


def score_tile(flat: FlatContraction, hw: HwModel, tile: Sequence[int] | Mapping[str, int],
               post_ops: int = 0, dtype: str = "float32", *, post_inputs: int = 0) -> Cost:
    """Score a tile the user gave (`--tile`): sizes in index order, or a mapping from index
    name to size (indices it leaves out get 1)."""
    names = flat.names
    if isinstance(tile, Mapping):
        unknown = [k for k in tile if k not in names]
        if unknown:
            raise TileError(f"--tile names unknown index {unknown[0]!r}; the contraction's "
                            f"indices are {', '.join(names)}")
        sizes = [int(tile.get(n, 1)) for n in names]
    else:
        sizes = [int(t) for t in tile]
        if len(sizes) != len(names):
            raise TileError(f"--tile has {len(sizes)} sizes but the contraction has "
                            f"{len(names)} indices ({', '.join(names)})")
    for n, t, r in zip(names, sizes, flat.ranges, strict=True):
        if not 1 <= t <= r:
            raise TileError(f"tile size {t} for index {n} is outside 1..{r}")
    return score(flat, sizes, hw, post_ops, dtype, post_inputs=post_inputs)


# -- strategies --------------------------------------------------------------------------------

def _no_fit_message(flat: FlatContraction, hw: HwModel, c: Cost) -> str:
    what = (f"{c.sm} bytes of local memory (max_mem {hw.max_mem})" if c.status == "over memory"
            else f"{c.or_} accumulator bytes (max_regs {hw.max_regs})"
            + (f" and {c.vregs} vector registers (registers {hw.registers})"
               if hw.kind == "cpu" else ""))
    return (f"hardware model {hw.name!r} cannot fit this operation: every tile is rejected, "
            f"and even the all-1 tile over indices {', '.join(flat.names)} needs {what}")
