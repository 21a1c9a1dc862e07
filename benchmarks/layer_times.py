"""Per-kernel times of one ONNX model under tilec and per-node times under onnxruntime's CPU
provider, side by side in one process: the minimum and the median over many calls of each.

Minimums are what to compare on machines whose speed changes in phases (the shared 2-core
development machines run the same kernel 1.6x slower for seconds at a time): a kernel's
minimum is its time in the fast phase, and the totals are sums of those.

    python benchmarks/layer_times.py MODEL.onnx [--calls 60] [--top 20] [--threads N]

MODEL.npz beside the model (`benchmarks/zoo.py export` writes both) gives the input; without
it, a standard normal one of the model's shape."""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np


def _input(path: Path) -> np.ndarray:
    data = path.with_suffix(".npz")
    if data.exists():
        return np.load(data)["input"]
    import onnx

    dims = onnx.load(str(path), load_external_data=False).graph.input[0].type.tensor_type.shape.dim
    shape = [d.dim_value if d.dim_value > 0 else 1 for d in dims]  # symbolic sizes: 1
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def tilec_times(path: Path, calls: int, device: str | None) -> dict[str, list[float]]:
    import tilec.onnx
    from tilec.config import Config

    # A launch a kernel (phase launches would time a whole run of kernels as one).
    exe = tilec.onnx.load(str(path), config=Config(device=device, phase_launches=False,
                                                   cache_dir=Path(tempfile.mkdtemp())))
    feed = {exe.inputs[0]: _input(path)}
    exe.run(feed, poison=True)
    per: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(calls):
        exe.run(feed)
        for name, t in exe.last.last_timings.items():
            per[name].append(t * 1e3)
    return per


def ort_times(path: Path, calls: int, threads: int) -> dict[str, list[float]]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    if threads:
        so.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    feed = {inp.name: _input(path)}
    for _ in range(calls + 1):
        sess.run(None, feed)
    events = json.loads(Path(sess.end_profiling()).read_text())
    per: dict[str, list[float]] = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per[e["name"][:-len("_kernel_time")]].append(e["dur"] / 1e3)
    return {k: v[1:] for k, v in per.items()}  # the first call warms up


def _report(title: str, per: dict[str, list[float]], top: int) -> None:
    rows = sorted(((min(v), float(np.median(v)), k) for k, v in per.items() if v),
                  reverse=True)
    print(f"{title}: total of minimums {sum(r[0] for r in rows):.3f} ms, "
          f"of medians {sum(r[1] for r in rows):.3f} ms")
    for lo, med, name in rows[:top]:
        print(f"  {lo:8.3f} {med:8.3f}  {name}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--calls", type=int, default=60)
    ap.add_argument("--top", type=int, default=20, help="slowest kernels / nodes to list")
    ap.add_argument("--device", default=None, help="tilec's device (default: as tilec picks)")
    ap.add_argument("--threads", type=int, default=0,
                    help="onnxruntime's intra-op threads (default: its own, every core)")
    args = ap.parse_args(argv)
    print(f"# {args.model.name}: minimum and median ms over {args.calls} calls")
    _report("tilec", tilec_times(args.model, args.calls, args.device), args.top)
    _report("onnxruntime", ort_times(args.model, args.calls, args.threads), args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
