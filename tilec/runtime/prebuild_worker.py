"""A build worker: one process that fills the OpenCL driver's own kernel cache (PoCL's) for
the process that started it (`prebuild.BuildWorkers`).

Run as a script, not imported: it needs pyopencl and numpy only, so that it starts in a
fraction of a second (tilec's planner is imported at the first search request).
`python prebuild_worker.py PLATFORM DEVICE [warm]` opens that device (with `warm`, building a
tiny program in a thread meanwhile, where a core is free for it) and answers one JSON line
per request line on stdin:

    {"op": "texts", "file": PATH}     first: a JSON file of the programs' sources ("texts")
                                      and the build options ("options")
    {"op": "build", "id": N, "part": P}                     build program P
    {"op": "launch", "id": N, "part": P, "entry": NAME, "global": [..], "local": [..] or
     null, "args": [nbytes, ..]}
        launch kernel NAME of program P once over zero-filled buffers of the given sizes
        (the parent sends one work-group where the size is fixed: PoCL generates a kernel's
        machine code for each work-group size at its first launch, and keeps it in its cache)
    {"op": "search", "id": N, "file": PATH, "index": I}
        run tile search I of the pickled list of `plan.search.search` arguments in PATH,
        which keeps its outcome in the search cache the arguments name (`search_ahead`)

each answered with {"id": N, "ok": true} or {"id": N, "ok": false, "error": "..."}.  It
exits at the end of its input, or after `IDLE_S` seconds without a request."""

from __future__ import annotations

import json
import pickle
import select
import sys
import threading

IDLE_S = 120.0


def _serve(platform: int, device_index: int, warm: bool = False) -> None:
    import numpy as np
    import pyopencl as cl

    device = cl.get_platforms()[platform].get_devices()[device_index]
    ctx = cl.Context([device])
    queue = cl.CommandQueue(ctx)
    warming = None
    if warm:
        # A process's first build loads the driver's kernel library (0.5 s on PoCL 3.1, about
        # a second with eight workers starting at once on PoCL 5.0): done in a thread, on a
        # core the parent leaves free, while this one answers the searches that come first.
        warming = threading.Thread(target=lambda: cl.Program(
            ctx, "__kernel void tilec_warm(__global float* a) { a[0] = 1.0f; }").build(),
            daemon=True)
        warming.start()
    texts: list[str] = []
    options: list[str] = []
    programs: dict[int, object] = {}
    buffers: dict[tuple[int, int], object] = {}
    searches: dict[str, list] = {}

    def search(path: str, index: int) -> None:
        from tilec.plan.search import search as run_search

        if path not in searches:
            with open(path, "rb") as f:
                searches[path] = pickle.load(f)
        run_search(**searches[path][index])

    def program(part: int):
        if warming is not None:
            warming.join()  # the library it loads is the build's
        if part not in programs:
            # The same call as the parent's build (pyopencl adds the same include option), so
            # that the driver's cache key is the same.
            programs[part] = cl.Program(ctx, texts[part]).build(options=options,
                                                                 cache_dir=False)
        return programs[part]

    def buffer(position: int, nbytes: int):
        # Zeros, not garbage: an index read from a buffer stays in range.
        key = (position, max(nbytes, 4))
        if key not in buffers:
            buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, key[1])
            cl.enqueue_fill_buffer(queue, buf, np.uint8(0), 0, key[1])
            buffers[key] = buf
        return buffers[key]

    while True:
        ready, _, _ = select.select([sys.stdin], [], [], IDLE_S)
        if not ready:
            return
        line = sys.stdin.readline()
        if not line:
            return
        msg = json.loads(line)
        reply: dict = {"id": msg.get("id"), "ok": True}
        try:
            if msg["op"] == "texts":
                with open(msg["file"]) as f:
                    given = json.load(f)
                texts, options = list(given["texts"]), list(given["options"])
            elif msg["op"] == "build":
                program(msg["part"])
            elif msg["op"] == "launch":
                kernel = cl.Kernel(program(msg["part"]), msg["entry"])
                kernel.set_args(*[buffer(i, n) for i, n in enumerate(msg["args"])])
                local = None if msg["local"] is None else tuple(msg["local"])
                cl.enqueue_nd_range_kernel(queue, kernel, tuple(msg["global"]), local)
                queue.finish()
            elif msg["op"] == "search":
                search(msg["file"], msg["index"])
            else:
                raise ValueError(f"unknown request {msg['op']!r}")
        except Exception as e:  # noqa: BLE001 - every failure is reported, the parent decides
            reply = {"id": msg.get("id"), "ok": False, "error": f"{type(e).__name__}: {e}"[:300]}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:] == ["warm"])
