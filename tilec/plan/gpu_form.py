"""Two GPU code forms for contractions staged in local memory, chosen with the schedule.

Runs: a thread's accumulator points along one output index that is not the vector index come
in runs of `RUN` consecutive values (a 128-wide tile on 16 threads: points 4h..4h+3 and
64+4h..64+4h+3), so an input laid out along that index in local memory is read as one aligned
vector per run instead of one scalar per point.  A matmul's 8x8 register tile then needs four
vector reads of local memory per 64 multiply-adds rather than eight; the scalar reads, not the
multiply-adds, were what held the 4x16 tile at 0.73 of cuBLAS on an H200 (8x8 with runs: 0.80).

Pipeline: the reduction loop is software-pipelined.  Each thread reads the next reduction
tile's staging elements from global memory into registers before computing on the current
tile, and writes them into the other half of a double-buffered local array afterwards; one
barrier per tile instead of two, and the global latency hidden behind the arithmetic (0.80 ->
0.84 of cuBLAS for the matmul above).  It applies where every staged tile is copied by at most
`PIPELINE_COPIES` elements a thread (they are held in registers) and the doubled tiles fit the
device's local memory."""

from __future__ import annotations

from dataclasses import dataclass

from .flat import FlatContraction

RUN = 4
PIPELINE_COPIES = 16
# The first tile's read is not hidden, and the doubled local tiles can halve the work-groups
# an SM holds: with two reduction tiles (the seed conv at N=1 56x56, ci 64 in tiles of 32)
# the pipelined kernel ran 1.17x slower on an H200; from 18 tiles on it ran 1.13x faster.
PIPELINE_MIN_TRIPS = 4


@dataclass(frozen=True)
class RunChoice:
    index: int  # the flat output index whose points come in runs
    input: int  # the input read a run at a time (its local stride along `index` is 1)


def run_step(a: int, threads: int) -> int:
    """Where a thread's point a along a run index lies from its first point: runs of RUN
    consecutive values, neighbouring threads on neighbouring runs."""
    return a % RUN + (a // RUN) * threads * RUN


def run_candidates(flat: FlatContraction, tile: tuple[int, ...], vec_index: int | None,
                   stage) -> list[RunChoice]:
    """The output indices and inputs that can take runs, the output's lowest-stride index
    first.  The input must not depend on the vector index (its value per point is then a
    scalar, a component of the run's vector) and its staged layout, widened for runs, must put
    the index at local stride 1 with every other local stride and the base a multiple of `RUN`
    (aligned vector reads).  `stage` is `schedule.stage_input`."""
    out = []
    for k in sorted(flat.out_indices, key=lambda k: abs(flat.output.strides[k])):
        if k == vec_index or tile[k] % RUN:
            continue
        for i, t in enumerate(flat.inputs):
            if t.strides[k] == 0 or t.dtype not in ("float32", "int32"):
                continue
            if vec_index is not None and t.strides[vec_index] != 0:
                continue
            st = stage(flat, tile, i, k, RUN)
            if st.local_strides[k] != 1 or st.local_base % RUN:
                continue
            # Indices whose tile is one point never move a read (their local stride is moot).
            if all(ls % RUN == 0 for j, ls in enumerate(st.local_strides)
                   if j != k and tile[j] > 1):
                out.append(RunChoice(k, i))
                break
    return out


def pipeline_fits(copies: list[int], buffers: list[int], wg_threads: int, trips: int,
                  local_mem_bytes: int) -> bool:
    """Whether the pipelined loop applies: PIPELINE_MIN_TRIPS reduction tiles or more, every
    staged tile
    (`copies` elements each) copied by at most PIPELINE_COPIES elements a thread, the doubled
    local buffers (`buffers` elements each, 4-byte, each half rounded up to a whole vector)
    within the device's local memory."""
    if trips < PIPELINE_MIN_TRIPS or not copies:
        return False
    if any(e > PIPELINE_COPIES * wg_threads for e in copies):
        return False
    need = sum(2 * 4 * (-(-e // RUN) * RUN) for e in buffers)
    return not local_mem_bytes or need <= local_mem_bytes
