"""Model compile time, cold and warm: `tilec.onnx.load(model.onnx)` and the first run, each
round a fresh process.

    python benchmarks/model_compile.py [resnet18 resnet50 ...] [--rounds 3] [--device TEXT]
    python benchmarks/model_compile.py resnet50 --profile out.prof   # one cold load, profiled

The models are written by tests/models.py (torchvision's ResNets as torch.onnx.export writes
them, random weights), once, before timing.  Cold: every cache empty (tilec's cache directory,
the user cache directory's parser tables, templates and device probe, PoCL's kernel cache,
each a new folder).  `--device-known`: also cold, but with the device probe and calibration
that a first compile on the machine leaves (a model never compiled on a known device).
Warm: a new process over the folders the cold one filled.  Figures:
`load` (open the device: cold, its probe and calibration, which a compile runs in a thread
while it reads and checks the model; read the file, import, passes, lowering, tile search,
codegen, the driver's build),
`first run` (where PoCL generates the machine code of each kernel) and their sum; medians over
the rounds.  The first run's outputs are checked against onnxruntime when it is installed.
Prints a Markdown table with the machine, the PoCL version, the date and the command."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from child import last_json  # noqa: E402 - beside this script

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))


def probe(path: str, cache_dir: str, device: str | None, profile: str | None,
          workers: int | None = None, halos: bool | None = None) -> dict:
    """In this (fresh) process: load + first run, timed; the caches are the environment's."""
    t0 = time.perf_counter()
    import numpy as np

    import tilec
    import tilec.onnx
    from tilec.config import Config
    from tilec.runtime.device import Runtime

    import_s = time.perf_counter() - t0
    config = Config(device=device, cache_dir=Path(cache_dir), use_tuning_records=False,
                    halos=halos)
    if workers is not None:
        config = replace(config, build_workers=workers)
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    t = time.perf_counter()
    try:
        exe = tilec.onnx.load(path, config=config, quiet=True)
    except TypeError:  # a tilec without `quiet` (the figures before it)
        exe = tilec.onnx.load(path, config=config)
    load_s = time.perf_counter() - t
    x = np.random.default_rng(1).standard_normal(
        exe.last.graph.inputs["input"].shape).astype(np.float32)
    t = time.perf_counter()
    out = exe(input=x)["output"]
    first_s = time.perf_counter() - t
    if prof is not None:
        prof.disable()
        prof.dump_stats(profile)
    later = []
    for _ in range(2):
        t = time.perf_counter()
        exe(input=x)
        later.append(time.perf_counter() - t)
    valid = None
    try:
        import onnxruntime as ort

        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        ref = sess.run(None, {"input": x})[0]
        valid = bool(np.allclose(out, ref, rtol=1e-3, atol=1e-3 * max(1.0, np.abs(ref).max())))
    except ImportError:
        pass
    ge = exe.last
    rt = Runtime.get(config.device)
    return {"device": rt.info.name, "platform": rt.info.platform_version,
            "import_s": import_s, "load_s": load_s, "first_run_s": first_s,
            "run_s": min(later), "valid": valid, "kernels": len(ge.kernels),
            "distinct": len(set(getattr(ge.executable, "entries", {}).values()))
            or len(ge.kernels)}


def _env(folder: str) -> dict:
    return dict(os.environ, POCL_CACHE_DIR=f"{folder}/pocl", XDG_CACHE_HOME=f"{folder}/xdg",
                TILEC_CACHE_DIR=f"{folder}/tilec", CUDA_CACHE_PATH=f"{folder}/nv")


def one(path: Path, folder: str, device: str | None, workers: int | None = None,
        halos: bool | None = None) -> dict:
    cmd = [sys.executable, __file__, "--probe", str(path), "--cache-dir", f"{folder}/tilec",
           "--halos-as", str(halos).lower()]
    if device:
        cmd += ["--device", device]
    if workers is not None:
        cmd += ["--build-workers", str(workers)]
    t = time.perf_counter()
    r = last_json(cmd, f"{path.name}: the probe", env=_env(folder))
    wall = time.perf_counter() - t
    if r["valid"] is False:
        raise SystemExit(f"{path.name}: the first run disagrees with onnxruntime")
    r["process_s"] = wall
    return r


