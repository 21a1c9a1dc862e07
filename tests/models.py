"""ONNX image classifiers as `torch.onnx.export` writes torchvision's models in eval mode, built
with onnx.helper and random weights (no torch needed): opset 17, batch 1, 3x224x224.

Export folds each BatchNorm into the convolution before it (weights and a bias), so a ResNet
is Conv, Relu, Add, MaxPool, GlobalAveragePool, Flatten and Gemm; names follow the exporter's
(`/layer1/layer1.0/conv1/Conv`, `onnx::Conv_193`).  The weights are scaled (He) so that
activations stay near unit size through fifty layers and the outputs can be compared.

    model = resnet("resnet50", seed=0)           # an onnx.ModelProto
    python benchmarks/models.py resnet50 -o resnet50.onnx
"""

from __future__ import annotations

import numpy as np

OPSET = 17
# torchvision: (block, blocks per stage)
RESNETS = {
    "resnet18": ("basic", (2, 2, 2, 2)),
    "resnet34": ("basic", (3, 4, 6, 3)),
    "resnet50": ("bottleneck", (3, 4, 6, 3)),
    "resnet101": ("bottleneck", (3, 4, 23, 3)),
}


class _Builder:
    """Nodes and initializers in export order, with the exporter's naming."""

    def __init__(self, seed: int, dtype=np.float32):
        from onnx import helper

        self.helper = helper
        self.rng = np.random.default_rng(seed)
        self.dtype = dtype
        self.nodes: list = []
        self.inits: list = []
        self._next = 100

    def weight(self, op: str, array: np.ndarray) -> str:
        from onnx import numpy_helper

        name = f"onnx::{op}_{self._next}"
        self._next += 1
        self.inits.append(numpy_helper.from_array(array.astype(self.dtype), name))
        return name

    def node(self, op: str, scope: str, inputs: list[str], **attrs) -> str:
        out = f"{scope}/{op}_output_0"
        self.nodes.append(self.helper.make_node(op, inputs, [out], name=f"{scope}/{op}",
                                                **attrs))
        return out

    def conv(self, scope: str, x: str, cin: int, cout: int, k: int, stride: int = 1,
             pad: int = 0, gain: float = 2.0) -> str:
        # He initialisation; the folded BatchNorm's shift becomes a small bias.
        std = np.sqrt(gain / (cin * k * k))
        w = self.rng.normal(0.0, std, size=(cout, cin, k, k))
        b = self.rng.normal(0.0, 0.01, size=cout)
        return self.node("Conv", scope, [x, self.weight("Conv", w), self.weight("Conv", b)],
                         dilations=[1, 1], group=1, kernel_shape=[k, k],
                         pads=[pad] * 4, strides=[stride, stride])

    def relu(self, scope: str, x: str) -> str:
        return self.node("Relu", scope, [x])


def _basic(b: _Builder, scope: str, x: str, cin: int, planes: int, stride: int) -> tuple[str, int]:
    y = b.relu(f"{scope}/relu", b.conv(f"{scope}/conv1", x, cin, planes, 3, stride, 1))
    # The last convolution of a residual branch starts small (torchvision's zero_init_residual
    # in spirit), so that the sums stay bounded.
    y = b.conv(f"{scope}/conv2", y, planes, planes, 3, 1, 1, gain=0.5)
    short = x if stride == 1 and cin == planes else \
        b.conv(f"{scope}/downsample/downsample.0", x, cin, planes, 1, stride)
    s = b.node("Add", f"{scope}", [y, short])
    return b.relu(f"{scope}/relu_1", s), planes


def _bottleneck(b: _Builder, scope: str, x: str, cin: int, planes: int,
                stride: int) -> tuple[str, int]:
    out = planes * 4
    y = b.relu(f"{scope}/relu", b.conv(f"{scope}/conv1", x, cin, planes, 1))
    # torchvision's v1.5: the stride is on the 3x3 convolution.
    y = b.relu(f"{scope}/relu_1", b.conv(f"{scope}/conv2", y, planes, planes, 3, stride, 1))
    y = b.conv(f"{scope}/conv3", y, planes, out, 1, gain=0.5)
    short = x if stride == 1 and cin == out else \
        b.conv(f"{scope}/downsample/downsample.0", x, cin, out, 1, stride)
    s = b.node("Add", f"{scope}", [y, short])
    return b.relu(f"{scope}/relu_2", s), out


def resnet(name: str = "resnet50", *, seed: int = 0, size: int = 224, classes: int = 1000,
           stages: tuple[int, ...] | None = None, width: int = 64):
    """torchvision's `name` as exported (an onnx.ModelProto).  `stages`, `width`, `size` and
    `classes` make smaller members of the family for tests."""
    import onnx
    from onnx import TensorProto, helper

    kind, blocks = RESNETS[name]
    blocks = stages if stages is not None else blocks
    b = _Builder(seed)
    x = b.relu("/relu", b.conv("/conv1", "input", 3, width, 7, 2, 3))
    x = b.node("MaxPool", "/maxpool", [x], ceil_mode=0, dilations=[1, 1], kernel_shape=[3, 3],
               pads=[1, 1, 1, 1], strides=[2, 2])
    block = _basic if kind == "basic" else _bottleneck
    cin = width
    for i, n in enumerate(blocks):
        planes = width * 2 ** i
        for j in range(n):
            scope = f"/layer{i + 1}/layer{i + 1}.{j}"
            x, cin = block(b, scope, x, cin, planes, 2 if j == 0 and i > 0 else 1)
    x = b.node("GlobalAveragePool", "/avgpool", [x])
    x = b.node("Flatten", "", [x], axis=1)
    fc_w = b.rng.normal(0.0, np.sqrt(1.0 / cin), size=(classes, cin))
    fc_b = b.rng.normal(0.0, 0.01, size=classes)
    b.inits += [onnx.numpy_helper.from_array(fc_w.astype(np.float32), "fc.weight"),
                onnx.numpy_helper.from_array(fc_b.astype(np.float32), "fc.bias")]
    b.nodes.append(helper.make_node("Gemm", [x, "fc.weight", "fc.bias"], ["output"],
                                    name="/fc/Gemm", alpha=1.0, beta=1.0, transB=1))
    graph = helper.make_graph(
        b.nodes, "main_graph",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, classes])],
        b.inits)
    model = helper.make_model(graph, producer_name="pytorch", producer_version="2.1.0",
                              opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def tiny_resnet(seed: int = 0):
    """A resnet18-shaped model small enough for a test: 2 stages of 2 basic blocks, width 8,
    32x32 input, 10 classes (its blocks repeat with the same shapes, as real ResNets' do)."""
    return resnet("resnet18", seed=seed, size=32, classes=10, stages=(2, 2), width=8)


def input_array(model, seed: int = 1) -> np.ndarray:
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return np.random.default_rng(seed).standard_normal(dims).astype(np.float32)


__all__ = ["OPSET", "RESNETS", "input_array", "resnet", "tiny_resnet"]
