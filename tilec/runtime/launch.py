"""Running compiled kernels: device buffers (pooled temporaries, bound inputs), input checks,
poisoned outputs, launches in order with event timing, downloads and validation.  Shared by
`compiler.Executable` and `bundle.BundledExecutable`."""

from __future__ import annotations

import contextlib
import statistics
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from ..codegen.phases import ABORT_INDEX, GRID_SYNC, SYNC_INTS
from ..errors import DeviceError, TileError, ValidationError
from ..lang import ir
from ..plan.halo import Halo
from . import host_io
from .device import Runtime, event_seconds
from .hoist import hoistable
from .host_io import OutputArrays
from .memory import MemoryPlan
from .transpose import contiguous
from .validate import Validation

NP = {"float32": np.float32, "float16": np.float16, "int32": np.int32, "bool": np.bool_,
      "int8": np.int8, "uint8": np.uint8, "int16": np.int16, "uint16": np.uint16,
      "uint32": np.uint32}
# A phase launch (`codegen.phases`) holds this from its launch to its end: two such launches
# running at once could each hold part of the driver's threads at a barrier, waiting for
# work-groups that have no thread left.
PHASE_LOCK = threading.Lock()
# Calls after which a phase launch's abort flag is no longer read back (a launch whose
# work-groups do not all run at once shows on the first call).
PHASE_CHECKS = 2

POISON = {"float32": np.float32(np.nan), "float16": np.float16(np.nan),
          "int32": np.int32(-0x21524111), "bool": np.uint8(0xAB), "int8": np.int8(-0x55),
          "uint8": np.uint8(0xAB), "int16": np.int16(-0x2153), "uint16": np.uint16(0xDEAD),
          "uint32": np.uint32(0xDEADBEEF)}


def itemsize(dtype: str) -> int:
    return ir.DTYPE_BYTES[dtype]


@dataclass(frozen=True)
class KernelInfo:
    name: str
    kind: str
    global_size: int
    local_size: int | None
    tile: dict[str, int]
    cost: str
    flops: int
    args: tuple[str, ...]
    writes: tuple[str, ...] = ()  # the args it writes (the others it only reads)


@dataclass(frozen=True)
class BufferSpec:
    shape: tuple[int, ...]
    dtype: str
    nbytes: int



