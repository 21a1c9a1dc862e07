"""Time tilec from Tile text to a first result, in a fresh process (run by run.py / gpu.py).

    XDG_CACHE_HOME=D/xdg POCL_CACHE_DIR=D/pocl python benchmarks/compile_probe.py FILE.tile \
        --cache-dir D

Prints one line of JSON: the import time of tilec, the time to open the device (platforms, the
build probe, a context), the time of `tilec.compile` (parse, check, tile search, codegen, the
driver's build) and of the first run (where PoCL generates the work-group code: its build
only goes to LLVM IR), with tilec's caches rooted at D.  The first run's output is checked
against the numpy reference afterwards; the fastest of three more runs tells what the first
one spent beyond running.  Run twice with the same D for the cold and the cached
figure."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--cache-dir", required=True)
    ap.add_argument("--device")
    ap.add_argument("--shape", action="append", default=[], metavar="NAME=AxB")
    args = ap.parse_args()
    t0 = time.perf_counter()
    sys.path.insert(0, str(ROOT))
    import numpy as np

    import tilec
    from tilec.config import Config
    from tilec.lang.reference import random_array
    from tilec.runtime.device import Runtime

    import_s = time.perf_counter() - t0
    shapes = {n: tuple(int(d) for d in s.split("x"))
              for n, s in (x.split("=", 1) for x in args.shape)} or None
    config = Config(device=args.device, cache_dir=Path(args.cache_dir),
                    use_tuning_records=False)
    t1 = time.perf_counter()
    Runtime.get(config.device)
    open_s = time.perf_counter() - t1
    t1 = time.perf_counter()
    exe = tilec.compile(Path(args.file).read_text(), shapes, config=config)
    compile_s = time.perf_counter() - t1
    rng = np.random.default_rng(0)
    arrays = {n: random_array(rng, exe.program.tensors[n].shape, exe.program.tensors[n].dtype)
              for n in exe.program.inputs}
    t1 = time.perf_counter()
    outs = exe.run(arrays, poison=True)
    first_run_s = time.perf_counter() - t1
    later = []
    for _ in range(3):
        t1 = time.perf_counter()
        exe.run(arrays)
        later.append(time.perf_counter() - t1)
    second_run_s = min(later)
    check = exe.check(arrays, outs)
    print(json.dumps({"import_s": import_s, "open_s": open_s, "compile_s": compile_s,
                      "first_run_s": first_run_s, "second_run_s": second_run_s,
                      "valid": bool(check.ok),
                      "kernels": len(exe.kernels)}), flush=True)
    return 0 if check.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
