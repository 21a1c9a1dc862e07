"""`tilec.ops` names every graph op, whichever module defines it; a graph built through it
alone (a transformer block's pieces) runs against numpy with its outputs poisoned."""

from __future__ import annotations

import numpy as np

import tilec
from tilec.graph import ops_attention, ops_einsum, ops_index, ops_math, ops_norm, ops_rnn

from ..device import needs_device


def test_every_op_is_in_tilec_ops():
    for module in (ops_math, ops_index, ops_norm):
        for name in module.__all__:
            assert getattr(tilec.ops, name) is getattr(module, name), name
    assert tilec.ops.attention is ops_attention.attention
    assert tilec.ops.einsum is ops_einsum.einsum
    assert (tilec.ops.lstm, tilec.ops.gru, tilec.ops.rnn) == (ops_rnn.lstm, ops_rnn.gru,
                                                             ops_rnn.rnn)
    assert tilec.ops.conv2d and tilec.ops.softmax and tilec.ops.matmul


@needs_device
def test_a_block_through_tilec_ops():
    rng = np.random.default_rng(5)
    ops = tilec.ops
    g = tilec.Graph("block")
    x = g.input("x", (2, 3, 10, 16))
    gamma = g.constant(rng.uniform(0.5, 1.5, 16).astype(np.float32))
    h = ops.layer_norm(x, gamma)
    y = ops.attention(h, h, h, causal=True)
    g.output("y", ops.gelu(y))
    xa = rng.standard_normal((2, 3, 10, 16)).astype(np.float32)
    got = g.compile().run({"x": xa}, poison=True)["y"]
    m = xa.mean(-1, keepdims=True)
    hn = (xa - m) / np.sqrt(((xa - m) ** 2).mean(-1, keepdims=True) + 1e-5) * \
        g.constants[gamma.name]
    s = hn @ np.swapaxes(hn, -1, -2) / 4.0
    s = np.where(np.tril(np.ones((10, 10), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    a = (p / p.sum(-1, keepdims=True)) @ hn
    from math import erf
    want = a * 0.5 * (1 + np.vectorize(erf)(a / np.sqrt(2)))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
