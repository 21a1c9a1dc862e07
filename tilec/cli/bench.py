"""`tilec bench`: the benchmark suite of a source checkout (benchmarks/run.py or, with --gpu,
benchmarks/gpu.py), with every argument after `--` passed through."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from ..errors import TileError

SUITE = Path(__file__).resolve().parents[2] / "benchmarks"


def cmd_bench(args: argparse.Namespace) -> int:
    script = SUITE / ("gpu.py" if args.gpu else "run.py")
    if not script.is_file():
        raise TileError(f"tilec bench runs the suite of a source checkout; {script} is not "
                        "here (the benchmarks are not part of the installed package)")
    extra = [a for a in args.rest if a != "--"]
    return subprocess.call([sys.executable, str(script), *extra])


def register(sub, common) -> None:
    sp = sub.add_parser("bench", help="run the benchmark suite against its peers "
                        "(see BENCHMARKS.md)")
    sp.add_argument("--gpu", action="store_true", help="the GPU suite (torch peers)")
    sp.add_argument("rest", nargs=argparse.REMAINDER,
                    help="arguments for the suite, e.g. -- --repeat 10 --only matmul")
    sp.set_defaults(fn=cmd_bench)
