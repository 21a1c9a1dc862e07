"""The graph frontend: a DAG of tensor operations built from Python (`tilec.ops`) or ONNX
(`tilec.onnx`), rewritten by inference passes (`tilec.passes`), lowered to one Tile program
(`tilec.lower`) and compiled by the same compiler as hand-written Tile.

```
g = tilec.Graph()
x = g.input("x", (1, 3, 32, 32))
y = tilec.ops.relu(tilec.ops.conv2d(x, g.constant(w), bias=g.constant(b), padding="same"))
g.output("y", y)
exe = g.compile()
outs = exe(x=array)
```

Constants (weights) are program inputs too: the compiler takes inputs only, so the
`GraphExecutable` binds their arrays itself and the caller passes the graph's inputs alone."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..compiler import COMPILE_STEPS
from ..errors import TileError
from ..runtime.progress import Progress, step
from .core import GraphBase, Node, TensorType, Value, constant_array
from .empty import eliminate_empty
from .lower import TileProgram, lower
from .passes import DEFAULT_PASSES, optimize

if TYPE_CHECKING:
    from ..compiler import Executable
    from ..config import Config
    from ..plan.hw import HwModel


def wants_channels_last(config: Config | None, device: str | None = None,
                        hw: HwModel | str | None = None) -> bool:
    """Whether a graph compiled with these settings goes channels-last: as
    `Config.channels_last` says, else where the target is a CPU (the hardware model given, or
    the device)."""
    from dataclasses import replace

    from ..config import Config
    from ..plan.hw import HwModel
    from ..runtime.device import Runtime

    config = config or Config()
    if config.channels_last is not None:
        return config.channels_last
    if isinstance(hw, HwModel):
        return hw.kind == "cpu"
    if (name := hw or config.hw) and name != "auto":
        return HwModel.load(name).kind == "cpu"
    if device is not None:
        config = replace(config, device=device)
    return Runtime.get(config.device).info.kind == "cpu"


class Graph(GraphBase):
    """A graph built from Python (`tilec.ops`) or ONNX: the dataflow graph, plus lowering to
    Tile, the reference, and compiling."""

    def lower(self) -> TileProgram:
        return lower(self)

    def to_tile(self) -> str:
        """The whole graph as one Tile program (constants are inputs of the function)."""
        return self.lower().source

    def evaluate(self, **arrays: np.ndarray) -> dict[str, np.ndarray]:
        """Every output computed by the numpy reference interpreter of the lowered program."""
        return self.lower().evaluate(arrays)

    def compile(self, *, device: str | None = None, hw: HwModel | str | None = None,
                config: Config | None = None, validate: bool = False,
                passes: bool | Sequence[str] = True, quiet: bool = False,
                progress: Progress | None = None) -> GraphExecutable:
        """Optimise (`passes`: True for the inference passes, False for none, or pass names)
        and compile into kernels for one device.  A compile that takes more than a couple of
        seconds shows its progress on a terminal (stderr), unless `quiet`."""
        with _progress(progress, quiet, f"compiling {self.name}") as bar:
            g = self.optimized(passes, channels_last=wants_channels_last(config, device, hw))
            step(bar, "passes")
            return GraphExecutable.build(g, device=device, hw=hw, config=config,
                                         validate=validate, progress=bar)

    def optimized(self, passes: bool | Sequence[str] = True, *,
                  channels_last: bool = False) -> Graph:
        """The graph `compile` lowers (`tilec tune` tunes the kernels of its program).
        `channels_last` (with the default passes): NCHW convolutions become NHWC first
        (`wants_channels_last` says where `compile` asks for it)."""
        g = eliminate_empty(self)  # tensors with no elements need no kernel (`tilec.empty`)
        if passes is True:
            g = optimize(self, (("channels_last",) if channels_last else ()) + DEFAULT_PASSES)
        elif passes:
            g = optimize(self, passes)
        return g  # type: ignore[return-value]


class GraphExecutable:
    """A compiled graph: call it with the graph's inputs; the constants are bound here."""

    def __init__(self, graph: Graph, program: TileProgram, executable: Executable | None):
        self.graph = graph
        self.program = program
        # None when every output is empty (`tilec.empty`): there is nothing to run.
        self.executable = executable
        # Weights go to the device once, not on every call.
        if executable is not None:
            executable.bind(program.bound)

    @classmethod
    def build(cls, graph: Graph, *, device: str | None = None,
              hw: HwModel | str | None = None, config: Config | None = None,
              validate: bool = False, progress: Progress | None = None) -> GraphExecutable:
        """Lower and compile `graph` as it is.  The whole compile is kept in the cache
        directory (`compile(reuse=True)`): a model compiled again skips parsing, planning and
        code generation."""
        from ..compiler import compile as tile_compile
        from ..errors import Source

        program = graph.lower()
        step(progress, "lowered to Tile")
        if not program.has_kernels:
            return cls(graph, program, None)
        exe = tile_compile(Source(program.source, f"<graph {graph.name}>"), program.shapes,
                           dtype=program.dtypes, device=device, hw=hw, config=config,
                           validate=validate, reuse=True, progress=progress,
                           constants=tuple(program.bound))
        return cls(graph, program, exe)

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(self.graph.inputs)

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(self.graph.outputs)

    @property
    def tile(self) -> str:
        return self.program.source

    @property
    def kernels(self):
        return self.executable.kernels if self.executable is not None else []

    @property
    def source(self) -> str:
        return self.executable.source if self.executable is not None else ""

    @property
    def last_timings(self) -> dict[str, float]:
        return self.executable.last_timings if self.executable is not None else {}

    @property
    def bind_timings(self) -> dict[str, float]:
        """Kernels launched once when the constants were bound (they depend on nothing else;
        plain copies of constants are made on the host instead and are not among them)."""
        return self.executable.bind_timings if self.executable is not None else {}

    @property
    def hoisted(self) -> tuple[str, ...]:
        """Every kernel settled at bind, on the device or on the host; calls skip them."""
        return self.executable.hoisted if self.executable is not None else ()

    def __call__(self, **arrays: np.ndarray) -> dict[str, np.ndarray]:
        return self.run(arrays)

    def bind(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The caller's arrays under their Tile names (the constants are bound already)."""
        missing = [k for k in self.graph.inputs if k not in arrays]
        if missing:
            t = self.graph.inputs[missing[0]]
            raise TileError(f"no array given for input {missing[0]} (shape {list(t.shape)})")
        extra = sorted(set(arrays) - set(self.graph.inputs))
        if extra:
            raise TileError(f"unknown input {extra[0]} (inputs: {', '.join(self.graph.inputs)})")
        for k, shape in self.program.empty_inputs.items():  # not inputs of the kernels
            if tuple(np.shape(arrays[k])) != tuple(shape):
                raise TileError(f"input {k}: expected shape {list(shape)}, got "
                                f"{list(np.shape(arrays[k]))}")
        return {tile_name: arrays[k] for k, tile_name in self.program.inputs.items()}

    def run(self, arrays: Mapping[str, np.ndarray], *, poison: bool = False,
            repeat: int = 1) -> dict[str, np.ndarray]:
        """Run the kernels (`poison`: fill every buffer the kernels write with NaN first).
        Outputs with no elements come from the host, with their shapes and types."""
        feed = self.bind(arrays)
        outs = {} if self.executable is None else \
            self.executable.run(feed, poison=poison, repeat=repeat)
        return self.program.arrange(outs)

    def reference(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The numpy reference's outputs for the same inputs."""
        return self.program.evaluate(arrays)


def _progress(given: Progress | None, quiet: bool, desc: str) -> Any:
    """The caller's bar (it closes it), or one of our own over lowering and compiling."""
    if given is not None:
        given.add(GRAPH_STEPS)
        return contextlib.nullcontext(given)
    return Progress(GRAPH_STEPS, desc, quiet=quiet)


# Steps a graph compile reports: passes, lowering and the compiler's.
GRAPH_STEPS = 2 + COMPILE_STEPS


__all__ = ["Graph", "GraphExecutable", "Node", "TensorType", "Value", "constant_array"]
