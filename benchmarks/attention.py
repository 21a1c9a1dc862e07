"""Attention, side by side in one run: tilec's attention kernel (`ops_attention.attention`, one
kernel, the scores never stored; `Config.attention_fusion` on, as GPUs have it by default),
tilec's separate kernels (attention fusion off, as CPUs have it by default: the scores go
through memory, the softmax is one row kernel), and the peer: torch's
`scaled_dot_product_attention` in fp32 with TF32 off on a GPU device torch sees, numpy
(matmul, softmax, matmul) on a CPU device.

    python benchmarks/attention.py [--device SPEC] [--batch 8] [--heads 12] [--seq 512]
                                   [--dim 64] [--repeat R] [--long 4096]

tilec's time is the median OpenCL event time of the kernels of one call; torch's the median
CUDA event time; numpy's the median wall time.  Every tilec result is checked against the numpy
reference (outputs poisoned) before it is timed.  `--long T` adds one causal run at sequence
length T with B=1 (tilec fused only: the separate kernels would store B*H*T*T scores), and
prints how many bytes of buffers it allocated next to what the scores alone would take."""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
from pathlib import Path

import numpy as np

import tilec
from tilec.config import Config
from tilec.graph.ops_attention import attention

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu import torch_timer  # noqa: E402
from harness import median_wall  # noqa: E402

BUDGET = 20.0


def build(shape_q, shape_kv, causal: bool):
    g = tilec.Graph("attention")
    q = g.input("q", shape_q)
    k = g.input("k", shape_kv)
    v = g.input("v", shape_kv)
    g.output("o", attention(q, k, v, causal=causal))
    return g


def np_attention(q, k, v, causal):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        t, n = s.shape[-2:]
        s = np.where(np.tril(np.ones((t, n), bool)), s, -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True))
    return (s / s.sum(-1, keepdims=True)) @ v


def tilec_time(g, arrays, config, repeat, check=True):
    exe = g.compile(config=config)
    out = exe.run(arrays, poison=True)
    if check:
        ref = np_attention(arrays["q"], arrays["k"], arrays["v"], "causal" in g.name)
        err = float(np.abs(out["o"] - ref).max())
        assert err < 1e-3, f"max error {err}"
    times = []
    for _ in range(repeat):
        exe.run(arrays)
        times.append(sum(exe.last_timings.values()))
    return statistics.median(times), len(exe.kernels), exe


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--long", type=int, default=0)
    ap.add_argument("--rows", type=int, help="query rows a work-group (Config.threads)")
    args = ap.parse_args()
    B, H, T, D = args.batch, args.heads, args.seq, args.dim
    rng = np.random.default_rng(0)
    arrays = {n: rng.standard_normal((B, H, T, D)).astype(np.float32) for n in "qkv"}
    fused = Config(device=args.device, threads=args.rows, attention_fusion=True)
    plain = Config(device=args.device, attention_fusion=False)
    probe = tilec.compile("function (X[N]) -> (Y) { Y = X + 1; }", {"X": (4,)}, config=fused)
    info = probe.runtime.info
    gpu = info.kind == "gpu"
    print(f"# {datetime.date.today()}  device: {info.label} ({info.platform_version})")
    from host import cpu_model

    print(f"# host CPU: {cpu_model()}; command: python "
          f"benchmarks/attention.py {' '.join(sys.argv[1:])}")
    peer = "torch SDPA fp32" if gpu else "numpy"
    print(f"| attention B={B} H={H} T={T} d={D} | tilec fused | kernels | tilec unfused | "
          f"kernels | {peer} | fused / {peer} (speed) | TFLOP/s (fused) |")
    print("|---|---|---|---|---|---|---|---|")
    for causal in (False, True):
        g = build((B, H, T, D), (B, H, T, D), causal)
        g.name = "attention causal" if causal else "attention"
        tf, kf, _ = tilec_time(g, arrays, fused, args.repeat)
        tp, kp, _ = tilec_time(g, arrays, plain, args.repeat)
        if gpu:
            import torch

            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            tq, tk, tv = (torch.from_numpy(arrays[n]).cuda() for n in "qkv")
            sdpa = torch.nn.functional.scaled_dot_product_attention
            tpeer, _ = torch_timer(lambda tq=tq, tk=tk, tv=tv, c=causal, f=sdpa: f(
                tq, tk, tv, is_causal=c), args.repeat, BUDGET)
        else:
            tpeer, _ = median_wall(lambda c=causal: np_attention(
                arrays["q"], arrays["k"], arrays["v"], c), args.repeat, BUDGET)
        flops = 4 * B * H * T * T * D / (2 if causal else 1)
        print(f"| {'causal' if causal else 'full'} | {tf * 1e3:.3f} ms | {kf} | "
              f"{tp * 1e3:.3f} ms | {kp} | {tpeer * 1e3:.3f} ms | {tpeer / tf:.2f} | "
              f"{flops / tf * 1e-12:.1f} |")
    if args.long:
        L = args.long
        big = {n: rng.standard_normal((1, H, L, D)).astype(np.float32) for n in "qkv"}
        g = build((1, H, L, D), (1, H, L, D), True)
        g.name = "attention causal"
        tl, kl, exe = tilec_time(g, big, fused, 3, check=L <= 4096)
        held = sum(a.size for a in big.values()) * 4 * 2  # inputs and the output, at most
        print(f"\ncausal B=1 H={H} T={L} d={D}: {tl * 1e3:.2f} ms in {kl} kernel(s); buffers "
              f"<= {held / 2**20:.0f} MiB, the scores alone would take "
              f"{H * L * L * 4 / 2**20:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
