"""Recurrent layers for the graph frontend, as ONNX defines them: `rnn` (RNN), `gru` (GRU) and
`lstm` (LSTM), forward, reverse or bidirectional, unrolled over the sequence.

Shapes (layout 0; layout 1 swaps the first two axes of X, Y and the states):
X [T, B, I]; W [D, G*H, I]; R [D, G*H, H]; B [D, 2*G*H] (W's biases, then R's); initial
states [D, B, H]; LSTM peepholes P [D, 3*H]; outputs Y [T, D, B, H] and Y_h (Y_c) [D, B, H].
G is the number of gates: 1 (RNN), 3 (GRU: z, r, h), 4 (LSTM: i, o, f, c).

The input projection does not depend on the recurrence, so it is one matrix product per gate
for all the time steps, X [T*B, I] x W_g^T + biases.  Each step then adds the recurrent product
in the same kernel (a gemm whose bias operand is that step's rows of the projection:
H_{t-1} x R_g^T + P_g[t]), and the gate arithmetic is elementwise, fused by the passes.  With
no initial state the first step has no recurrent product at all.

`sequence_lens` (int32 [B]) may end sequences early: a step past a sequence's end leaves its
state unchanged and writes zeros to Y, which also makes the reverse direction start at each
sequence's own last element; Y_h and Y_c of an empty sequence are zeros (as onnxruntime).

Activations are ONNX's names (Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu,
ScaledTanh, HardSigmoid, Elu, Softsign, Softplus); `activation_alpha` / `activation_beta` are
consumed in order by the activations that take them, a missing one taking the default of the
ONNX operator of that name.  `clip` bounds the gates' inputs to their activations to
[-clip, clip] (not the cell state before LSTM's h, as onnxruntime does)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import TileError
from . import ops, ops_index, ops_math
from .core import Value

# lower-case name -> (ONNX name, default alpha, default beta); None: not taken
_ACTIVATIONS: dict[str, tuple[str, float | None, float | None]] = {
    "relu": ("Relu", None, None), "tanh": ("Tanh", None, None),
    "sigmoid": ("Sigmoid", None, None), "affine": ("Affine", 1.0, 0.0),
    "leakyrelu": ("LeakyRelu", 0.01, None), "thresholdedrelu": ("ThresholdedRelu", 1.0, None),
    "scaledtanh": ("ScaledTanh", 1.0, 1.0), "hardsigmoid": ("HardSigmoid", 0.2, 0.5),
    "elu": ("Elu", 1.0, None), "softsign": ("Softsign", None, None),
    "softplus": ("Softplus", None, None),
}
# Per kind: the gates, the activations per direction and their defaults.
_KINDS = {"rnn": (1, ("Tanh",)), "gru": (3, ("Sigmoid", "Tanh")),
          "lstm": (4, ("Sigmoid", "Tanh", "Tanh"))}


@dataclass(frozen=True)
class Activation:
    """One activation function with its parameters."""

    name: str
    alpha: float | None = None
    beta: float | None = None

    def __call__(self, x: Value) -> Value:
        a, b = self.alpha, self.beta
        n = self.name
        if n == "Relu":
            return ops.relu(x)
        if n == "Tanh":
            return ops.tanh(x)
        if n == "Sigmoid":
            return ops.sigmoid(x)
        if n == "Affine":
            return x * a + b
        if n == "LeakyRelu":
            return ops.leaky_relu(x, a)  # type: ignore[arg-type]
        if n == "ThresholdedRelu":
            return ops_math.where(ops_math.greater(x, a), x, 0.0)
        if n == "ScaledTanh":
            return ops.tanh(x * b) * a
        if n == "HardSigmoid":
            return ops_math.hard_sigmoid(x, a, b)  # type: ignore[arg-type]
        if n == "Elu":
            return ops_math.elu(x, a)  # type: ignore[arg-type]
        if n == "Softsign":
            return x / (ops_math.abs(x) + 1.0)
        return ops_math.softplus(x)


def activations(kind: str, directions: int, names: Sequence[str] | None = None,
                alphas: Sequence[float] | None = None, betas: Sequence[float] | None = None
                ) -> tuple[tuple[Activation, ...], ...]:
    """The activations of each direction, ONNX's attributes resolved (a bidirectional layer
    names both directions' activations)."""
    per = len(_KINDS[kind][1])
    names = list(names) if names else list(_KINDS[kind][1]) * directions
    if len(names) != per * directions:
        raise TileError(f"{kind}: activations has {len(names)} names; expected {per} per "
                        f"direction ({per * directions})")
    alpha, beta = list(alphas or ()), list(betas or ())
    out: list[Activation] = []
    for name in names:
        found = _ACTIVATIONS.get(str(name).lower())
        if found is None:
            raise TileError(f"{kind}: activations: {name!r} is not supported (supported: "
                            f"{', '.join(v[0] for v in _ACTIVATIONS.values())})")
        onnx_name, da, db = found
        a = (alpha.pop(0) if alpha else da) if da is not None else None
        b = (beta.pop(0) if beta else db) if db is not None else None
        out.append(Activation(onnx_name, a, b))
    if alpha or beta:
        raise TileError(f"{kind}: activation_alpha / activation_beta have more values than "
                        "the activations take")
    return tuple(tuple(out[d * per:(d + 1) * per]) for d in range(directions))


