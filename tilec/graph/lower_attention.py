"""The Tile text of the attention node (`ops_attention`): the chain `tilec.plan.attention`
recognises and runs as one kernel.

    S[b, i, j : B, Tq, Tk] = +(Q[b, i, d] * K[b, j, d]);
    X = S * 0.125;  X1 = X + Mask;  C = index(X1, 2) >= index(X1, 3);  X2 = C ? X1 : -1e39;
    M[b, i, 0 : B, Tq, 1] = >(X2[b, i, j]);  W = exp(X2 - M);
    Z[b, i, 0 : B, Tq, 1] = +(W[b, i, j]);  P = W / Z;
    O[b, i, e : B, Tq, E] = +(P[b, i, j] * V[b, j, e]);

-1e39 is past float32's range: Tile reads it as -inf (the masked scores' value)."""

from __future__ import annotations

from collections.abc import Callable

from .core import Node
from .emit import Emitter, lit


def _attention(em: Emitter, node: Node) -> None:
    q, k, v = node.inputs[:3]
    mask = node.inputs[3] if len(node.inputs) > 3 else None
    qs, ks, vs = em.shape(q), em.shape(k), em.shape(v)
    lead = [f"b{n}" for n in range(len(qs) - 2)]
    sizes = [str(n) for n in qs[:-2]]
    score = [*lead, "i", "j"]
    s_dims = ", ".join([*sizes, str(qs[-2]), str(ks[-2])])
    r_dims = ", ".join([*sizes, str(qs[-2]), "1"])
    o_dims = ", ".join([*sizes, str(qs[-2]), str(vs[-1])])
    rows = ", ".join([*lead, "i"])
    at = ", ".join(score)
    S, X, M, W, Z, P = (em.temp(f"{node.output}_{t}")
                        for t in ("scores", "scaled", "max", "exp", "sum", "probs"))
    em.stmt(f"{S}[{at} : {s_dims}] = +({em.ref(q)}[{rows}, d] * "
            f"{em.ref(k)}[{', '.join([*lead, 'j', 'd'])}]);")
    em.stmt(f"{X} = {S} * {lit(node.get('scale'), 'float32')};")  # type: ignore[arg-type]
    last = X
    if mask is not None:
        masked = em.temp(f"{node.output}_masked")
        if em.graph.type(mask).dtype == "bool":
            em.stmt(f"{masked} = {em.ref(mask)} ? {last} : -1e39;")
        else:
            em.stmt(f"{masked} = {last} + {em.ref(mask)};")
        last = masked
    if node.get("causal"):
        n = len(score)
        causal = em.temp(f"{node.output}_causal")
        em.stmt(f"{causal} = index({last}, {n - 2}) >= index({last}, {n - 1}) ? {last} "
                f": -1e39;")
        last = causal
    em.stmt(f"{M}[{rows}, 0 : {r_dims}] = >({last}[{at}]);")
    em.stmt(f"{W} = exp({last} - {M});")
    em.stmt(f"{Z}[{rows}, 0 : {r_dims}] = +({W}[{at}]);")
    em.stmt(f"{P} = {W} / {Z};")
    em.stmt(f"{em.define(node)}[{rows}, e : {o_dims}] = +({P}[{at}] * "
            f"{em.ref(v)}[{', '.join([*lead, 'j', 'e'])}]);")


ATTENTION_EMITTERS: dict[str, Callable[[Emitter, Node], None]] = {"attention": _attention}
