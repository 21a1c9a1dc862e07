"""Settings that travel explicitly through the pipeline; no stage reads the environment."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_CACHE_MAX_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Config:
    device: str | None = None  # substring of "platform: device"; None = GPU if any, else PoCL
    hw: str | None = None  # hardware model name or .toml path; None = derived from the device
    top_k: int = 8
    # Forced choices, for tests and `--tile`: kernel name or output tensor -> {index: size}.
    tiles: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    vector_width: int | None = None  # None = the hardware model's; 1 disables vectors
    staging: str | None = None  # None = the hardware model's; "local" or "global"
    threads: int | None = None  # None = the hardware model's
    # Threads on a reduction index, partial results combined in local memory (`schedule.
    # split_choice`): None = where a GPU / local-staging model leaves most threads idle, False =
    # never, True = always where the aggregation allows, an int = that many threads.
    split_reduction: bool | int | None = None
    # Sums with few outputs and a long reduction as partial sums over parts of the reduction
    # and their sum (`plan.splitk`, split-K): None = on GPU models, where the time model
    # predicts both kernels faster than the contraction as written (True: the same); False =
    # never; an int >= 2 = that many parts for every contraction that can be split (any
    # device).
    split_k: bool | int | None = None
    # Processes that weigh the split-K part counts of a model's contractions at once (each
    # a few tile searches): None = one a core (at most 8) where there are 4 cores or more,
    # 0 or 1 = in this process.
    search_workers: int | None = None
    # GPU forms of staged contractions (`plan.gpu_form`): runs of accumulator points read as one
    # vector from local memory, and the reduction loop pipelined (next tile read into registers
    # during this one, local tiles double-buffered).  None = on GPU models, False = never,
    # True = wherever inputs are staged in local memory.
    gpu_forms: bool | None = None
    # How the search ranks tiles: "time" = the predicted time (`plan.predict`, GPU models with a
    # peak and a bandwidth; others fall back to PlaidML's score), "plaidml" = PlaidML's score.
    cost_model: str = "time"
    # Chains of reductions over the same rows and their elementwise statements (softmax,
    # normalisations) as one kernel a row per work-group (`plan.rows`); False: one kernel each.
    row_fusion: bool = True
    # CPU matrix products read their reused operand from panels packed contiguous first
    # (`plan.pack`); False: as written.
    pack_panels: bool = True
    # Zero-padded reads of tensors the program computes (a padded convolution's input) read
    # a buffer with a zero border instead, the tensor written inside it (`plan.halo`), so
    # the kernel tests no bounds: a padded convolution's code is half as long and PoCL makes
    # its machine code 3-4x faster (resnet50 cold 1.2 s sooner on a 2-core Zen 3 and on a
    # 16-core Xeon), and the models ran as fast or faster (resnet18 0.94-0.96x the time,
    # resnet50 0.97-0.99x, squeezenet 0.97-1.00x).  None: for CPU devices (and CPU hardware
    # models); True / False: always / never.
    halos: bool | None = None
    # A graph's NCHW convolutions, and the pools, normalisations and elementwise nodes between
    # them, channels-last (`graph.channels_last`): a CPU convolution's output channels are its
    # vector lanes, stored whole in NHWC and lane by lane in NCHW (squeezenet's 55x55 3x3
    # layer: 0.25 -> 0.16 ms on a 2-core AVX-512 Xeon).  None: for CPU devices (and CPU
    # hardware models); True / False: always / never.  Graph and ONNX compiles only.
    channels_last: bool | None = None
    # Runs of small kernels (each one compute unit finishes within about a launch's cost: an
    # unrolled recurrent layer's steps, a batch-1 tail) run as one kernel of one work-group
    # that takes them in turn, barriers between them (`plan.chain`); False: one launch each.
    chains: bool = True
    # Independent kernels next to each other (a fire module's two expand convolutions) share
    # one launch, its work-groups split between them (`codegen.siblings`): a launch costs PoCL
    # 5.0 on 16 cores 30-60 us.  None: for CPU devices (and CPU hardware models); True /
    # False: always / never.  Graph and ONNX compiles only (they say which inputs are
    # constants; a `.tile` compile keeps one kernel a launch).
    sibling_launches: bool | None = None
    # Graph and ONNX compiles on PoCL's CPU driver: runs of consecutive kernels as one launch
    # of one work-group a compute unit, which meet at a barrier between kernels
    # (`codegen.phases`): the driver's 10-90 us a launch paid once; no chains are made there
    # (small kernels run on the launch's first work-group).  False: a kernel a launch.
    phase_launches: bool = True
    # On a CPU device (whose buffers are host memory): a call's outputs are new arrays the
    # kernels write in place, and inputs aligned as the driver aligns its buffers (64-128
    # bytes; `tilec.aligned_empty` makes such arrays) are read where they are, instead of
    # copies into and out of the executable's buffers.  False: copies.
    host_io: bool = True
    # CPU contractions: the last, partial tile along one output index (a 7-wide row in tiles
    # of 4) runs a register tile as wide as the range's rest, with code of its own
    # (`codegen.edge`); False: it moves back and repeats points, one copy of the loops less.
    edge_tiles: bool = True
    # A chain's repeating stages (a recurrent layer's steps) written as one loop over the
    # passes (`codegen.roll`): the text, and its build, is one step's; False: written out.
    chain_loops: bool = True
    # Attention (scores, softmax, value product) as one kernel (`plan.attention`), the scores
    # never stored.  None: where row fusion is on and the device is not a CPU; on PoCL the
    # separate kernels are faster up to long sequences (B=1 H=4 T=256: 1.6 ms against 9 ms),
    # so a CPU gets the fused kernel only when asked (True).
    attention_fusion: bool | None = None
    # The device's measured facts (`tilec devices --calibrate`: the mul-add and vector access
    # forms the codegen writes, peak rate, bandwidths, launch cost) in a model derived from
    # the device.  None: those stored for the device, a CPU or GPU without them measured on
    # first use (about 2 s on a 2-core CPU, under 1 s on an H200, once per device and driver:
    # PoCL builds differ 2-7x on what no query shows, and a GPU without a measured peak and
    # bandwidth gets PlaidML's ranking, 2-4x slower picks on an H200); True: any device
    # (a simulator, an accelerator) too; False: ignore them (the queried model alone).
    # Stored facts stay until the user calibrates again, so a compile gives the same kernels
    # every time.
    calibrate: bool | None = None
    build_options: tuple[str, ...] = ("-cl-mad-enable",)
    # The registers of a long GPU kernel's top tiles asked of the driver's compiler, where it
    # says (NVIDIA: `runtime.registers`), and the tiles ranked again with them in place of the
    # time model's estimate (`plan.registers`); False: the estimate alone.
    compiler_registers: bool = True
    # Worker processes that build a large program's parts and each kernel's code on PoCL's CPU
    # devices (`runtime.prebuild`), filling PoCL's cache for this process: None = one a
    # compute unit (at most 8), 0 or 1 = build everything in process.
    build_workers: int | None = None
    # tilec's cache root (programs live in <cache_dir>/programs); None = the user cache directory.
    # The CLI fills it from TILEC_CACHE_DIR; library code never reads the environment.
    cache_dir: Path | None = None
    use_disk_cache: bool = True
    cache_max_bytes: int = DEFAULT_CACHE_MAX_BYTES  # least recently used entries go past this
    # Drivers that keep a build cache of their own (PoCL, NVIDIA's) gain nothing from a second
    # one, and PoCL compiles every kernel again (seconds) to hand a binary out; True keeps their
    # binaries anyway (tests, benchmarks).
    disk_cache_all_drivers: bool = False
    use_tuning_records: bool = True
    # Tuning records (JSON lines); None = cache_dir/tuning.jsonl, or the user cache directory's.
    records_path: Path | None = None
    rtol: float = 1e-3
    atol: float = 1e-4

    def __post_init__(self):
        # Paths may be given as strings (as a user writes them); every stage reads them as Path.
        for name in ("cache_dir", "records_path"):
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, Path(value))
