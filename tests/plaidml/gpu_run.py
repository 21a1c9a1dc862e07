"""The PlaidML corpus report (`tests.plaidml.report`) with every compiled case on one chosen
OpenCL device, e.g. the NVIDIA GPU of a remote machine.

    python -m tests.plaidml.gpu_run [--device SPEC] [report options: --no-compile, -k, --verbose]

`report.make_compiled_runner` calls `tilec.compile` without a device, and tilec reads no
environment variable for one (the library takes `Config.device` / `device=` only), so this
wraps `tilec.compile` to pass `device=SPEC` (a substring of "platform: device", as for
`tilec devices`).  It prints the OpenCL platforms and devices first, then the report, then which
device every compiled executable used and how many kernel launches ran on each device.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time


def list_devices() -> None:
    import pyopencl as cl

    print(f"pyopencl {cl.VERSION_TEXT}")
    for p in cl.get_platforms():
        print(f"platform {p.name.strip()!r} ({p.version.strip()})")
        try:
            devs = p.get_devices()
        except cl.Error as e:
            print(f"  (no devices: {e})")
            continue
        for d in devs:
            print(f"  device {d.name.strip()!r}: {cl.device_type.to_string(d.type)}, "
                  f"{d.version.strip()}, driver {d.driver_version.strip()}, "
                  f"{d.max_compute_units} CUs, max work-group {d.max_work_group_size}, "
                  f"local mem {d.local_mem_size // 1024} KiB, "
                  f"global mem {d.global_mem_size / 2**30:.1f} GiB")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="NVIDIA",
                    help='substring of "platform: device" (default: NVIDIA)')
    args, rest = ap.parse_known_args(argv)

    list_devices()

    import tilec
    from tilec.compiler import hw_model_for
    from tilec.config import Config
    from tilec.runtime.device import Runtime

    rt = Runtime.get(args.device)
    info = rt.info
    model = hw_model_for(None, Config(device=args.device), rt)
    print(f"\ntilec device for compiled runs: {info.label} ({info.version}, driver {info.driver}, "
          f"kind {info.kind}); probe vector limit {rt.vector_limit}, max work-group {rt.max_wg}; "
          f"hardware model {getattr(model, 'name', model)!r}\n")
    sys.stdout.flush()

    used: collections.Counter[str] = collections.Counter()  # executables per device
    launches: collections.Counter[str] = collections.Counter()  # kernel launches per device
    kernels: dict[str, set[str]] = collections.defaultdict(set)
    real_compile = tilec.compile

    def compile_on_device(*a, device=None, **kw):
        exe = real_compile(*a, device=args.device if device is None else device, **kw)
        runtime = getattr(exe, "runtime", None)
        used[runtime.info.label if runtime is not None else "(no runtime)"] += 1
        return exe

    real_launch = Runtime.launch

    def counting_launch(self, kernel, global_size, local_size, largs):
        ev = real_launch(self, kernel, global_size, local_size, largs)
        launches[self.info.label] += 1
        kernels[self.info.label].add(kernel.function_name)
        return ev

    tilec.compile = compile_on_device
    Runtime.launch = counting_launch
    from . import report

    t0 = time.perf_counter()
    try:
        rc = report.main(rest)
    finally:
        tilec.compile = real_compile
        Runtime.launch = real_launch
    print(f"\nwall time of the report: {time.perf_counter() - t0:.1f} s")
    print("compiled executables per device: "
          + (", ".join(f"{k}: {v}" for k, v in used.items()) or "none"))
    print("kernel launches per device: "
          + (", ".join(f"{k}: {v} launches of {len(kernels[k])} distinct kernel names"
                       for k, v in launches.items()) or "none"))
    others = [k for k in list(used) + list(launches) if k != info.label]
    if others:
        print(f"WARNING: some work ran on other devices than {info.label}: {sorted(set(others))}")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
