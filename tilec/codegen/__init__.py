"""The code generator: a `KernelPlan` and a hardware model in, OpenCL C text (`KernelSource`) out.

`contraction` renders a scheduled contraction (with `copy` for staged inputs and `split` for
reductions split across threads), `elementwise` the elementwise and initialising kernels,
`clexpr` Tile expressions as OpenCL; `kernel_text` holds the kernel description and the jinja
environment.  No device: the text is built, not compiled."""
