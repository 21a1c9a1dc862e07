"""The time model's per-device correction, fitted from what `tilec tune` measured.

A tuning record keeps, for each candidate tile the time model predicted, its predicted and
measured seconds and the resource the prediction named as the limit (`records.TuneRecord.
pairs`).  For each resource the correction is the factor f minimising the squared error of
log(measured / (f x predicted)) over that resource's pairs plus one pair at ratio 1 (a prior
that keeps a factor fitted from a few tiles near 1): f = exp(sum(log ratio) / (n + 1)).
Compiles multiply a prediction by the factor of its limiting resource (`HwModel.correct_*`,
`plan.predict.corrected`); tuning itself predicts uncorrected, so its records are not fitted
to their own correction."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

from ..plan.hw import CORRECTIONS, HwModel
from .records import DeviceKey, TuneRecord

# Factors are kept within this range: a wild one comes from a broken measurement.
LIMITS = (0.1, 10.0)


def fit(records: Iterable[TuneRecord], device: DeviceKey) -> dict[str, float]:
    """Resource -> factor for `device`, from its records' pairs (resources without pairs are
    left out)."""
    logs: dict[str, list[float]] = {}
    for rec in records:
        if rec.device != device:
            continue
        for predicted, measured, bottleneck in rec.pairs:
            if predicted > 0 and measured > 0 and bottleneck in CORRECTIONS \
                    and math.isfinite(predicted):
                logs.setdefault(bottleneck, []).append(math.log(measured / predicted))
    return {b: min(max(math.exp(sum(v) / (len(v) + 1)), LIMITS[0]), LIMITS[1])
            for b, v in logs.items()}


def apply(hw: HwModel, factors: dict[str, float]) -> HwModel:
    """The model with these factors (others unchanged)."""
    if not factors:
        return hw
    return dataclasses.replace(hw, **{"correct_" + b.lower(): f for b, f in factors.items()})
