"""Cold model loads of two (or more) trees of tilec, in turn in one run.

    python benchmarks/cold_trees.py MODEL.onnx OLD_TREE NEW_TREE [--rounds 4] [--device TEXT]
        [--known DEVICES_DIR]

Each run is a new process with every cache empty (PoCL's kernel cache, tilec's cache
directory, the user cache directory), which times `tilec.onnx.load` from its call to the end
of the first batch: opening the device (its probe and calibration where they run), reading
the model, planning, code generation, the driver's builds and the first launches.
`--known DIR`: a user cache's `tilec/devices` folder copied in first (a device probed and
calibrated before; a cold compile of a model on a known machine).  The trees (`git archive
REV | tar -x -C DIR`) take turns, the order reversed every other round; medians per tree."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

from child import last_json  # noqa: E402 - beside this script

_PROBE = r'''
import json, os, sys, time
sys.path.insert(0, os.getcwd())
import numpy as np
import tilec.onnx
from tilec.config import Config
from pathlib import Path
t = time.perf_counter()
exe = tilec.onnx.load(sys.argv[1], config=Config(device=sys.argv[2] or None,
                      cache_dir=Path(os.environ["TILEC_CACHE_DIR"]), use_tuning_records=False),
                      quiet=True)
t1 = time.perf_counter()
graph = exe.last.graph
name, value = next(iter(graph.inputs.items()))
x = np.random.default_rng(0).standard_normal(value.shape).astype(np.float32)
exe(**{name: x})
t2 = time.perf_counter()
print(json.dumps({"load": t1 - t, "first": t2 - t1, "total": t2 - t}))
'''


def one(tree: str, model: str, device: str, known: str | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="tilec-cold-") as d:
        os.makedirs(f"{d}/xdg/tilec")
        if known:
            shutil.copytree(known, f"{d}/xdg/tilec/devices")
        env = dict(os.environ, POCL_CACHE_DIR=f"{d}/pocl", XDG_CACHE_HOME=f"{d}/xdg",
                   TILEC_CACHE_DIR=f"{d}/tilec", CUDA_CACHE_PATH=f"{d}/nv")
        return last_json([sys.executable, "-c", _PROBE, model, device], f"{tree}: the load",
                         env=env, cwd=str(tree))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("trees", nargs="+")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--device", default="")
    ap.add_argument("--known", help="a `tilec/devices` folder of a user cache to start from")
    args = ap.parse_args()
    trees = [os.path.abspath(t) for t in args.trees]
    runs: dict[str, list[dict]] = {t: [] for t in trees}
    for r in range(args.rounds):
        for t in (trees if r % 2 == 0 else trees[::-1]):
            runs[t].append(one(t, os.path.abspath(args.model), args.device, args.known))
            j = runs[t][-1]
            print(f"{t}: {j['load']:.2f} + {j['first']:.2f} = {j['total']:.2f} s", flush=True)
    from host import cpu_model

    state = "device known" if args.known else "everything cold"
    print(f"\n{time.strftime('%Y-%m-%d %H:%M')}, {cpu_model()} ({os.cpu_count()} CPUs), "
          f"{os.path.basename(args.model)}, {state}, "
          f"`python benchmarks/cold_trees.py {' '.join(sys.argv[1:])}` (medians)\n")
    print("| tree | load s | first run s | load + first run s | runs |")
    print("| --- | ---: | ---: | ---: | --- |")
    for t in trees:
        def med(key: str, t: str = t) -> float:
            return statistics.median(j[key] for j in runs[t])
        every = ", ".join(f"{j['total']:.2f}" for j in runs[t])
        print(f"| {t} | {med('load'):.2f} | {med('first'):.2f} | **{med('total'):.2f}** | "
              f"{every} |")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    raise SystemExit(main())