@dataclass(frozen=True)
class _Layer:
    """The checked operands and sizes of one recurrent layer."""

    kind: str
    x2: Value  # X as [T * B, I] (time-major whatever the layout)
    seq: int
    batch: int
    hidden: int
    directions: int
    gates: int


def _check(kind: str, x: Value, w: Value, r: Value, hidden_size: int | None,
           direction: str, layout: int) -> _Layer:
    if direction not in ("forward", "reverse", "bidirectional"):
        raise TileError(f"{kind}: direction {direction!r}, expected 'forward', 'reverse' or "
                        "'bidirectional'")
    if layout not in (0, 1):
        raise TileError(f"{kind}: layout {layout}, expected 0 or 1")
    if x.dtype not in ("float16", "float32"):
        raise TileError(f"{kind} needs floating-point inputs, not {x.dtype}")
    if x.ndim != 3 or w.ndim != 3 or r.ndim != 3:
        raise TileError(f"{kind}: X, W and R must be 3-D, got {list(x.shape)}, "
                        f"{list(w.shape)} and {list(r.shape)}")
    d = 2 if direction == "bidirectional" else 1
    gates = _KINDS[kind][0]
    h = r.shape[-1]
    if hidden_size is not None and int(hidden_size) != h:
        raise TileError(f"{kind}: hidden_size {hidden_size} differs from R's {h}")
    if layout == 1:
        x = ops.transpose(x, (1, 0, 2))
    t, b, i = x.shape
    if not t or not b:
        raise TileError(f"{kind}: X {list(x.shape)} has no steps or no sequences")
    for name, v, want in (("W", w, (d, gates * h, i)), ("R", r, (d, gates * h, h))):
        if v.shape != want:
            raise TileError(f"{kind}: {name} has shape {list(v.shape)}, expected {list(want)}")
        if v.dtype != x.dtype:
            raise TileError(f"{kind}: {name} is {v.dtype}, X is {x.dtype}")
    return _Layer(kind, ops.reshape(x, (t * b, i)), t, b, h, d, gates)


def _expect(layer: _Layer, name: str, v: Value | None, shape: tuple[int, ...]) -> None:
    if v is not None and (v.shape != shape or v.dtype != layer.x2.dtype):
        raise TileError(f"{layer.kind}: {name} is {list(v.shape)} {v.dtype}, expected "
                        f"{list(shape)} {layer.x2.dtype}")


def _block(v: Value, d: int, start: int, size: int) -> Value:
    """v[d, start:start + size] (the rest of the axes whole), without the first axis: a
    constant for a constant v."""
    g = v.graph
    if g.is_constant(v.name):
        return g.constant(g.constants[v.name][d, start:start + size])
    s = ops_index.strided_slice(v, [d, start], [d + 1, start + size], [1, 1], [0, 1])
    return ops.reshape(s, s.shape[1:])


