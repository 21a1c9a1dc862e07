"""The runtime: OpenCL through pyopencl.

`device` chooses and probes a device and builds, launches and times kernels; `cache` keeps built
programs (in process and on disk); `memory` plans the buffer pool by liveness; `launch` runs a
sequence of kernels with buffers, bound inputs, poisoned outputs and validation."""
