"""A call's inputs and outputs in the caller's memory, on devices whose buffers are host
memory (PoCL's CPU devices): a buffer made over a numpy array (CL_MEM_USE_HOST_PTR) is the
array itself to the driver, so kernels read an input where the caller keeps it and write an
output into the array the call returns, instead of copies into and out of the executable's
own buffers (`Config.host_io`, `launch.Launcher`).

Copies cost a call more than its launch on large tensors: the seed conv at 224x224 (12.8 MB
in and out) took 2.9 ms more a call on the Zen 4 with them.  An input is read in place only
where it starts at the alignment the driver gives its own buffers (MEM_BASE_ADDR_ALIGN):
the generated kernels' vector reads may assume it.  `aligned_empty` makes such arrays; the
outputs are made so.  Whether a mapped host buffer is the array itself is asked of the
driver once (`maps_in_place`); where it is not, each output is mapped after the kernels, as
OpenCL promises the host's view of such a buffer only through a map."""

from __future__ import annotations

import math
import sys
import weakref
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..errors import DeviceError


def aligned_empty(shape: Iterable[int], dtype="float32", align: int = 4096) -> np.ndarray:
    """An uninitialised C-order array whose data starts at a multiple of `align` bytes: on a
    CPU device a call reads such an input where it is (`Config.host_io`), no copy."""
    shape = tuple(int(d) for d in shape)
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    raw = np.empty(nbytes + align, np.uint8)
    start = -address(raw) % align
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def address(array: np.ndarray) -> int:
    """Where `array`'s data starts (`ndarray.ctypes` costs microseconds a call)."""
    return array.__array_interface__["data"][0]


def in_place(array: np.ndarray, runtime: Any) -> bool:
    """Whether kernels may read `array` where it is: C-contiguous, not empty, aligned."""
    return bool(array.size) and array.flags.c_contiguous and \
        address(array) % runtime.base_align == 0


def host_buffer(runtime: Any, array: np.ndarray, read_only: bool = False) -> Any:
    """A buffer whose memory is `array`'s (C-contiguous, not empty); `read_only` for an
    input no kernel writes (the caller's array may be read-only)."""
    cl = runtime.cl
    access = cl.mem_flags.READ_ONLY if read_only else cl.mem_flags.READ_WRITE
    try:
        return cl.Buffer(runtime.context, access | cl.mem_flags.USE_HOST_PTR, hostbuf=array)
    except cl.Error as e:
        raise DeviceError(f"cannot make a buffer over a {array.nbytes}-byte array on "
                          f"{runtime.info.label}: {e}") from None


_IN_PLACE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def maps_in_place(runtime: Any) -> bool:
    """Whether a `host_buffer` is the array itself to the driver (asked once a runtime): the
    map of a buffer made over an array is that array's memory.  Then a call's outputs hold
    what the kernels wrote when it finishes, no map needed."""
    known = _IN_PLACE.get(runtime)
    if known is not None:
        return known
    cl, queue = runtime.cl, runtime.queue
    array = np.zeros(256, np.float32)
    try:
        mapped, _ = cl.enqueue_map_buffer(queue, host_buffer(runtime, array), cl.map_flags.READ,
                                          0, array.shape, array.dtype, is_blocking=True)
        same = address(mapped) == address(array)
        mapped.base.release(queue)
        queue.finish()
    except (cl.Error, DeviceError):
        same = False
    _IN_PLACE[runtime] = same
    return same


def map_read(runtime: Any, buf: Any, shape: tuple[int, ...], dtype) -> Any:
    """Queue a read map of `buf` (a `host_buffer`); after the next `finish` its array holds
    what the kernels wrote.  Returns the map, for `unmap` after that `finish`."""
    cl = runtime.cl
    mapped, ev = cl.enqueue_map_buffer(runtime.queue, buf, cl.map_flags.READ, 0, shape, dtype,
                                       is_blocking=False)
    runtime._pending.append(ev)
    return mapped


def unmap(runtime: Any, mapped: Any) -> None:
    """Queue the unmap of a `map_read` (done by the next `finish`)."""
    runtime._pending.append(mapped.base.release(runtime.queue))


class OutputArrays:
    """The arrays a call's outputs are written into, by output name.  An array a caller has
    let go of (no array of theirs is a view of its memory any more) is written again by the
    next call, with the buffer made over it: no new memory for the kernels to fault in and
    no new buffer for the driver; one still held is left alone and a new one made."""

    def __init__(self, runtime: Any):
        self.runtime = runtime
        self._held: dict[str, tuple[np.ndarray, Any]] = {}  # name -> (memory, its buffer)
        self._alone: dict[str, int] = {}  # references to the memory when nobody else's

    def take(self, name: str, shape: tuple[int, ...], dtype) -> tuple[np.ndarray, Any]:
        """A new array for output `name` and the buffer whose memory it is."""
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        if name not in self._held or self._refs(name) != self._alone[name] or \
                self._held[name][0].nbytes != nbytes:
            memory = aligned_empty((nbytes,), np.uint8, self.runtime.base_align)
            self._held[name] = (memory, host_buffer(self.runtime, memory))
            del memory
            self._alone[name] = self._refs(name)
        # A view: every view of it (numpy makes a view's base the memory's owner) counts.
        return self._held[name][0].view(dtype).reshape(shape), self._held[name][1]

    def _refs(self, name: str) -> int:
        # Views of the memory name its owner (the unaligned block `aligned_empty` cut it
        # from) as their base: the owner's references count the caller's arrays.
        return sys.getrefcount(self._held[name][0].base)