def machine() -> str:
    from host import cpu_model

    return f"{cpu_model() or 'unknown CPU'} ({os.cpu_count()} CPUs)"


def write_models(names: list[str], folder: Path) -> dict[str, Path]:
    from tests.models import resnet

    out = {}
    for name in names:
        path = folder / f"{name}.onnx"
        path.write_bytes(resnet(name, seed=0).SerializeToString())
        out[name] = path
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=["resnet18", "resnet50"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device")
    ap.add_argument("--build-workers", type=int,
                    help="Config.build_workers (0: build in process; default: automatic)")
    ap.add_argument("--profile", metavar="FILE.prof",
                    help="profile one cold load of the first model (cProfile) and stop")
    ap.add_argument("--halos", choices=("default", "off", "on", "both"), default="default",
                    help="Config.halos (default: the Config's, on for CPUs; both: each round "
                    "compiles with and without, in turn)")
    ap.add_argument("--halos-as", choices=("none", "true", "false"), default="none",
                    help=argparse.SUPPRESS)
    ap.add_argument("--device-known", action="store_true",
                    help="also time a cold load whose device tilec has probed and calibrated "
                    "before (its user cache's devices folder kept; every other cache empty)")
    ap.add_argument("--probe", help=argparse.SUPPRESS)
    ap.add_argument("--cache-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.probe:
        print(json.dumps(probe(args.probe, args.cache_dir, args.device, args.profile,
                               args.build_workers,
                               {"none": None, "true": True, "false": False}[args.halos_as])))
        return 0
    with tempfile.TemporaryDirectory(prefix="tilec-models-") as mdir:
        models = write_models(args.models, Path(mdir))
        if args.profile:
            with tempfile.TemporaryDirectory(prefix="tilec-modelcache-") as d:
                cmd = [sys.executable, __file__, "--probe", str(models[args.models[0]]),
                       "--cache-dir", f"{d}/tilec", "--profile", args.profile]
                if args.device:
                    cmd += ["--device", args.device]
                p = subprocess.run(cmd, env=_env(d), capture_output=True, text=True)
                print(p.stdout, p.stderr[-2000:])
            return p.returncode
        rows = []
        settings = {"default": (None,), "off": (False,), "on": (True,),
                    "both": (False, True)}[args.halos]
        for name, path in models.items():
            runs: dict[bool | None, tuple[list, list, list]] = {
                h: ([], [], []) for h in settings}
            for _ in range(args.rounds):
                for h in settings:
                    with tempfile.TemporaryDirectory(prefix="tilec-modelcache-") as d:
                        runs[h][0].append(one(path, d, args.device, args.build_workers, h))
                        runs[h][1].append(one(path, d, args.device, args.build_workers, h))
                        if args.device_known:
                            with tempfile.TemporaryDirectory(prefix="tilec-modelcache-") as e:
                                known = Path(e) / "xdg" / "tilec" / "devices"
                                shutil.copytree(Path(d) / "xdg" / "tilec" / "devices", known)
                                runs[h][2].append(one(path, e, args.device,
                                                      args.build_workers, h))
            for h in settings:
                label = {None: name, True: f"{name} (halos)", False: f"{name} (no halos)"}[h]
                rows.append((label, *runs[h]))
    first = rows[0][1][0]
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {machine()} (load average {load}), "
          f"{first['device']} on {first['platform']}, "
          f"`python benchmarks/model_compile.py {' '.join(sys.argv[1:])}` "
          f"(medians of {args.rounds} rounds)\n")
    print("| model | state | kernels | distinct kernels built | load s "
          "| first run s | load + first run s | whole process s | run s |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, cold, warm, known in rows:
        for state, runs in (("cold", cold), ("cold, device known", known), ("warm", warm)):
            if not runs:
                continue
            def med(key, runs=runs):
                return statistics.median(r[key] for r in runs)

            both = statistics.median(r["load_s"] + r["first_run_s"] for r in runs)
            print(f"| {name} | {state} | {runs[0]['kernels']} | {runs[0]['distinct']} | "
                  f"{med('load_s'):.2f} | {med('first_run_s'):.2f} | "
                  f"**{both:.2f}** | {med('process_s'):.2f} | {med('run_s'):.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
