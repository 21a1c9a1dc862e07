"""What one launch costs on a CPU OpenCL device as its thread pool grows: N launches of a
small kernel in an in-order queue and one wait, per launch, for several work-group counts,
each thread-pool size in a fresh process (PoCL reads `POCL_MAX_PTHREAD_COUNT` and
`POCL_CPU_MAX_CU_COUNT` once, when it starts).

    python benchmarks/launch_threads.py [--device TEXT] [--threads 16,8,4] [--groups 1,16,256,1024]
        [--mode inorder|wait|flush|ooo|noprof]

Modes: `inorder` (enqueue all, one wait), `wait` (wait for each launch), `flush` (a flush
after each), `ooo` (an out-of-order queue, each launch waiting for the one before),
`noprof` (a queue without profiling).  Prints per launch: the wall time and the kernel's own
event time (of one launch waited for alone)."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

SRC = """__kernel void k(__global float *a, __global const float *b) {
  size_t g = get_global_id(0); float s = b[g];
  for (int i = 0; i < 10; i++) s = s * 0.999f + 0.5f;
  a[g] = s; }"""
LAUNCHES = 100


def one(device: str, mode: str, groups: int) -> str:
    import pyopencl as cl

    dev = next(d for p in cl.get_platforms() for d in p.get_devices()
               if device.lower() in f"{p.name}: {d.name}".lower())
    ctx = cl.Context([dev])
    props = 0 if mode == "noprof" else cl.command_queue_properties.PROFILING_ENABLE
    if mode == "ooo":
        props |= cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
    q = cl.CommandQueue(ctx, properties=props)
    k = cl.Program(ctx, SRC).build().k
    a = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, groups * 4)
    b = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, groups * 4)
    k.set_args(a, b)
    walls = []
    for _ in range(7):
        q.finish()
        t0 = time.perf_counter()
        ev = None
        for _ in range(LAUNCHES):
            wait = [ev] if mode == "ooo" and ev is not None else None
            ev = cl.enqueue_nd_range_kernel(q, k, (groups,), (1,), wait_for=wait)
            if mode == "flush":
                q.flush()
            elif mode == "wait":
                ev.wait()
        q.finish()
        walls.append((time.perf_counter() - t0) / LAUNCHES * 1e6)
    events = []
    if mode != "noprof":
        for _ in range(20):
            ev = cl.enqueue_nd_range_kernel(q, k, (groups,), (1,))
            ev.wait()
            events.append((ev.profile.end - ev.profile.start) * 1e-3)
    event = f"{statistics.median(events):7.1f} us" if events else "      -"
    return (f"| {dev.max_compute_units} | {mode} | {groups} | "
            f"{statistics.median(walls):.1f} us | {event} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="Portable")
    ap.add_argument("--threads", default="", help="pool sizes (default: the device's own)")
    ap.add_argument("--groups", default="1,16,256,1024")
    ap.add_argument("--mode", default="inorder")
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # mode groups, in a child
    args = ap.parse_args()
    if args.one:
        print(one(args.device, args.one[0], int(args.one[1])), flush=True)
        return 0
    print(f"# {' '.join(sys.argv)}")
    print("| threads | mode | work-groups | wall a launch | event |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for threads in [t for t in args.threads.split(",") if t] or [None]:
        env = dict(os.environ)
        if threads:
            env["POCL_MAX_PTHREAD_COUNT"] = env["POCL_CPU_MAX_CU_COUNT"] = threads
        for mode in args.mode.split(","):
            for groups in args.groups.split(","):
                subprocess.run([sys.executable, __file__, "--device", args.device,
                                "--one", mode, groups], env=env, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
