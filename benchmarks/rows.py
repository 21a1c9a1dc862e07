"""Row reductions, side by side in one run: softmax and layer normalisation as tilec's row-fused
kernel, as tilec's separate kernels (row fusion off), and the peers: numpy on a CPU device, torch
(CUDA, fp32) on a GPU device when torch sees one.

    python benchmarks/rows.py [--device SPEC] [--rows N] [--cols C] [--repeat R]

tilec's time is the median OpenCL event time of the kernels of one call; torch's the median CUDA
event time of `torch.softmax` / `torch.nn.functional.layer_norm`; numpy's the median wall time.
Every tilec result is checked against the numpy reference with poisoned outputs first."""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
from pathlib import Path

import numpy as np

import tilec
from tilec.config import Config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu import torch_timer  # noqa: E402
from harness import median_wall  # noqa: E402

BUDGET = 20.0  # seconds a peer's repeats may take

SOFTMAX = """function (X[R, C]) -> (Y) {
    M[r, 0 : R, 1] = >(X[r, c]);
    E = exp(X - M);
    S[r, 0 : R, 1] = +(E[r, c]);
    Y = E / S;
}"""

LAYERNORM = """function (X[R, C], G[C], B[C]) -> (Y) {
    S[r, 0 : R, 1] = +(X[r, c]);
    D = X - S / C;
    D2 = D * D;
    Q[r, 0 : R, 1] = +(D2[r, c]);
    Y = D / sqrt(Q / C + 0.00001) * G + B;
}"""


def np_softmax(x):
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def np_layernorm(x, g, b):
    m = x.mean(1, keepdims=True)
    d = x - m
    return d / np.sqrt((d * d).mean(1, keepdims=True) + 1e-5) * g + b


def tilec_time(text, arrays, config, repeat):
    exe = tilec.compile(text, {k: v.shape for k, v in arrays.items()}, config=config)
    out = exe.run(arrays, poison=True)
    v = exe.check(exe._inputs(arrays), out)
    assert v.ok, v.worst
    times = []
    for _ in range(repeat):
        exe.run(arrays)
        times.append(sum(exe.last_timings.values()))
    return statistics.median(times), len(exe.sources), exe


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device")
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--cols", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--threads", type=int, help="at most this many threads a row (GPU)")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    R, C = args.rows, args.cols
    x = rng.standard_normal((R, C)).astype(np.float32)
    g = rng.uniform(0.5, 1.5, C).astype(np.float32)
    b = rng.uniform(-0.5, 0.5, C).astype(np.float32)
    fused = Config(device=args.device, threads=args.threads)
    plain = Config(device=args.device, row_fusion=False)
    exe = tilec.compile(SOFTMAX, {"X": (R, C)}, config=fused)
    info = exe.runtime.info
    gpu = info.kind == "gpu"
    print(f"# {datetime.date.today()}  device: {info.label} ({info.platform_version})")
    from host import cpu_model

    print(f"# host CPU: {cpu_model()}; command: python benchmarks/rows.py "
          f"--rows {R} --cols {C}" + (f" --device {args.device}" if args.device else ""))
    peer = "torch CUDA" if gpu else "numpy"
    print(f"| op | size | tilec row-fused | kernels | tilec unfused | kernels | {peer} | "
          f"fused / {peer} (speed) | GB/s (fused, 2 passes of memory) |")
    print("|---|---|---|---|---|---|---|---|---|")
    cases = [("softmax", SOFTMAX, {"X": x}), ("layer norm", LAYERNORM, {"X": x, "G": g, "B": b})]
    for name, text, arrays in cases:
        tf, kf, _ = tilec_time(text, arrays, fused, args.repeat)
        tp, kp, _ = tilec_time(text, arrays, plain, args.repeat)
        if gpu:
            import torch

            tx = torch.from_numpy(x).cuda()
            tg, tb = torch.from_numpy(g).cuda(), torch.from_numpy(b).cuda()
            fn = ((lambda tx=tx: torch.softmax(tx, 1)) if name == "softmax" else
                  (lambda tx=tx, tg=tg, tb=tb: torch.nn.functional.layer_norm(
                      tx, (C,), tg, tb, 1e-5)))
            tpeer, _ = torch_timer(fn, args.repeat, BUDGET)
        else:
            fn = (lambda: np_softmax(x)) if name == "softmax" else (
                lambda: np_layernorm(x, g, b))
            tpeer, _ = median_wall(fn, args.repeat, BUDGET)
        gbs = 2 * x.nbytes / tf * 1e-9
        print(f"| {name} | {R}x{C} | {tf * 1e3:.3f} ms | {kf} | {tp * 1e3:.3f} ms | {kp} | "
              f"{tpeer * 1e3:.3f} ms | {tpeer / tf:.2f} | {gbs:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
