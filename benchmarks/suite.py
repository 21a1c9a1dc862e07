"""The benchmark suite's kernels: Tile text, shapes, work counts and the peers' versions.

One `Case` is one kernel at one size.  Its Tile text is what tilec and PlaidML both compile;
numpy, onnxruntime and torch run the same operation their own way (layouts converted outside
the timed region).  Work counts are conventional, not what a kernel happens to execute: a 3x3
"same" conv counts 2*9*CI multiply-adds per output even at the borders, and `bytes` is the
least traffic the operation needs (every input read once, every output written once), so
flops / bytes is the arithmetic intensity that places a kernel on the roofline.

Peers are imported inside their builders: the GPU host has torch and no onnxruntime, the CPU
machine the other way round."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _example(name: str) -> str:
    return (EXAMPLES / name).read_text()


MATMUL = _example("matmul.tile")
CONV = _example("conv_relu.tile")  # the seed's conv + ReLU (NHWC data, IJ-CO-CI kernel)
MAXPOOL = _example("maxpool.tile")
SOFTMAX = _example("softmax.tile")
DEPTHWISE = """\
// 3x3 "same" depthwise convolution (NHWC data, IJ-C kernel), as in MobileNet's blocks.
function (D[N, X, Y, C], K[I, J, C]) -> (R) {
  R[n, x, y, c : N, X, Y, C] = +(D[n, x+i-1, y+j-1, c] * K[i, j, c]);
}
"""

F32 = 4


@dataclass(frozen=True)
class Case:
    name: str
    op: str  # matmul, conv, depthwise, maxpool, softmax: picks the peers' implementations
    source: str
    shapes: dict[str, tuple[int, ...]]
    output: str
    out_shape: tuple[int, ...]
    flops: float
    # "compute": judged in GFLOP/s against peak FLOP/s; "memory": in GB/s against bandwidth.
    bound: str
    devices: tuple[str, ...] = ("cpu", "gpu")

    @property
    def bytes(self) -> float:
        n = sum(_count(s) for s in self.shapes.values()) + _count(self.out_shape)
        return float(n * F32)

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def matmul(m: int, n: int, k: int, devices=("cpu", "gpu")) -> Case:
    name = f"matmul {m}" if m == n == k else f"matmul {m}x{n}x{k} (MxNxK)"
    return Case(name, "matmul", MATMUL, {"A": (m, k), "B": (k, n)}, "C", (m, n),
                2.0 * m * n * k, "compute", devices)


def conv(n: int, hw: int, c: int, devices=("cpu", "gpu")) -> Case:
    return Case(f"seed conv 3x3 + ReLU, N={n} {hw}x{hw} {c}->{c}", "conv", CONV,
                {"D": (n, hw, hw, c), "K": (3, 3, c, c)}, "R", (n, hw, hw, c),
                2.0 * n * hw * hw * c * c * 9, "compute", devices)


def depthwise(n: int, hw: int, c: int, devices=("cpu", "gpu")) -> Case:
    return Case(f"depthwise 3x3, N={n} {hw}x{hw}x{c}", "depthwise", DEPTHWISE,
                {"D": (n, hw, hw, c), "K": (3, 3, c)}, "R", (n, hw, hw, c),
                2.0 * n * hw * hw * c * 9, "memory", devices)


def maxpool(n: int, hw: int, c: int, devices=("cpu", "gpu")) -> Case:
    # One comparison per input element.
    return Case(f"max pool 2x2/2, N={n} {hw}x{hw}x{c}", "maxpool", MAXPOOL,
                {"I": (n, hw, hw, c)}, "O", (n, hw // 2, hw // 2, c),
                float(n * hw * hw * c), "memory", devices)


def softmax(rows: int, cols: int = 1000, devices=("cpu", "gpu")) -> Case:
    # max, subtract, exp, sum, divide: five operations an element.
    return Case(f"softmax {rows}x{cols} (rows)", "softmax", SOFTMAX, {"X": (rows, cols)}, "Y",
                (rows, cols), 5.0 * rows * cols, "memory", devices)


def cpu_cases() -> list[Case]:
    cpu = ("cpu",)
    return [
        *(matmul(s, s, s, cpu) for s in (256, 512, 1024, 2048)),
        conv(1, 56, 64, cpu),
        conv(1, 224, 64, cpu),
        # Sizes past the 32 MiB L3 so that GB/s compares with the DRAM copy figure.
        depthwise(4, 112, 128, cpu),
        maxpool(4, 224, 64, cpu),
        softmax(16384, 1000, cpu),
        # The long ones last: on a shared 2-core machine a quiet spell rarely lasts the run.
        matmul(4096, 4096, 1024, cpu),
        matmul(4096, 4096, 4096, cpu),
    ]


def gpu_cases() -> list[Case]:
    gpu = ("gpu",)
    return [
        *(matmul(s, s, s, gpu) for s in (256, 512, 1024, 2048, 4096)),
        matmul(4096, 4096, 1024, gpu),
        conv(1, 56, 64, gpu),
        conv(1, 224, 64, gpu),
        conv(32, 224, 64, gpu),  # the seed's full size
        depthwise(32, 112, 128, gpu),
        maxpool(32, 224, 64, gpu),
        softmax(65536, 1000, gpu),
    ]


def select(cases: list[Case], only: str | None) -> list[Case]:
    """Cases named by the comma-separated keys (all without): a key that is a whole name
    picks that case alone ("matmul 4096" is not "matmul 4096x4096x1024"), another key every
    case whose name contains it ("conv")."""
    if not only:
        return cases
    names = {c.name.lower() for c in cases}
    keys = [k.strip().lower() for k in only.split(",") if k.strip()]
    return [c for c in cases if any(k == c.name.lower() if k in names else k in c.name.lower()
                                    for k in keys)]


# ---- peers -------------------------------------------------------------------------------
# Each builder takes the case and its input arrays (tilec's layouts, numpy float32) and returns
# (run, result): `run()` is the timed call, `result(out)` turns its output into tilec's layout
# for validation.  Layout changes of the inputs happen here, outside the timed region.


def numpy_peer(case: Case, arrays: dict):
    if case.op != "matmul":
        return None
    a, b = arrays["A"], arrays["B"]
    return (lambda: a @ b), (lambda out: out)


def _ort_model(case: Case, arrays: dict):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def vi(name, shape):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))

    if case.op in ("conv", "depthwise"):
        d = arrays["D"].transpose(0, 3, 1, 2)  # NHWC -> NCHW
        c = d.shape[1]
        if case.op == "conv":
            w = arrays["K"].transpose(2, 3, 0, 1)  # I J CO CI -> CO CI I J
            group = 1
        else:
            w = arrays["K"].transpose(2, 0, 1)[:, None]  # I J C -> C 1 I J
            group = c
        nodes = [helper.make_node("Conv", ["x", "w"], ["y" if case.op == "depthwise" else "c"],
                                  kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=group)]
        if case.op == "conv":
            nodes.append(helper.make_node("Relu", ["c"], ["y"]))
        inits = [numpy_helper.from_array(np.ascontiguousarray(w), "w")]
        feeds = {"x": np.ascontiguousarray(d)}
        in_shape, out_shape = d.shape, d.shape[:1] + (w.shape[0],) + d.shape[2:]

        def back(out):
            return out.transpose(0, 2, 3, 1)
    elif case.op == "maxpool":
        d = np.ascontiguousarray(arrays["I"].transpose(0, 3, 1, 2))
        nodes = [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
        inits, feeds = [], {"x": d}
        in_shape = d.shape
        out_shape = d.shape[:2] + (d.shape[2] // 2, d.shape[3] // 2)

        def back(out):
            return out.transpose(0, 2, 3, 1)
    elif case.op == "softmax":
        x = arrays["X"]
        nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=1)]
        inits, feeds, in_shape, out_shape = [], {"x": x}, x.shape, x.shape

        def back(out):
            return out
    else:
        return None
    graph = helper.make_graph(nodes, case.op, [vi("x", in_shape)], [vi("y", out_shape)], inits)
    # IR 8 (ONNX 1.10's) with opset 13: new enough for these ops, old enough for any
    # onnxruntime this suite may meet (onnx writes its own, newer IR version by default).
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model)
    return model, feeds, back


# The input each op's peers take as a constant (onnxruntime's initializer).
WEIGHTS = {"conv": "K", "depthwise": "K"}


def tilec_bound_peer(case: Case, arrays: dict, config):
    """tilec's whole call (upload, launch, wait, download) with the weights bound once."""
    import tilec

    w = WEIGHTS.get(case.op)
    if w is None:
        return None
    exe = tilec.compile(case.source, case.shapes, config=config, constants=(w,))
    exe.bind({w: arrays[w]})
    # In memory aligned as a buffer is, as a caller that wants no copy gives it.
    given = {n: tilec.aligned_empty(a.shape, a.dtype) for n, a in arrays.items() if n != w}
    for n, a in given.items():
        a[...] = arrays[n]
    exe.run(given, poison=True)  # a kernel that missed an element leaves NaN for the check
    return (lambda: exe.run(given)[case.output]), (lambda out: out)


