"""The einsum graph op (`tilec.graph.ops_einsum`) against numpy.einsum on random inputs, run
with the outputs poisoned: transposes, diagonals, sums, batched and broadcast products, outer
products, 1 to 4 operands; a two-operand einsum is one contraction kernel; its errors."""

from __future__ import annotations

import numpy as np
import pytest

from tilec.errors import TileError
from tilec.graph import Graph
from tilec.graph import ops_einsum as E

from ..device import needs_device
from ..graph_refs import close, kinds, run

device = needs_device
RNG = np.random.default_rng(47)


def rand(*shape):
    """Random values away from zero, either sign."""
    v = RNG.uniform(0.25, 2.0, shape) * RNG.choice([-1, 1], shape)
    return np.asarray(v, np.float32)


EINSUMS = [
    ("ij,jk->ik", [(37, 53), (53, 29)]),
    ("ij,kj->ik", [(13, 9), (7, 9)]),          # a transposed operand
    ("ji,jk", [(5, 7), (5, 3)]),               # implicit output: ik
    ("bij,bjk->bik", [(3, 5, 7), (3, 7, 4)]),
    ("bij, bkj -> bki", [(2, 5, 7), (2, 3, 7)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 5), (4, 5, 6)]),  # broadcast batch dimensions
    ("ij,ij->ij", [(1, 9), (5, 9)]),           # a size-1 dimension broadcasts
    ("i,j->ij", [(7,), (11,)]),                # outer product
    ("i,i", [(13,), (13,)]),                   # inner product
    ("ij,ij", [(5, 7), (5, 7)]),               # all summed: a scalar
    ("bhqd,bhkd->bhqk", [(2, 3, 5, 8), (2, 3, 7, 8)]),  # attention scores
    ("ij->ji", [(3, 4)]),
    ("ij->i", [(5, 9)]),
    ("ii->i", [(6, 6)]),
    ("ii", [(6, 6)]),                           # trace
    ("...ii->...i", [(3, 5, 5)]),
    ("iij->j", [(4, 4, 3)]),
    ("Ab,bC->CA", [(3, 4), (4, 5)]),           # upper-case labels
    ("ii,ij->j", [(4, 4), (4, 3)]),            # a diagonal inside a product
    ("ij,jk,kl->il", [(3, 4), (4, 5), (5, 2)]),
    ("abc,cd,de,ea->b", [(2, 3, 4), (4, 5), (5, 6), (6, 2)]),
    ("i,j,k->ijk", [(2,), (3,), (4,)]),
    ("->", [()]),
    (",i->i", [(), (5,)]),
]


@device
@pytest.mark.parametrize("equation, shapes", EINSUMS, ids=[e for e, _ in EINSUMS])
@pytest.mark.parametrize("passes", [False, True])
def test_einsum(equation, shapes, passes):
    xs = [rand(*s) for s in shapes]
    g = Graph()
    vs = [g.input(f"x{k}", s) for k, s in enumerate(shapes)]
    g.output("y", E.einsum(equation, *vs))
    exe, outs = run(g, {f"x{k}": x for k, x in enumerate(xs)}, passes=passes)
    close(outs["y"], np.einsum(equation, *[x.astype(np.float64) for x in xs]))
    if len(shapes) == 2 and not passes:
        assert kinds(exe) == ["contraction"], exe.tile


@device
def test_einsum_integers_and_constants():
    a = RNG.integers(-5, 6, (4, 6)).astype(np.int32)
    b = RNG.integers(-5, 6, (6, 3)).astype(np.int32)
    g = Graph()
    g.output("y", E.einsum("ij,jk->ik", g.input("a", a.shape, "int32"), g.constant(b)))
    _, outs = run(g, {"a": a}, passes=True)
    np.testing.assert_array_equal(outs["y"], a @ b)


def test_einsum_tile_is_one_contraction():
    g = Graph()
    y = E.einsum("bij,bkj->bik", g.input("a", (2, 3, 4)), g.input("b", (2, 5, 4)))
    g.output("y", y)
    body = [ln for ln in g.to_tile().splitlines() if "=" in ln and not ln.strip().startswith("//")]
    assert len(body) == 1 and "+(" in body[0], g.to_tile()


