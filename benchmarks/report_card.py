"""The time model's report card over the benchmark suite: `tilec tune` of every suite kernel on
one device (`--kind cpu` or `gpu` picks the suite's cases), its top-k candidates timed against
the model's predictions, one table.

Per kernel (contractions, row-fused and attention kernels; elementwise kernels have one
candidate and no grade): Spearman's rho between the model's order and the measured order,
regret = the model's first choice's time / the fastest measured, and the first choice's
predicted and measured time with their ratio, and the ties: pairs of candidates predicted the
same time whose kernels differ.  The summary line gives the median rho, the
largest regret and the largest miss of a first choice's prediction (max(p/m, m/p)).

    python benchmarks/report_card.py --device NVIDIA --kind gpu [--only "matmul,conv"]
    python benchmarks/report_card.py --device Portable --kind cpu --repeat 5 --budget 120
    python benchmarks/report_card.py --device Portable --kind cpu --only "" --model m.onnx

Nothing is written to the tuning records; the device's stored records are not read either, so
the model's own first choice is graded."""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.suite import cpu_cases, gpu_cases, select  # noqa: E402
from tilec.config import Config  # noqa: E402
from tilec.tune.measure import tune  # noqa: E402


def grade(case, config: Config, top_k: int, repeat: int, budget: float | None) -> list[dict]:
    report = tune(case.source, case.shapes, config=config, top_k=top_k, repeat=repeat,
                  budget=budget, save=False, quiet=True)
    return [row(case.name, t, report) for t in report.kernels if graded(t)]


def graded(t) -> bool:
    return t.regret is not None or t.rho is not None  # one candidate: nothing to grade


def row(case: str, t, report, bind: bool = False) -> dict:
    """One kernel's line of the card: its model's first choice against the fastest."""
    first = t.first
    pred = first.candidate.predicted if first is not None else None
    meas = first.seconds if first is not None and first.status == "ok" else None
    return {"case": case + (" (bind)" if bind else ""), "kernel": t.kernel, "kind": t.kind,
            "bind": bind, "candidates": sum(m.status == "ok" for m in t.results),
            "ties": ties(t.results), "rho": t.rho, "regret": t.regret,
            "predicted_ms": None if pred is None else pred * 1e3,
            "measured_ms": None if meas is None else meas * 1e3,
            "device": report.device.label()}


def grade_model(path: str, config: Config, top_k: int, repeat: int,
                budget: float | None) -> list[dict]:
    """The kernels of an ONNX model (or a .py graph script) as `compile` builds them, each
    graded as a suite kernel is.  A kernel that reads only the model's weights (a filter
    relaid in panels) runs once at bind time, not in a call: its row says "bind"."""
    from tilec.cli.graph import lowered
    from tilec.graph.builder import wants_channels_last

    program = lowered(path, {}, wants_channels_last(config))
    if program is None:
        return []
    report = tune(program.source, program.shapes, dtype=dict(program.dtypes), config=config,
                  top_k=top_k, repeat=repeat, budget=budget, save=False, quiet=True,
                  constants=tuple(program.bound))
    name = Path(path).stem
    bound = set(program.bound)
    rows = []
    for t in report.kernels:
        src = next((m.candidate.source for m in t.results), None)
        args = src.args if src is not None else ()
        reads = {a.tensor for a in args if a.role == "in"}
        at_bind = bool(reads) and reads <= bound
        if at_bind:
            bound |= {a.tensor for a in args}
        if graded(t):
            rows.append(row(name, t, report, at_bind))
    return rows


def ties(results) -> int:
    """Pairs of the graded candidates predicted the same time whose kernels differ (their
    text without comments)."""
    seen: dict[float, set[str]] = {}
    for m in results:
        c = m.candidate
        if c.phase != "tile" or c.predicted is None:
            continue
        seen.setdefault(c.predicted, set()).add(
            re.sub(r"/\*.*?\*/|//[^\n]*", "", c.source.text, flags=re.S))
    return sum(len(v) * (len(v) - 1) // 2 for v in seen.values())


def summary(rows: list[dict], what: str) -> str:
    """The card's summary line: median rho, largest regret and prediction miss, the first
    choices predicted within 1.5x and the regrets within 1.10."""
    rhos = [r["rho"] for r in rows if r["rho"] is not None]
    regrets = [r["regret"] for r in rows if r["regret"] is not None]
    misses = [max(r["predicted_ms"] / r["measured_ms"], r["measured_ms"] / r["predicted_ms"])
              for r in rows if r["predicted_ms"] and r["measured_ms"]]
    median = statistics.median(rhos) if rhos else None
    return (f"{what} {len(rows)}; median rho {_fmt(median, '+.2f')}"
            f"; largest regret {_fmt(max(regrets) if regrets else None, '.3f')}"
            f" ({sum(g <= 1.10 for g in regrets)} of {len(regrets)} within 1.10)"
            f"; largest prediction miss {_fmt(max(misses) if misses else None, '.2f')}x"
            f" ({sum(x <= 1.5 for x in misses)} of {len(misses)} within 1.5x)"
            f"; ties {sum(r['ties'] for r in rows)}")


def _fmt(v, spec: str) -> str:
    return "" if v is None else format(v, spec)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", required=True, help="OpenCL device (as tilec's --device)")
    ap.add_argument("--kind", choices=("cpu", "gpu"), required=True,
                    help="which of the suite's case lists")
    ap.add_argument("--only", help="comma-separated case names or parts of them")
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--budget", type=float, help="seconds a case may spend measuring")
    ap.add_argument("--model", action="append", default=[], metavar="FILE.onnx",
                    help="grade a model's kernels too (repeatable); with --only \"\" the "
                    "models alone")
    ap.add_argument("--json", type=Path, help="write the rows here too")
    ap.add_argument("--hw", help="a hardware model (name or TOML) to predict with instead of "
                    "the device's own and its calibration: two trees graded on one model")
    args = ap.parse_args(argv)
    cases = select(cpu_cases() if args.kind == "cpu" else gpu_cases(), args.only)
    if args.only is not None and not args.only.strip():
        cases = []
    config = Config(device=args.device, hw=args.hw, use_tuning_records=False)
    rows: list[dict] = []
    print(f"# report card, {datetime.date.today()}, {platform.node()}, "
          f"`{' '.join(['python', 'benchmarks/report_card.py', *(argv or sys.argv[1:])])}`")
    print("| case | kernel | candidates | rho | regret | predicted / measured ms | ratio | ties |")
    print("|---|---|---:|---:|---:|---|---:|---:|")
    graded = [(lambda c=c: grade(c, config, args.top_k, args.repeat, args.budget))
              for c in cases]
    graded += [(lambda m=m: grade_model(m, config, args.top_k, args.repeat, args.budget))
               for m in args.model]
    for one in graded:
        for r in one():
            rows.append(r)
            p, m = r["predicted_ms"], r["measured_ms"]
            ratio = p / m if p and m else None
            print(f"| {r['case']} | {r['kernel']} ({r['kind']}) | {r['candidates']} | "
                  f"{_fmt(r['rho'], '+.2f')} | {_fmt(r['regret'], '.3f')} | "
                  f"{_fmt(p, '.4g')} / {_fmt(m, '.4g')} | {_fmt(ratio, '.2f')} | {r['ties']} |",
                  flush=True)
    if rows:
        print(f"device: {rows[0]['device']}")
    print(summary(rows, "kernels"))
    if any(r.get("bind") for r in rows):
        print(summary([r for r in rows if not r.get("bind")], "kernels a call runs"))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
