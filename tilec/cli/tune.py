"""`tilec tune FILE.tile [--top-k K] [--lws] [--budget SECONDS]`."""

from __future__ import annotations

import argparse

from ..errors import TileError
from ..lang.source import read_source


def cmd_tune(args: argparse.Namespace) -> int:
    from ..tune.measure import describe, tune
    from .options import make_config, progress_for, shapes_from

    if args.top_k < 1:
        raise TileError("--top-k must be at least 1")
    if args.budget is not None and args.budget <= 0:
        raise TileError("--budget must be a positive number of seconds")
    src = read_source(args.file)
    config = make_config(args)
    with progress_for(args, 0, f"tuning {args.file}") as bar:
        report = tune(src, shapes_from(args, src), dtype=args.dtype, config=config,
                      top_k=args.top_k, lws=args.lws, budget=args.budget, repeat=args.repeat,
                      warmup=args.warmup, progress=bar, save=not args.no_save,
                      seed=args.seed)
    print(describe(report))
    print()
    print(f"tuned in {report.seconds:.1f} s; "
          + (f"records appended to {report.records_path}" if report.records_path
             else "no records written"))
    return 0 if all(t.best is not None for t in report.kernels) else 2


def register(sub, common) -> None:
    from .options import add_device_options, add_quiet_option

    sp = sub.add_parser("tune", help="time the cost model's top tiles and local sizes; keep "
                        "the fastest as tuning records")
    common(sp)
    add_device_options(sp)
    sp.add_argument("--top-k", type=int, default=8, help="tiles per contraction (default 8)")
    sp.add_argument("--lws", action="store_true",
                    help="also tune local work sizes (thread counts of the best tiles)")
    sp.add_argument("--budget", type=float, metavar="SECONDS",
                    help="stop measuring new candidates after this long")
    sp.add_argument("--repeat", type=int, default=5, help="timed runs per candidate (median)")
    sp.add_argument("--warmup", type=int, default=2, help="untimed runs first")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--no-save", action="store_true", help="do not write tuning records")
    add_quiet_option(sp)
    sp.set_defaults(fn=cmd_tune)
