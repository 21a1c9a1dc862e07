"""numpy's matmul in a process of its own, so that its OpenBLAS starts with the environment the
caller chose (OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are read once, when the library loads).

    python benchmarks/numpy_runner.py --data DIR [--repeat N]

DIR holds A.npy, B.npy and expected.npy.  Prints one line of JSON: the median of the timed
calls after a warm-up, whether the product matched, and threadpoolctl's view of the BLAS
(which OpenBLAS kernel, "architecture", it picked)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--budget", type=float, default=20.0)
    args = ap.parse_args()
    a = np.load(os.path.join(args.data, "A.npy"))
    b = np.load(os.path.join(args.data, "B.npy"))
    expected = np.load(os.path.join(args.data, "expected.npy"))
    out: dict = {"env": {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE",
                                                         "OPENBLAS_L2_SIZE")}}
    try:
        from threadpoolctl import threadpool_info

        out["blas"] = [{k: i.get(k) for k in ("internal_api", "version", "architecture",
                                              "num_threads")} for i in threadpool_info()]
    except ImportError:
        out["blas"] = "threadpoolctl not installed"
    t = time.perf_counter()
    c = a @ b
    warm = time.perf_counter() - t
    err = np.abs(c.astype(np.float64) - expected)
    scale = max(1.0, float(np.max(np.abs(expected))))
    out["ok"] = bool(np.all(err <= 1e-4 * scale + 1e-3 * np.abs(expected)))
    out["max_abs_err"] = float(err.max())
    n = 1 if warm > args.budget else max(3, min(args.repeat, int(args.budget / max(warm, 1e-9))))
    times = []
    for _ in range(n):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    out["median_s"] = statistics.median(times)
    out["times_s"] = times
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
