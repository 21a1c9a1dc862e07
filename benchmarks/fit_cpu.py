"""Fit the CPU time model's coefficients (`plan.predict_cpu.CpuCoefficients`) to tile sweeps.

    python benchmarks/fit_cpu.py SWEEP.pkl ... [--rounds 4] [--hold-out CPU]
        [--read-curve CPU=MIB:GBS,...]

`benchmarks/sweeps/` keeps sweeps of two CPUs (its README gives their commands and curves).

Each sweep is one `benchmarks/tile_sweep.py --save` run: a contraction, the hardware model of
the machine it ran on (its calibrated peak, bandwidths and launch costs) and 20-40 tiles with
their measured medians.  The coefficients are shared by every CPU: what differs between
machines is meant to come from their calibration, so sweeps of several machines are fitted
together and a coefficient that only one machine wants shows up as a worse fit of the other.

The objective, averaged over the machines (each machine's sweeps averaged first, so that the
one with more sweeps does not decide alone), is per sweep

    mean (log predicted/measured)^2 over its tiles          the time itself (issue: 1.5x)
    + 2 x log(regret of the predicted-fastest tile)         the choice a compile makes
    + 0.5 x (1 - Spearman's rho)                            the order of the rest

and coordinate descent moves one coefficient at a time by factors that shrink each round.
The launch and work-group costs are the calibrated ones and are not fitted; neither are
`fma_ports` (the clock is derived from it) and `llc_mib`.

It prints, per sweep, the shipped coefficients' figures and the fitted ones', then the fitted
values.  `--hold-out CPU` fits without the sweeps whose CPU name contains CPU and reports
them separately: how the fit carries to a machine it did not see."""

from __future__ import annotations

import argparse
import dataclasses
import math
import pickle
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tilec.plan.cost import score_many  # noqa: E402
from tilec.plan.predict_cpu import DEFAULT, CpuCoefficients, predict_many_cpu  # noqa: E402
from tilec.plan.read_curve import normal_curve  # noqa: E402
from tilec.tune.measure import spearman  # noqa: E402

FITTED = ("load_ports", "latency", "load_issue", "stream", "chunk", "loop", "line", "llc",
          "tile", "partial", "store_run", "overlap", "run_bytes", "page")


@dataclasses.dataclass
class Sweep:
    name: str
    cpu: str
    flat: object
    hw: object
    tiles: np.ndarray
    stats: dict
    measured: np.ndarray

    def predict(self, coeff: CpuCoefficients) -> np.ndarray:
        return predict_many_cpu(self.flat, self.tiles, self.hw, self.stats,
                                coeff=coeff)["time"]


def load(path: str) -> Sweep:
    with open(path, "rb") as f:
        d = pickle.load(f)
    tiles = np.asarray(d["tiles"], np.int64)
    stats = score_many(d["flat"], tiles, d["hw"], d["post"])
    return Sweep(f"{d['name']} [{d['kernel']}]", d["cpu"], d["flat"], d["hw"], tiles, stats,
                 np.asarray(d["measured_s"], np.float64))


def with_curve(s: Sweep, curves: list[str]) -> Sweep:
    """`s` with the first matching `--read-curve` where its hardware model has none."""
    if getattr(s.hw, "read_gbs", ()):
        return s
    for spec in curves:
        cpu, _, points = spec.partition("=")
        if cpu and cpu in s.cpu:
            curve = normal_curve(tuple(p.split(":")) for p in points.split(","))
            return dataclasses.replace(s, hw=dataclasses.replace(s.hw, read_gbs=curve))
    return s


def grade(s: Sweep, coeff: CpuCoefficients) -> dict:
    p = s.predict(coeff)
    ok = np.isfinite(p)
    p, m = p[ok], s.measured[ok]
    if len(p) < 3:
        return {"loss": 0.0, "rho": None, "regret": 1.0, "miss": 1.0, "log": 0.0}
    first = int(np.argmin(p))
    regret = float(m[first] / m.min())
    rho = spearman(list(p), list(m)) or 0.0
    logs = np.log(p / m)
    loss = float(np.mean(logs ** 2)) + 2.0 * math.log(regret) + 0.5 * (1.0 - rho)
    return {"loss": loss, "rho": rho, "regret": regret, "miss": float(p[first] / m[first]),
            "log": float(np.median(np.abs(logs)))}


