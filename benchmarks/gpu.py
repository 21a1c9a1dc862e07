"""GPU benchmarks: tilec on the GPU's OpenCL against torch (cuBLAS / cuDNN, TF32 off), side by
side in one run.  Usage (on the GPU host): python benchmarks/gpu.py [--repeat N] [--hw MODEL]

tilec's time is the median OpenCL event time of its kernels; torch's is the median CUDA event
time of the same operation.  Inputs are random and every tilec result is validated first."""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tilec  # noqa: E402
from tilec.cli import random_array  # noqa: E402
from tilec.config import Config  # noqa: E402

MATMUL = (ROOT / "examples" / "matmul.tile").read_text()
CONV = (ROOT / "examples" / "seed_conv.tile").read_text()


def run_tilec(src, shapes, repeat, hw):
    t0 = time.perf_counter()
    exe = tilec.compile(src, shapes, config=Config(hw=hw))
    compile_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    arrays = {n: random_array(rng, exe.program.tensors[n].shape, exe.program.tensors[n].dtype)
              for n in exe.program.inputs}
    outs = exe.run(arrays, poison=True)
    v = exe.check(exe._inputs(arrays), outs)
    if not v.ok:
        raise SystemExit(f"validation failed: {v.worst}")
    exe.run(arrays, repeat=repeat)
    secs = sum(exe.last_timings.values())
    tiles = "; ".join(" ".join(f"{n}={t}" for n, t in k.tile.items()) for k in exe.kernels
                      if k.tile)
    return secs, tiles, compile_s, arrays


def torch_time(fn, repeat):
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--hw", default=None, help="hardware model (default: derived from device)")
    ap.add_argument("--sizes", default="1024,2048,4096")
    args = ap.parse_args()
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    from tilec.runtime import Runtime

    rt = Runtime.get(None)
    print(f"date: {datetime.date.today()}; device: {rt.info.label}, driver {rt.info.driver}; "
          f"torch {torch.__version__} on {torch.cuda.get_device_name()}; hw model: "
          f"{args.hw or 'derived from the device'}; command: python benchmarks/gpu.py "
          + " ".join(sys.argv[1:]))
    print()
    print("| kernel | tilec TFLOP/s | torch TFLOP/s | tilec / torch | tilec ms | torch ms | tile "
          "| compile s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
    for size in [int(s) for s in args.sizes.split(",")]:
        secs, tiles, comp, arrays = run_tilec(MATMUL, {"A": (size, size), "B": (size, size)},
                                               args.repeat, args.hw)
        a = torch.from_numpy(arrays["A"]).cuda()
        b = torch.from_numpy(arrays["B"]).cuda()
        tt = torch_time(lambda a=a, b=b: a @ b, args.repeat)
        fl = 2 * size ** 3
        print(f"| matmul {size} fp32 | {fl / secs * 1e-12:.2f} | {fl / tt * 1e-12:.2f} | "
              f"{tt / secs:.2f} | {secs * 1e3:.3f} | {tt * 1e3:.3f} | {tiles} | {comp:.2f} |",
              flush=True)
    secs, tiles, comp, arrays = run_tilec(CONV, None, args.repeat, args.hw)
    d = torch.from_numpy(arrays["D"]).cuda().permute(0, 3, 1, 2).contiguous()
    k = torch.from_numpy(arrays["K"]).cuda().permute(2, 3, 0, 1).contiguous()  # co ci i j
    tt = torch_time(lambda: torch.relu(torch.nn.functional.conv2d(d, k, padding=1)),
                    args.repeat)
    fl = 2 * 32 * 224 * 224 * 64 * 64 * 9
    print(f"| seed conv 3x3 + ReLU, N=32 224x224 64->64 (tilec NHWC, cuDNN NCHW) | "
          f"{fl / secs * 1e-12:.2f} | {fl / tt * 1e-12:.2f} | {tt / secs:.2f} | "
          f"{secs * 1e3:.3f} | {tt * 1e3:.3f} | {tiles} | {comp:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
