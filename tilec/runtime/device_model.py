"""The hardware model a compile plans for (`hw_model_for`): the one given, a named one, or the
device's own, measured on its first use (`calibrate`); and the device opened ahead, in a
thread, while a compile reads and checks its program (`open_ahead`)."""

from __future__ import annotations

import atexit
import threading
import warnings
from dataclasses import replace

from ..config import Config
from ..errors import DeviceError, TileError, TileWarning
from ..plan.hw import HwModel
from ..plan.hw_device import from_device
from .device import (
    _RUNTIMES,
    Runtime,
    _several_kinds,
    all_devices,
    describe,
    split_index,
)

_AHEAD: dict[str | None, threading.Thread] = {}


def open_ahead(config: Config, hw: HwModel | str | None = None) -> None:
    """Open the device of `config` in a thread while the caller reads and checks its program:
    the device probe and, where the compile will calibrate the device, the first launch of
    each calibration kernel (`calibrate.warm`).  On a CPU both are PoCL generating code for
    small kernels, one core for 1-2 s on a machine's first compile, which the model's
    reading, parsing and checking (about a second for resnet50) then hide.  What fails
    here is left for the compile to meet and report (it opens the device itself)."""
    spec = config.device
    if spec in _RUNTIMES or spec in _AHEAD:
        return
    try:
        devices = all_devices()
    except DeviceError:
        return  # the compile says so
    if spec:
        want, index = split_index(spec)
        devices = [d for d in devices if want.lower() in describe(d).label.lower()]
        devices = devices[index:index + 1]
    if not devices or any(_several_kinds(d) for d in devices):
        # A simulator's runtime is left to the compile's own thread: Oclgrind's crashed on
        # a context another thread had opened.
        return

    def work() -> None:
        try:
            runtime = Runtime.get(spec)
            if measures_device(hw, config, runtime):
                from .calibrate import warm

                warm(runtime.context, runtime.device, runtime.vector_limit)
        except Exception:  # noqa: BLE001, S110 - the compile's own open reports it
            pass

    thread = threading.Thread(target=work, name="tilec-open-device", daemon=True)
    if not _AHEAD:
        # A process that ends early (a program with an error) waits for the driver's calls
        # in flight: a daemon thread stopped inside them could leave the driver's locks held
        # for its own exit handlers.
        atexit.register(_join_ahead)
    _AHEAD[spec] = thread
    thread.start()


def _join_ahead() -> None:
    for thread in list(_AHEAD.values()):
        thread.join(timeout=60)


def measures_device(hw: HwModel | str | None, config: Config, runtime: Runtime) -> bool:
    """Whether `hw_model_for` will measure the device (`calibrate`) when called now: its own
    model, calibrated as `config.calibrate` says, and nothing stored for it yet."""
    from .calibrate import stored

    if isinstance(hw, HwModel) or ((hw or config.hw) not in (None, "auto")) or \
            config.calibrate is False:
        return False
    # A CPU or GPU is measured on first use unless told otherwise.  A CPU's PoCL build
    # decides whether fma() and vloadN are instructions or calls (2-7x on every kernel),
    # which no query shows; a GPU without a measured peak rate and bandwidth is ranked
    # by PlaidML's score, whose picks ran 2-4x slower on an H200 (vgg11 at batch 1:
    # 2.62 ms against 1.47 calibrated, its first fully connected layer 0.59 against
    # 0.13 ms).  Under a second on an H200, once per device and driver.  Other devices
    # only when asked: an accelerator, or a simulator (Oclgrind calls itself a CPU, a GPU
    # and an accelerator at once, and fails the calibration's queries), whose timings
    # mean nothing.
    measure = config.calibrate or (runtime.info.kind in ("cpu", "gpu")
                                   and not _several_kinds(runtime.device))
    return bool(measure) and stored(runtime.info) is None


def hw_model_for(hw: HwModel | str | None, config: Config, runtime: Runtime) -> HwModel:
    """The hardware model to plan for: the one given, the named one, or the device's own
    (its queries, vectors capped at the width the probe saw computed correctly, and its
    calibration as `config.calibrate` says)."""
    limit = runtime.vector_limit
    if config.vector_width and limit and config.vector_width > limit:
        raise TileError(f"vector width {config.vector_width}: {runtime.info.label} computes "
                        f"vectors wider than {limit} wrongly (the device probe checks every "
                        f"lane); use {limit} or less")
    if isinstance(hw, HwModel):
        model = hw
    elif (name := hw or config.hw) and name != "auto":
        model = HwModel.load(name)
    else:
        from .calibrate import apply, calibration_for

        model = from_device(runtime.device, max_vec=limit)
        if config.calibrate is False:
            return model
        measure = measures_device(hw, config, runtime)
        if measure:
            # The kernels' first launches in flight (`open_ahead`) end before the timing.
            ahead = _AHEAD.get(config.device)
            if ahead is not None:
                ahead.join()
        return apply(model, calibration_for(runtime, measure=measure))
    if limit and model.vec_size > limit and not config.vector_width:
        # A model written for another device would make kernels that compute wrong results
        # here: plan narrower vectors, and say so.
        warnings.warn(TileWarning(
            f"hardware model {model.name!r} plans {model.vec_size}-wide vectors, but "
            f"{runtime.info.label} computes vectors wider than {limit} wrongly: planning "
            f"{limit}-wide ones"), stacklevel=3)
        model = replace(model, vec_size=limit,
                        source=f"{model.source}; vectors capped at {limit} for this device")
    return model