def test_einsum_pair_order_keeps_intermediates_small():
    """A chain with a large outer product on one side is contracted the cheap way first."""
    g = Graph()
    a, b, c = g.input("a", (100, 2)), g.input("b", (2, 100)), g.input("c", (100, 3))
    y = E.einsum("ij,jk,kl->il", a, b, c)
    shapes = [n.shape for n in g.nodes if n.op == "einsum"]
    assert y.shape == (100, 3) and (2, 3) in shapes and (100, 100) not in shapes


def test_einsum_empty_operand_is_zeros():
    g = Graph()
    y = E.einsum("ij,jk->ik", g.input("a", (3, 0)), g.input("b", (0, 4)))
    assert g.is_constant(y.name) and not g.constants[y.name].any() and y.shape == (3, 4)


@pytest.mark.parametrize("equation, shapes, pattern", [
    ("ij,jk->ik", [(3, 4), (5, 6)], "label 'j' has size 4 and size 5"),
    ("ij,jk", [(3, 4)], "2 operand terms for 1 operands"),
    ("ijk->i", [(3, 4)], "names 3 dimensions"),
    ("ij->ik", [(3, 4)], "output label 'k' is not on any operand"),
    ("ij->ii", [(3, 3)], "repeats a label"),
    ("i1->i", [(3, 3)], "'1' is not a label"),
    ("...ij->ij", [(2, 3, 4)], "does not say where they go"),
    ("i->i->i", [(3,)], "more than one '->'"),
    ("......i->i", [(3,)], "'...' appears twice"),
])
def test_einsum_errors(equation, shapes, pattern):
    g = Graph()
    vs = [g.input(f"x{k}", s) for k, s in enumerate(shapes)]
    with pytest.raises(TileError, match=pattern):
        E.einsum(equation, *vs)


def test_einsum_type_errors():
    g = Graph()
    with pytest.raises(TileError, match="one numeric type"):
        E.einsum("i,i", g.input("a", (3,)), g.input("b", (3,), "int32"))
    with pytest.raises(TileError, match="one numeric type"):
        E.einsum("i->i", g.input("c", (3,), "bool"))
    with pytest.raises(TileError, match="no operands"):
        E.einsum("->")


# recurrent layers ---------------------------------------------------------------------------------

def sigmoid(x):
    return 1 / (1 + np.exp(-x))


NP_ACTS = {"Sigmoid": sigmoid, "Tanh": np.tanh, "Relu": lambda x: np.maximum(x, 0),
           "HardSigmoid": lambda x: np.clip(0.2 * x + 0.5, 0, 1),
           "Softsign": lambda x: x / (1 + np.abs(x))}


def np_recurrent(kind, x, w, r, b=None, h0=None, c0=None, p=None, direction="forward",
                 acts=None, lens=None, clip=None, lbr=False, input_forget=False):
    """The ONNX definitions, step by step in float64 (layout 0); returns Y, Y_h (, Y_c)."""
    t_len, batch, _ = x.shape
    nd, gh, _ = w.shape
    gates = {"rnn": 1, "gru": 3, "lstm": 4}[kind]
    hs = gh // gates
    per = {"rnn": 1, "gru": 2, "lstm": 3}[kind]
    acts = acts or {"rnn": ["Tanh"], "gru": ["Sigmoid", "Tanh"],
                    "lstm": ["Sigmoid", "Tanh", "Tanh"]}[kind] * nd
    lens = np.full(batch, t_len) if lens is None else np.asarray(lens)
    y = np.zeros((t_len, nd, batch, hs))
    yh, yc = np.zeros((nd, batch, hs)), np.zeros((nd, batch, hs))
    cl = (lambda v: np.clip(v, -clip, clip)) if clip else (lambda v: v)
    for d in range(nd):
        f, g, hfn = ([NP_ACTS[a] for a in acts[d * per:(d + 1) * per]] + [None, None])[:3]
        wd, rd = w[d].astype(np.float64), r[d].astype(np.float64)
        bd = np.zeros(2 * gh) if b is None else b[d].astype(np.float64)
        wb, rb = bd[:gh], bd[gh:]
        for n in range(batch):
            h = np.zeros(hs) if h0 is None else h0[d, n].astype(np.float64)
            c = np.zeros(hs) if c0 is None else c0[d, n].astype(np.float64)
            steps = range(lens[n])
            reverse = direction == "reverse" or d == 1
            for t in (reversed(steps) if reverse else steps):
                xw = wd @ x[t, n] + wb
                hr = rd @ h + rb
                if kind == "rnn":
                    h = f(cl(xw + hr))
                elif kind == "gru":
                    z = f(cl(xw[:hs] + hr[:hs]))
                    rg = f(cl(xw[hs:2 * hs] + hr[hs:2 * hs]))
                    if lbr:
                        hh = g(cl(xw[2 * hs:] + rg * hr[2 * hs:]))
                    else:
                        hh = g(cl(xw[2 * hs:] + rd[2 * hs:] @ (rg * h) + rb[2 * hs:]))
                    h = (1 - z) * hh + z * h
                else:
                    pre = xw + hr
                    pi, po, pf = (np.zeros(hs),) * 3 if p is None else np.split(p[d], 3)
                    i = f(cl(pre[:hs] + pi * c))
                    fg = 1 - i if input_forget else f(cl(pre[2 * hs:3 * hs] + pf * c))
                    c = fg * c + i * g(cl(pre[3 * hs:]))
                    o = f(cl(pre[hs:2 * hs] + po * c))
                    h = o * hfn(c)
                y[t, d, n] = h
            yh[d, n], yc[d, n] = (h, c) if lens[n] else (0, 0)
    return (y, yh, yc) if kind == "lstm" else (y, yh)


