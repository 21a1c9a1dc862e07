"""A whole call on a CPU device, inputs and outputs in place against copies, beside
onnxruntime: the seed conv with its filter bound once (onnxruntime's initializer), an aligned
input (`tilec.aligned_empty`), the output read back each call.

    python benchmarks/call_io.py [--device TEXT] [--size 56] [--rounds 21]

Three callables in turn, each round a block of 10 calls after a 0.2 s pause (onnxruntime's
threads spin for a while after its calls), the order reversed every other round; each figure
is the median of the blocks' medians, each ratio the median of the rounds' ratios.  "in
place": Config.host_io (the default); "copies": Config.host_io=False.  Outputs are checked
against the numpy reference first.  Prints one Markdown row with the machine and command."""

from __future__ import annotations

import argparse
import datetime
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import suite  # noqa: E402
from host import cpu_model  # noqa: E402

BLOCK = 10
PAUSE_S = 0.2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--size", type=int, default=56, help="the image's height and width")
    ap.add_argument("--rounds", type=int, default=21)
    args = ap.parse_args()

    from tilec.config import Config
    from tilec.lang.api import evaluate
    from tilec.runtime.device import Runtime

    case = suite.conv(1, args.size, 64)
    rng = np.random.default_rng(0)
    arrays = {n: rng.uniform(-1, 1, s).astype(np.float32) for n, s in case.shapes.items()}
    ref = evaluate(case.source, **arrays)[case.output]
    fns = {"in place": suite.tilec_bound_peer(case, arrays, Config(device=args.device))[0],
           "copies": suite.tilec_bound_peer(case, arrays,
                                            Config(device=args.device, host_io=False))[0]}
    ort, back = suite.onnxruntime_peer(case, arrays)
    fns["onnxruntime"] = lambda: back(ort())
    for name, fn in fns.items():
        got = np.asarray(fn())
        if not np.allclose(got, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max())):
            print(f"{name}: wrong result", file=sys.stderr)
            return 1
    times: dict[str, list[float]] = {n: [] for n in fns}
    order = list(fns)
    for r in range(args.rounds):
        for name in (order if r % 2 else order[::-1]):
            time.sleep(PAUSE_S)
            fns[name]()
            block = []
            for _ in range(BLOCK):
                t = time.perf_counter()
                fns[name]()
                block.append(time.perf_counter() - t)
            times[name].append(statistics.median(block))
    med = {n: statistics.median(v) * 1e3 for n, v in times.items()}

    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))

    rt = Runtime.get(args.device)
    print(f"{datetime.date.today()}, {cpu_model()}, {rt.info.name} ({rt.info.platform_version}),"
          f" `python benchmarks/call_io.py {shlex.join(sys.argv[1:])}`\n")
    print("| size | in place ms | copies ms | onnxruntime ms | copies / in place | "
          "onnxruntime / in place |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    print(f"| {args.size}x{args.size} | {med['in place']:.3f} | {med['copies']:.3f} | "
          f"{med['onnxruntime']:.3f} | {ratio('copies', 'in place'):.2f} | "
          f"{ratio('onnxruntime', 'in place'):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
