"""What run.py (CPU) and gpu.py (GPU) share: timing, validation, the subprocess peers, tables.

A measurement is the median of repeated runs after one warm-up run; `budget` caps how long the
repeats of one measurement may take (big kernels get fewer repeats, never fewer than 3 unless
one run alone takes longer than the budget).
tilec's figure is the OpenCL event time of its kernels; a peer's is its own wall or event time
of the same operation on the same random inputs.  tilec's output is validated against the
numpy reference before anything is timed, and every peer's output against the same reference."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from suite import Case  # noqa: E402

from tilec.config import Config  # noqa: E402
from tilec.lang.reference import random_array  # noqa: E402
from tilec.runtime.validate import compare  # noqa: E402


def output_paths(args, suite: str, here: Path) -> tuple[Path, Path]:
    """Where a run writes its figures and roofline: `--json` / `--png` where given; a whole
    suite's run into `results-{suite}.json` beside the scripts (the committed figures); a run
    of part of it (`--only`, `--skip`) into the temporary folder, so that it does not replace
    the whole suite's figures with its few."""
    partial = bool(getattr(args, "only", None) or getattr(args, "skip", None))
    folder = Path(tempfile.gettempdir()) / "tilec-bench" if partial else here
    folder.mkdir(parents=True, exist_ok=True)
    js = Path(args.json) if args.json else folder / f"results-{suite}.json"
    png = Path(args.png) if args.png else folder / f"roofline-{suite}.png"
    return js, png


def scratch(prefix: str) -> str:
    """A temporary folder removed when the run ends (caches of kernels built for the run)."""
    d = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, d, ignore_errors=True)
    return d


def repeats_for(first_s: float, repeat: int, budget: float) -> int:
    """Timed runs after a warm-up that took `first_s`: as many as fit in `budget`, at most
    `repeat`, at least 3, or 1 when one run alone is longer than the budget (PlaidML's
    llvm_cpu takes a minute and a half for one 4096 matmul)."""
    if first_s > budget:
        return 1
    return max(3, min(repeat, int(budget / max(first_s, 1e-9))))


def median_wall(fn: Callable[[], object], repeat: int, budget: float,
                sync: Callable[[], None] = lambda: None) -> tuple[float, object]:
    """Median wall time of `fn()` (after `sync`) and the warm-up call's result."""
    t = time.perf_counter()
    out = fn()
    sync()
    first = time.perf_counter() - t
    times = []
    for _ in range(repeats_for(first, repeat, budget)):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


@dataclass
class Result:
    case: Case
    tilec_s: float | None = None  # event time, the figure every ratio uses
    tilec_wall_s: float | None = None  # launch + wait, per run
    tilec_compile_s: float | None = None
    tilec_runs: int = 0  # timed runs behind the median
    neighbours: float | None = None  # other processes' share of the CPUs meanwhile
    attempts: int = 1  # measurements taken, the quietest kept
    rounds: int = 1  # tilec and in-process peers timed in turn this many times (`alternate`)
    tile: str = ""
    error: str = ""  # why tilec has no figure
    # peer name -> {"s": seconds or None, "note": why not, ...}
    peers: dict[str, dict] = field(default_factory=dict)

    def as_json(self) -> dict:
        c = self.case
        return {"kernel": c.name, "op": c.op, "bound": c.bound, "flops": c.flops,
                "bytes": c.bytes, "intensity": c.intensity, "shapes": c.shapes,
                "tilec_s": self.tilec_s, "tilec_wall_s": self.tilec_wall_s,
                "tilec_compile_s": self.tilec_compile_s, "tilec_runs": self.tilec_runs,
                "tile": self.tile, "neighbours": self.neighbours,
                "attempts": self.attempts, "rounds": self.rounds,
                "error": self.error, "peers": self.peers}


