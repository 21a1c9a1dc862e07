"""Session-wide test settings."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_program_cache(tmp_path_factory):
    """Keep every test's program binaries out of the user's cache directory: a Config without
    `cache_dir` gets a directory of this session instead."""
    from tilec import memo
    from tilec.runtime import cache

    root = tmp_path_factory.mktemp("tilec-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(memo, "default_cache_root", lambda: root)
        mp.setattr(cache, "default_cache_root", lambda: root)
        yield root


# How much of the long randomised runs to do.  CI runs the defaults (a bounded share); the full
# runs reported in the issue are, for example:
#   pytest tests/test_fuzz.py --fuzz-inputs 7000          (per fuzz test; three tests)
#   pytest tests/test_differential.py --diff-programs 1000
#   python benchmarks/oclgrind_check.py                   (every kernel under oclgrind)
FUZZ_INPUTS_CI = 300
DIFF_PROGRAMS_CI = 120


def pytest_addoption(parser):
    group = parser.getgroup("tilec", "tilec's randomised tests")
    group.addoption("--fuzz-inputs", type=int, default=FUZZ_INPUTS_CI,
                    help="inputs per fuzz test (hypothesis examples)")
    group.addoption("--diff-programs", type=int, default=DIFF_PROGRAMS_CI,
                    help="random programs the differential test compiles and runs")
    group.addoption("--diff-start", type=int, default=0,
                    help="first seed of the differential programs (to reproduce one: "
                         "--diff-start N --diff-programs 1)")


def pytest_generate_tests(metafunc):
    if "diff_seed" in metafunc.fixturenames:
        start = metafunc.config.getoption("--diff-start")
        count = metafunc.config.getoption("--diff-programs")
        metafunc.parametrize("diff_seed", range(start, start + count))


@pytest.fixture
def fuzz_inputs(request) -> int:
    return request.config.getoption("--fuzz-inputs")


def pytest_terminal_summary(terminalreporter):
    from .progen import TALLY

    if TALLY:
        terminalreporter.section("tilec randomised runs")
        for key in sorted(TALLY):
            terminalreporter.write_line(f"{key}: {TALLY[key]}")
