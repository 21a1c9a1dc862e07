"""Flat contractions built by hand, for planner tests that must not depend on the flattener."""

from tilec.plan.flat import FlatContraction, FlatTensor


def seed_flat(n: int = 32) -> FlatContraction:
    """Seed 001's convolution table (DESIGN.md): ci co i j n x y over O, D, K."""
    names = ("ci", "co", "i", "j", "n", "x", "y")
    ranges = (64, 64, 3, 3, n, 224, 224)
    out = FlatTensor("O", (0, 1, 0, 0, 3211264, 14336, 64), 0)
    d = FlatTensor("D", (1, 0, 14336, 64, 3211264, 14336, 64), -14400)
    k = FlatTensor("K", (1, 64, 12288, 4096, 0, 0, 0), 0)
    return FlatContraction(names, ranges, (out, d, k))


def matmul_flat(m: int, n: int, k: int) -> FlatContraction:
    out = FlatTensor("C", (0, n, 1), 0)
    a = FlatTensor("A", (1, k, 0), 0)
    b = FlatTensor("B", (n, 0, 1), 0)
    return FlatContraction(("k", "m", "n"), (k, m, n), (out, a, b))