def measure_tilec(case: Case, config: Config, repeat: int, budget: float):
    """Compile, validate on poisoned outputs, then time.  Returns (result, arrays, reference,
    executable); arrays and reference are None when tilec failed."""
    import tilec
    from tilec.lang.reference import evaluate_program

    res = Result(case)
    t0 = time.perf_counter()
    try:
        exe = tilec.compile(case.source, case.shapes, config=config)
    except tilec.TileError as e:
        res.error = f"compile failed: {e}"
        return res, None, None, None
    res.tilec_compile_s = time.perf_counter() - t0
    res.tile = "; ".join(" ".join(f"{n}={t}" for n, t in k.tile.items())
                         for k in exe.kernels if k.tile)
    rng = np.random.default_rng(0)
    arrays = {n: random_array(rng, exe.program.tensors[n].shape, exe.program.tensors[n].dtype)
              for n in exe.program.inputs}
    outs = exe.run(arrays, poison=True)
    ref = evaluate_program(exe.program, arrays)
    v = compare(ref, outs, exe.program, exe.config)
    if not v.ok:
        res.error = f"validation failed: {v.worst}"
        return res, None, None, None
    exe.run(arrays)  # warm-up
    n = repeats_for(sum(exe.last_timings.values()), repeat, budget)
    res.tilec_s, res.tilec_wall_s = tilec_times(exe, arrays, n)
    res.tilec_runs = n
    return res, arrays, ref[case.output], exe


def tilec_times(exe, arrays: dict, n: int) -> tuple[float, float | None]:
    """The kernels' median event time over `n` runs, and the wall time a run: (n runs - 1
    run) / (n - 1) cancels the upload and download that every exe.run call does once,
    leaving launch, kernel and wait (None for one run)."""
    t = time.perf_counter()
    exe.run(arrays, repeat=1)
    one = time.perf_counter() - t
    t = time.perf_counter()
    exe.run(arrays, repeat=n)
    many = time.perf_counter() - t
    event = sum(exe.last_timings.values())
    # The difference is noisy: where it comes out below the kernels' own time, report that.
    return event, (max((many - one) / (n - 1), event) if n > 1 else None)


def check_peer(ref: np.ndarray, got: np.ndarray, exe, name: str) -> str:
    """'' when a peer's output matches the reference (tilec's tolerances), else why not."""
    got = np.asarray(got)
    if got.shape != ref.shape:
        return f"output shape {list(got.shape)}, expected {list(ref.shape)}"
    v = compare({name: ref}, {name: got}, exe.program, exe.config)
    return "" if v.ok else f"wrong result: {v.worst}"


def run_peer(build, case: Case, arrays: dict, ref: np.ndarray, exe, repeat: int,
             budget: float, sync: Callable[[], None] = lambda: None,
             timer=None, keep: dict | None = None) -> dict | None:
    """Time an in-process peer (`suite.*_peer`); None when it has no version of this op.
    `keep` (a dict) receives the peer's call under "fn" when it ran and matched, for more
    rounds (`alternate`)."""
    try:
        built = build(case, arrays)
        if built is None:
            return None
        fn, back = built
        if timer is not None:
            secs, out = timer(fn, repeat, budget)
        else:
            secs, out = median_wall(fn, repeat, budget, sync)
        bad = check_peer(ref, back(out), exe, case.output)
    except Exception as e:  # noqa: BLE001 - a peer that cannot run is reported, not fatal
        return {"s": None, "note": f"{type(e).__name__}: {e}"[:200]}
    if not bad and keep is not None:
        keep["fn"] = fn
    return {"s": None, "note": bad} if bad else {"s": secs}


# A pause before each timing of a round: onnxruntime's worker threads spin for a while after a
# call, and would take the cores from whatever runs next.
SETTLE_S = 0.2


def alternate(res: Result, exe, arrays: dict, peers: dict[str, Callable[[], object]],
              rounds: int, repeat: int, budget: float) -> None:
    """`rounds - 1` more rounds of tilec and each in-process peer in turn, and each figure
    the median over all its rounds: a machine's slow and fast phases (seconds long on shared
    VMs) then fall on tilec and its peers alike, instead of on whichever ran during one."""
    if rounds <= 1 or res.tilec_s is None:
        return
    mine, walls = [res.tilec_s], [res.tilec_wall_s]
    theirs = {name: [res.peers[name]["s"]] for name in peers}
    for _ in range(rounds - 1):
        time.sleep(SETTLE_S)
        event, wall = tilec_times(exe, arrays, res.tilec_runs)
        mine.append(event)
        walls.append(wall)
        for name, fn in peers.items():
            time.sleep(SETTLE_S)
            theirs[name].append(median_wall(fn, repeat, budget)[0])
    res.tilec_s = statistics.median(mine)
    res.tilec_wall_s = statistics.median(walls) if None not in walls else None
    res.rounds = rounds
    for name, times in theirs.items():
        res.peers[name]["s"] = statistics.median(times)


