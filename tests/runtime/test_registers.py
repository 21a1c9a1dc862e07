"""Register counts from the driver's compiler (`runtime.registers`) and the compile that uses
them (`codegen.generate.counted_plan`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import numpy as np
import pytest

from tilec import compiler
from tilec.compiler import compile as tile_compile
from tilec.config import Config
from tilec.lang.reference import evaluate_program, random_array
from tilec.plan import registers as plan_registers
from tilec.runtime.registers import RegisterCounts, parse_log, register_counter, renamed

from ..device import needs_device

LOG = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'contract_O_r0' for 'sm_90'
ptxas info    : Function properties for contract_O_r0
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 147 registers, 384 bytes cmem[0]
ptxas info    : Compiling entry function 'contract_O_r2' for 'sm_90'
ptxas info    : Function properties for contract_O_r2
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'contract_O_r1' for 'sm_90'
ptxas info    : Function properties for contract_O_r1
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 128 registers, 384 bytes cmem[0]
"""


def test_the_log_is_read_entry_by_entry() -> None:
    # r2's section says nothing: it is left out, not given r1's count.
    assert parse_log(LOG) == {"contract_O_r0": 147, "contract_O_r1": 128}
    assert parse_log("") == {}


def test_a_candidate_is_renamed_with_its_parts() -> None:
    text = ("__kernel void contract_O(int a) {}\n__kernel void contract_O_part1() {}\n"
            "// contract_OX stays\n")
    assert renamed("contract_O", text, "q3") == (
        "__kernel void contract_O_q3(int a) {}\n__kernel void contract_O_q3_part1() {}\n"
        "// contract_OX stays\n")


class _Error(Exception):
    pass


@dataclass
class _Info:
    key: tuple = ("NVIDIA CUDA", "3.0", "H200", "3.0", "580")


class _FakeCL:
    """A driver that counts a kernel's registers as 100 + its text's length % 50, refuses
    programs with "REFUSED" in them and logs as NVIDIA's does, keeping the last `keep` entries of
    a program's log."""

    Error = _Error

    def __init__(self, keep: int = 100):
        self.sources: list[str] = []
        self.keep = keep

    def Program(self, context, source):  # noqa: N802 - pyopencl's spelling
        fake = self

        class Program:
            def build(self, options, cache_dir):
                fake.sources.append(source)
                assert "-cl-nv-verbose" in options and "-cl-mad-enable" in options
                if "REFUSED" in source:
                    raise _Error("refused")
                self.log = "".join(
                    f"ptxas info : Compiling entry function '{m.group(1)}' for 'sm_90'\n"
                    f"ptxas info : Used {100 + len(m.group(2)) % 50} registers\n"
                    for m in list(re.finditer(r"void (\w+)\(\) \{(.*?)\}", source))[-fake.keep:])

            def get_build_info(self, device, what):
                return self.log

        return Program()


class _FakeRuntime:
    def __init__(self, keep: int = 100):
        self.cl = _FakeCL(keep)
        self.context = self.device = None
        self.info = _Info()


def _texts(*bodies: str) -> list[str]:
    return [f"__kernel void contract_O() {{{b}}}\n" for b in bodies]


def test_counts_are_asked_once_and_kept_on_disk(tmp_path) -> None:
    rt = _FakeRuntime()
    counts = RegisterCounts(rt, ("-cl-mad-enable",), tmp_path)
    texts = _texts("a" * 3, "b" * 7)
    assert counts("contract_O", texts) == [103, 107]
    assert counts.built == 1
    # Each entry renamed with a tag no build had (the driver's cache gives empty logs).
    names = re.findall(r"void (contract_O_q[0-9a-f]+)\(\)", rt.cl.sources[0])
    assert len(names) == 2 and len(set(names)) == 2
    assert counts("contract_O", texts[::-1]) == [107, 103]  # from memory, by text
    assert counts.built == 1
    again = RegisterCounts(rt, ("-cl-mad-enable",), tmp_path)  # another process: from disk
    assert again("contract_O", texts + _texts("c")) == [103, 107, 101]
    assert again.built == 1 and re.search(r"contract_O_q\w+\(\) \{c\}", rt.cl.sources[-1])
    assert counts("contract_O", texts)[0] == 103 and not re.search(r"\{a+\}", rt.cl.sources[-1])
    # Other build options are another key.
    other = RegisterCounts(rt, ("-cl-mad-enable", "-cl-fast-relaxed-math"), tmp_path)
    other("contract_O", texts[:1])
    assert other.built == 1


