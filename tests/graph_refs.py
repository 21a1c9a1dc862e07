"""Plain numpy versions of the graph ops, written independently of tilec's Tile lowering, and
the helper that runs a graph on the CPU device with its outputs poisoned."""

from __future__ import annotations

import itertools

import numpy as np


def run(graph, arrays, *, passes=False, **kw):
    """Compile, run with every written buffer poisoned first, return (executable, outputs)."""
    exe = graph.compile(passes=passes, **kw)
    outs = exe.run(arrays, poison=True)
    for k, v in outs.items():
        assert not (v.dtype.kind == "f" and np.isnan(v).any()), f"{k} kept poison"
    return exe, outs


def kinds(exe):
    """The kinds of an executable's kernels in launch order, each kernel of a phase launch
    (`codegen.phases`: a run of a call's kernels as one launch on PoCL's CPU driver) by its
    own kind."""
    inner = exe
    while not hasattr(inner, "sources"):
        inner = inner.executable if hasattr(inner, "executable") else inner._require()
    return [m.kind for s in inner.sources for m in (s.members if s.kind == "phases" else (s,))]


def close(got, want, rtol=1e-4, atol=1e-5):
    want = np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * max(1.0, np.abs(want).max()))


def conv_nchw(x, w, b=None, stride=(1, 1), pads=(0, 0, 0, 0), dil=(1, 1), groups=1):
    """Direct convolution: pads are (top, left, bottom, right)."""
    n, c, h, wd = x.shape
    co, cig, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    oh = (h + pads[0] + pads[2] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + pads[1] + pads[3] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, co, oh, ow))
    cog = co // groups
    for g in range(groups):
        xs = xp[:, g * cig:(g + 1) * cig]
        for i, j in itertools.product(range(kh), range(kw)):
            patch = xs[:, :, i * dil[0]:i * dil[0] + stride[0] * (oh - 1) + 1:stride[0],
                       j * dil[1]:j * dil[1] + stride[1] * (ow - 1) + 1:stride[1]]
            out[:, g * cog:(g + 1) * cog] += np.einsum("nchw,oc->nohw", patch,
                                                       w[g * cog:(g + 1) * cog, :, i, j])
    if b is not None:
        out += b[None, :, None, None]
    return out


def pool_nchw(x, kind, k, s, pads=(0, 0, 0, 0), ceil=False, include_pad=False):
    """2-D max / average pooling; pads (top, left, bottom, right)."""
    n, c, h, w = x.shape

    def size(i, pb, pe, kk, ss):
        span = i + pb + pe - kk
        out = -(-span // ss) + 1 if ceil else span // ss + 1
        if ceil and (out - 1) * ss >= i + pb:
            out -= 1
        return out

    oh, ow = size(h, pads[0], pads[2], k[0], s[0]), size(w, pads[1], pads[3], k[1], s[1])
    out = np.zeros((n, c, oh, ow))
    for y, z in itertools.product(range(oh), range(ow)):
        y0, z0 = y * s[0] - pads[0], z * s[1] - pads[1]
        ys = [t for t in range(y0, y0 + k[0]) if 0 <= t < h]
        zs = [t for t in range(z0, z0 + k[1]) if 0 <= t < w]
        win = x[:, :, ys][:, :, :, zs]
        if kind == "max":
            out[:, :, y, z] = win.max(axis=(2, 3))
        else:
            if include_pad:
                cy = len([t for t in range(y0, y0 + k[0]) if -pads[0] <= t < h + pads[2]])
                cz = len([t for t in range(z0, z0 + k[1]) if -pads[1] <= t < w + pads[3]])
                count = cy * cz
            else:
                count = len(ys) * len(zs)
            out[:, :, y, z] = win.sum(axis=(2, 3)) / count
    return out


def softmax(x, axes):
    e = np.exp(x - x.max(axis=axes, keepdims=True))
    return e / e.sum(axis=axes, keepdims=True)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))
