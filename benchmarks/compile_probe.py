"""Time tilec from Tile text to a built kernel, in a fresh process (run by run.py / gpu.py).

    POCL_CACHE_DIR=D/pocl python benchmarks/compile_probe.py FILE.tile --cache-dir D

Prints one line of JSON: the import time of tilec and the time of `tilec.compile` (parse,
check, tile search, codegen, the driver's build), with tilec's caches rooted at D.  Run twice
with the same D for the cold and the cached figure."""

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
    import tilec
    from tilec.config import Config

    import_s = time.perf_counter() - t0
    shapes = {n: tuple(int(d) for d in s.split("x"))
              for n, s in (x.split("=", 1) for x in args.shape)} or None
    config = Config(device=args.device, cache_dir=Path(args.cache_dir),
                    use_tuning_records=False)
    t1 = time.perf_counter()
    exe = tilec.compile(Path(args.file).read_text(), shapes, config=config)
    compile_s = time.perf_counter() - t1
    print(json.dumps({"import_s": import_s, "compile_s": compile_s,
                      "kernels": len(exe.kernels)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
