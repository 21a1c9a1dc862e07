"""The cost log: the seed's text form (one block per tile), or JSON lines; a search's plan
ranked by the time model adds each tile's prediction."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from ..errors import TileError
from .cost import Cost
from .predict import bottleneck_of


def log_text(costs: Iterable[Cost]) -> str:
    """The seed's text form, one block per tile."""
    return "".join(c.log_text() + "\n" for c in costs)


def json_lines(costs: Iterable[Cost]) -> str:
    """One JSON record per tile ("version": 1, "tile": {index: size}, every statistic)."""
    return "".join(json.dumps(c.to_json(), sort_keys=False) + "\n" for c in costs)


def write_log(source: object, path: str | os.PathLike[str] | IO[str],
              fmt: str | None = None) -> None:
    """Write a search's plan's top tiles (`search.TiledPlan`) or the given costs as text or
    JSON lines.  `fmt` is "text" or
    "jsonl"; by default a path ending in .jsonl/.json gets JSON lines, anything else text.  A
    plan ranked by the time model adds each tile's prediction: a "Predicted:" line in text,
    "predicted_us" and "bottleneck" in JSON."""
    plan = source if hasattr(source, "predicted") else None  # a search's TiledPlan
    costs = plan.costs if plan is not None else tuple(source)  # type: ignore[call-overload]
    if fmt is None:
        name = str(path) if isinstance(path, str | os.PathLike) else getattr(path, "name", "")
        fmt = "jsonl" if str(name).endswith((".jsonl", ".json")) else "text"
    if fmt not in ("text", "jsonl"):
        raise TileError(f"unknown cost-log format {fmt!r} (expected 'text' or 'jsonl')")
    if plan is not None and plan.predicted:
        if fmt == "text":
            body = "".join("\n".join(plan.log_lines(i)) + "\n" for i in range(len(costs)))
        else:
            rows = []
            for c, (secs, line) in zip(costs, plan.predicted, strict=True):
                rec = c.to_json()
                rec["predicted_us"] = round(secs * 1e6, 3)
                rec["bottleneck"] = bottleneck_of(line)
                rows.append(json.dumps(rec, sort_keys=False) + "\n")
            body = "".join(rows)
    else:
        body = json_lines(costs) if fmt == "jsonl" else log_text(costs)
    if isinstance(path, io.TextIOBase) or hasattr(path, "write"):
        path.write(body)  # type: ignore[union-attr]
    else:
        Path(path).write_text(body, encoding="utf-8")