def recurrent_inputs(kind, t, batch, i, h, nd, **present):
    gates = {"rnn": 1, "gru": 3, "lstm": 4}[kind]
    arrays = {"x": rand(t, batch, i), "w": rand(nd, gates * h, i) * 0.5,
              "r": rand(nd, gates * h, h) * 0.5, "b": rand(nd, 2 * gates * h) * 0.5,
              "h0": rand(nd, batch, h), "c0": rand(nd, batch, h), "p": rand(nd, 3 * h) * 0.5}
    return {k: v for k, v in arrays.items() if present.get(k, True)}


def build(kind, arrays, layout=0, const_weights=True, lens=None, **kw):
    """The layer over graph inputs (x, states) and constants (weights) or inputs."""
    from tilec.graph import ops_rnn

    g = Graph()
    feed = {}

    def val(name):
        if name not in arrays:
            return None
        a = arrays[name]
        if name in ("x", "h0", "c0") and layout:
            a = np.swapaxes(a, 0, 1).copy()
        if const_weights and name in ("w", "r", "b", "p"):
            return g.constant(a)
        feed[name] = a
        return g.input(name, a.shape)

    seq = None if lens is None else g.input("lens", (len(lens),), "int32")
    if lens is not None:
        feed["lens"] = np.asarray(lens, np.int32)
    args = [val("x"), val("w"), val("r"), val("b"), seq, val("h0")]
    if kind == "lstm":
        args += [val("c0"), val("p")]
    fn = {"rnn": ops_rnn.rnn, "gru": ops_rnn.gru, "lstm": ops_rnn.lstm}[kind]
    outs = fn(*args, layout=layout, **kw)
    for name, v in zip(("y", "yh", "yc"), outs, strict=False):
        g.output(name, v)
    return g, feed


def check_recurrent(kind, arrays, want, layout=0, passes=True, **build_kw):
    g, feed = build(kind, arrays, layout, **build_kw)
    _, outs = run(g, feed, passes=passes)
    for name, w in zip(("y", "yh", "yc"), want, strict=False):
        if layout:
            w = np.transpose(w, (2, 0, 1, 3)) if w.ndim == 4 else np.swapaxes(w, 0, 1)
        close(outs[name], w, rtol=2e-4, atol=2e-5)