def _state(layer: _Layer, v: Value | None, layout: int, d: int) -> Value | None:
    """Direction d's initial state [B, H] (None: zeros)."""
    if v is None:
        return None
    shape = (layer.batch, layer.directions, layer.hidden) if layout else \
        (layer.directions, layer.batch, layer.hidden)
    _expect(layer, "an initial state", v, shape)
    if layout:
        v = ops.transpose(v, (1, 0, 2))
    return _block(v, d, 0, layer.batch)


class _Steps:
    """Per-step views of the sequence: the projection rows of step t and the step masks."""

    def __init__(self, layer: _Layer, w: Value, r: Value, b: Value | None, d: int,
                 recurrent_bias: Sequence[int], sequence_lens: Value | None):
        self.layer, self.r, self.d = layer, r, d
        h = layer.hidden
        self.proj = []
        for k in range(layer.gates):
            bias = None
            if b is not None:
                bias = _block(b, d, k * h, h)
                if k not in recurrent_bias:  # R's bias too, unless it is added later
                    bias = bias + _block(b, d, (layer.gates + k) * h, h)
            self.proj.append(ops.gemm(layer.x2, _block(w, d, k * h, h), bias, trans_b=True))
        self.masks = _masks(layer, sequence_lens)
        self._r: dict[int, Value] = {}

    def recurrent(self, k: int) -> Value:
        """Gate k's block of R, made once for all the steps (a constant block per step would
        be one more buffer per step: 124 copies of R's blocks in a 32-step LSTM)."""
        if k not in self._r:
            hs = self.layer.hidden
            self._r[k] = _block(self.r, self.d, k * hs, hs)
        return self._r[k]

    def rows(self, k: int, t: int) -> Value:
        p = self.proj[k]
        if self.layer.seq == 1:
            return p
        bt = self.layer.batch
        return ops_index.strided_slice(p, [t * bt], [(t + 1) * bt], [1], [0])

    def pre(self, k: int, t: int, h: Value | None) -> Value:
        """Gate k's input at step t: h x R_k^T + the projection's rows, in one gemm; just
        the rows when h is zero (no initial state yet)."""
        if h is None:
            return self.rows(k, t)
        return ops.gemm(h, self.recurrent(k), self.rows(k, t), trans_b=True)


def _masks(layer: _Layer, lens: Value | None) -> list[Value] | None:
    """Per step, which sequences it is inside ([B, 1] bool); None when all run to the end."""
    if lens is None:
        return None
    g, t, b = lens.graph, layer.seq, layer.batch
    if lens.shape != (b,) or lens.dtype != "int32":
        raise TileError(f"{layer.kind}: sequence_lens is {list(lens.shape)} {lens.dtype}, "
                        f"expected [{b}] integers")
    if g.is_constant(lens.name):
        n = g.constants[lens.name]
        if (n < 0).any() or (n > t).any():
            raise TileError(f"{layer.kind}: sequence_lens {n.tolist()} must lie in 0..{t}")
        if (n == t).all():
            return None
        return [g.constant((step < n).reshape(b, 1)) for step in range(t)]
    col = ops.reshape(lens, (b, 1))
    return [ops_math.greater(col, step) for step in range(t)]


def _output(steps, t: int, new: Value, h: Value | None, out: dict[int, Value]) -> Value:
    """Step t's output into `out` (zero past a sequence's end) and the state after it."""
    mask = steps.masks[t] if steps.masks else None
    y = new if mask is None else ops_math.where(mask, new, 0.0)
    # Y's slice [1, 1, B, H] made here, beside its step rather than after the last: in a
    # chain (`plan.chain`) the copy then runs with its step, the step's output stays inside
    # the chain, and the steps repeat alike (`codegen.roll` writes them as one loop).
    out[t] = ops.reshape(y, (1, 1, *y.shape))
    return _advance(h, new, mask)


def _advance(state: Value | None, new: Value, mask: Value | None) -> Value:
    """The state after a step: `new` inside the sequence, the old state past its end."""
    if mask is None:
        return new
    if state is None:
        return ops_math.where(mask, new, 0.0)
    return ops_math.where(mask, new, state)


def _act(f: Activation, x: Value, clip: float | None) -> Value:
    return f(x if clip is None else ops.clip(x, -float(clip), float(clip)))


def _peephole(pre: Value, p: Value | None, cell: Value | None) -> Value:
    return pre if p is None or cell is None else pre + p * cell


