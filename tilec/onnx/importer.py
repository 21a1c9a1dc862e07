"""ONNX importer: a model -> a `tilec.Graph` -> passes -> one Tile program -> kernels.

`load(path_or_model)` returns an executable called like `tilec.compile`'s: `exe(**arrays)` with
the model's inputs (initializers are bound constants).  Inputs whose values fix shapes (a
Reshape's target, a Reduce's axes) and dimensions the model leaves symbolic are taken from the
first call's arrays; the program is built for them and kept per distinct set of values.

Element types: float32 and float16 run as they are; float64 runs in float32 and integers of any
width in int32 (values must fit); outputs are cast back to the model's types."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import TileError
from ..graph.builder import GRAPH_STEPS, Graph, GraphExecutable, Value
from ..runtime.progress import Progress, step
from .arith import ARITH_CONVERTERS, ARITH_STATIC_OPERANDS
from .attention import ATTENTION_CONVERTERS
from .converters import CONVERTERS as BASE_CONVERTERS
from .converters import STATIC_OPERANDS, NodeContext
from .einsum import EINSUM_CONVERTERS
from .elementwise import ELEMENTWISE_CONVERTERS
from .fold import graph_constant, try_fold
from .norms import NORM_CONVERTERS
from .recurrent import RECURRENT_CONVERTERS
from .shape_ops import SHAPE_CONVERTERS, SHAPE_STATIC_OPERANDS

if TYPE_CHECKING:
    from ..config import Config
    from ..plan.hw import HwModel

CONVERTERS = {**BASE_CONVERTERS, **ELEMENTWISE_CONVERTERS, **NORM_CONVERTERS,
              **ATTENTION_CONVERTERS,
              **SHAPE_CONVERTERS, **EINSUM_CONVERTERS, **RECURRENT_CONVERTERS,
              **ARITH_CONVERTERS}
SUPPORTED_OPS = tuple(sorted(CONVERTERS))

# ONNX TensorProto element type -> tilec storage type.
_DTYPES = {1: "float32", 2: "int32", 3: "int32", 4: "int32", 5: "int32", 6: "int32",
           7: "int32", 9: "bool", 10: "float16", 11: "float32", 12: "int32", 13: "int32"}


def _onnx():
    try:
        import onnx
    except ImportError:
        raise TileError("the ONNX importer needs the onnx package (pip install "
                        "'tilec[onnx]')") from None
    return onnx


def read_model(model: str | Path | Any) -> Any:
    onnx = _onnx()
    if isinstance(model, str | Path):
        try:
            return _parse_file(onnx, Path(model))
        except Exception as e:  # OSError, or protobuf's DecodeError (no stable import path)
            raise TileError(f"cannot read ONNX model {model}: {e}") from None
    if not isinstance(model, onnx.ModelProto):
        raise TileError(f"expected a path or an onnx.ModelProto, got {type(model).__name__}")
    return model


def _parse_file(onnx: Any, path: Path) -> Any:
    """The model in `path`, as `onnx.load` reads it (tensors kept in files beside it
    included), parsed from the file mapped in memory rather than first read into one bytes
    object: resnet50's 100 MB in 0.07 s against 0.15 s."""
    import mmap

    from onnx.external_data_helper import load_external_data_for_model

    model = onnx.ModelProto()
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            model.ParseFromString(b"")
        else:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped, \
                    memoryview(mapped) as view:
                model.ParseFromString(view)  # copies what it keeps: the map may close
    load_external_data_for_model(model, str(path.parent))
    return model


def unsupported_ops(model: Any) -> list[str]:
    """Every op type of the model that the importer cannot convert (sorted)."""
    bad = set()
    for n in model.graph.node:
        if n.domain not in ("", "ai.onnx") or n.op_type not in CONVERTERS:
            bad.add(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}")
    return sorted(bad)


def check_supported(model: Any) -> None:
    bad = unsupported_ops(model)
    if bad:
        raise TileError(f"the model uses ONNX ops tilec does not support: {', '.join(bad)} "
                        f"(supported: {', '.join(SUPPORTED_OPS)})")


def _opset(model: Any) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return 1