def objective(sweeps: list[Sweep], coeff: CpuCoefficients) -> float:
    by_cpu: dict[str, list[float]] = {}
    for s in sweeps:
        by_cpu.setdefault(s.cpu, []).append(grade(s, coeff)["loss"])
    return float(np.mean([np.mean(v) for v in by_cpu.values()]))


def fit(sweeps: list[Sweep], start: CpuCoefficients, rounds: int) -> CpuCoefficients:
    best, score = start, objective(sweeps, start)
    for r in range(rounds):
        span = 2.0 ** (1.0 / (r + 1))
        factors = [span ** e for e in (-1.0, -0.5, -0.25, 0.25, 0.5, 1.0)]
        for name in FITTED:
            base = getattr(best, name)
            # A coefficient at 0 (a term switched off) is tried at a few values instead.
            for value in [base * f for f in factors] if base else [16.0, 64.0, 256.0]:
                if name == "overlap":
                    value = max(1.0, value)
                trial = dataclasses.replace(best, **{name: value})
                got = objective(sweeps, trial)
                if got < score - 1e-9:
                    best, score = trial, got
        print(f"round {r + 1}: objective {score:.4f}", file=sys.stderr)
    return best


def table(sweeps: list[Sweep], before: CpuCoefficients, after: CpuCoefficients) -> None:
    print("| sweep | CPU | tiles | rho before / after | regret before / after "
          "| first choice predicted/measured before / after | median miss before / after |")
    print("|---|---|---:|---|---|---|---|")
    for s in sweeps:
        a, b = grade(s, before), grade(s, after)
        print(f"| {s.name} | {s.cpu} | {len(s.tiles)} | {_f(a['rho'])} / {_f(b['rho'])} "
              f"| {a['regret']:.3f} / {b['regret']:.3f} | {a['miss']:.2f} / {b['miss']:.2f} "
              f"| {math.exp(a['log']):.2f} / {math.exp(b['log']):.2f} |")


def summary(label: str, sweeps: list[Sweep], coeff: CpuCoefficients) -> None:
    g = [grade(s, coeff) for s in sweeps]
    rhos = [x["rho"] for x in g if x["rho"] is not None]
    misses = [max(x["miss"], 1 / x["miss"]) for x in g]
    print(f"{label}: median rho {np.median(rhos):+.2f}, largest regret "
          f"{max(x['regret'] for x in g):.3f}, largest first-choice miss {max(misses):.2f}x, "
          f"objective {objective(sweeps, coeff):.4f}")


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2f}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("sweeps", nargs="+")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--hold-out", help="leave out the sweeps whose CPU name contains this")
    ap.add_argument("--read-curve", action="append", default=[], metavar="CPU=MIB:GBS,...",
                    help="the read curve (`tilec devices --calibrate`) of the sweeps whose CPU "
                         "name contains CPU and whose model has none (saved before the curve "
                         "was measured), e.g. Xeon=64:368,128:334,256:182,512:98")
    args = ap.parse_args()
    sweeps = [with_curve(load(p), args.read_curve) for p in args.sweeps]
    train = [s for s in sweeps if not (args.hold_out and args.hold_out in s.cpu)]
    held = [s for s in sweeps if s not in train]
    fitted = fit(train, DEFAULT, args.rounds)
    table(sweeps, DEFAULT, fitted)
    for label, group in (("fitted on", train), ("held out", held)):
        if group:
            summary(f"{label} ({len(group)} sweeps), shipped", group, DEFAULT)
            summary(f"{label} ({len(group)} sweeps), fitted", group, fitted)
    changed = {f.name: round(getattr(fitted, f.name), 4)
               for f in dataclasses.fields(CpuCoefficients)
               if getattr(fitted, f.name) != getattr(DEFAULT, f.name)}
    print("fitted:", changed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
