"""An attention kernel's time (`attention.AttentionKernel`) in each form the codegen can make,
predicted from the device's facts, so that the form and the query rows a work-group are the
fastest predicted rather than a rule's.

The codegen describes each candidate it can build (`Form`: tiled or one work-item a query row,
query rows and work-items a group, local memory a group); this module predicts it:

    compute = the busiest compute unit's groups x (each group's FMAs / EFFICIENCY[form] x the
              warp's lanes used x sqrt(resident warps / WARPS) + the scores' exp, max and sum,
              SCORE_OPS each) / a compute unit's peak
    L2      = each group's K and V blocks (every key up to the causal bound) / the L2 bandwidth
    DRAM    = Q, K, V and the output once / the DRAM bandwidth
    time    = launch + |compute, L2, DRAM|_p

EFFICIENCY is the fraction of the mul-add peak each form's inner loop issues: the tiled form's
4x4 score and 4x8 output register tiles read two float4s from local memory for 16 to 32 FMAs;
the row form reads a local value for every FMA, and on a CPU the work-items of a group run as
vector lanes.  Values from `tilec tune` of the forms on an H200 (BENCHMARKS.md); the tuning
correction (`HwModel.correct_*`) rescales them for another device."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .attention import AttentionKernel
from .hw import HwModel

EFFICIENCY = {"tiled": 0.59, "rows": 0.34, "cpu": 0.25}
REGISTERS = 65536  # a GPU compute unit's register file (NVIDIA's since Kepler, AMD's CU alike)
WARPS = 16  # resident warps a compute unit needs for full issue (fewer: by their square root)
SCORE_OPS = 12.0  # max, exp (a few instructions), sum and rescaling, a score
OVERLAP = 3.0  # p of the p-norm joining the terms
LAUNCH_US = 5.0  # where the device was not calibrated


@dataclass(frozen=True)
class Form:
    form: str  # "tiled" or "rows"
    rows: int  # query rows a work-group
    threads: int  # work-items a work-group
    local_bytes: int  # local memory a work-group
    registers: int = 64  # 32-bit registers a work-item (its accumulators and row values)
    predicted_s: float = math.nan
    bottleneck: str = ""

    def describe(self) -> str:
        return (f"tiled, {self.rows} rows" if self.form == "tiled" else
                f"a row a work-item, {self.rows} rows")


def _size(k: AttentionKernel, names) -> int:
    return math.prod(k.range(n) for n in names)


def predict(k: AttentionKernel, hw: HwModel, f: Form) -> Form:
    """`f` with its predicted seconds and limiting resource."""
    B, Q, N = _size(k, k.batch), _size(k, k.query), k.range(k.key)
    D, E = _size(k, k.depth), _size(k, k.values)
    # A causal bound skips about half the keys (the blocks past the diagonal).
    share = 0.5 if k.causal else 1.0
    pairs = B * Q * N * share
    peak = hw.peak_gflops * 1e9
    groups = B * math.ceil(Q / f.rows)
    cus = hw.compute_units or max(1, hw.goal_groups // 4)
    per_cu = math.ceil(groups / cus)
    eff = EFFICIENCY["cpu" if hw.kind == "cpu" else f.form]
    if hw.kind != "cpu":
        local_cu = hw.l1_bytes or 2 * (hw.local_mem_bytes or 49152)
        resident = max(1, min(per_cu, local_cu // max(1, f.local_bytes),
                              2 * (hw.max_work_group_size or 1024) // f.threads,
                              REGISTERS // (f.threads * f.registers), 32))
        warps = resident * math.ceil(f.threads / 32)
        # Lanes a warp uses, and enough warps to hide the latency of local reads and FMAs.
        eff *= f.threads / (math.ceil(f.threads / 32) * 32) * math.sqrt(min(1.0, warps / WARPS))
    # A compute unit runs its groups (the busiest one sets the time).
    work = 2 * (D + E) / eff + SCORE_OPS
    compute = per_cu * (pairs / groups) * work / (peak / cus)
    es = 4
    l2 = groups * N * share * (D + E) * es / ((hw.l2_gbs or 2 * hw.bandwidth_gbs) * 1e9)
    dram = (B * Q * (D + E) + _kv_heads(k) * N * (D + E)) * es / (hw.bandwidth_gbs * 1e9)
    terms = {"compute": compute * hw.correct_compute, "L2": l2 * hw.correct_l2,
             "DRAM": dram * hw.correct_dram}
    body = sum(v ** OVERLAP for v in terms.values()) ** (1 / OVERLAP)
    launch = (hw.launch_us or LAUNCH_US) * 1e-6 * hw.correct_launch
    limit = "launch" if launch > body else max(terms, key=lambda n: terms[n])
    return replace(f, predicted_s=body + launch, bottleneck=limit)


def _kv_heads(k: AttentionKernel) -> int:
    """Batches of K and V (fewer than of Q under grouped-query attention)."""
    names = set(k.k.names) | set(k.v.names)
    return math.prod(k.range(n) for n in k.batch if n in names) or 1


def can_predict(hw: HwModel) -> bool:
    return hw.peak_gflops > 0 and hw.bandwidth_gbs > 0


def choose(k: AttentionKernel, hw: HwModel, forms: list[Form]) -> tuple[Form, list[Form]]:
    """The fastest predicted form and all of them, fastest first (the first given wins ties
    and stands alone where the device's peak or bandwidth is unknown)."""
    if not can_predict(hw):
        return forms[0], []
    predicted = [(predict(k, hw, f), i) for i, f in enumerate(forms)]
    ranked = [f for f, _ in sorted(predicted, key=lambda p: (p[0].predicted_s, p[1]))]
    return ranked[0], ranked
