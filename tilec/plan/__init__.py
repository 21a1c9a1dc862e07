"""The planner: a checked `ir.Program` in, kernel plans with tiles and schedules out.

flatten (index polynomials -> stride tables), reduce/defract (rewrites of contractions), fuse
(`KernelPlan`: contractions with their elementwise post-ops), the hardware model (`hw`, derived
from a device's queries in `hw_device`), the cost model and tile search, and the schedule
(threads, accumulators, local buffers, vector width).  Pure: no device, no OpenCL."""