def write_data(folder: Path, arrays: dict, ref: np.ndarray, source: str) -> None:
    for n, a in arrays.items():
        np.save(folder / f"{n}.npy", a)
    np.save(folder / "expected.npy", ref)
    (folder / "program.tile").write_text(source)


def run_json(cmd: list[str], env: dict, timeout: float) -> dict:
    """Run a runner script; its last stdout line is JSON.  Failures come back as a note."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:.0f} s"}
    except OSError as e:
        return {"ok": False, "error": str(e)}
    lines = p.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        return {"ok": False, "error": f"exit {p.returncode}: {' | '.join(tail)}"[:300]}


def plaidml_peer(python: str, env: dict, data: Path, case: Case, repeat: int, budget: float,
                 device: str = "", timeout: float = 1200) -> dict:
    cmd = [python, str(HERE / "plaidml_runner.py"), "--code", str(data / "program.tile"),
           "--data", str(data), "--output", case.output, "--repeat", str(repeat),
           "--budget", str(budget), "--device", device]
    r = run_json(cmd, env, timeout)
    if not r.get("ok"):
        return {"s": None, "note": r.get("error", "failed"),
                "first_call_s": r.get("first_call_s"), "device": r.get("device"),
                "version": r.get("version")}
    return {"s": r["median_s"], "first_call_s": r["first_call_s"],
            "compile_s": r["compile_s"], "map_s": r.get("map_s"), "device": r.get("device"),
            "version": r.get("version")}


def plaidml_env(extra: dict) -> dict:
    env = dict(os.environ)
    env.update(extra)
    env["PLAIDML_EXPERIMENTAL"] = "1"
    return env


def plaidml_first_calls(python: str, env: dict, case: Case,
                        device: str = "") -> Callable[[], dict]:
    """PlaidML's first call on `case`, in a fresh process each time it is called."""
    def run() -> dict:
        from tilec.lang.api import evaluate

        rng = np.random.default_rng(0)
        arrays = {n: random_array(rng, s, "float32") for n, s in case.shapes.items()}
        ref = evaluate(case.source, **arrays)[case.output]
        with tempfile.TemporaryDirectory(prefix="tilec-bench-") as d:
            write_data(Path(d), arrays, ref, case.source)
            t = time.perf_counter()
            r = plaidml_peer(python, env, Path(d), case, 3, 1.0, device)
            r["process_s"] = time.perf_counter() - t
        return r

    return run


def compile_figures(case: Case, env: dict, device: str | None,
                    plaidml: Callable[[], dict] | None = None) -> list[dict]:
    """tilec from text to built kernels, cold and then cached, each in a fresh process: the
    API (`tilec.compile` with Config(cache_dir)) and the CLI (`tilec compile`, cache from
    TILEC_CACHE_DIR).  The drivers' own build caches (PoCL's, NVIDIA's) move into the same
    empty folder: they are what serves the cached figure on drivers that cache builds, where
    tilec leaves its disk cache unused.  Then PlaidML's first call, in two fresh processes."""
    rows = []
    shapes = sum((["--shape", f"{n}={'x'.join(map(str, s))}"] for n, s in case.shapes.items()),
                 [])
    dev = ["--device", device] if device else []
    for how in ("api", "cli"):
        with tempfile.TemporaryDirectory(prefix=f"tilec-compile-{how}-") as d:
            prog = Path(d) / "program.tile"
            prog.write_text(case.source)
            cenv = dict(env, POCL_CACHE_DIR=f"{d}/pocl", CUDA_CACHE_PATH=f"{d}/nv",
                        TILEC_CACHE_DIR=d, XDG_CACHE_HOME=f"{d}/xdg")
            if how == "api":
                cmd = [sys.executable, str(HERE / "compile_probe.py"), str(prog),
                       "--cache-dir", d, *dev, *shapes]
            else:
                cmd = [sys.executable, "-m", "tilec.cli", "compile", str(prog), "-o",
                       f"{d}/out.cl", "--no-records", *dev, *shapes]
            for state in ("cold", "cached"):
                t = time.perf_counter()
                if how == "api":
                    r = run_json(cmd, cenv, 600)
                else:
                    p = subprocess.run(cmd, capture_output=True, text=True, env=cenv,
                                       timeout=600, cwd=ROOT)
                    r = {"error": (p.stderr.strip().splitlines() or ["failed"])[-1]
                         } if p.returncode else {}
                r["process_s"] = time.perf_counter() - t
                rows.append({"who": f"tilec ({how})", "state": state, **r})
    if plaidml is not None:
        for state in ("cold", "again"):
            rows.append({"who": "PlaidML", "state": state, **plaidml()})
    return rows


