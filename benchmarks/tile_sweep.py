"""Measure many tiles of one contraction against the time model's predictions.

    python benchmarks/tile_sweep.py FILE.tile --shape NAME=AxB ... [--device D] [--kernel K]
           [--top 16] [--random 16] [--repeat 9] [--json OUT.jsonl] [--save OUT.pkl]
    python benchmarks/tile_sweep.py --case "matmul 1024" ...   (a case of benchmarks/suite.py)

The contraction is the one compile builds: the program is planned as `tilec compile` plans it
(sums split in parts, filters relaid and operands packed: `tune.measure.Prepared`), and the
kernel swept is `--kernel` or the contraction with the most multiply-adds.  Its tiles: the
time model's top `--top` (exact predictions over a pool of both rankings' top 512), PlaidML's
top 8, the tile compile chose, and `--random` tiles drawn (seeded) from the time model's next
240, so the sample is not only what the model already likes.  Every tile's kernel is rendered
as compile renders it, validated against the numpy reference with its outputs poisoned, and
the correct ones are timed together in interleaved rounds (`tune.bench.Runner`: drift on a
shared machine hits every tile alike).  One JSON line a tile: the tile, predicted seconds and
bottleneck, PlaidML's score, whether compile chose it, measured seconds (median of `--repeat`)
and the runs' spread; the end prints Spearman's rho between predicted and measured and the
regret of the time model's first choice and of compile's choice within the sample.  The data
fits and checks `plan.predict`'s coefficients: `--save` keeps, beside the measurements, the
contraction, its post-ops and the hardware model the predictions came from, so that
`benchmarks/fit_cpu.py` can predict the same tiles again under other coefficients, sweeps of
several machines together."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("file", nargs="?", help="a .tile program (or --case)")
    ap.add_argument("--case", help="a case of benchmarks/suite.py by its exact name instead")
    ap.add_argument("--save", help="a pickle of the sweep for benchmarks/fit_cpu.py")
    ap.add_argument("--shape", action="append", default=[])
    ap.add_argument("--device")
    ap.add_argument("--hw", help="hardware model (default: the device's, calibrated if stored)")
    ap.add_argument("--kernel", help="the kernel to sweep (default: the largest contraction)")
    ap.add_argument("--top", type=int, default=16)
    ap.add_argument("--registers", action="store_true",
                    help="also record the registers NVIDIA's compiler gives each kernel "
                         "(-cl-nv-verbose) beside the time model's estimate")
    ap.add_argument("--random", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--json")
    args = ap.parse_args()

    from tilec.config import Config
    from tilec.lang.source import parse_shape, read_source
    from tilec.plan.cost import score_many
    from tilec.plan.fuse import ContractionKernel
    from tilec.plan.predict import BOTTLENECKS, predict_many
    from tilec.plan.search import search
    from tilec.tune.bench import Candidate, Runner
    from tilec.tune.measure import Prepared, spearman, variant

    if args.case:
        from benchmarks.suite import cpu_cases, gpu_cases
        found = [c for c in cpu_cases() + gpu_cases() if c.name == args.case]
        if not found:
            ap.error(f"no suite case named {args.case!r}")
        src, shapes = found[0].source, dict(found[0].shapes)
    elif args.file:
        src = read_source(args.file)
        shapes = dict(parse_shape(s) for s in args.shape) or None
    else:
        ap.error("give a .tile file or --case")
    config = Config(device=args.device, use_tuning_records=False)
    prep = Prepared(src, shapes, config=config, hw=args.hw)
    hw = prep.model
    contractions = [k for k in prep.plan.kernels if isinstance(k, ContractionKernel)]
    if args.kernel:
        kernel = prep.kernel(args.kernel)
    else:
        kernel = max(contractions, key=lambda k: int(np.prod(k.flat.ranges)))
    flat, post = kernel.flat, kernel.post_op_count
    chosen = tuple(prep.searches[kernel.name].top[0][0])
    # The pool: both rankings' top 512, ordered by predicted time (padded convolutions are
    # ranked by PlaidML's score in a compile, but predicted all the same).
    timed = search(flat, hw, post_ops=post, top_k=512)
    plaid = search(flat, hw, post_ops=post, top_k=512, model="plaidml")
    pool = np.asarray(list(dict.fromkeys([t for t, _ in timed.top] + [t for t, _ in plaid.top])),
                      np.int64)
    order = np.argsort(predict_many(flat, pool, hw, score_many(flat, pool, hw, post))["time"],
                       kind="stable")
    ranked = [tuple(int(v) for v in pool[i]) for i in order]
    tiles = ranked[:args.top] + [t for t, _ in plaid.top[:8]] + [chosen]
    rng = np.random.default_rng(0)
    rest = ranked[args.top:256]
    if rest:
        pick = rng.choice(len(rest), size=min(args.random, len(rest)), replace=False)
        tiles += [rest[i] for i in sorted(pick)]
    tiles = list(dict.fromkeys(tiles))
    arr = np.asarray(tiles, np.int64)
    stats = score_many(flat, arr, hw, post)
    pred = predict_many(flat, arr, hw, stats)
    threads = config.threads if config.threads is not None else hw.threads
    cands = []
    for i, tile in enumerate(tiles):
        source = variant(kernel, prep.plan, hw, config, tile, threads)
        cands.append(Candidate(kernel.name, "contraction", "tile",
                               tuple(zip(flat.names, tile, strict=True)), source.local_size,
                               source.local_size, i, float(stats["score"][i]), source,
                               float(pred["time"][i]),
                               BOTTLENECKS[int(pred["bottleneck"][i])]))
    runner = Runner(prep.bench, None, None, None, warmup=2, repeat=args.repeat)
    rows = []
    out = open(args.json, "w") if args.json else None  # noqa: SIM115
    for m in runner.measure(cands):
        c = m.candidate
        if m.status != "ok":
            print(f"{c.label()}: {m.status} ({m.note})", file=sys.stderr)
            continue
        tile = dict(c.tile)
        rec = {"tile": tile, "predicted_s": c.predicted, "bottleneck": c.bottleneck,
               "plaidml_score": c.score, "chosen": tuple(tile.values()) == chosen,
               "measured_s": m.seconds, "spread": round(m.spread, 3)}
        if args.registers:
            j = c.rank
            rec.update({k: float(pred[k][j]) for k in ("regs", "copies", "reads", "acc_regs",
                                                        "resident") if k in pred})
            rec["registers"] = _registers(prep, c.source.text)
        rows.append(rec)
        line = json.dumps(rec)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
    if args.save:
        _save(args.save, prep, kernel, args.case or " ".join([args.file] + args.shape), rows)
    fin = [r for r in rows if np.isfinite(r["predicted_s"])]
    if len(fin) > 2:
        rho = spearman([r["predicted_s"] for r in fin], [r["measured_s"] for r in fin])
        first = min(fin, key=lambda r: r["predicted_s"])
        best = min(r["measured_s"] for r in rows)
        took = [r for r in rows if r["chosen"]]
        took_s = f"{took[0]['measured_s'] / best:.3f}" if took else "n/a"
        print(f"{kernel.name}: rho {rho:+.3f}; regret in the sample: time model's first "
              f"choice {first['measured_s'] / best:.3f} (predicted "
              f"{first['predicted_s'] * 1e3:.4f} ms, measured {first['measured_s'] * 1e3:.4f} "
              f"ms), compile's choice {took_s}; fastest {best * 1e3:.4f} ms")
    return 0


def _save(path: str, prep, kernel, name: str, rows: list[dict]) -> None:
    """The sweep as `fit_cpu.py` reads it: what predicts a tile (the contraction, its post-op
    count, the hardware model) and each measured tile with its time and spread."""
    import pickle

    from benchmarks.host import cpu_model

    info = prep.runtime.info
    data = {"name": name, "kernel": kernel.name, "flat": kernel.flat,
            "post": kernel.post_op_count, "hw": prep.model,
            "device": f"{info.platform_version} / {info.name}", "cpu": cpu_model(),
            "tiles": [tuple(r["tile"].values()) for r in rows],
            "measured_s": [r["measured_s"] for r in rows],
            "spread": [r["spread"] for r in rows], "chosen": [r["chosen"] for r in rows]}
    with open(path, "wb") as f:
        pickle.dump(data, f)


def _registers(prep, text: str) -> int | None:
    """Registers a thread NVIDIA's OpenCL compiler gives `text` (None elsewhere)."""
    import re

    import pyopencl as cl

    rt = prep.runtime
    try:
        prg = cl.Program(rt.context, text).build(options=["-cl-nv-verbose"])
        log = prg.get_build_info(rt.device, cl.program_build_info.LOG) or ""
    except cl.Error:
        return None
    found = re.findall(r"Used (\d+) registers", log)
    return int(found[-1]) if found else None


if __name__ == "__main__":
    raise SystemExit(main())
