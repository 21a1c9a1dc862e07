"""A candidate checked on its own (`tune.check`): where the compile's own program fails the
check of the whole program (rounding grown through a deep chain with random weights), each
candidate's writes are compared with the reference of its statements on the device's values."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tilec.config import Config
from tilec.lang.reference import evaluate_program
from tilec.tune import measure as tune_mod
from tilec.tune.check import stepwise, tensor_values
from tilec.tune.measure import Prepared, tune

from ..device import CPU, needs_device

WIDTH = 32


def _chain(layers: int) -> tuple[str, dict]:
    """Dense layers with ReLU6 between them, as mobilenet's blocks are: at 30 layers with
    random N(0, 1) weights the last one's rounding is past the check's tolerance."""
    args = ["X[B, N]"] + [f"W{i}[N, N]" for i in range(layers + 1)]
    body, prev = [], "X"
    for i in range(layers):
        body += [f"H{i}[b, n : B, N] = +({prev}[b, k] * W{i}[k, n]);",
                 f"C{i} = (H{i} > 0 ? H{i} : 0);", f"R{i} = (C{i} < 6 ? C{i} : 6);"]
        prev = f"R{i}"
    body.append(f"Y[b, n : B, N] = +({prev}[b, k] * W{layers}[k, n]);")
    shapes = {"X": (256, WIDTH), **{f"W{i}": (WIDTH, WIDTH) for i in range(layers + 1)}}
    return f"function ({', '.join(args)}) -> (Y) {{\n" + "\n".join(body) + "\n}", shapes


@needs_device
def test_a_deep_chain_checks_each_candidate_on_its_own(monkeypatch):
    src, shapes = _chain(30)
    config = Config(device=CPU)
    prep = Prepared(src, shapes, config=config, top_k=3)
    bench = prep.bench
    assert bench.whole and "expected" in bench.whole  # the compile's own program fails whole
    assert bench.step is not None
    # Every kernel of the compile's own program passes on its own.
    for s in bench.sources:
        assert bench.validate(s, bench.kernels[s.name]) == "", s.name
    # A middle layer's candidates: the correct ones pass, one that leaves outputs poisoned
    # does not.
    name = next(k.name for k in prep.plan.kernels if "R15" in k.writes)
    real = tune_mod.variant

    def broken(kernel, plan, hw, cfg, tile, threads, code=""):
        src = real(kernel, plan, hw, cfg, tile, threads, code)
        if kernel.name == name and tile == broken.victim:
            return replace(src, global_size=src.local_size)  # one work-group only
        return src

    first = tune(src, shapes, config=config, top_k=4, timer=lambda c: 1.0, save=False)
    k = next(t for t in first.kernels if t.kernel == name)
    assert all(m.status == "ok" for m in k.results), [m.note for m in k.results]
    # A tile of several work-groups: launched as one, it leaves outputs poisoned.
    victim = next(i for i, m in enumerate(k.results)
                  if m.candidate.source.global_size > (m.candidate.source.local_size or 1))
    broken.victim = tuple(t for _, t in k.results[victim].candidate.tile)
    monkeypatch.setattr(tune_mod, "variant", broken)
    report = tune(src, shapes, config=config, top_k=4, timer=lambda c: 1.0, save=False)
    k = next(t for t in report.kernels if t.kernel == name)
    assert k.results[victim].status == "failed"
    assert "checked on its own" in k.results[victim].note
    assert all(m.status == "ok" for i, m in enumerate(k.results) if i != victim)


@needs_device
def test_device_values_of_bordered_tensors_and_the_stepwise_reference():
    # conv -> ReLU -> padded conv: on a CPU the ReLU's output lives inside a bordered buffer.
    src = """function (D[N, X, Y, C], K1[I, J, C, F], K2[I, J, F, G]) -> (O2) {
      A[n, x, y, f : N, X, Y, F] = +(D[n, x + i - 1, y + j - 1, c] * K1[i, j, c, f]);
      R = (A > 0 ? A : 0);
      O2[n, x, y, g : N, X, Y, G] = +(R[n, x + i - 1, y + j - 1, f] * K2[i, j, f, g]);
    }"""
    shapes = {"D": (1, 9, 9, 8), "K1": (3, 3, 8, 16), "K2": (3, 3, 16, 8)}
    prep = Prepared(src, shapes, config=Config(device=CPU, halos=True))
    bench, plan = prep.bench, prep.plan
    assert not bench.whole and bench.step is None  # shallow: checked whole as before
    assert plan.storage, "expected a bordered buffer on a CPU device"
    bench._run(None, None)
    names = [n for k in plan.kernels for n in k.writes]
    roots = bench._roots(names)
    device = {n: tensor_values(plan, n, roots) for n in names}
    full = evaluate_program(replace(plan.program, outputs=tuple(names)), bench.inputs)
    step = stepwise(plan.program, bench.inputs, device)
    for n in names:
        scale = float(np.max(np.abs(full[n])))
        # The bordered tensor read out of its buffer is the reference's, its border left out.
        np.testing.assert_allclose(device[n], full[n], rtol=1e-4, atol=1e-5 * scale)
        np.testing.assert_allclose(step[n], full[n], rtol=1e-4, atol=1e-5 * scale)
