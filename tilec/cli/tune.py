"""`tilec tune FILE... [--top-k K] [--lws] [--budget SECONDS] [--cluster local|ADDRESS]`.

One .tile file without --cluster is tuned as it always was (`tune.measure.tune`).  Several
files, graphs (.onnx models, .py graph scripts: their kernels as `compile` would build them)
or a cluster go through `tune.jobs`: each distinct kernel tuned once, kernels that already
have a record skipped (--retune tunes them again), each record appended as it is measured."""

from __future__ import annotations

import argparse
import time

from ..errors import TileError
from ..lang.source import read_source


def cmd_tune(args: argparse.Namespace) -> int:
    from .options import make_config

    if args.top_k < 1:
        raise TileError("--top-k must be at least 1")
    if args.budget is not None and args.budget <= 0:
        raise TileError("--budget must be a positive number of seconds")
    if args.workers is not None and args.cluster != "local":
        raise TileError("--workers sizes a local cluster: give it with --cluster local")
    config = make_config(args)
    if args.cluster is None and len(args.files) == 1 and not _is_graph(args.files[0]):
        return _tune_one_file(args, config)
    return _tune_jobs(args, config)


def _is_graph(path: str) -> bool:
    return path.endswith((".onnx", ".py"))


def _tune_one_file(args: argparse.Namespace, config) -> int:
    from ..tune.measure import describe, tune
    from .options import progress_for, shapes_from

    (path,) = args.files
    src = read_source(path)
    with progress_for(args, 0, f"tuning {path}") as bar:
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


def _tune_jobs(args: argparse.Namespace, config) -> int:
    from ..tune.jobs import Ledger, Settings, run_here
    from ..tune.measure import describe
    from ..tune.records import RecordStore, default_path
    from .options import progress_for

    jobs = [job for path in args.files for job in _jobs_of(path, args, config)]
    path = default_path(config)
    ledger = Ledger(RecordStore(path), retune=args.retune, save=not args.no_save)
    settings = Settings(lws=args.lws, repeat=args.repeat, warmup=args.warmup,
                        deadline=None if args.budget is None else time.time() + args.budget)
    where = f" on cluster {args.cluster}" if args.cluster else ""
    with progress_for(args, 0, f"tuning {len(jobs)} programs{where}") as bar:
        if args.cluster:
            from ..tune import cluster

            with cluster.connect(args.cluster, config.device, args.workers) as client:
                cluster.tune_on(client, jobs, settings, ledger, device=config.device, bar=bar)
        else:
            run_here(jobs, settings, ledger, bar=bar)
    for report in ledger.reports():
        print(describe(report))
        print()
    for line in ledger.summary():
        print(line)
    print(f"{ledger.appended} records appended to {path}" if ledger.appended
          else "no records written")
    return 0 if ledger.complete() else 2


def _jobs_of(path: str, args: argparse.Namespace, config) -> list:
    """The programs a file holds: a Tile program, or a graph's lowered program (none when
    every output of the graph is empty)."""
    from ..lang.api import parse
    from ..lang.source import parse_shape
    from ..tune.jobs import ProgramJob
    from .options import shapes_from

    common = {"top_k": args.top_k, "seed": args.seed}
    if _is_graph(path):
        from ..graph.builder import wants_channels_last
        from .graph import lowered

        shapes = dict(parse_shape(s) for s in (args.shape or []))
        program = lowered(path, shapes, wants_channels_last(config))
        if program is None:
            return []
        return [ProgramJob.make(path, program.source, program.shapes, program.dtypes, config,
                                constants=tuple(program.bound), **common)]
    src = read_source(path)
    dtypes = {i.name: args.dtype for i in parse(src).inputs}
    return [ProgramJob.make(path, src.text, shapes_from(args, src), dtypes, config, **common)]


def register(sub, common) -> None:
    from .options import add_device_options, add_quiet_option

    sp = sub.add_parser("tune", help="time the cost model's top tiles and local sizes; keep "
                        "the fastest as tuning records")
    sp.add_argument("files", nargs="+", metavar="FILE",
                    help="a .tile program, an .onnx model or a .py graph script (several: "
                    "each distinct kernel is tuned once)")
    sp.add_argument("--shape", action="append", metavar="NAME=AxBxC",
                    help="an input's shape (the file's `// shapes:` comment gives the others)")
    sp.add_argument("--dtype", default="float32", help="element type of a .tile's inputs")
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
    sp.add_argument("--cluster", metavar="local|ADDRESS",
                    help="spread the kernels over Dask workers that each own a device: "
                    "'local' starts one per GPU --device matches (or --workers sharing a "
                    "CPU device); tcp://HOST:PORT uses that scheduler's workers "
                    "(pip install 'tilec[cluster]')")
    sp.add_argument("--workers", type=int, metavar="N",
                    help="workers of the local cluster (default: one per GPU, or one)")
    sp.add_argument("--retune", action="store_true",
                    help="tune kernels that already have a record (several files or a "
                    "cluster; otherwise they are skipped, so that a run resumes)")
    add_quiet_option(sp)
    sp.set_defaults(fn=cmd_tune)