class ModelInfo:
    """What the graph inputs need: names, element types, declared shapes, static operands."""

    def __init__(self, model: Any):
        g = model.graph
        self.model = model
        init = {t.name for t in g.initializer}
        self.inputs = [i for i in g.input if i.name not in init]
        names = {i.name for i in self.inputs}
        self.static = sorted({n.input[k] for n in g.node
                              for (op, k) in STATIC_OPERANDS | SHAPE_STATIC_OPERANDS
                              | ARITH_STATIC_OPERANDS
                              if n.op_type == op and k < len(n.input) and n.input[k] in names})
        self.out_dtypes = {o.name: _np_dtype(o, "output") for o in g.output}
        self.in_dtypes = {i.name: _np_dtype(i, "input") for i in self.inputs}

    def declared_shape(self, name: str) -> tuple[int, ...] | None:
        for i in self.inputs:
            if i.name == name:
                dims = i.type.tensor_type.shape.dim
                if not i.type.tensor_type.HasField("shape") or \
                        any(not d.HasField("dim_value") for d in dims):
                    return None
                return tuple(int(d.dim_value) for d in dims)
        return None


def _np_dtype(vi: Any, what: str) -> np.dtype:
    onnx = _onnx()
    if not vi.type.HasField("tensor_type"):
        raise TileError(f"{what} {vi.name}: only tensors are supported, not "
                        f"{vi.type.WhichOneof('value')}")
    et = vi.type.tensor_type.elem_type
    if et not in _DTYPES:
        name = onnx.TensorProto.DataType.Name(et)
        raise TileError(f"{what} {vi.name}: element type {name} is not supported")
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(et))


def to_graph(model: str | Path | Any, arrays: Mapping[str, np.ndarray] | None = None,
             shapes: Mapping[str, Sequence[int]] | None = None,
             progress: Progress | None = None) -> Graph:
    """The model as a graph.  `arrays` supply static operands (and shapes); `shapes` fix
    symbolic dimensions; `progress` advances a step per node."""
    model = read_model(model)
    check_supported(model)
    info = ModelInfo(model)
    from onnx import numpy_helper

    g = Graph(model.graph.name or "onnx")
    env: dict[str, Value] = {}
    # Values known now, in the model's types: shape arithmetic on them folds (`fold`).
    known: dict[str, np.ndarray] = {}
    arrays = arrays or {}
    for t in model.graph.initializer:
        known[t.name] = numpy_helper.to_array(t)
        env[t.name] = graph_constant(g, known[t.name], t.name)
    for i in info.inputs:
        if i.name in info.static:
            if i.name not in arrays:
                raise TileError(f"input {i.name} decides a shape: give its value")
            known[i.name] = np.asarray(arrays[i.name])
            env[i.name] = graph_constant(g, known[i.name], i.name)
            continue
        shape = info.declared_shape(i.name)
        if i.name in arrays:
            shape = tuple(np.shape(arrays[i.name]))
        elif shapes and i.name in shapes:
            shape = tuple(int(s) for s in shapes[i.name])
        if shape is None:
            raise TileError(f"input {i.name} has symbolic dimensions: give its shape")
        env[i.name] = g.input(i.name, shape, _DTYPES[i.type.tensor_type.elem_type])
    opset = _opset(model)
    for node in model.graph.node:
        step(progress, f"{node.op_type} {node.name}")
        folded = try_fold(node, opset, env, known)
        if folded is not None:
            for name, arr in zip([o for o in node.output if o], folded, strict=False):
                known[name] = arr
                env[name] = graph_constant(g, arr, name)
            continue
        ctx = NodeContext(g, env, node, opset)
        ctx.known = known
        try:
            outs = CONVERTERS[node.op_type](ctx)
        except TileError as e:
            if e.message.startswith("ONNX node"):
                raise
            raise ctx.fail(e.message) from None
        if len(outs) > len(node.output):
            raise ctx.fail(f"internal: {len(outs)} results for {len(node.output)} outputs")
        for name, v in zip(node.output, outs, strict=False):  # by position; "" is absent
            if not name:
                continue
            # Nodes take the model's names, so the Tile text reads like the model.
            if g.nodes and g.nodes[-1].output == v.name and \
                    all(x.name != v.name for x in env.values()):
                g.retarget(v, g.fresh(name))
                v = Value(g, g.nodes[-1].output)
            env[name] = v
    for o in model.graph.output:
        if o.name not in env:
            raise TileError(f"output {o.name} is never computed")
        g.output(o.name, env[o.name])
    return g


