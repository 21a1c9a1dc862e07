"""A model's kernels with its convolutions NCHW and channels-last (`Config.channels_last`),
both executables loaded in one process and called in turn:

    python benchmarks/layout_ab.py MODEL.onnx [--calls 30] [--top 12] [--device Portable]

MODEL.npz beside the model holds its input ("input"; `benchmarks/zoo.py export` writes both).
Prints, for each layout, the kernel count, the sum of each kernel's minimum event time over
the calls, the median and minimum wall time of a call, and its slowest kernels (`--top`).
The outputs of both are compared with each other on every call."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--top", type=int, default=0)
    ap.add_argument("--device", default="Portable")
    args = ap.parse_args()

    import tilec.onnx
    from tilec.config import Config

    path = Path(args.model)
    x = np.load(path.with_suffix(".npz"))["input"]
    runs = {lab: tilec.onnx.load(str(path), config=Config(
        device=args.device, use_tuning_records=False, channels_last=cl))
        for lab, cl in (("NCHW", False), ("channels-last", True))}
    feed = {runs["NCHW"].inputs[0]: x}
    wall: dict[str, list[float]] = {k: [] for k in runs}
    kern: dict[str, dict[str, list[float]]] = {k: {} for k in runs}
    for _ in range(args.calls):
        outs = {}
        for lab, e in runs.items():
            t = time.perf_counter()
            outs[lab] = e.run(feed)
            wall[lab].append(time.perf_counter() - t)
            for n, v in e.executable_for({}).executable.last_timings.items():
                kern[lab].setdefault(n, []).append(v)
        a, b = outs.values()
        for k in a:
            scale = max(1.0, float(np.abs(a[k]).max()))
            assert np.abs(a[k] - b[k]).max() <= 1e-4 * scale, f"{k}: the layouts disagree"
    print(f"# {path.name}: {args.calls} calls, each layout in turn")
    for lab in runs:
        ks = kern[lab]
        total = sum(min(v) for v in ks.values()) * 1e3
        print(f"{lab}: {len(ks)} kernels, sum of minimums {total:.3f} ms, wall median "
              f"{np.median(wall[lab]) * 1e3:.3f} min {min(wall[lab]) * 1e3:.3f}")
        for n, v in sorted(ks.items(), key=lambda kv: -min(kv[1]))[:args.top]:
            print(f"  {min(v) * 1e3:.3f} {n}")


if __name__ == "__main__":
    main()
