"""tilec benchmarks against the peers a user would pick instead, measured side by side in one run.

    python benchmarks/run.py [--suite cpu|gpu] [--repeat N] [--device SUBSTRING]

Every figure is the median of N timed runs after a warm-up; inputs are random and every tilec
result is validated against the numpy reference before its time is reported.  tilec's time is
the kernels' OpenCL event time; numpy's is wall time of the call (its data is already in memory).
Prints a markdown table (paste into BENCHMARKS.md with the machine, date and command)."""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tilec  # noqa: E402
from tilec.cli import random_array  # noqa: E402

MATMUL = (ROOT / "examples" / "matmul.tile").read_text()
CONV = (ROOT / "examples" / "conv_relu.tile").read_text()


def median_time(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def tilec_case(src: str, shapes: dict, repeat: int, device: str | None):
    t0 = time.perf_counter()
    exe = tilec.compile(src, shapes, device=device)
    compile_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    arrays = {n: random_array(rng, exe.program.tensors[n].shape, exe.program.tensors[n].dtype)
              for n in exe.program.inputs}
    outs = exe.run(arrays, poison=True)
    v = exe.check(exe._inputs(arrays), outs)
    if not v.ok:
        raise SystemExit(f"validation failed: {v.worst}")
    exe.run(arrays, repeat=repeat)
    seconds = sum(exe.last_timings.values())
    flops = sum(k.flops for k in exe.kernels)
    tiles = "; ".join(" ".join(f"{n}={t}" for n, t in k.tile.items()) for k in exe.kernels
                      if k.tile)
    return seconds, flops, tiles, compile_s, arrays, exe


def numpy_conv(d: np.ndarray, k: np.ndarray) -> np.ndarray:
    """3x3 same conv + ReLU as nine shifted matrix products (BLAS does the work)."""
    n, x, y, ci = d.shape
    co = k.shape[2]
    pad = np.zeros((n, x + 2, y + 2, ci), np.float32)
    pad[:, 1:-1, 1:-1] = d
    out = np.zeros((n * x * y, co), np.float32)
    for i in range(3):
        for j in range(3):
            out += pad[:, i:i + x, j:j + y].reshape(-1, ci) @ k[i, j].T
    return np.maximum(out, 0).reshape(n, x, y, co)


def cpu_suite(repeat: int, device: str | None) -> list[dict]:
    rows = []
    for size in (1024,):
        shapes = {"A": (size, size), "B": (size, size)}
        secs, flops, tiles, comp, arrays, _ = tilec_case(MATMUL, shapes, repeat, device)
        a, b = arrays["A"], arrays["B"]
        np_secs = median_time(lambda a=a, b=b: a @ b, repeat)
        rows.append(dict(kernel=f"matmul {size}^3 fp32", tilec=flops / secs * 1e-9,
                         peer="numpy (OpenBLAS)", peer_gflops=flops / np_secs * 1e-9,
                         tilec_ms=secs * 1e3, peer_ms=np_secs * 1e3, tile=tiles,
                         compile_s=comp))
    shapes = {"D": (1, 56, 56, 64), "K": (3, 3, 64, 64)}
    secs, flops, tiles, comp, arrays, exe = tilec_case(CONV, shapes, repeat, device)
    d, k = arrays["D"], arrays["K"]
    ref = numpy_conv(d, k)
    got = exe(D=d, K=k)["R"]
    assert np.allclose(ref, got, rtol=1e-3, atol=1e-3), "numpy conv peer disagrees"
    np_secs = median_time(lambda: numpy_conv(d, k), repeat)
    rows.append(dict(kernel="conv 3x3 same + ReLU, N=1 56x56 64->64", tilec=flops / secs * 1e-9,
                     peer="numpy (9 shifted GEMMs)", peer_gflops=flops / np_secs * 1e-9,
                     tilec_ms=secs * 1e3, peer_ms=np_secs * 1e3, tile=tiles, compile_s=comp))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="cpu", choices=["cpu"])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--device")
    args = ap.parse_args()
    from tilec.runtime import Runtime

    rt = Runtime.get(args.device)
    rows = cpu_suite(args.repeat, args.device)
    print(f"date: {datetime.date.today()}  machine: {platform.machine()} "
          f"{platform.processor() or ''} ({rt.device.max_compute_units} compute units)")
    print(f"device: {rt.info.label}; platform {rt.info.platform_version}")
    print(f"numpy {np.__version__}; command: python benchmarks/run.py "
          + " ".join(sys.argv[1:]))
    print()
    print("| kernel | tilec GFLOP/s | peer | peer GFLOP/s | tilec / peer | tilec ms | peer ms "
          "| tile | compile s |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | --- | ---: |")
    for r in rows:
        print(f"| {r['kernel']} | {r['tilec']:.1f} | {r['peer']} | {r['peer_gflops']:.1f} "
              f"| {r['tilec'] / r['peer_gflops']:.2f} | {r['tilec_ms']:.3f} | {r['peer_ms']:.3f} "
              f"| {r['tile']} | {r['compile_s']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
