"""Hardware models: shipped files, the TOML schema's errors, derivation from OpenCL devices,
and MegEngine's CPU blocking."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from tilec.errors import HardwareModelError
from tilec.plan.hw import HwModel, list_models, register_tile_for
from tilec.plan.hw_device import auto, from_device

SHIPPED = ["adreno-640", "intel-uhd", "mali-g52", "nvidia-h100", "pocl-cpu", "seed-example"]

VALID = """\
name = "board"
kind = "gpu"
threads = 128
mem_width = 64
max_mem = 16384
max_regs = 16384
goal_groups = 8
goal_flops_per_byte = 10.0
staging = "local"
vec_size = 4
"""


def write(tmp_path: Path, text: str, name: str = "board.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def load_error(tmp_path: Path, text: str) -> str:
    with pytest.raises(HardwareModelError) as info:
        HwModel.load(write(tmp_path, text))
    return str(info.value)


# -- shipped models ----------------------------------------------------------------------------

def test_list_models_names_the_shipped_files() -> None:
    assert set(SHIPPED) <= set(list_models())


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_model_loads(name: str) -> None:
    model = HwModel.load(name)
    assert model.name == name
    assert model.source
    assert name in model.describe()
    hash(model)  # frozen and hashable: used as a cache key


def test_seed_example_has_exactly_the_seed_values() -> None:
    m = HwModel.load("seed-example")
    assert (m.kind, m.threads, m.mem_width, m.goal_groups, m.goal_flops_per_byte) == (
        "gpu", 256, 32, 20, 20.0)
    assert (m.max_mem, m.max_regs, m.vec_size, m.staging) == (16384, 16384, 1, "local")
    assert m.elem_size("float32") == 4


def test_load_by_path_equals_load_by_name() -> None:
    path = Path(__file__).resolve().parents[2] / "hwmodels" / "nvidia-h100.toml"
    assert HwModel.load(path) == HwModel.load(str(path)) == HwModel.load("nvidia-h100")


def test_unknown_model_name_lists_the_shipped_ones() -> None:
    with pytest.raises(HardwareModelError) as info:
        HwModel.load("nvidia-h10")
    assert "nvidia-h100" in str(info.value) and "pocl-cpu" in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(HardwareModelError, match="nope.toml"):
        HwModel.load(tmp_path / "nope.toml")


# -- schema errors -----------------------------------------------------------------------------

def test_valid_file_with_defaults(tmp_path: Path) -> None:
    m = HwModel.load(write(tmp_path, VALID))
    assert (m.name, m.threads, m.vec_size, m.registers, m.peak_gflops) == ("board", 128, 4, 0, 0.0)
    assert m.elem_size("float16") == 2


def test_missing_field(tmp_path: Path) -> None:
    msg = load_error(tmp_path, VALID.replace("threads = 128\n", ""))
    assert "board.toml" in msg and "'threads'" in msg and "missing" in msg


def test_ill_typed_field(tmp_path: Path) -> None:
    msg = load_error(tmp_path, VALID.replace("threads = 128", 'threads = "many"'))
    assert "board.toml:3:1" in msg and "'threads'" in msg and "integer" in msg and "many" in msg


def test_float_where_integer_is_needed(tmp_path: Path) -> None:
    msg = load_error(tmp_path, VALID.replace("mem_width = 64", "mem_width = 64.0"))
    assert "board.toml:4:" in msg and "'mem_width'" in msg


def test_unknown_field(tmp_path: Path) -> None:
    msg = load_error(tmp_path, VALID + "thread_count = 4\n")
    assert "board.toml:11:1" in msg and "'thread_count'" in msg and "unknown" in msg


def test_misspelt_field_gets_a_suggestion(tmp_path: Path) -> None:
    msg = load_error(tmp_path, VALID + "l1_byte = 4\n")
    assert "'l1_byte'" in msg and "l1_bytes" in msg


def test_bad_staging(tmp_path: Path) -> None:
    msg = load_error(tmp_path, VALID.replace('"local"', '"shared"'))
    assert "board.toml:9:1" in msg and "'staging'" in msg and "shared" in msg


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("threads = 128", "threads = 96", "threads"),
        ("threads = 128", "threads = 0", "threads"),
        ("vec_size = 4", "vec_size = 3", "vec_size"),
        ('kind = "gpu"', 'kind = "fpga"', "kind"),
        ("goal_groups = 8", "goal_groups = 0", "goal_groups"),
        ("goal_flops_per_byte = 10.0", "goal_flops_per_byte = -1", "goal_flops_per_byte"),
        ("max_regs = 16384", "max_regs = true", "max_regs"),
    ],
)
def test_bad_values(tmp_path: Path, old: str, new: str, field: str) -> None:
    msg = load_error(tmp_path, VALID.replace(old, new))
    assert "board.toml" in msg and repr(field) in msg


def test_bad_elem_bytes(tmp_path: Path) -> None:
    msg = load_error(tmp_path, VALID + "\n[elem_bytes]\nfloat32 = 3\n")
    assert "board.toml:12:" in msg and "'elem_bytes'" in msg


def test_elem_bytes_table_overrides_defaults(tmp_path: Path) -> None:
    m = HwModel.load(write(tmp_path, VALID + "\n[elem_bytes]\nfloat16 = 4\nfloat64 = 8\n"))
    assert (m.elem_size("float16"), m.elem_size("float64"), m.elem_size("int32")) == (4, 8, 4)
    with pytest.raises(HardwareModelError, match="complex64"):
        m.elem_size("complex64")


def test_cpu_model_needs_register_facts(tmp_path: Path) -> None:
    cpu = VALID.replace('"gpu"', '"cpu"').replace('"local"', '"global"')
    msg = load_error(tmp_path, cpu)
    assert "board.toml" in msg and "'registers'" in msg
    msg = load_error(tmp_path, cpu + "registers = 16\nl1_bytes = 32768\n")
    assert "'l2_bytes'" in msg


def test_toml_syntax_error_names_file_line_and_column(tmp_path: Path) -> None:
    msg = load_error(tmp_path, VALID.replace("max_mem = 16384", "max_mem = = 16384"))
    assert "board.toml:5:" in msg and "syntax" in msg
    assert "max_mem = = 16384" in msg  # the source line is quoted under the message


def test_not_a_toml_file_at_all(tmp_path: Path) -> None:
    msg = load_error(tmp_path, "threads: 256\n")
    assert "board.toml:1:" in msg


def test_models_built_in_code_are_checked_too() -> None:
    base = HwModel.load("seed-example")
    with pytest.raises(HardwareModelError, match="'threads'"):
        dataclasses.replace(base, threads=100)
    assert dataclasses.replace(base, elem_bytes={"float16": 4}).elem_size("float16") == 4


def test_to_toml_round_trips() -> None:
    for name in SHIPPED:
        model = HwModel.load(name)
        assert HwModel.loads(model.to_toml(), f"{name}-copy.toml") == model


# -- CPU blocking (seed 004) -------------------------------------------------------------------

def test_pocl_cpu_blocking() -> None:
    m = HwModel.load("pocl-cpu")
    mr, nr = m.register_tile()
    v = m.vec_size
    assert nr % v == 0
    assert mr * nr // v + nr // v + 1 <= m.registers  # accumulators + B row + A broadcast
    assert (mr, nr) == (6, 16)  # the classic AVX2 sgemm micro-kernel
    assert mr * nr * m.elem_size("float32") <= m.max_regs
    kr = m.kr()
    assert kr == 32768 // ((6 + 16) * 4) == 372
    assert (mr + nr) * kr * 4 <= m.l1_bytes
    nb = m.nr_block()
    assert nb % nr == 0 and nb * kr * 4 <= m.l2_bytes - m.l1_bytes
    assert nb == 672


@pytest.mark.parametrize(("registers", "vec"), [(16, 8), (32, 16), (32, 4), (16, 1), (8, 4)])
def test_register_tile_fits(registers: int, vec: int) -> None:
    mr, nr = register_tile_for(registers, vec)
    assert mr >= 1 and nr % vec == 0
    assert mr * nr // vec + nr // vec + 1 <= registers


def test_blocking_needs_cpu_facts() -> None:
    with pytest.raises(HardwareModelError, match="registers"):
        HwModel.load("seed-example").register_tile()
    with pytest.raises(HardwareModelError, match="registers"):
        HwModel.load("nvidia-h100").kr()  # a GPU model may record L1 but has no register tile
    with pytest.raises(HardwareModelError, match="l1_bytes, l2_bytes"):
        HwModel.load("seed-example").nr_block()


# -- from_device -------------------------------------------------------------------------------

def fake_device(**queries: object) -> SimpleNamespace:
    platform = SimpleNamespace(name="Fake", version="OpenCL 3.0 fake")
    return SimpleNamespace(platform=platform, **queries)


def test_from_device_gpu_rules() -> None:
    h100 = fake_device(
        name="NVIDIA H100 80GB HBM3", type=4, max_compute_units=132, max_work_group_size=1024,
        local_mem_size=49152, local_mem_type=1, global_mem_cacheline_size=128,
        global_mem_cache_size=4325376, preferred_vector_width_float=1, max_clock_frequency=1980,
    )
    m = from_device(h100)
    assert (m.kind, m.staging, m.threads, m.mem_width) == ("gpu", "local", 256, 128)
    assert (m.max_mem, m.goal_groups, m.vec_size, m.compute_units) == (24576, 528, 4, 132)
    assert m.name == "device:nvidia-h100-80gb-hbm3" and m.device_name == "NVIDIA H100 80GB HBM3"


def test_from_device_emulated_local_memory_means_global_staging() -> None:
    mali = fake_device(name="Mali-G52", type=4, max_compute_units=2, max_work_group_size=384,
                       local_mem_size=32768, local_mem_type=2, global_mem_cacheline_size=64)
    m = from_device(mali)
    assert (m.staging, m.threads) == ("global", 256)


def test_from_device_tolerates_failing_queries() -> None:
    class Stubborn:
        name = "odd"
        type = 4

        def __getattr__(self, attr: str) -> object:
            raise RuntimeError(f"{attr}: CL_INVALID_VALUE")

    m = from_device(Stubborn())
    assert (m.kind, m.threads, m.mem_width) == ("gpu", 256, 64)


def pocl_cpu_device():  # type: ignore[no-untyped-def]
    cl = pytest.importorskip("pyopencl")
    try:
        platforms = cl.get_platforms()
    except Exception as exc:  # PLATFORM_NOT_FOUND_KHR without the pocl extra
        pytest.skip(f"no OpenCL platform: {exc}")
    for platform in platforms:
        for device in platform.get_devices():
            if device.type & cl.device_type.CPU:
                return device
    pytest.skip("no OpenCL CPU device")


@pytest.mark.device
def test_from_device_on_the_pocl_cpu() -> None:
    m = from_device(pocl_cpu_device())
    assert (m.kind, m.staging, m.threads) == ("cpu", "global", 1)
    assert m.vec_size in (4, 8, 16)
    assert m.compute_units >= 1 and m.goal_groups >= m.compute_units
    assert m.registers in (16, 32) and m.l2_bytes > m.l1_bytes > 0
    mr, nr = m.register_tile()
    assert mr * nr // m.vec_size + nr // m.vec_size + 1 <= m.registers
    assert mr * nr * 4 <= m.max_regs
    assert m.kr() >= 16 and m.nr_block() >= nr
    assert HwModel.loads(m.to_toml()) == m
    assert m.device_name in m.describe()


@pytest.mark.device
def test_auto_with_the_pocl_cpu() -> None:
    device = pocl_cpu_device()
    assert auto(device) == from_device(device)