@device
@pytest.mark.parametrize("kind", ["rnn", "gru", "lstm"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_recurrent(kind, direction, layout):
    nd = 2 if direction == "bidirectional" else 1
    arrays = recurrent_inputs(kind, 5, 3, 7, 6, nd)
    want = np_recurrent(kind, *(arrays.get(k) for k in ("x", "w", "r", "b", "h0", "c0", "p")),
                        direction=direction)
    check_recurrent(kind, arrays, want, layout, direction=direction)


@device
@pytest.mark.parametrize("kind", ["rnn", "gru", "lstm"])
def test_recurrent_without_optional_inputs(kind):
    """No bias, no initial states (the first step has no recurrent product), weights as
    graph inputs, no passes."""
    arrays = recurrent_inputs(kind, 3, 2, 5, 9, 1, b=False, h0=False, c0=False, p=False)
    want = np_recurrent(kind, arrays["x"], arrays["w"], arrays["r"])
    check_recurrent(kind, arrays, want, passes=False, const_weights=False)


@device
@pytest.mark.parametrize("kind, kw", [
    ("gru", {"linear_before_reset": True}),
    ("lstm", {"input_forget": True}),
    ("lstm", {"clip": 0.4}),
    ("gru", {"clip": 0.4, "activations": ["HardSigmoid", "Softsign"]}),
    ("rnn", {"activations": ["Relu"]}),
    ("lstm", {"activations": ["Sigmoid", "Relu", "Softsign"]}),
])
def test_recurrent_attributes(kind, kw):
    arrays = recurrent_inputs(kind, 4, 3, 5, 7, 1)
    np_kw = {"lbr": kw.get("linear_before_reset", False),
             "input_forget": kw.get("input_forget", False), "clip": kw.get("clip"),
             "acts": kw.get("activations")}
    want = np_recurrent(kind, *(arrays.get(k) for k in ("x", "w", "r", "b", "h0", "c0", "p")),
                        **np_kw)
    check_recurrent(kind, arrays, want, **kw)


@device
@pytest.mark.parametrize("kind", ["gru", "lstm"])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_recurrent_sequence_lens(kind, direction):
    """Sequences ending early (one empty): Y is zero past each end, the reverse direction
    starts at each sequence's own end, an empty sequence's final states are zeros."""
    nd = 2 if direction == "bidirectional" else 1
    lens = [5, 2, 0, 4]
    arrays = recurrent_inputs(kind, 5, 4, 3, 6, nd)
    want = np_recurrent(kind, *(arrays.get(k) for k in ("x", "w", "r", "b", "h0", "c0", "p")),
                        direction=direction, lens=lens)
    check_recurrent(kind, arrays, want, lens=lens, direction=direction)


def test_activation_parameters():
    from tilec.graph.ops_rnn import Activation, activations

    got = activations("lstm", 1, ["LeakyRelu", "tanh", "ScaledTanh"], [0.3, 2.0], [0.5])
    assert got == ((Activation("LeakyRelu", 0.3), Activation("Tanh"),
                    Activation("ScaledTanh", 2.0, 0.5)),)
    assert activations("gru", 2, ["Tanh", "Relu", "Sigmoid", "Elu"])[1] == (
        Activation("Sigmoid"), Activation("Elu", 1.0))
    with pytest.raises(TileError, match="'Gelu' is not supported"):
        activations("rnn", 1, ["Gelu"])
    with pytest.raises(TileError, match="expected 3 per direction"):
        activations("lstm", 1, ["Tanh"])
    with pytest.raises(TileError, match="more values than the activations take"):
        activations("rnn", 1, ["Tanh"], [1.0])


@pytest.mark.parametrize("kind, change, pattern", [
    ("lstm", {"w": (1, 10, 5)}, r"W has shape \[1, 10, 5\], expected \[1, 16, 5\]"),
    ("gru", {"b": (1, 7)}, r"B is \[1, 7\] float32, expected \[1, 24\]"),
    ("rnn", {"h0": (2, 3, 4)}, r"initial state is \[2, 3, 4\]"),
])
def test_recurrent_shape_errors(kind, change, pattern):
    arrays = recurrent_inputs(kind, 3, 3, 5, 4, 1)
    arrays.update({k: rand(*s) for k, s in change.items()})
    with pytest.raises(TileError, match=pattern):
        build(kind, arrays)


def test_recurrent_argument_errors():
    arrays = recurrent_inputs("rnn", 3, 2, 5, 4, 1)
    with pytest.raises(TileError, match="direction 'sideways'"):
        build("rnn", arrays, direction="sideways")
    with pytest.raises(TileError, match="hidden_size 5 differs"):
        build("rnn", arrays, hidden_size=5)
    with pytest.raises(TileError, match="layout 2"):
        build("rnn", arrays, layout=2)
    with pytest.raises(TileError, match=r"sequence_lens \[4, 1\] must lie in 0..3"):
        from tilec.graph import ops_rnn

        g = Graph()
        ops_rnn.rnn(g.input("x", (3, 2, 5)), g.constant(arrays["w"]), g.constant(arrays["r"]),
                    sequence_lens=g.constant(np.array([4, 1], np.int32)))