def _sequence(ys: list[list[Value]], layout: int) -> Value:
    """Y [T, D, B, H] (layout 1: [B, T, D, H]) from each direction's steps in time order
    (each [1, 1, B, H], `_output`)."""
    y = ops.concat([ops.concat(steps, 0) for steps in ys], 1)
    return ops.transpose(y, (2, 0, 1, 3)) if layout else y


def _finals(layer: _Layer, finals: list[Value], layout: int, lens: Value | None) -> Value:
    """The final states [D, B, H] (layout 1: [B, D, H]); an empty sequence's are zeros."""
    b, h = layer.batch, layer.hidden
    if lens is not None:
        g = lens.graph
        if g.is_constant(lens.name):
            known = g.constants[lens.name]
            some = None if known.all() else g.constant((known > 0).reshape(b, 1))
        else:
            some = ops_math.greater(ops.reshape(lens, (b, 1)), 0)
        if some is not None:
            finals = [ops_math.where(some, f, 0.0) for f in finals]
    out = ops.concat([ops.reshape(f, (1, b, h)) for f in finals], 0)
    return ops.transpose(out, (1, 0, 2)) if layout else out


def _order(layer: _Layer, direction: str, d: int) -> range:
    reverse = direction == "reverse" or (direction == "bidirectional" and d == 1)
    return range(layer.seq - 1, -1, -1) if reverse else range(layer.seq)


def rnn(x: Value, w: Value, r: Value, b: Value | None = None,
        sequence_lens: Value | None = None, initial_h: Value | None = None, *,
        hidden_size: int | None = None, direction: str = "forward",
        activations: Sequence[str] | None = None,
        activation_alpha: Sequence[float] | None = None,
        activation_beta: Sequence[float] | None = None, clip: float | None = None,
        layout: int = 0) -> tuple[Value, Value]:
    """ONNX RNN: H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb); returns (Y, Y_h)."""
    layer = _check("rnn", x, w, r, hidden_size, direction, layout)
    acts = _activations_of(layer, activations, activation_alpha, activation_beta)
    _expect(layer, "B", b, (layer.directions, 2 * layer.hidden))
    ys, finals = [], []
    for d in range(layer.directions):
        steps = _Steps(layer, w, r, b, d, (), sequence_lens)
        (f,) = acts[d]
        h = _state(layer, initial_h, layout, d)
        out: dict[int, Value] = {}
        for t in _order(layer, direction, d):
            new = _act(f, steps.pre(0, t, h), clip)
            h = _output(steps, t, new, h, out)
        ys.append([out[t] for t in range(layer.seq)])
        finals.append(h)  # type: ignore[arg-type]
    return _sequence(ys, layout), _finals(layer, finals, layout, sequence_lens)


def gru(x: Value, w: Value, r: Value, b: Value | None = None,
        sequence_lens: Value | None = None, initial_h: Value | None = None, *,
        hidden_size: int | None = None, direction: str = "forward",
        activations: Sequence[str] | None = None,
        activation_alpha: Sequence[float] | None = None,
        activation_beta: Sequence[float] | None = None, clip: float | None = None,
        linear_before_reset: bool = False, layout: int = 0) -> tuple[Value, Value]:
    """ONNX GRU, gates z, r, h:
    z = f(X Wz^T + H Rz^T + Wbz + Rbz), r likewise,
    h = g(X Wh^T + (r * H) Rh^T + Rbh + Wbh), or with linear_before_reset
    h = g(X Wh^T + r * (H Rh^T + Rbh) + Wbh);  H_t = (1 - z) * h + z * H_{t-1}.
    Returns (Y, Y_h)."""
    layer = _check("gru", x, w, r, hidden_size, direction, layout)
    acts = _activations_of(layer, activations, activation_alpha, activation_beta)
    hs = layer.hidden
    _expect(layer, "B", b, (layer.directions, 6 * hs))
    ys, finals = [], []
    for d in range(layer.directions):
        lbr = bool(linear_before_reset)
        steps = _Steps(layer, w, r, b, d, (2,) if lbr else (), sequence_lens)
        f, g = acts[d]
        rbh = _block(b, d, 5 * hs, hs) if b is not None and lbr else None
        h = _state(layer, initial_h, layout, d)
        out: dict[int, Value] = {}
        for t in _order(layer, direction, d):
            z = _act(f, steps.pre(0, t, h), clip)
            rg = _act(f, steps.pre(1, t, h), clip)
            if h is None:  # a zero state: no recurrent product, z * H vanishes
                pre = steps.rows(2, t) if rbh is None else steps.rows(2, t) + rg * rbh
            elif lbr:
                lin = ops.gemm(h, steps.recurrent(2), rbh, trans_b=True)
                pre = steps.rows(2, t) + rg * lin
            else:
                pre = steps.pre(2, t, rg * h)
            hh = _act(g, pre, clip)
            new = (1.0 - z) * hh if h is None else (1.0 - z) * hh + z * h
            h = _output(steps, t, new, h, out)
        ys.append([out[t] for t in range(layer.seq)])
        finals.append(h)  # type: ignore[arg-type]
    return _sequence(ys, layout), _finals(layer, finals, layout, sequence_lens)


