"""Per-kernel times of one ONNX model with `Config.halos` off, on, and off again: three
executables in one process, their kernels launched in turn (ROUNDS rounds, default 20), the
minimum event time of each kernel.  The third column shows how far the order moves the first.

    python benchmarks/halo_ab.py model.onnx [--device Portable] [--rounds 20] [--top 14]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    import onnx

    import tilec.onnx
    from tilec.config import Config

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--device", default="Portable")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--top", type=int, default=14)
    args = ap.parse_args()
    m = onnx.load(args.model)
    shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    exes = []
    for name, halos in (("off", False), ("on", True), ("off again", False)):
        exe = tilec.onnx.load(args.model, config=Config(
            device=args.device, halos=halos, cache_dir=Path(tempfile.mkdtemp())), quiet=True)
        exe.run({exe.inputs[0]: x})
        exes.append((name, exe.last.executable))
    times: list[dict[str, list[float]]] = [{} for _ in exes]
    for _ in range(args.rounds):
        for i, (_, ex) in enumerate(exes):
            kernels = [k for k in ex.kernels if k.name not in set(ex.hoisted)]
            for k, v in ex._launch(kernels, 1).items():
                times[i].setdefault(k, []).append(v)
    print("halos:", " / ".join(n for n, _ in exes))
    print("total of minimums, ms:", " / ".join(
        f"{sum(min(v) for v in t.values()) * 1e3:.3f}" for t in times))
    for k in sorted(times[0], key=lambda k: -min(times[0][k]))[:args.top]:
        print(f"{k[-70:]:70s}", " ".join(f"{min(t.get(k, [0])) * 1e3:.3f}" for t in times))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
