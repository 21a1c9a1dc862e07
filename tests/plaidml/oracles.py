"""numpy oracles written from what each op means (convolution, pooling, padding, ...), in
float64 and cast at the end.  None of these reads the Tile text."""

from __future__ import annotations

import itertools

import numpy as np


# --------------------------------------------------------------------------- padding rules
def out_and_pad(size, k_eff, stride, padding, pads=None):
    """Output size and padding before, by the usual definitions:
    explicit pads (before, after); VALID: no padding, only whole windows; SAME: ceil(size /
    stride) outputs, total padding max(0, (out - 1) * stride + k_eff - size), split with the
    odd one after (SAME_UPPER) or before (SAME_LOWER)."""
    if pads is not None:
        before, after = pads
        return (size + before + after - k_eff) // stride + 1, before
    if padding == "valid":
        return (size - k_eff) // stride + 1, 0
    out = -(-size // stride)
    total = max(0, (out - 1) * stride + k_eff - size)
    before = total // 2 if padding == "same_upper" else (total + 1) // 2
    return out, before


# --------------------------------------------------------------------------- layouts
def to_ncx(x, data_format):
    """channels_last (N, *X, C) -> (N, C, *X)."""
    if data_format == "channels_first":
        return x
    return np.moveaxis(x, -1, 1)


def from_ncx(x, data_format):
    if data_format == "channels_first":
        return x
    return np.moveaxis(x, 1, -1)


# --------------------------------------------------------------------------- convolution
def conv_ncx(x, w, strides, dilations, pads_before, out_sizes, groups=1):
    """Grouped, strided, dilated convolution (cross-correlation) with zero padding.
    x: (N, CI, *L); w: (CO, CI // groups, *K); output (N, CO, *out_sizes);
    out[n, co, o] = sum_{ci in co's group, k} x[n, ci, o*s + k*d - pad] * w[co, ci, k]."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    n, ci = x.shape[:2]
    co = w.shape[0]
    gci, gco = ci // groups, co // groups
    out = np.zeros((n, co) + tuple(out_sizes))
    for kpos in itertools.product(*[range(k) for k in w.shape[2:]]):
        pos = [np.arange(o) * s + k * d - p for o, s, k, d, p
               in zip(out_sizes, strides, kpos, dilations, pads_before, strict=True)]
        valid = [(q >= 0) & (q < size) for q, size in zip(pos, x.shape[2:], strict=True)]
        patch = x[(slice(None), slice(None)) + np.ix_(*[np.clip(q, 0, size - 1) for q, size
                                                         in zip(pos, x.shape[2:], strict=True)])]
        mask = np.ones(tuple(out_sizes), bool)
        for axis, v in enumerate(valid):
            shape = [1] * len(out_sizes)
            shape[axis] = -1
            mask = mask & v.reshape(shape)
        patch = patch * mask
        for g in range(groups):
            wk = w[(slice(g * gco, (g + 1) * gco), slice(None)) + kpos]
            out[:, g * gco:(g + 1) * gco] += np.einsum(
                "nc...,oc->no...", patch[:, g * gci:(g + 1) * gci], wk)
    return out


def conv(x, w_ocx, *, data_format, strides, dilations, padding, pads=None, groups=1):
    """x in data_format, w as (CO, CI // groups, *K); returns the output in data_format."""
    xc = to_ncx(np.asarray(x, np.float64), data_format)
    rank = xc.ndim - 2
    outs, befores = [], []
    for i in range(rank):
        k_eff = dilations[i] * (w_ocx.shape[2 + i] - 1) + 1
        pr = (pads[i], pads[i + rank]) if pads is not None else None
        o, b = out_and_pad(xc.shape[2 + i], k_eff, strides[i], padding, pr)
        outs.append(o)
        befores.append(b)
    y = conv_ncx(xc, w_ocx, strides, dilations, befores, outs, groups)
    return from_ncx(y, data_format).astype(np.float32)


def conv_transpose(x, w_io, out_spatial, *, data_format, strides, dilations, padding):
    """Transposed convolution (the gradient of `conv` with respect to its input): every input
    element x[n, o, co] adds x * w[k, ci, co] at position o*s + k*d - pad of the output, where
    pad is the padding the forward conv of an `out_spatial`-sized input would use.
    w_io: (CI_out, CO_in, *K) (output channels first)."""
    xc = to_ncx(np.asarray(x, np.float64), data_format)
    w = np.asarray(w_io, np.float64)
    n, cx = xc.shape[:2]
    rank = xc.ndim - 2
    befores = []
    for i in range(rank):
        k_eff = dilations[i] * (w.shape[2 + i] - 1) + 1
        befores.append(out_and_pad(out_spatial[i], k_eff, strides[i], padding)[1])
    y = np.zeros((n, w.shape[0]) + tuple(out_spatial))
    for opos in itertools.product(*[range(s) for s in xc.shape[2:]]):
        for kpos in itertools.product(*[range(k) for k in w.shape[2:]]):
            t = [o * s + k * d - b
                 for o, s, k, d, b in zip(opos, strides, kpos, dilations, befores, strict=True)]
            if all(0 <= q < size for q, size in zip(t, out_spatial, strict=True)):
                idx = (slice(None), slice(None)) + tuple(t)
                y[idx] += np.einsum("nc,oc->no", xc[(slice(None), slice(None)) + opos],
                                    w[(slice(None), slice(None)) + kpos])
    return from_ncx(y, data_format).astype(np.float32)


# --------------------------------------------------------------------------- pooling
def pool(x, *, mode, kernel, strides, padding, data_format, pads=None):
    """Max / average pooling over windows that may hang over the edges; elements outside the
    input take no part (the average divides by the number of real elements)."""
    xc = to_ncx(np.asarray(x, np.float64), data_format)
    rank = xc.ndim - 2
    outs, befores = [], []
    for i in range(rank):
        pr = (pads[i], pads[i + rank]) if pads is not None else None
        o, b = out_and_pad(xc.shape[2 + i], kernel[i], strides[i], padding, pr)
        outs.append(o)
        befores.append(b)
    y = np.zeros(xc.shape[:2] + tuple(outs))
    for opos in itertools.product(*[range(o) for o in outs]):
        sl = []
        for o, s, b, k, size in zip(opos, strides, befores, kernel, xc.shape[2:], strict=True):
            lo, hi = o * s - b, o * s - b + k
            sl.append(slice(max(lo, 0), min(hi, size)))
        win = xc[(slice(None), slice(None)) + tuple(sl)].reshape(xc.shape[:2] + (-1,))
        y[(slice(None), slice(None)) + opos] = win.max(-1) if mode == "max" else win.mean(-1)
    return from_ncx(y, data_format).astype(np.float32)


# --------------------------------------------------------------------------- misc
def extract_image_patches(x, ksizes, strides, rates, padding):
    """tf.image.extract_patches: (B, Y, X, D) -> (B, OY, OX, KY*KX*D), patch elements in
    (ky, kx, d) order; SAME pads zeros, total padding split with the extra one after."""
    x = np.asarray(x, np.float64)
    b, h, w, d = x.shape
    ky, kx = ksizes[1], ksizes[2]
    sy, sx = strides[1], strides[2]
    ry, rx = rates[1], rates[2]
    oy, pt = out_and_pad(h, (ky - 1) * ry + 1, sy, "valid" if padding == "VALID" else "same_upper")
    ox, pl = out_and_pad(w, (kx - 1) * rx + 1, sx, "valid" if padding == "VALID" else "same_upper")
    xp = np.pad(x, [(0, 0), (pt, pt + ky * ry + sy), (pl, pl + kx * rx + sx), (0, 0)])
    out = np.zeros((b, oy, ox, ky, kx, d))
    for i in range(ky):
        for j in range(kx):
            out[:, :, :, i, j, :] = xp[:, i * ry:i * ry + oy * sy:sy, j * rx:j * rx + ox * sx:sx, :]
    return out.reshape(b, oy, ox, ky * kx * d).astype(np.float32)


def linear_upsample_axis(x, axis, factor):
    """Linear interpolation onto a grid `factor` times finer: input sample h sits at output
    position factor*h; output position p gets sum_h x[h] * max(0, 1 - |p - factor*h| / factor)
    (so past the last sample the values fall off towards zero)."""
    x = np.moveaxis(np.asarray(x, np.float64), axis, -1)
    n = x.shape[-1]
    p = np.arange(factor * n)[:, None]
    h = np.arange(n)[None, :]
    weights = np.maximum(0.0, 1.0 - np.abs(p - factor * h) / factor)  # (factor*n, n)
    y = x @ weights.T
    return np.moveaxis(y, -1, axis)


def softmax(x, axis=-1):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax(x, axis=-1):
    x = np.asarray(x, np.float64)
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def round_half_away(x):
    """C's round(): halves go away from zero."""
    x = np.asarray(x, np.float64)
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def f32(x):
    return np.asarray(x).astype(np.float32)
