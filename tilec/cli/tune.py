"""`tilec tune FILE.tile [--top-k K] [--lws] [--budget SECONDS]`."""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from ..errors import TileError
from ..lang.source import read_source


class ProgressBar:
    """A one-line bar redrawn in place on a terminal; elsewhere one line per kernel."""

    def __init__(self, stream: TextIO | None = None, width: int = 30):
        # Looked up now, not at import: tests and callers may have replaced sys.stderr.
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.tty = self.stream.isatty()
        self.kernel = ""

    def __call__(self, done: int, total: int, label: str) -> None:
        kernel = label.split(" ", 1)[0]
        if not self.tty and kernel != self.kernel and self.kernel:
            self.stream.write(f"tuned {self.kernel}\n")
        self.kernel = kernel
        if not self.tty:
            return
        filled = self.width * done // max(1, total)
        bar = "#" * filled + "." * (self.width - filled)
        self.stream.write(f"\r[{bar}] {done}/{total} {label[:60]:<60}")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
        elif self.kernel:
            self.stream.write(f"tuned {self.kernel}\n")
        self.stream.flush()


def cmd_tune(args: argparse.Namespace) -> int:
    from ..tune.measure import describe, tune
    from .options import make_config, shapes_from

    if args.top_k < 1:
        raise TileError("--top-k must be at least 1")
    if args.budget is not None and args.budget <= 0:
        raise TileError("--budget must be a positive number of seconds")
    src = read_source(args.file)
    config = make_config(args)
    bar = ProgressBar()
    try:
        report = tune(src, shapes_from(args, src), dtype=args.dtype, config=config,
                      top_k=args.top_k, lws=args.lws, budget=args.budget, repeat=args.repeat,
                      warmup=args.warmup, progress=None if args.quiet else bar,
                      save=not args.no_save, seed=args.seed)
    finally:
        if not args.quiet:
            bar.close()
    print(describe(report))
    print()
    print(f"tuned in {report.seconds:.1f} s; "
          + (f"records appended to {report.records_path}" if report.records_path
             else "no records written"))
    return 0 if all(t.best is not None for t in report.kernels) else 2


def register(sub, common) -> None:
    from .options import add_device_options

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
    sp.add_argument("--quiet", action="store_true", help="no progress bar")
    sp.set_defaults(fn=cmd_tune)