class Neighbours:
    """CPU time that other processes took while we measured: the load average counts our own
    threads too, so it cannot tell a quiet run from a shared one.  /proc/stat's busy time
    less this process's and its finished children's (os.times) is everyone else's."""

    def __init__(self) -> None:
        self.start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float] | None:
        try:
            fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        except OSError:
            return None
        ticks = os.sysconf("SC_CLK_TCK")
        user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in fields[:8])
        busy = (user + nice + system + irq + softirq) / ticks
        t = os.times()
        return busy, t.user + t.system + t.children_user + t.children_system, time.monotonic()

    def share(self) -> float | None:
        """Other processes' CPU seconds since start, as a fraction of all CPUs' time."""
        end = self._sample()
        if self.start is None or end is None:
            return None
        busy, mine, wall = (e - s for e, s in zip(end, self.start, strict=True))
        return max(0.0, busy - mine) / (wall * (os.cpu_count() or 1))


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


# ---- tables ----------------------------------------------------------------------------


OPS = ["matmul", "conv", "depthwise", "maxpool", "softmax"]


def _fmt(x: float) -> str:
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def rate(r: Result, secs: float | None, peaks: dict, flop_scale: float) -> str:
    """'figure (x% of peak)' in the unit the kernel is judged by."""
    if secs is None:
        return "n/a"
    c = r.case
    if c.bound == "compute":
        v = c.flops / secs / flop_scale
        return f"{_fmt(v)} ({c.flops / secs / peaks['flops']:.0%})"
    v = c.bytes / secs * 1e-9
    return f"{_fmt(v)} ({c.bytes / secs / peaks['bytes']:.0%})"


