"""Measure many tiles of one contraction against the time model's predictions.

    python benchmarks/tile_sweep.py FILE.tile --shape NAME=AxB ... [--device D] [--top 16]
           [--random 16] [--repeat 5] [--json OUT.jsonl]

The tiles: the time model's top `--top` (exact predictions over a pool of both rankings' top
512), PlaidML's top 8, and `--random` tiles drawn (seeded) from the time model's next 240, so
the sample is not only what the model already likes.  Each tile is compiled alone (`--tile`),
validated against the numpy reference once, and timed (median OpenCL event time of
`--repeat` runs).  One JSON line a tile: the tile, predicted seconds and bottleneck, PlaidML's
score, measured seconds; the end prints Spearman's rho between predicted and measured and the
regret of the model's first choice within the sample.  The data fits and checks
`plan.predict`'s coefficients."""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--shape", action="append", default=[])
    ap.add_argument("--device")
    ap.add_argument("--hw", help="hardware model (default: the device's, calibrated if stored)")
    ap.add_argument("--top", type=int, default=16)
    ap.add_argument("--random", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()

    import tilec
    from tilec.config import Config
    from tilec.lang.reference import random_array
    from tilec.lang.source import parse_shape, read_source
    from tilec.plan.cost import score_many
    from tilec.plan.fuse import plan_kernels
    from tilec.plan.predict import BOTTLENECKS, predict_many
    from tilec.plan.search import search
    from tilec.runtime.device import Runtime, hw_model_for
    from tilec.tune.measure import spearman

    src = read_source(args.file)
    shapes = dict(parse_shape(s) for s in args.shape) or None
    prog = tilec.check_program(src, shapes)
    kernel = next(k for k in plan_kernels(prog).kernels if hasattr(k, "flat"))
    flat = kernel.flat
    rt = Runtime.get(args.device)
    hw = hw_model_for(args.hw, Config(device=args.device), rt)
    # The pool: both rankings' top 512, ordered by predicted time (padded convolutions are
    # ranked by PlaidML's score in a compile, but predicted all the same).
    timed = search(flat, hw, post_ops=kernel.post_op_count, top_k=512)
    plaid = search(flat, hw, post_ops=kernel.post_op_count, top_k=512, model="plaidml")
    pool = np.asarray(list(dict.fromkeys([t for t, _ in timed.top] + [t for t, _ in plaid.top])),
                      np.int64)
    order = np.argsort(predict_many(flat, pool, hw, score_many(flat, pool, hw,
                                                               kernel.post_op_count))["time"],
                       kind="stable")
    ranked = [tuple(int(v) for v in pool[i]) for i in order]
    tiles = ranked[:args.top] + [t for t, _ in plaid.top[:8]]
    rng = np.random.default_rng(0)
    rest = ranked[args.top:256]
    if rest:
        pick = rng.choice(len(rest), size=min(args.random, len(rest)), replace=False)
        tiles += [rest[i] for i in sorted(pick)]
    tiles = list(dict.fromkeys(tiles))
    arr = np.asarray(tiles, np.int64)
    stats = score_many(flat, arr, hw, kernel.post_op_count)
    pred = predict_many(flat, arr, hw, stats)
    arrays = None
    rows = []
    out = open(args.json, "w") if args.json else None  # noqa: SIM115
    for i, tile in enumerate(tiles):
        forced = dict(zip(flat.names, tile, strict=True))
        cfg = Config(device=args.device, tiles={kernel.name: forced}, use_tuning_records=False)
        exe = tilec.compile(src, shapes, config=cfg, hw=args.hw)
        if arrays is None:
            g = np.random.default_rng(1)
            arrays = {n: random_array(g, exe.program.tensors[n].shape,
                                      exe.program.tensors[n].dtype)
                      for n in exe.program.inputs}
            check = True
        else:
            check = False
        outs = exe.run(arrays, poison=True)
        if check or i < 3:
            v = exe.check(exe._inputs(arrays), outs)
            if not v.ok:
                print(f"{forced}: validation failed ({v.worst})", file=sys.stderr)
                continue
        times = []
        for _ in range(args.repeat):
            exe.run(arrays)
            times.append(exe.last_timings[kernel.name])
        secs = statistics.median(times)
        rec = {"tile": forced, "predicted_s": float(pred["time"][i]),
               "bottleneck": BOTTLENECKS[int(pred["bottleneck"][i])],
               "plaidml_score": float(stats["score"][i]), "measured_s": secs}
        rows.append(rec)
        line = json.dumps(rec)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
    fin = [r for r in rows if np.isfinite(r["predicted_s"])]
    if len(fin) > 2:
        rho = spearman([r["predicted_s"] for r in fin], [r["measured_s"] for r in fin])
        first = min(fin, key=lambda r: r["predicted_s"])
        best = min(r["measured_s"] for r in rows)
        print(f"rho {rho:+.3f}; regret in the sample {first['measured_s'] / best:.3f}; "
              f"first choice predicted {first['predicted_s'] * 1e3:.4f} ms, measured "
              f"{first['measured_s'] * 1e3:.4f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
