"""Recurrent layers at batch 1: tilec with chains of small kernels (one launch for a run of a
layer's steps, `plan.chain`), tilec with one launch a kernel, and onnxruntime's CPU provider,
interleaved in one process, wall time of one call (medians and minimums).

    python benchmarks/recurrent.py --device Portable [--ops LSTM,GRU] [--seq 32] [--hidden 128]

The models are built with onnx.helper (one recurrent node, random weights): the zoo's LSTM
(torch's nn.LSTM(64, 128) over 32 steps) without its final linear layer."""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time

import numpy as np


def model(op: str, seq: int, inputs: int, hidden: int, seed: int = 0):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((1, gates * hidden, inputs)) * 0.1).astype(np.float32)
    r = (rng.standard_normal((1, gates * hidden, hidden)) * 0.1).astype(np.float32)
    b = (rng.standard_normal((1, 2 * gates * hidden)) * 0.1).astype(np.float32)
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, ["X", "W", "R", "B"], outs, hidden_size=hidden)
    shape = {"Y": [seq, 1, 1, hidden], "Y_h": [1, 1, hidden], "Y_c": [1, 1, hidden]}
    graph = helper.make_graph(
        [node], op.lower(), [helper.make_tensor_value_info("X", TensorProto.FLOAT,
                                                           [seq, 1, inputs])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, shape[o]) for o in outs],
        [numpy_helper.from_array(a, n) for a, n in ((w, "W"), (r, "R"), (b, "B"))])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--ops", default="LSTM,GRU")
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--inputs", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    import onnxruntime as ort
    from host import cpu_model

    import tilec.onnx
    from tilec.config import Config

    print(f"# {datetime.date.today()}; python benchmarks/recurrent.py {' '.join(sys.argv[1:])}")
    print(f"# host CPU: {cpu_model()}; onnxruntime {ort.__version__}")
    print("| layer | tilec kernels (chains / one each) | tilec, chains | tilec, one launch a "
          "kernel | onnxruntime CPU | chains / one each (speed) | chains / onnxruntime "
          "(speed) | max error |")
    print("|---|---|---|---|---|---|---|---|")
    for op in args.ops.split(","):
        m = model(op, args.seq, args.inputs, args.hidden)
        x = np.random.default_rng(1).standard_normal((args.seq, 1, args.inputs)).astype(
            np.float32)
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        want = sess.run(None, {"X": x})
        exes = {c: tilec.onnx.load(m, config=Config(device=args.device, chains=c))
                for c in (True, False)}
        err = 0.0
        for exe in exes.values():
            got = exe.run({"X": x}, poison=True)
            err = max(err, max(float(np.abs(g - w).max() / np.abs(w).max())
                               for g, w in zip(got.values(), want, strict=False)))
        times: dict[str, list[float]] = {"chains": [], "one": [], "ort": []}
        calls = (("chains", exes[True].run), ("one", exes[False].run),
                 ("ort", lambda feed, s=sess: s.run(None, feed)))
        for _ in range(args.rounds):
            for key, call in calls:
                t = time.perf_counter()
                call({"X": x})
                times[key].append(time.perf_counter() - t)
        med = {k: statistics.median(v) for k, v in times.items()}
        low = {k: min(v) for k, v in times.items()}
        kern = f"{len(exes[True].kernels)} / {len(exes[False].kernels)}"
        print(f"| {op} T={args.seq} I={args.inputs} H={args.hidden} | {kern} | "
              f"{med['chains'] * 1e3:.3f} ms (min {low['chains'] * 1e3:.3f}) | "
              f"{med['one'] * 1e3:.3f} ms (min {low['one'] * 1e3:.3f}) | "
              f"{med['ort'] * 1e3:.3f} ms (min {low['ort'] * 1e3:.3f}) | "
              f"{med['one'] / med['chains']:.2f} | {med['ort'] / med['chains']:.2f} | "
              f"{err:.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
