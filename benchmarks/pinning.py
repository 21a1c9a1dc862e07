"""PoCL's thread pinning (`POCL_AFFINITY=1`, tilec's default where the variable is unset)
against PoCL's own placement (`POCL_AFFINITY=0`), for whole models: a fresh process for each
measurement, the two in turn.

    python benchmarks/pinning.py MODEL.onnx... [--device TEXT] [--rounds 4]

Each process loads the model from warm caches (a first process compiles it), makes 10 calls
(their sum: "first 10 calls"), pauses 0.5 s, then times 60 calls (their median).  Prints per
model the medians over the processes, the median of the rounds' ratios pinned / PoCL's own, and
each process's figure.  MODEL.npz beside a model (`zoo.py export`) gives its input."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def child(path: str, device: str | None, cache: str) -> dict:
    import numpy as np

    sys.path.insert(0, str(HERE.parent))
    import tilec.onnx
    from tilec.config import Config

    exe = tilec.onnx.load(path, config=Config(device=device, cache_dir=Path(cache)), quiet=True)
    data = Path(path).with_suffix(".npz")
    x = np.load(data)["input"] if data.exists() else \
        np.random.default_rng(0).standard_normal(exe.last.graph.inputs["input"].shape)
    feed = {exe.inputs[0]: x.astype(np.float32)}
    exe.run(feed, poison=True)
    t = time.perf_counter()
    for _ in range(10):
        exe.run(feed)
    first = time.perf_counter() - t
    time.sleep(0.5)
    times = []
    for _ in range(60):
        t = time.perf_counter()
        exe.run(feed)
        times.append(time.perf_counter() - t)
    return {"median_ms": statistics.median(times) * 1e3, "first_ms": first * 1e3}


def measure(path: str, device: str | None, cache: str, pinned: bool) -> dict:
    # "0": PoCL's own placement (tilec sets "1" where the variable is unset).
    env = {**os.environ, "POCL_AFFINITY": "1" if pinned else "0"}
    cmd = [sys.executable, __file__, "--child", path, "--cache", cache]
    if device:
        cmd += ["--device", device]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--device")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cache", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.models[0], args.device, args.cache)))
        return 0
    cache = tempfile.mkdtemp(prefix="tilec-pinning-")
    print("| model | PoCL's own ms | pinned ms | pinned / own | first 10 calls own / pinned ms "
          "| each process, own; pinned |")
    print("| --- | ---: | ---: | ---: | --- | --- |")
    for path in args.models:
        measure(path, args.device, cache, False)  # compiles into the cache
        runs: dict[bool, list[dict]] = {False: [], True: []}
        for _ in range(args.rounds):
            for pinned in (False, True):
                runs[pinned].append(measure(path, args.device, cache, pinned))
        med = {p: statistics.median(r["median_ms"] for r in runs[p]) for p in runs}
        first = {p: statistics.median(r["first_ms"] for r in runs[p]) for p in runs}
        ratio = statistics.median(b["median_ms"] / a["median_ms"]
                                  for a, b in zip(runs[False], runs[True], strict=True))
        each = "; ".join(", ".join(f"{r['median_ms']:.2f}" for r in runs[p]) for p in runs)
        print(f"| {Path(path).stem} | {med[False]:.3f} | {med[True]:.3f} | {ratio:.3f} | "
              f"{first[False]:.1f} / {first[True]:.1f} | {each} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
