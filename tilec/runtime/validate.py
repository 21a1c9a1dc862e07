"""The comparison of kernels' outputs with the numpy reference (`compare`): every result
within Config.rtol / atol (ten times that for float16) of the reference's value, where atol
scales with the largest finite magnitude of the output; integer and bool outputs equal."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..config import Config
from ..lang import ir


@dataclass
class Validation:
    max_abs_error: float
    max_rel_error: float
    ok: bool
    worst: str = ""


def compare(ref: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray], program: ir.Program,
            config: Config) -> Validation:
    worst_abs, worst_rel, ok, worst = 0.0, 0.0, True, ""
    for name, r in ref.items():
        g = got[name]
        dt = program.tensors[name].dtype
        if dt not in ir.FLOAT_DTYPES:
            bad = np.asarray(r != g)
            if bad.any():
                ok = False
                worst = f"{name}: {int(bad.sum())} of {bad.size} elements differ"
            continue
        r64, g64 = np.asarray(r, np.float64), np.asarray(g, np.float64)
        scale = float(np.max(np.abs(r64[np.isfinite(r64)]), initial=1.0))
        rtol = config.rtol * (10 if dt == "float16" else 1)
        atol = config.atol * max(1.0, scale) * (10 if dt == "float16" else 1)
        err = np.abs(r64 - g64)
        same = (r64 == g64) | (np.isnan(r64) & np.isnan(g64))
        err = np.where(same, 0.0, err)
        # NaN where the reference has NaN (0/0 of a fully masked softmax row) agrees; the
        # tolerance itself would be NaN there.
        bad = ~same & ~(err <= atol + rtol * np.abs(r64))
        if err.size:
            worst_abs = max(worst_abs, float(np.nanmax(np.where(np.isnan(err), np.inf, err))))
            rel = err / np.maximum(np.abs(r64), 1e-30)
            worst_rel = max(worst_rel, float(np.max(np.where(same, 0.0, rel))))
        if bad.any():
            ok = False
            idx = np.unravel_index(int(np.argmax(bad)), r64.shape) if r64.ndim else ()
            worst = (f"{name}{list(idx)}: expected {r64[idx]:.6g}, got {g64[idx]:.6g} "
                     f"({int(bad.sum())} of {bad.size} elements outside rtol={rtol:g}, "
                     f"atol={atol:g})")
    return Validation(worst_abs, worst_rel, ok, worst)
