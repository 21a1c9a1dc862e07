"""Calls after an idle pause: phase launches and a launch a kernel (Config.phase_launches) of
one ONNX model in one process, in turn, 15 rounds of a pause, one call timed, then 5 calls
back to back (their fastest).  Prints the medians; POCL_AFFINITY as the environment has it
(tilec sets 1 where it is unset; 0 for PoCL's own placement).

    python benchmarks/sporadic.py DEVICE MODEL.onnx [PAUSE_S]

MODEL.npz beside the model (`zoo.py export`) gives the input."""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROUNDS = 15
HOT = 5


def main() -> int:
    import tilec.onnx
    from tilec.config import Config

    device, path = sys.argv[1], sys.argv[2]
    pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.2
    data = np.load(Path(path).with_suffix(".npz"))
    exes = {ph: tilec.onnx.load(path, config=Config(device=device, phase_launches=ph),
                                quiet=True) for ph in (False, True)}
    feed = {exes[True].inputs[0]: data["input"]}
    for exe in exes.values():
        for _ in range(HOT):
            exe.run(feed)
    first: dict[bool, list[float]] = {False: [], True: []}
    hot: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(ROUNDS):
        for ph, exe in exes.items():
            time.sleep(pause)
            t = time.perf_counter()
            exe.run(feed)
            first[ph].append(time.perf_counter() - t)
            times = []
            for _ in range(HOT):
                t = time.perf_counter()
                exe.run(feed)
                times.append(time.perf_counter() - t)
            hot[ph].append(min(times))

    def ms(values: list[float]) -> str:
        return f"{statistics.median(values) * 1e3:.3f}"

    print(f"{Path(path).stem}, pause {pause} s, POCL_AFFINITY="
          f"{os.environ.get('POCL_AFFINITY', 'unset')}: first call after the pause: a launch "
          f"a kernel {ms(first[False])} ms, phases {ms(first[True])} ms (max "
          f"{max(first[False]) * 1e3:.3f} / {max(first[True]) * 1e3:.3f}); back to back "
          f"{ms(hot[False])} / {ms(hot[True])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
