"""Matrix-vector product (a fully connected layer at batch 1), tilec against numpy, one run.

    python benchmarks/gemv.py [--device SPEC] [--n 4096] [--k 25088] [--repeat 7]

tilec's time is the median OpenCL event time of its kernels; numpy's the median wall time of
`w @ x`.  GB/s counts the matrix read once."""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import tilec
from tilec.config import Config

GEMV = "function (X[M, K], W[N, K]) -> (O) { O[m, n : M, N] = +(X[m, k] * W[n, k]); }"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=25088)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (1, args.k)).astype(np.float32)
    w = rng.uniform(-1, 1, (args.n, args.k)).astype(np.float32)
    exe = tilec.compile(GEMV, {"X": x.shape, "W": w.shape}, config=Config(device=args.device))
    arrays = {"X": x, "W": w}
    out = exe.run(arrays, poison=True)
    v = exe.check(exe._inputs(arrays), out)
    assert v.ok, v.worst
    times = []
    for _ in range(args.repeat):
        exe.run(arrays)
        times.append(sum(exe.last_timings.values()))
    t = statistics.median(times)
    w @ x[0]
    peer = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        w @ x[0]
        peer.append(time.perf_counter() - t0)
    tp = statistics.median(peer)
    k = exe.sources[-1]
    print(f"device: {exe.runtime.info.label}; kernel {k.name} tile {k.tile} global "
          f"{k.global_size} local {k.local_size}")
    print(f"gemv {args.n}x{args.k}: tilec {t * 1e3:.3f} ms ({w.nbytes / t * 1e-9:.1f} GB/s), "
          f"numpy {tp * 1e3:.3f} ms ({w.nbytes / tp * 1e-9:.1f} GB/s), tilec speed / numpy "
          f"{tp / t:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