def onnxruntime_peer(case: Case, arrays: dict):
    built = _ort_model(case, arrays)
    if built is None:
        return None
    import onnxruntime as ort

    model, feeds, back = built
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return (lambda: sess.run(["y"], feeds)[0]), back


def torch_peer(case: Case, arrays: dict):
    """cuBLAS / cuDNN fp32 (the caller turns TF32 off); convolutions in NCHW."""
    import torch
    import torch.nn.functional as F

    def dev(a, perm=None):
        t = torch.from_numpy(a)
        if perm is not None:
            t = t.permute(*perm)
        return t.contiguous().cuda()

    def nhwc(out):
        return out.permute(0, 2, 3, 1).cpu().numpy()

    if case.op == "matmul":
        a, b = dev(arrays["A"]), dev(arrays["B"])
        return (lambda: a @ b), (lambda out: out.cpu().numpy())
    if case.op == "conv":
        d, k = dev(arrays["D"], (0, 3, 1, 2)), dev(arrays["K"], (2, 3, 0, 1))
        return (lambda: torch.relu(F.conv2d(d, k, padding=1))), nhwc
    if case.op == "depthwise":
        d = dev(arrays["D"], (0, 3, 1, 2))
        k = dev(arrays["K"], (2, 0, 1)).unsqueeze(1).contiguous()
        return (lambda: F.conv2d(d, k, padding=1, groups=d.shape[1])), nhwc
    if case.op == "maxpool":
        d = dev(arrays["I"], (0, 3, 1, 2))
        return (lambda: F.max_pool2d(d, 2, 2)), nhwc
    if case.op == "softmax":
        x = dev(arrays["X"])
        return (lambda: torch.softmax(x, dim=1)), (lambda out: out.cpu().numpy())
    return None
