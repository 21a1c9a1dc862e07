"""Run one Tile program through PlaidML 0.7.0 and print one line of JSON: the PlaidML peer.

    PLAIDML_EXPERIMENTAL=1 PLAIDML_DEVICE_IDS=llvm_cpu.0 /tmp/plaidml-venv/bin/python \\
        benchmarks/plaidml_runner.py --code prog.tile --data DIR --output R [--repeat N]

It runs under PlaidML's own Python (a venv of its own on the CPU machine, the wheel unpacked
on PYTHONPATH on the GPU host), so it imports neither tilec nor anything from benchmarks/.
DIR holds one NAME.npy per input and `expected.npy`, the numpy reference of the output.

PlaidML's low-level Tile API takes the same program text tilec compiles: `plaidml.Function`
parses it, an `Invoker` binds tensors to its inputs and outputs and PlaidML compiles it on the
first `invoke()`.  That first call (parse, compile and one run) is reported as compile time.
Invocations are asynchronous and the API has no wait but mapping the output, so a sample is
the wall time of one invocation and one map of the output.  On a GPU that map copies the output
to the host: `map_s` (a map with nothing pending) estimates that part, reported, not
subtracted.  Several invocations before one map do not measure one run: on NVIDIA OpenCL they
came out up to 20x faster per invocation than one at a time (PlaidML lets them overlap or
drops superseded ones), so each sample waits for its own invocation."""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
import traceback


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", required=True, help="file with the Tile program")
    ap.add_argument("--data", required=True, help="folder with NAME.npy inputs, expected.npy")
    ap.add_argument("--output", required=True, help="the program's output to time and check")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--budget", type=float, default=20.0,
                    help="fewer repeats when they would take longer than this (seconds)")
    ap.add_argument("--device", default="",
                    help="substring of the PlaidML device id (default: the only device)")
    ap.add_argument("--rtol", type=float, default=1e-3)
    ap.add_argument("--atol", type=float, default=1e-4)
    args = ap.parse_args()
    result: dict = {"ok": False}
    try:
        run(args, result)
    except Exception as e:  # noqa: BLE001 - any failure is the peer's figure: "n/a (why)"
        result["error"] = f"{type(e).__name__}: {e}".strip()[:400]
        result["traceback"] = traceback.format_exc()[-2000:]
    print(json.dumps(result), flush=True)
    return 0


def run(args: argparse.Namespace, result: dict) -> None:
    import numpy as np

    t0 = time.perf_counter()
    import plaidml

    result["import_s"] = time.perf_counter() - t0
    try:
        from importlib.metadata import version

        result["version"] = version("plaidml")
    except Exception:  # noqa: BLE001 - an unpacked wheel without metadata still runs
        result["version"] = "?"
    # PlaidML 0.7's grammar has no comments (tilec's does): drop them, keep the program.
    code = re.sub(r"//[^\n]*", "", open(args.code).read())
    names = [f[:-4] for f in os.listdir(args.data) if f.endswith(".npy") and f != "expected.npy"]
    arrays = {n: np.load(os.path.join(args.data, n + ".npy")) for n in names}
    expected = np.load(os.path.join(args.data, "expected.npy"))

    ctx = plaidml.Context()
    valid, _ = plaidml.devices(ctx, limit=None, return_all=True)
    ids = [d.id.decode() for d in valid]
    pick = [d for d in valid if args.device in d.id.decode()]
    if not pick:
        raise RuntimeError(f"no PlaidML device matches {args.device!r} (valid: {ids})")
    conf = pick[0]
    result["device"] = conf.id.decode()
    result["device_description"] = conf.description.decode()
    dev = plaidml.Device(ctx, conf)

    def tensor(shape):
        return plaidml.Tensor(dev, plaidml.Shape(ctx, plaidml.DType.FLOAT32, *shape))

    inputs = {}
    for name, a in arrays.items():
        t = tensor(a.shape)
        with t.mmap_discard(ctx) as view:
            view.copy_from_ndarray(np.ascontiguousarray(a, dtype=np.float32))
            view.writeback()
        inputs[name] = t
    # Compile time starts at the text: the uploads above are data movement, not compiling.
    t_first = time.perf_counter()
    func = plaidml.Function(code)
    invoker = plaidml.Invoker(ctx, func, inputs, {})
    out = plaidml.Tensor(dev, invoker.get_output_shape(args.output))
    invoker.set_output(args.output, out)
    setup_s = time.perf_counter() - t_first

    def sample() -> float:
        t = time.perf_counter()
        invoker.invoke()
        with out.mmap_current():
            pass
        return time.perf_counter() - t

    first = sample()
    result["first_call_s"] = setup_s + first
    got = out.as_ndarray(ctx).copy()
    err = np.abs(got.astype(np.float64) - expected)
    scale = max(1.0, float(np.max(np.abs(expected))))
    bad = ~(err <= args.atol * scale + args.rtol * np.abs(expected))
    result["max_abs_err"] = float(np.max(err)) if err.size else 0.0
    result["ok"] = not bool(bad.any())
    if not result["ok"]:
        result["error"] = (f"{int(bad.sum())} of {bad.size} elements disagree with numpy "
                           f"(max abs error {result['max_abs_err']:.3g})")
        return
    # The first call was the warm-up, unless it was quick: then one more, as for the others.
    # A run longer than the budget is timed once (llvm_cpu's 4096 matmul takes 90 s).
    warm = first if first > args.budget else sample()
    n = 1 if warm > args.budget else max(3, min(args.repeat, int(args.budget / max(warm, 1e-9))))
    times = [sample() for _ in range(n)]
    result["times_s"] = times
    result["median_s"] = statistics.median(times)
    result["compile_s"] = max(0.0, result["first_call_s"] - result["median_s"])
    maps = []
    for _ in range(3):
        t = time.perf_counter()
        with out.mmap_current():
            pass
        maps.append(time.perf_counter() - t)
    result["map_s"] = statistics.median(maps)


if __name__ == "__main__":
    sys.exit(main())
