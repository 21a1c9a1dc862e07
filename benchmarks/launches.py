"""What a launch costs on a device, and what sharing launches saves a model, in one process.

    python benchmarks/launches.py [--device TEXT] [--calls 40] [MODEL.onnx ...]

First the driver's cost of a launch in an in-order stream: 32 launches of an empty kernel of
1, 64 and 1024 work-groups, then one wait; the median over 20 rounds of the time a launch
adds.  Then each model twice, with `Config.sibling_launches` off and on (independent kernels
sharing a launch, `codegen.siblings`), called in turn: kernel counts, the largest error
against MODEL.npz's `out0` (written by `benchmarks/zoo.py export`) and the medians of the
calls' wall times."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def launch_costs(device: str | None) -> dict[int, float]:
    from tilec.runtime.device import Runtime

    rt = Runtime.get(device)
    cl = rt.cl
    prg = cl.Program(rt.context, "__kernel void k(__global float* a) "
                                 "{ int g = get_global_id(0); a[g] = a[g] * 0.5f + 1.0f; }").build()
    buf = cl.Buffer(rt.context, cl.mem_flags.READ_WRITE, 4 * 1024)
    kernel = prg.k
    kernel.set_args(buf)
    queue = cl.CommandQueue(rt.context)
    out = {}
    for groups in (1, 64, 1024):
        rounds = []
        for _ in range(20):
            t = time.perf_counter()
            for _ in range(32):
                cl.enqueue_nd_range_kernel(queue, kernel, (groups,), (1,))
            queue.finish()
            rounds.append((time.perf_counter() - t) / 32)
        out[groups] = statistics.median(rounds)
    return out


def siblings_ab(path: Path, device: str | None, calls: int) -> None:
    import tilec.onnx
    from tilec.config import Config

    data = np.load(path.with_suffix(".npz"))
    runs = {}
    for label, on in (("one kernel a launch", False), ("sibling launches", True)):
        exe = tilec.onnx.load(str(path), config=Config(device=device, sibling_launches=on,
                                                       use_tuning_records=False))
        feed = {exe.inputs[0]: data["input"]}
        out = next(iter(exe.run(feed, poison=True).values()))
        err = float(np.abs(out - data["out0"]).max() / np.abs(data["out0"]).max())
        runs[label] = (exe, feed, len(exe.executable_for({}).executable.kernels), err, [])
    for i in range(calls):
        for label in (list(runs) if i % 2 == 0 else list(runs)[::-1]):
            exe, feed, _, _, walls = runs[label]
            t = time.perf_counter()
            exe.run(feed)
            walls.append(time.perf_counter() - t)
    base = statistics.median(runs["one kernel a launch"][4])
    for label, (_, _, kernels, err, walls) in runs.items():
        wall = statistics.median(walls)
        print(f"| {path.stem} | {label} | {kernels} | {wall * 1e3:.3f} ms | "
              f"{wall / base:.3f} | {err:.1e} |")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", type=Path)
    ap.add_argument("--device")
    ap.add_argument("--calls", type=int, default=40)
    args = ap.parse_args()
    costs = launch_costs(args.device)
    print("| work-groups | a launch in a stream of 32 |\n|---:|---:|")
    for groups, s in costs.items():
        print(f"| {groups} | {s * 1e6:.1f} us |")
    if args.models:
        print("\n| model | launches | kernels | wall (median) | / one kernel a launch | "
              "max error / max |\n|---|---|---:|---:|---:|---:|")
    for path in args.models:
        siblings_ab(path, args.device, args.calls)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
