"""One tile's statistics as the cost log shows them (`Cost`: the seed's text lines and a JSON
record), and what PlaidML's model and the CPU model (`cost`, `cost_cpu`) both compute from
them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .hw import HwModel

VERSION = 1
STATUS_TEXT = ("ok", "over memory", "over regs")

_GPU_STATS = ("to", "wg", "il", "sm", "or", "mr", "mw", "op", "rp", "tu")
_CPU_STATS = ("vregs", "l2_bytes", "dram_bytes", "sweep")
_RATIOS = ("compute_ratio", "cache_ratio", "l2_ratio")


@dataclass(frozen=True)
class Cost:
    """Every statistic of one tile; `score` is -1 unless `status` is "ok"."""

    names: tuple[str, ...]
    tile: tuple[int, ...]
    hw: str
    kind: str
    status: str
    to: int
    wg: int
    il: int
    sm: int
    or_: int
    mr: int
    mw: int
    op: int
    rp: int
    tu: int
    flops_per_byte: float = 0.0
    occupancy: float = 0.0
    roof_ratio: float = 0.0
    occ_ratio: float = 0.0
    thread_ratio: float = 0.0
    score: float = -1.0
    # CPU model only (0 / 1 on GPUs)
    vregs: int = 0
    l2_bytes: int = 0
    dram_bytes: int = 0
    compute_ratio: float = 1.0
    cache_ratio: float = 1.0
    l2_ratio: float = 1.0
    sweep: int = 1  # register tiles a work-item runs in turn (`sweep.sweep_many`)

    @property
    def regs(self) -> int:
        return self.or_

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def log_text(self) -> str:
        """The seed's cost-log lines (C++ iostream number format), plus a CPU line on CPUs."""
        lines = [f"Computing cost for tile size: [{', '.join(str(t) for t in self.tile)}]",
                 "  Compute score: " + " ".join(f"{k}={self.stat(k)}" for k in _GPU_STATS)]
        if self.kind == "cpu":
            lines.append(f"  cpu: vregs={self.vregs} l2_bytes={self.l2_bytes} "
                         f"dram_bytes={self.dram_bytes} compute_ratio={self.compute_ratio:g} "
                         f"cache_ratio={self.cache_ratio:g} l2_ratio={self.l2_ratio:g}"
                         + (f" sweep={self.sweep}" if self.sweep > 1 else ""))
        if not self.ok:
            lines.append(f"  {self.status}")
            return "\n".join(lines)
        lines.append(f"  flops_per_byte={self.flops_per_byte:g} occupancy={self.occupancy:g}")
        lines.append(f"  roof_ratio={self.roof_ratio:g} occ_ratio={self.occ_ratio:g} "
                     f"thread_ratio={self.thread_ratio:g} score={self.score:g}")
        return "\n".join(lines)

    def stat(self, key: str) -> Any:
        return self.or_ if key == "or" else getattr(self, key)

    def to_json(self) -> dict[str, Any]:
        """One JSON-lines record: the tile by index name and every statistic."""
        rec: dict[str, Any] = {"version": VERSION, "hw": self.hw, "kind": self.kind,
                               "tile": dict(zip(self.names, self.tile, strict=True)),
                               "status": self.status}
        rec.update({k: self.stat(k) for k in _GPU_STATS})
        for k in ("flops_per_byte", "occupancy", "roof_ratio", "occ_ratio", "thread_ratio",
                  "score"):
            rec[k] = float(getattr(self, k))
        if self.kind == "cpu":
            rec.update({k: getattr(self, k) for k in _CPU_STATS})
            rec.update({k: float(getattr(self, k)) for k in _RATIOS})
        return rec


def ratios(to: Any, nbytes: Any, wg: Any, tu: Any, hw: HwModel) -> tuple:
    """PlaidML's ratios; works on numbers and on arrays, with the same float operations."""
    goal = hw.goal_flops_per_byte
    fpb = to / nbytes
    occupancy = np.minimum(wg, hw.goal_groups) * 1.0
    roof_ratio = np.minimum(fpb, goal) / goal
    occ_ratio = occupancy / hw.goal_groups
    thread_ratio = tu / hw.threads
    score_ = roof_ratio * occ_ratio * thread_ratio
    return fpb, occupancy, roof_ratio, occ_ratio, thread_ratio, score_


def finish(res: dict, status: np.ndarray, **ratios: np.ndarray) -> None:
    """Rejected tiles get score -1 and ratios 0 (1 for the CPU-only ones), as `score` does."""
    bad = status != 0
    for key, val in ratios.items():
        fill = -1.0 if key == "score" else (1.0 if key in _RATIOS else 0.0)
        res[key] = np.where(bad, fill, np.asarray(val, dtype=np.float64))