class OnnxExecutable:
    """A loaded model, compiled once its shapes are known; call it with the model's inputs."""

    def __init__(self, model: Any, *, device: str | None = None,
                 hw: HwModel | str | None = None, config: Config | None = None,
                 validate: bool = False, passes: bool | Sequence[str] = True,
                 shapes: Mapping[str, Sequence[int]] | None = None, quiet: bool = False):
        check_supported(model)
        self.quiet = quiet
        self.model = model
        self.info = ModelInfo(model)
        self.options = {"device": device, "hw": hw, "config": config, "validate": validate,
                        "passes": passes}
        self.shapes = dict(shapes or {})
        self._built: dict[tuple, GraphExecutable] = {}
        self.last: GraphExecutable | None = None
        if not self.info.static and all(
                self.info.declared_shape(i.name) is not None or i.name in self.shapes
                for i in self.info.inputs):
            self.executable_for({})

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.info.inputs)

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(self.info.out_dtypes)

    @property
    def graph(self) -> Graph:
        return self._require().graph

    @property
    def tile(self) -> str:
        return self._require().tile

    @property
    def kernels(self):
        return self._require().kernels

    def _require(self) -> GraphExecutable:
        if self.last is None:
            raise TileError("the model's shapes are known only once it is called with arrays")
        return self.last

    def _key(self, arrays: Mapping[str, np.ndarray]) -> tuple:
        parts: list[Any] = []
        for i in self.info.inputs:
            if i.name in self.info.static:
                a = np.asarray(arrays.get(i.name, ()))
                parts.append((i.name, a.shape, a.tobytes()))
            elif self.info.declared_shape(i.name) is None and i.name not in self.shapes:
                parts.append((i.name, np.shape(arrays.get(i.name, ()))))
        return tuple(parts)

    def executable_for(self, arrays: Mapping[str, np.ndarray]) -> GraphExecutable:
        key = self._key(arrays)
        if key not in self._built:
            # One bar over import and compile: a step per node, then the compile's stages.
            name = self.model.graph.name or "model"
            with Progress(len(self.model.graph.node) + GRAPH_STEPS, f"compiling {name}",
                          quiet=self.quiet, unit="step") as bar:
                g = to_graph(self.model, arrays, self.shapes, progress=bar)
                opts = dict(self.options)
                passes = opts.pop("passes")
                bar.add(-GRAPH_STEPS)  # Graph.compile announces its own
                self._built[key] = g.compile(passes=passes, progress=bar, **opts)
        self.last = self._built[key]
        return self.last

    def __call__(self, **arrays: np.ndarray) -> dict[str, np.ndarray]:
        return self.run(arrays)

    def run(self, arrays: Mapping[str, np.ndarray], *, poison: bool = False,
            repeat: int = 1) -> dict[str, np.ndarray]:
        unknown = sorted(set(arrays) - set(self.inputs))
        if unknown:
            raise TileError(f"unknown input {unknown[0]} (inputs: {', '.join(self.inputs)})")
        exe = self.executable_for(arrays)
        feed = {k: v for k, v in arrays.items() if k not in self.info.static}
        outs = exe.run(feed, poison=poison, repeat=repeat)
        return {k: np.asarray(v).astype(self.info.out_dtypes[k], copy=False)
                for k, v in outs.items()}


def load(model: str | Path | Any, *, device: str | None = None,
         hw: HwModel | str | None = None, config: Config | None = None,
         validate: bool = False, passes: bool | Sequence[str] = True,
         shapes: Mapping[str, Sequence[int]] | None = None,
         quiet: bool = False) -> OnnxExecutable:
    """Import an ONNX model (a path or a ModelProto) and compile it.  `shapes` fix symbolic
    input dimensions; without them the first call's arrays do.  A compile that takes more
    than a couple of seconds shows its progress on a terminal (stderr), unless `quiet`."""
    from dataclasses import replace

    from ..config import Config
    from ..runtime.device_model import open_ahead

    # The device opens (and its first compile's calibration builds) while the model is read.
    base = config or Config()
    open_ahead(replace(base, device=device) if device is not None else base, hw)
    return OnnxExecutable(read_model(model), device=device, hw=hw, config=config,
                          validate=validate, passes=passes, shapes=shapes, quiet=quiet)


__all__ = ["OnnxExecutable", "SUPPORTED_OPS", "check_supported", "load", "read_model",
           "to_graph", "unsupported_ops"]