def lstm(x: Value, w: Value, r: Value, b: Value | None = None,
         sequence_lens: Value | None = None, initial_h: Value | None = None,
         initial_c: Value | None = None, p: Value | None = None, *,
         hidden_size: int | None = None, direction: str = "forward",
         activations: Sequence[str] | None = None,
         activation_alpha: Sequence[float] | None = None,
         activation_beta: Sequence[float] | None = None, clip: float | None = None,
         input_forget: bool = False, layout: int = 0) -> tuple[Value, Value, Value]:
    """ONNX LSTM, gates i, o, f, c (activations f, g, h):
    i = f(X Wi^T + H Ri^T + Pi * C_{t-1} + Wbi + Rbi); f likewise (or 1 - i with
    input_forget); c = g(X Wc^T + H Rc^T + Wbc + Rbc); C_t = f * C_{t-1} + i * c;
    o = f(X Wo^T + H Ro^T + Po * C_t + Wbo + Rbo); H_t = o * h(C_t).
    Returns (Y, Y_h, Y_c)."""
    layer = _check("lstm", x, w, r, hidden_size, direction, layout)
    acts = _activations_of(layer, activations, activation_alpha, activation_beta)
    hs = layer.hidden
    _expect(layer, "B", b, (layer.directions, 8 * hs))
    _expect(layer, "P", p, (layer.directions, 3 * hs))
    ys, finals, cells = [], [], []
    for d in range(layer.directions):
        steps = _Steps(layer, w, r, b, d, (), sequence_lens)
        f, g, hf = acts[d]
        pi, po, pf = ((_block(p, d, k * hs, hs) for k in range(3)) if p is not None
                      else (None, None, None))
        h = _state(layer, initial_h, layout, d)
        c = _state(layer, initial_c, layout, d)
        out: dict[int, Value] = {}
        for t in _order(layer, direction, d):
            i = _act(f, _peephole(steps.pre(0, t, h), pi, c), clip)
            fg = 1.0 - i if input_forget else _act(f, _peephole(steps.pre(2, t, h), pf, c),
                                                   clip)
            cc = _act(g, steps.pre(3, t, h), clip)
            cell = i * cc if c is None else fg * c + i * cc
            o = _act(f, _peephole(steps.pre(1, t, h), po, cell), clip)
            new = o * hf(cell)
            c = _advance(c, cell, steps.masks[t] if steps.masks else None)
            h = _output(steps, t, new, h, out)
        ys.append([out[t] for t in range(layer.seq)])
        finals.append(h)  # type: ignore[arg-type]
        cells.append(c)  # type: ignore[arg-type]
    return (_sequence(ys, layout), _finals(layer, finals, layout, sequence_lens),
            _finals(layer, cells, layout, sequence_lens))


def _activations_of(layer: _Layer, names: Sequence[str] | None,
                    alphas: Sequence[float] | None, betas: Sequence[float] | None
                    ) -> tuple[tuple[Activation, ...], ...]:
    return activations(layer.kind, layer.directions, names, alphas, betas)


__all__ = ["Activation", "activations", "gru", "lstm", "rnn"]
