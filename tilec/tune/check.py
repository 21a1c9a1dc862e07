"""A candidate kernel checked on its own: the numpy reference of what it writes, computed from
the values its inputs have on the device.

The bench first checks a program whole: every candidate runs in the program, and the program's
outputs are compared with the numpy reference from its random inputs.  A deep network with
random weights defeats that check: each layer multiplies the rounding of the layers before it
by about the square root of its fan-in, and after fifty layers float32 programs that differ
only in their summation order disagree everywhere (mobilenet_v2 through `tilec tune`: the
compile's own kernels 8% away from the reference, every candidate of every kernel "failed").
Where the compile's own program fails the whole check, each candidate is checked as loopy
checks a transformed kernel: the tensors its kernel writes against the reference of those
statements evaluated on the device's values of the tensors they read (`stepwise`), which the
kernels before it computed.  Rounding then crosses one kernel, as in a unit test."""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping

import numpy as np

from ..lang.ir import Program
from ..lang.reference import evaluate_op
from ..plan.fuse import KernelPlan
from ..plan.placement import storage_of


def tensor_values(plan: KernelPlan, name: str, roots: Mapping[str, np.ndarray]) -> np.ndarray:
    """Tensor `name`'s elements read out of its root buffer's contents (`roots`, each the
    root tensor's array): its own buffer, a slice of a concatenation's or the inside of a
    bordered one (`Storage`)."""
    p = plan.program
    st = storage_of(name, p.tensors, plan.storage)
    flat = np.ascontiguousarray(roots[st.root]).reshape(-1)
    shape = p.tensors[name].shape
    if not shape:
        return flat[st.offset].copy()
    view = np.lib.stride_tricks.as_strided(
        flat[st.offset:], shape, tuple(s * flat.itemsize for s in st.strides), writeable=False)
    return view.copy()


def stepwise(program: Program, inputs: Mapping[str, np.ndarray],
             device: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every statement's reference value, each computed from the device's values of the
    tensors it reads where the device holds them (`device`), else from this pass's own values
    (a kernel's fused intermediates)."""
    own: dict[str, np.ndarray] = {n: np.asarray(a) for n, a in inputs.items()}
    env = ChainMap(device, own)  # the device's values first
    for op in program.ops:
        own[op.output] = evaluate_op(op, program.tensors, env)
    return own
