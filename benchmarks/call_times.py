"""Milliseconds a call of ONNX models, two (or more) trees of tilec in turn in one run.

    python benchmarks/call_times.py DIR OLD_TREE NEW_TREE --only lstm,gpt_decoder
        [--device TEXT] [--rounds 2]

DIR holds `NAME-b1.onnx` and `NAME-b1.npz` (`zoo.py export`).  Each tree runs in a process of
its own (`git archive REV | tar -x -C DIR` for an old one), which compiles every model and
times its calls from Python, as a user's loop sees them: after 30 calls, 9 rounds of 30,
the median round; the trees take turns for `--rounds` rounds."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

_PROBE = r'''
import os, statistics, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, os.getcwd())
import numpy as np
import tilec.onnx
from tilec.config import Config
folder, device, names = sys.argv[1], sys.argv[2] or None, sys.argv[3].split(",")
out = []
for name in names:
    exe = tilec.onnx.load(f"{folder}/{name}-b1.onnx", quiet=True,
                          config=Config(device=device, cache_dir=Path(tempfile.mkdtemp())))
    data = np.load(f"{folder}/{name}-b1.npz")
    feed = {exe.inputs[0]: data["input"]}
    for _ in range(30):
        exe(**feed)
    rounds = []
    for _ in range(9):
        t = time.perf_counter()
        for _ in range(30):
            exe(**feed)
        rounds.append((time.perf_counter() - t) / 30 * 1e3)
    out.append(f"{name} {statistics.median(rounds):.3f}")
print(", ".join(out))
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    ap.add_argument("trees", nargs="+")
    ap.add_argument("--only", required=True, help="comma-separated model names")
    ap.add_argument("--device", default="")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    folder = os.path.abspath(args.folder)
    print(f"`python benchmarks/call_times.py {' '.join(sys.argv[1:])}`: ms a call")
    for r in range(args.rounds):
        for tree in (args.trees if r % 2 == 0 else args.trees[::-1]):
            p = subprocess.run([sys.executable, "-c", _PROBE, folder, args.device, args.only],
                               cwd=os.path.abspath(tree), capture_output=True, text=True)
            line = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else p.stderr[-1500:]
            print(f"{tree}: {line}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