def tables(results: list[Result], peer_names: list[str], peaks: dict, flop_unit: str) -> str:
    flop_scale = {"GFLOP/s": 1e9, "TFLOP/s": 1e12}[flop_unit]
    # The suite's order, whatever order the run took (long kernels go last there).
    results = sorted(results, key=lambda r: (OPS.index(r.case.op), r.case.flops))
    out, notes = [], []
    for bound, unit in (("compute", flop_unit), ("memory", "GB/s")):
        rows = [r for r in results if r.case.bound == bound]
        if not rows:
            continue
        # tilec's own call (`run.BOUND`) is shown with the times, not as a peer.
        peers = [p for p in peer_names if any(p in r.peers for r in rows)
                 and not p.startswith("tilec")]
        peak = (f"peak {peaks['flops'] / flop_scale:.3g} {flop_unit}" if bound == "compute"
                else f"bandwidth {peaks['bytes'] * 1e-9:.0f} GB/s")
        out.append(f"{'Compute-bound' if bound == 'compute' else 'Memory-bound'} kernels, "
                   f"{unit} (% of {peak}); tilec / peer > 1 means tilec is faster:\n")
        head = ["kernel", "flop/B", "tilec", *peers, *(f"tilec / {p}" for p in peers)]
        out.append("| " + " | ".join(head) + " |")
        out.append("| --- | " + " | ".join("---:" for _ in head[1:]) + " |")
        for r in rows:
            cells = [r.case.name, f"{r.case.intensity:.1f}",
                     rate(r, r.tilec_s, peaks, flop_scale) if not r.error else "failed"]
            if r.error:
                notes.append(f"{r.case.name}, tilec: {r.error}")
            for p in peers:
                e = r.peers.get(p)
                cells.append("—" if e is None else rate(r, e.get("s"), peaks, flop_scale))
                if e is not None and e.get("s") is None:
                    notes.append(f"{r.case.name}, {p}: n/a ({e.get('note')})")
                elif e is not None and (e.get("map_s") or 0) > 0.05 * e["s"]:
                    notes.append(f"{r.case.name}, {p}: its {e['s'] * 1e3:.3g} ms include the "
                                 f"wait, a map of the output (alone {e['map_s'] * 1e3:.3g} ms)")
            for p in peers:
                e = r.peers.get(p)
                ok = e is not None and e.get("s") and r.tilec_s
                cells.append(f"{e['s'] / r.tilec_s:.2f}" if ok else "—")
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    out.append("Times (ms, medians) and tilec's choices:\n")
    noisy = any(r.neighbours is not None for r in results)
    head = ["kernel", "tilec (event)", "tilec (wall)", *peer_names, "tile",
            "tilec compile s", "PlaidML first call s", *(["others' CPU"] if noisy else [])]
    out.append("| " + " | ".join(head) + " |")
    out.append("| --- | " + " | ".join("---:" for _ in head[1:2 + len(peer_names) + 1])
               + " | --- | ---: | ---: |" + (" ---: |" if noisy else ""))
    for r in results:
        def ms(s):
            return f"{s * 1e3:.3f}" if s else ("n/a" if s is None else "—")
        cells = [r.case.name, ms(r.tilec_s), ms(r.tilec_wall_s)]
        for p in peer_names:
            e = r.peers.get(p)
            cells.append("—" if e is None else ms(e.get("s")))
        pl = r.peers.get("PlaidML") or {}
        cells += [r.tile or "—",
                  f"{r.tilec_compile_s:.2f}" if r.tilec_compile_s is not None else "—",
                  f"{pl['first_call_s']:.2f}" if pl.get("first_call_s") else "—"]
        if noisy:
            cells.append(f"{r.neighbours or 0:.0%}"
                         + (f" ({r.attempts} tries)" if r.attempts > 1 else ""))
        out.append("| " + " | ".join(cells) + " |")
    if notes:
        out.append("")
        out += [f"- {n}" for n in notes]
    return "\n".join(out)


def compile_table(rows: list[dict]) -> str:
    out = ["| compiler | process | open device s | text to built kernels s | first run s | "
           "text to first result s | whole process s |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]

    def f(x):
        return f"{x:.3f}" if x is not None else "—"

    for r in rows:
        err = r.get("error") or r.get("note")
        opened = built = first = None
        if r["who"] == "PlaidML":
            what = "first call (parse, compile, 1 run)"
            result = r.get("first_call_s")
            if result is not None and r.get("s"):
                left = result - r["s"]
                what += (f"; minus one run: {left:.3f}" if left > 0.1 * r["s"] else
                         f"; compile within one run's noise ({r['s']:.3f})")
        elif r["who"] == "tilec (api)":
            what = "`tilec.compile`, then a run"
            opened, built, first = r.get("open_s"), r.get("compile_s"), r.get("first_run_s")
            result = built + first if built is not None and first is not None else None
        else:
            what, result = "`tilec compile` (a process)", None
        fig = f(result) if result is not None else (f"n/a ({err})" if err else "—")
        out.append(f"| {r['who']} | {r['state']}: {what} | {f(opened)} | {f(built)} | "
                   f"{f(first)} | {fig} | {r['process_s']:.2f} |")
    return "\n".join(out)


def save_json(path: Path, meta: dict, results: list[Result], compile_rows: list[dict]) -> None:
    path.write_text(json.dumps({"meta": meta, "results": [r.as_json() for r in results],
                                "compile": compile_rows}, indent=1, default=str) + "\n")
