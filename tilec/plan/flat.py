"""The flat form of one contraction: index ranges, per-tensor stride tables with constant offsets,
and the constraints that the ranges do not imply.  Produced by `flatten`, read by the planner,
layout and code generation."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property


@dataclass(frozen=True)
class FlatTensor:
    """How one tensor is addressed: element offset = offset + sum(strides[k] * idx[k])."""

    name: str
    strides: tuple[int, ...]  # one per index of the FlatContraction, in its order
    offset: int
    dtype: str = "float32"
    size: int = 0  # elements in the buffer, for bounds checks


@dataclass(frozen=True)
class FlatConstraint:
    """sum(coeffs[k] * idx[k]) <= rhs, over the flat (zero-based) indices."""

    coeffs: tuple[int, ...]
    rhs: int

    def holds(self, point: tuple[int, ...]) -> bool:
        return sum(c * p for c, p in zip(self.coeffs, point, strict=True)) <= self.rhs


@dataclass(frozen=True)
class FlatContraction:
    """One contraction, flattened.

    `names` are the index variables (sorted; a fused index is named `a_b`), each running over
    0 .. ranges[k]-1 (the original variable is `mins[k]` + the flat one).  `tensors[0]` is the
    output, followed by the inputs in operand order.  An index is an output index when its output
    stride is non-zero.
    """

    names: tuple[str, ...]
    ranges: tuple[int, ...]
    tensors: tuple[FlatTensor, ...]
    constraints: tuple[FlatConstraint, ...] = ()
    agg: str = "+"
    comb: str | None = "*"
    mins: tuple[int, ...] = ()
    fused: tuple[tuple[str, tuple[str, ...]], ...] = ()  # fused name -> original names, major first
    output_covered: bool = True  # every output element is written by some index point
    text: str = ""
    # Every index variable of the statement as (name, min, range), before folding and fusion:
    # what `flatten.operand_strides` needs to address other tensors over the flat indices.
    index_bounds: tuple[tuple[str, int, int], ...] = ()
    # Indices of a padded window read through a zero border instead of under constraints
    # (`plan.halo`): no bounds test, but tiled as the constrained window would be (the
    # search's ranking, the vector index, the loop order: `schedule.constrained`).
    windowed: tuple[int, ...] = ()
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def output(self) -> FlatTensor:
        return self.tensors[0]

    @property
    def inputs(self) -> tuple[FlatTensor, ...]:
        return self.tensors[1:]

    @cached_property  # the searches ask for them of every tile
    def out_mask(self) -> tuple[bool, ...]:
        return tuple(s != 0 for s in self.output.strides)

    @cached_property  # the searches ask for them of every tile
    def out_indices(self) -> tuple[int, ...]:
        return tuple(k for k, s in enumerate(self.output.strides) if s != 0)

    @cached_property  # the searches ask for them of every tile
    def reduce_indices(self) -> tuple[int, ...]:
        return tuple(k for k, s in enumerate(self.output.strides) if s == 0)

    @property
    def points(self) -> int:
        n = 1
        for r in self.ranges:
            n *= r
        return n

    def table(self) -> str:
        """The seed's table: index, range, then each tensor's stride; an `off` row last."""
        head = f"{'':>8}{'Range':>10}" + "".join(f"{t.name:>10}" for t in self.tensors)
        rows = [head]
        for k, name in enumerate(self.names):
            rows.append(f"{name:>8}{self.ranges[k]:>10}"
                        + "".join(f"{t.strides[k]:>10}" for t in self.tensors))
        rows.append(f"{'off':>8}{'':>10}" + "".join(f"{t.offset:>10}" for t in self.tensors))
        return "\n".join(rows)

    def constraint_text(self, c: FlatConstraint) -> str:
        terms = []
        for k, coef in enumerate(c.coeffs):
            if coef == 0:
                continue
            mag = abs(coef)
            terms.append(("-" if coef < 0 else "+") + (self.names[k] if mag == 1
                                                       else f"{mag}*{self.names[k]}"))
        s = " ".join(t[0] + " " + t[1:] for t in terms)
        s = s[2:] if s.startswith("+ ") else "-" + s[2:]
        return f"{s} <= {c.rhs}"