def test_a_refused_candidate_is_counted_as_unknown(tmp_path) -> None:
    rt = _FakeRuntime()
    counts = RegisterCounts(rt, ("-cl-mad-enable",), None)
    assert counts("contract_O", _texts("aa", "REFUSED", "a")) == [102, None, 101]
    assert counts.built == 4  # the program refused, then each text alone


def test_candidates_are_built_in_chunks_and_lost_entries_again() -> None:
    # The driver's log keeps the last 6 entries: of a chunk of 8, the first two are built
    # again on their own.
    rt = _FakeRuntime(keep=6)
    counts = RegisterCounts(rt, ("-cl-mad-enable",), None)
    texts = _texts(*("x" * n for n in range(1, 11)))
    assert counts("contract_O", texts) == [100 + n for n in range(1, 11)]
    assert [s.count("__kernel") for s in rt.cl.sources] == [8, 2, 1, 1]


@needs_device
def test_the_cpu_device_says_nothing() -> None:
    from tilec.runtime.device import Runtime

    rt = Runtime.get(None)
    if "cl_nv_compiler_options" in str(rt.device.extensions).split():
        pytest.skip("this device counts registers")
    assert register_counter(rt, Config()) is None


MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }"


@needs_device
def test_a_compile_takes_the_tile_the_counts_make_fastest(tmp_path, monkeypatch) -> None:
    """A GPU model's plan on this device, with a compiler that gives the time model's first
    tiles too many registers for two groups a compute unit: the kernel built is another
    tile's, says why, and computes the reference's result into a poisoned output."""
    asked: list[list[str]] = []

    def fake(runtime, config):
        def counts(name, texts):
            seen = sum(len(a) for a in asked)
            asked.append(list(texts))
            return [255 if seen + i < 4 else 96 for i in range(len(texts))]
        return counts if config.compiler_registers else None

    monkeypatch.setattr(compiler, "register_counter", fake)
    monkeypatch.setattr(plan_registers, "MIN_SECONDS", 0.0)  # a short kernel is counted too
    shapes = {"A": (4096, 64), "B": (64, 1024)}
    base = Config(hw="nvidia-h100", cache_dir=tmp_path, use_tuning_records=False,
                  split_k=False)
    plain = tile_compile(MATMUL, shapes, config=replace(base, compiler_registers=False))
    assert not asked
    exe = tile_compile(MATMUL, shapes, config=base)
    # Asked 1, 2, 4, ... at a time, until a counted tile beats every estimate left.
    assert [len(a) for a in asked] == [1, 2, 4][:len(asked)] and len(asked) == 3
    texts = [t for a in asked for t in a]
    assert len(set(texts)) == len(texts)
    assert all("__kernel" in t and "void contract_C(" in t for t in texts)
    (old,) = plain.sources
    (new,) = exe.sources
    assert new.tile != old.tile
    assert "registers as compiled" in new.cost and "registers as compiled" not in old.cost
    rng = np.random.default_rng(5)
    arrays = {n: random_array(rng, exe.program.tensors[n].shape, exe.program.tensors[n].dtype)
              for n in exe.program.inputs}
    out = exe.run(arrays, poison=True)["C"]
    ref = evaluate_program(exe.program, arrays)["C"]
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
