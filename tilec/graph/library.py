"""`tilec.ops`: every graph op in one namespace.

The ops live in one module per family (`ops`: the core library, convolutions, products,
pooling, elementwise, layout; `ops_math`: math, comparisons, activations; `ops_index`:
gathers, slices, casts; `ops_norm`: normalisations; `ops_attention`; `ops_einsum`;
`ops_rnn`: recurrent layers).  Users should not need to know which: `tilec.ops.layer_norm`,
`tilec.ops.attention` and `tilec.ops.conv2d` are all here."""

from __future__ import annotations

from . import ops, ops_attention, ops_einsum, ops_index, ops_math, ops_norm, ops_rnn
from .ops import *  # noqa: F403
from .ops_attention import attention  # noqa: F401
from .ops_einsum import einsum  # noqa: F401
from .ops_index import *  # noqa: F403
from .ops_math import *  # noqa: F403
from .ops_norm import *  # noqa: F403
from .ops_rnn import gru, lstm, rnn  # noqa: F401

__all__ = sorted({*ops.__all__, *ops_math.__all__, *ops_index.__all__, *ops_norm.__all__,
                  "attention", "einsum", "gru", "lstm", "rnn"})
del ops_attention, ops_einsum, ops_rnn