def poisoned_halo(halo: Halo, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """A bordered buffer's contents before a checked run: the border's value (`plan.halo`),
    poison inside it."""
    arr = np.full(shape, halo.fill, dtype=NP[dtype])
    arr[tuple(slice(a, n - b) for a, b, n in zip(halo.lo, halo.hi, shape, strict=True))] = \
        POISON[dtype]
    return arr

class Launcher:
    """Kernels in launch order over named device buffers.  Subclasses set the attributes
    below (through `_setup`) and implement `check`."""

    runtime: Runtime
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    kernels: list[KernelInfo]
    validate: bool

    def _setup(self, runtime: Runtime, inputs: tuple[str, ...], outputs: tuple[str, ...],
               specs: Mapping[str, BufferSpec], kernels: list[KernelInfo], cl_kernels: dict,
               memory: MemoryPlan | None, validate: bool,
               replan: Callable[[set[str]], MemoryPlan] | None = None,
               halos: Iterable[Halo] = (), host_io: bool = False) -> None:
        runtime.check_sizes({n: s.nbytes for n, s in specs.items()})
        self.runtime = runtime
        self.inputs, self.outputs = inputs, outputs
        self.specs = dict(specs)
        self.kernels = kernels
        self._kernels = cl_kernels
        self.memory = memory
        self.validate = validate
        # The last call's events, read into `last_timings` when asked for: reading an event's
        # profile costs microseconds: 0.08 ms a call of squeezenet1_1's 31 kernels (2-core Xeon).
        self._last_events: list[list[tuple[str, object]]] = []
        self._last_times: dict[str, float] | None = {}
        self.last_validation: Validation | None = None
        self._buffers: dict[object, object] = {}
        self._bound: dict[str, np.ndarray] = {}
        self._unsent: set[str] = set()  # bound inputs whose buffers do not hold them yet
        # The memory plan with more tensors kept out of the pool (those `bind` computes).
        self._replan = replan
        self.hoisted: tuple[str, ...] = ()  # kernels run by `bind`, not by every call
        self._hoist_reads: set[str] = set()  # the bound inputs they depend on
        self.bind_timings: dict[str, float] = {}
        # The buffers each kernel's arguments were set to: set once, again only after the
        # memory plan changes (a model's call launches dozens of kernels, and setting their
        # arguments, or even finding their buffers by name, costs as much as the launch).
        self._args_set: dict[str, list] = {}
        # Buffers whose border holds a value no kernel writes (`plan.halo`): filled when the
        # buffer is made, and again after poisoning.  They keep their own buffers.
        self.halos = {h.root: h for h in halos}
        self._phase_checks = PHASE_CHECKS
        self._input_order = {n: i for i, n in enumerate(inputs)}
        self._kept: set[str] = set()  # what the kernels run at bind write (`bind`)
        # In-place inputs and outputs (`Config.host_io`): on a device whose buffers are host
        # memory, a call's aligned inputs and its outputs are buffers over the arrays
        # themselves, made for the call (`_call_buffers`), instead of copies into and out of
        # the executable's own.  `_io_args`: each kernel's argument positions that such a
        # buffer may take, set again before every call's first launch of the kernel.
        self._host_io = host_io and runtime.shares_host_memory
        self._call_buffers: dict[str, object] = {}
        self._staged: dict[str, np.ndarray] = {}  # inputs' own host buffers' arrays
        self._outputs = OutputArrays(runtime)
        written = {t for k in kernels for t in k.writes}
        # Never a halo, a pooled temporary or an input a kernel writes (inputs and outputs
        # stay out of the pool, `compiler.Executable`, whatever `bind` replans).
        io = {n for n in (*inputs, *outputs) if n in self.specs and n not in self.halos
              and n != GRID_SYNC and self._slot(n) is None
              and not (n in inputs and n in written)} if self._host_io else set()
        self._set_io(io)
        # The buffer each of those positions was set to last (positions over a call's own
        # input buffer are forgotten after the call: its array is the caller's).
        self._arg_now: dict[str, dict[int, object]] = {}
        assert not (memory and set(self.halos) & set(memory.slot_of)), "a halo in the pool"

    def check(self, inputs: Mapping[str, np.ndarray],
              outs: Mapping[str, np.ndarray]) -> Validation:
        raise NotImplementedError

    def _slot(self, name: str) -> int | None:
        return self.memory.slot_of.get(name) if self.memory else None

    def _buffer_bytes(self, name: str) -> int:
        """The size of the buffer `_buffer` gives `name` (its pool slot's, where pooled)."""
        slot = self._slot(name)
        return self.specs[name].nbytes if slot is None else self.memory.slot_bytes[slot]

    def _prepare(self, kernels: list[KernelInfo]) -> None:
        """Called before `kernels` are launched (a subclass may build ahead)."""

    def _buffer(self, name: str):
        own = self._call_buffers.get(name)
        if own is not None:
            return own
        slot = self._slot(name)
        key: object = name if slot is None else ("pool", slot)
        if key not in self._buffers:
            if self._stages(name):
                # A host buffer over an array of our own: a call's input is copied into it by
                # numpy, no command for the driver's threads (`_upload`).
                s = self.specs[name]
                self._staged[name] = host_io.aligned_empty(
                    s.shape, np.uint8 if s.dtype == "bool" else NP[s.dtype],
                    self.runtime.base_align)
                self._buffers[key] = host_io.host_buffer(self.runtime, self._staged[name])
                return self._buffers[key]
            self._buffers[key] = self.runtime.buffer(self._buffer_bytes(name))
            if name in self.halos:
                s = self.specs[name]
                self.runtime.fill(self._buffers[key], NP[s.dtype](self.halos[name].fill),
                                  s.nbytes)
            elif name == GRID_SYNC:
                self.runtime.fill(self._buffers[key], np.int32(0), self._buffer_bytes(name))
        return self._buffers[key]

    def _poison(self, name: str) -> None:
        """Fill `name`'s buffer with NaN (or a pattern); a halo's border keeps its value."""
        s = self.specs[name]
        halo = self.halos.get(name)
        if halo is None:
            self.runtime.fill(self._buffer(name), POISON[s.dtype], s.nbytes)
            return
        self.runtime.upload(self._buffer(name), poisoned_halo(halo, s.shape, s.dtype))

    def _set_io(self, io: set[str]) -> None:
        self._io = io
        self._io_args = {k.name: tuple((i, a) for i, a in enumerate(k.args) if a in io)
                         for k in self.kernels if io & set(k.args)}

    def bind(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Upload inputs that stay the same between calls (weights) once; later calls may
        leave them out.  Kernels that depend on bound inputs alone (a filter copied into
        another layout, a normalization folded into weights) run here, once, instead of on
        every call.  A bound input that only kernels settled on the host read is not
        uploaded (a model's filters, read once to be relaid in panels)."""
        prepared = self._inputs(arrays, partial=True, views=True)
        self._bound.update(prepared)
        self._unsent.update(prepared)
        # Bound inputs keep their own buffers: no call gives them in place (a model's
        # weights: dozens of argument positions a call would otherwise set again).
        self._set_io(self._io - set(self._bound))
        hoisted, deps = hoistable(self.kernels, set(self._bound))
        if not hoisted:
            self._send_bound()
            return
        kept = {t for k in self.kernels if k.name in hoisted for t in k.writes}
        if self.memory is not None and kept & set(self.memory.slot_of):
            # What bind computes lives on between calls: out of the pool, in own buffers.
            assert self._replan is not None, "a pooled memory plan comes with its replan"
            self.memory = self._replan(kept)
            self._buffers = {k: b for k, b in self._buffers.items()
                             if not (isinstance(k, tuple) and k[0] == "pool")}
            self._args_set.clear()
        self.hoisted, self._hoist_reads = tuple(sorted(hoisted)), deps
        self._kept = kept  # what they write: a call that skips them keeps it
        # Poisoned first, as a call with `poison` would: an element no kernel writes shows.
        for name in sorted(kept):
            self._poison(name)
        device = self._bind_on_host(hoisted)
        on_host = hoisted - {k.name for k in device}
        self._send_bound({a for k in self.kernels if k.name not in on_host for a in k.args})
        self.bind_timings = medians(self._launch(device, 1))

    def _send_bound(self, only: set[str] | None = None) -> None:
        """Write into their buffers the bound inputs not sent yet (of those in `only`)."""
        for name in sorted(self._unsent if only is None else self._unsent & only):
            self.runtime.write(self._buffer(name), self._bound[name])
            self._unsent.discard(name)

    def _bind_on_host(self, hoisted: set[str]) -> list[KernelInfo]:
        """Settle on the host the bound kernels a subclass can compute there (`_on_host`),
        uploading what they write; the others, in launch order, for the device.  A kernel's
        inputs must be bound arrays or host results already, and what it writes no other
        kernel may write (an upload is not ordered with launches that run later)."""
        env = dict(self._bound)
        writers: dict[str, int] = {}
        for k in self.kernels:
            for t in k.writes:
                writers[t] = writers.get(t, 0) + 1
        device = []
        for k in self.kernels:
            if k.name not in hoisted:
                continue
            done = None
            if all(writers[t] == 1 for t in k.writes) and \
                    all(a in env for a in k.args if a not in k.writes):
                done = self._on_host(k.name, env)
            if done is None:
                device.append(k)
                continue
            for t, arr in done.items():
                self.runtime.write(self._buffer(t), arr)  # a view: copied once, into the buffer
                env[t] = arr
        return device

    def _on_host(self, name: str, env: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """What kernel `name` writes, computed on the host from `env`, where that is better
        than building the kernel; None: launch it."""
        return None

    def __call__(self, **arrays: np.ndarray) -> dict[str, np.ndarray]:
        return self.run(arrays)

    def run(self, arrays: Mapping[str, np.ndarray], *, poison: bool = False,
            repeat: int = 1) -> dict[str, np.ndarray]:
        """Run every kernel `repeat` times (timings: the median per kernel), return outputs.
        `poison` fills every buffer the kernels write with NaN (or a pattern) first."""
        given = self._inputs(arrays, partial=bool(self._bound))
        rt = self.runtime
        covered = len(self._bound) + sum(1 for n in given if n not in self._bound)
        missing = [n for n in self.inputs if n not in given and n not in self._bound] \
            if covered < len(self.inputs) else []
        if missing:
            s = self.specs[missing[0]]
            raise TileError(f"no array given for input {missing[0]} (shape {list(s.shape)})")
        # A call's copies ride in the queue with its kernels, not as blocking commands of
        # their own: each wait for a blocking copy is a round trip to the driver's threads.
        direct = self._in_place(given)
        for name, arr in given.items():
            if name not in direct:
                self._upload(name, arr)
        # A value given for a bound input replaces the binding (its buffer holds it now), and
        # a call that gives one the bound kernels read runs them again.
        self._bound.update({n: a for n, a in given.items() if n in self._bound})
        self._unsent -= set(given)
        skip = set(self.hoisted) if not set(given) & self._hoist_reads else set()
        if not skip:
            self._send_bound()  # the bound kernels run on the device now, reading them all
        kept = self._kept if skip else set()
        self._call_buffers = {n: host_io.host_buffer(rt, a, read_only=True)
                              for n, a in direct.items()}
        for name, (arr, buf) in self._out_in_place(kept).items():
            direct[name], self._call_buffers[name] = arr, buf
        if poison:
            for name in self.specs:
                if name not in self.inputs and name not in kept and name != GRID_SYNC:
                    self._poison(name)
        outs: dict[str, np.ndarray] = {}
        maps = []

        def download() -> None:
            for name in self.outputs:
                if name not in self.specs:  # an output that is an input passed straight through
                    outs[name] = (given.get(name) if name in given
                                  else self._bound[name]).copy()
                    continue
                s = self.specs[name]
                dtype = np.uint8 if s.dtype == "bool" else NP[s.dtype]
                if name in self._call_buffers and name not in given:
                    outs[name] = direct[name]  # the kernels wrote it
                    if not host_io.maps_in_place(rt):  # a driver that may keep a copy
                        maps.append(host_io.map_read(rt, self._call_buffers[name], s.shape,
                                                     dtype))
                    continue
                outs[name] = rt.download(self._buffer(name), s.shape, dtype, wait=False)

        try:
            self._last_events = self._launch([k for k in self.kernels if k.name not in skip],
                                             repeat, download)
        finally:
            for m in maps:
                host_io.unmap(rt, m)
            # The call's input buffers go with it (their arrays are the caller's): the
            # positions they took are set again next call.
            for name, positions in self._io_args.items():
                now = self._arg_now.get(name, {})
                for i, a in positions:
                    if a in given and a in self._call_buffers:
                        now.pop(i, None)
            self._call_buffers = {}
        self._last_times = None
        for name in self.outputs:
            if name in self.specs and self.specs[name].dtype == "bool":
                outs[name] = outs[name].astype(np.bool_)
        if self.validate:
            self.last_validation = self.check({**self._bound, **given}, outs)
            if not self.last_validation.ok:
                raise ValidationError(f"results disagree with the numpy reference: "
                                      f"{self.last_validation.worst}")
        return outs

    @property
    def last_timings(self) -> dict[str, float]:
        """Seconds each kernel of the last call took (the median over its repeats)."""
        if self._last_times is None:
            self._last_times = medians(self._last_events)
        return self._last_times

    def _launch(self, kernels: list[KernelInfo], repeat: int,
                then: Callable[[], None] | None = None) -> list[list[tuple[str, object]]]:
        """Launch `kernels` in order `repeat` times, waiting for each round; each round's
        (kernel, event) pairs (`medians` reads them).  `then` queues more commands after the
        last round's kernels, before its wait (a call's downloads)."""
        self._prepare(kernels)
        rt = self.runtime
        rounds = []
        phased = any(k.kind == "phases" for k in kernels)
        with PHASE_LOCK if phased else contextlib.nullcontext():
            for r in range(max(1, repeat)):
                events = []
                for k in kernels:
                    fresh = k.name not in self._args_set
                    if fresh:
                        self._args_set[k.name] = [self._buffer(a) for a in k.args]
                    elif r == 0 and k.name in self._io_args:
                        kernel, now = self._kernels[k.name], self._arg_now.setdefault(k.name, {})
                        for i, a in self._io_args[k.name]:
                            buf = self._buffer(a)
                            if now.get(i) is not buf:
                                kernel.set_arg(i, buf)
                                now[i] = buf
                    # A phase launch: one work-group a compute unit the driver has now.
                    size = min(k.global_size, rt.compute_units) if k.kind == "phases" \
                        else k.global_size
                    events.append((k.name, rt.launch(self._kernels[k.name], size,
                                                     k.local_size,
                                                     self._args_set[k.name] if fresh
                                                     else None)))
                    if fresh and k.name in self._io_args:
                        set_to = self._args_set[k.name]
                        self._arg_now[k.name] = {i: set_to[i] for i, _ in self._io_args[k.name]}
                    if fresh and self._call_buffers:
                        # Kept as the marker only: the list would keep a call's arrays alive.
                        self._args_set[k.name] = []
                if then is not None and r == max(1, repeat) - 1:
                    then()
                rt.finish()
                rounds.append(events)
            if phased and self._phase_checks > 0:
                self._phase_checks -= 1
                self._check_phases()
        return rounds

    def _check_phases(self) -> None:
        """Refuse a call whose phase launch stopped (its work-groups did not all run at once:
        a driver that runs them one after another); the sync buffer is cleared for another."""
        buf = self._buffer(GRID_SYNC)
        flags = self.runtime.download(buf, (SYNC_INTS,), np.int32)
        if flags[ABORT_INDEX]:
            self.runtime.fill(buf, np.int32(0), self._buffer_bytes(GRID_SYNC))
            self.runtime.finish()
            raise DeviceError(f"{self.runtime.info.label} did not run the work-groups of a "
                              "phase launch at once, and it stopped; compile with "
                              "Config(phase_launches=False) for this device")

    def _stages(self, name: str) -> bool:
        """Whether `name`'s own buffer is a host buffer over an array of ours (`_staged`): an
        input that may be read in place, on a driver for which such a buffer is the array."""
        return (name in self._io and name in self._input_order
                and host_io.maps_in_place(self.runtime))

    def _upload(self, name: str, arr: np.ndarray) -> None:
        """A call's input into its own buffer: by numpy into a staged one (the previous
        call's kernels have finished with it), else a copy queued before the kernels."""
        buf = self._buffer(name)
        staged = self._staged.get(name)
        if staged is not None:
            np.copyto(staged, arr.reshape(staged.shape), casting="no")
        else:
            self.runtime.upload(buf, arr, wait=False)

    def _in_place(self, given: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The given inputs that kernels may read where they are (`_host_io`): aligned as
        the driver aligns a buffer, and not bound (`bind` takes those out of `_io`)."""
        return {n: a for n, a in given.items()
                if n in self._io and host_io.in_place(a, self.runtime)}

    def _out_in_place(self, kept: set[str]) -> dict[str, tuple[np.ndarray, object]]:
        """Arrays (and their buffers) for the outputs the kernels of this call write in
        place (`host_io.OutputArrays`): not those a bound kernel wrote once (`kept`), nor an
        input (`_io` holds no halo nor pooled buffer)."""
        out = {}
        for n in self.outputs:
            if n not in self._io or n in kept or n in self._input_order or \
                    not self.specs[n].nbytes:
                continue
            s = self.specs[n]
            out[n] = self._outputs.take(n, s.shape, np.uint8 if s.dtype == "bool"
                                        else NP[s.dtype])
        return out

    def _inputs(self, arrays: Mapping[str, np.ndarray], *, partial: bool = False,
                views: bool = False) -> dict[str, np.ndarray]:
        """The given arrays checked against the inputs' shapes, in their element types,
        contiguous for upload (`views`: as given where the type is right)."""
        out = {}
        # A model's call gives one input of a hundred (the others bound): its own, in order.
        names = self.inputs if not partial else \
            sorted((n for n in arrays if n in self._input_order), key=self._input_order.get)
        for name in names:
            s = self.specs[name]
            if name not in arrays:
                raise TileError(f"no array given for input {name} (shape {list(s.shape)})")
            a = np.asarray(arrays[name])
            if tuple(a.shape) != tuple(s.shape):
                raise TileError(f"input {name} has shape {list(a.shape)}; the program was "
                                f"compiled for {list(s.shape)}")
            a = a.astype(NP[s.dtype], copy=False)
            if s.dtype == "bool":
                a = a.astype(np.uint8)
            out[name] = a if views else contiguous(a)
        extra = [n for n in arrays if n not in self._input_order]
        if extra:
            raise TileError(f"unknown input {sorted(extra)[0]} (inputs: "
                            f"{', '.join(self.inputs)})")
        return out

    def gflops(self) -> dict[str, float]:
        return {k.name: k.flops / self.last_timings[k.name] * 1e-9
                for k in self.kernels if self.last_timings.get(k.name)}


def medians(rounds: list[list[tuple[str, object]]]) -> dict[str, float]:
    """Each kernel's median seconds over the rounds `Launcher._launch` returned."""
    times: dict[str, list[float]] = {}
    for events in rounds:
        for name, ev in events:
            times.setdefault(name, []).append(event_seconds(ev))
    return {n: statistics.median(v) for n, v in times.items()}
