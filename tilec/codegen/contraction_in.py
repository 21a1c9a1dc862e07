"""The reads of a contraction kernel: where an input's value at an accumulator point comes
from (global memory, masked where a constraint may exclude it; a staged local tile; a run
read as one vector) and how its accesses are aligned (`Inputs`, a part of
`contraction._Contraction`, whose naming rules it shares: `pos`, `point_env`, `rel`)."""

from __future__ import annotations

from collections.abc import Callable

from ..plan.gpu_form import RUN, run_step
from . import clexpr
from .kernel_text import LANES, _lin, buf


class Inputs:
    """Input reads and their alignment (mixed into `contraction._Contraction`)."""

    def offset_bounds(self, strides: tuple[int, ...], off: int,
                      starts: bool = False) -> tuple[int, int]:
        """Extreme offsets over every position the kernel forms, partial tiles included;
        `starts`: of vectors' first lanes, which are multiples of W along the vector index
        (`lanes_aligned`), the last one W - 1 or less before the tile's end."""
        lo = hi = off
        for k, s in enumerate(strides):
            top = self.counts[k] * self.sched.tile[k] - 1
            if self.sched.shifted(k):  # the last tile ends where the range does
                top = self.flat.ranges[k] - (self.W if starts and k == self.v else 1)
            if starts and k == self.v and self.lanes_aligned():
                top -= (self.sched.tile[k] - 1) % self.W
            lo += min(0, s * top)
            hi += max(0, s * top)
        return lo, hi

    def lanes_aligned(self) -> bool:
        """Every vector's first position along the vector index is a multiple of W: tiles
        are multiples of W and threads, accumulators and loop steps move by W (not the GPU
        forms' runs, nor a reduction split along the vector index)."""
        s = self.sched
        return self.W > 1 and self.v is not None and s.tile[self.v] % self.W == 0 and \
            not s.shifted(self.v) and \
            (s.run is None or s.run.index != self.v) and \
            not (self.split and s.split_index == self.v)

    def vector_aligned(self, t_index: int) -> bool:
        """Tensor t_index's vectors (W consecutive elements along the vector index) all start
        on a multiple of W in its buffer, clamped or not (`guarded`): read and written as
        whole vectors (clexpr.vector_access) instead of through vloadN/vstoreN."""
        t, W = self.flat.tensors[t_index], self.W
        return self.plain_vectors and self.lanes_aligned() and t.strides[self.v] == 1 and \
            t.offset % W == 0 and t.size % W == 0 and \
            all(x % W == 0 for k, x in enumerate(t.strides) if k != self.v)

    def overhangs(self, k: int) -> bool:
        """Whether output index k's tiles reach past its range (a partial last tile that does
        not move back: `Schedule.shift`)."""
        return self.counts[k] * self.sched.tile[k] > self.flat.ranges[k] and \
            not self.sched.shifted(k)

    def lanes_fit(self) -> bool:
        """Whether vector lanes never pass the vector index's range: vectors start on
        multiples of W of a range W divides, or the last tile moves back."""
        v, W = self.v, self.W
        return W == 1 or v is None or self.sched.shifted(v) or \
            (self.lanes_aligned() and self.flat.ranges[v] % W == 0)

    def span(self, t) -> int:
        """Elements one read of tensor t covers: a vector's lanes, `stride` apart."""
        if self.W == 1 or self.v is None or t.strides[self.v] == 0:
            return 1
        return (self.W - 1) * abs(t.strides[self.v]) + 1

    def guarded(self, t_index: int, expr: str, width: int, decls: list[str] | None = None,
                name: str = "g") -> str:
        """Offset `expr` of a read of `width` elements, clamped into the tensor where some
        position the kernel forms falls outside it.  With `decls`, the offset is declared
        there as `name` and clamped by clexpr.clamp (plain C: clamp() is a library call on
        some drivers, and a call in the loop spills every accumulator); without, clamp()."""
        t = self.flat.tensors[t_index]
        if self.stays_inside(t_index, width):
            return expr
        if decls is None:
            return f"clamp({expr}, 0, {t.size - width})"
        decls.append(f"const int {name} = {expr};")
        return clexpr.clamp(name, "0", str(t.size - width))

    def stays_inside(self, t_index: int, width: int) -> bool:
        """Whether every read of `width` elements of tensor t_index the kernel forms lies
        inside the tensor (then `guarded` leaves its offset alone)."""
        t = self.flat.tensors[t_index]
        lo, hi = self.offset_bounds(t.strides, t.offset, starts=width > 1)
        return lo >= 0 and hi + width - 1 < t.size

    def input_value(self, i: int, c: tuple[int, ...], decls: list[str] | None = None,
                    name: str = "g", clamp: bool = True, at: str | None = None,
                    element: bool = False) -> str:
        """Text of input i at accumulator point c (vector of W lanes where vectorised); an
        offset that needs clamping is declared first, as `name`, in `decls` (`guarded`);
        `clamp=False` where the read is known to be in bounds (`Interior`); `at`: an
        offset in bounds by construction (`steered_offset`); `element`: an input the lanes
        share as its one element, not broadcast to W lanes."""
        t = self.flat.inputs[i]
        st = self.sched.staged[i] if self.sched.staged else None
        env = self.point_env(c)
        W, v = self.W, self.v
        ctype = clexpr.COMPUTE[t.dtype]
        if st is not None:
            off = self.local_offset(i, c)
            name = self.local_name(i)
            step = st.local_strides[v] if v is not None else 0
            if W == 1 or v is None or t.strides[v] == 0:
                val = f"{name}[{off}]"
                return val if W == 1 or element else f"(({ctype}{W})({val}))"
            if step == 1:
                if st.local_base % W == 0 and all(
                        ls % W == 0 for k, ls in enumerate(st.local_strides) if k != v):
                    # Every vector starts on a multiple of W (the layout is widened for it,
                    # the thread's lane offset and the loop step are multiples of W), and
                    # the buffer is aligned to a vector: one aligned local read.
                    return f"*((__local const {ctype}{W}*)({name} + ({off})))"
                return f"vload{W}(0, {name} + ({off}))"
            lanes = ", ".join(f"{name}[{off} + {j * step}]" for j in range(W))
            return f"(({ctype}{W})({lanes}))"
        terms = [(t.strides[k], env[k]) for k in range(len(self.names))]
        off = _lin(terms, t.offset)
        based = self.based_read(i, c, clamp) if at is None else None
        ptr = buf(t.name)
        if at is not None:
            off, clamp = at, False
        elif based is not None:
            (ptr, off), clamp = based, False
        if W == 1 or v is None or t.strides[v] == 0:
            at = self.guarded(i + 1, off, 1, decls, name) if clamp else off
            val = clexpr.load(ptr, at, t.dtype)
            return val if W == 1 or element else f"(({ctype}{W})({val}))"
        at = self.guarded(i + 1, off, self.span(t), decls, name) if clamp else off
        if t.strides[v] == 2:  # every other element (`vector_candidates(cpu)`)
            return clexpr.load_pairs(ptr, at, t.dtype, W, unaligned=self.unaligned(t.dtype))
        aligned = self.vector_aligned(i + 1)
        return clexpr.load(ptr, at, t.dtype, W, aligned=aligned,
                           unaligned=not aligned and self.unaligned(t.dtype))

    def based_read(self, i: int, c: tuple[int, ...], clamp: bool) -> tuple[str, str] | None:
        """(pointer, constant offset) of input i's read at point c, while a CPU body is
        written (`contraction.body` declares the pointers): the body's base pointer for input
        i (where it reads at the first point) and the point's distance from there, which is
        a constant (`point_offset`).  Only reads that need no clamp.  Written as sums of
        `stride * position` terms, a register tile's reads cost PoCL's compiler (instruction
        combining, scalar evolution, loop strength reduction) part of a kernel's code
        generation to fold back into this form: resnet50's global average pool 0.13-0.20 ->
        0.09 s, its 3x3 convolutions about 12% less, on a Zen 4 (PoCL 3.1)."""
        bases = self.bases
        t = self.flat.inputs[i]
        if bases is None or (self.sched.staged and self.sched.staged[i] is not None):
            return None
        if self.sched.run is not None and self.sched.run.input == i:
            return None
        if any(self.sched.ragged(k) for k in self.out_idx if t.strides[k]) or \
                self.reads_meet(i):
            return None
        if clamp and not self.stays_inside(i + 1, self.span(t)):
            return None
        if i not in bases:
            first = self.point_env(tuple(0 for _ in self.out_idx))
            terms = [(t.strides[k], first[k]) for k in range(len(self.names))]
            bases[i] = f"__global const {clexpr.STORAGE[t.dtype]}* base{i} = " \
                f"{buf(t.name)} + ({_lin(terms, t.offset)});"
        return f"base{i}", str(self.point_offset(i, c))

    def binder(self, lines: list[str], ctype: str, var: str) -> Callable[[str], str] | None:
        """clexpr.expr's `bind` for a post-op computing `var`: each value it names becomes a
        constant appended to `lines` (var_0, var_1, ...).  Only where vloadN was measured a
        library call (`plain_vectors`): the builtins it keeps out of post-ops are calls too."""
        if not self.plain_vectors:
            return None
        names: list[str] = []

        def bind(text: str) -> str:
            names.append(f"{var}_{len(names)}")
            lines.append(f"const {ctype} {names[-1]} = {text};")
            return names[-1]
        return bind

    def unaligned(self, dtype: str, width: int | None = None) -> bool:
        """Whether a vector of dtype (of W lanes, or `width`) that may start anywhere is read
        or written through the kernel's `clexpr.unaligned_typedef` (devices with
        `plain_vectors`; the typedef is then declared in the prologue)."""
        if not self.plain_vectors or dtype not in clexpr.VECTOR_ACCESS:
            return False
        self.typedefs[clexpr.unaligned_typedef(dtype, width or self.W)] = None
        return True

    def local_offset(self, i: int, c: tuple[int, ...]) -> str:
        """Where staged input i's value for accumulator point c is in its local tile."""
        st = self.sched.staged[i]
        terms = []
        for k in range(len(self.names)):
            ls = st.local_strides[k]
            if ls == 0:
                continue
            var = self.rel(k, c[self.out_idx.index(k)]) if k in self.out_idx \
                else f"u_{self.flat.names[k]}"
            terms.append((ls, var))
        return _lin(terms, st.local_base)

    def reads_meet(self, i: int) -> bool:
        """Whether input i's reads at two passes of the unrolled loops (those `loops` marks,
        and a short innermost loop the compiler may unroll itself) can fall on one element,
        at different points of the tile: a padded window's columns at stride 1 or 2.  From
        a base pointer the compiler sees those addresses are equal and keeps the first
        pass's value for the later one, which holds a register across the window: mobilenet_v2's
        3x3 depthwise layers moved 600 vectors to and from the stack and ran 1.2-1.5x slower
        on a Zen 4.  Written out, the sums differ and each read stays next to its update."""
        memo = self.__dict__.setdefault("_meets", {})
        if i not in memo:
            memo[i] = self._reads_meet(i)
        return memo[i]

    def _reads_meet(self, i: int) -> bool:
        t = self.flat.inputs[i]
        _, inner = self.loops()

        def trips(lp: dict) -> int:
            return -(-(lp["end"] - lp["start"]) // lp["step"])

        passes = [lp for lp in inner if lp.get("unroll")]
        if inner and not inner[-1].get("unroll") and trips(inner[-1]) <= 16:
            passes.append(inner[-1])
        apart = {0}
        for lp in passes:
            d = t.strides[lp["index"]] * lp["step"]
            apart = {a + d * j for a in apart for j in range(1 - trips(lp), trips(lp))}
        apart.discard(0)
        if not apart:
            return False
        offs = {self.point_offset(i, c) for c in self.points}
        return any(a - b in apart for a in offs for b in offs if a != b)

    def point_offset(self, i: int, c: tuple[int, ...]) -> int:
        """Where input i's value at accumulator point c lies from the thread's first point's,
        in elements: points along an index are placed in rising order, so this orders a
        thread's reads of one input as memory does (`stream.streamed`)."""
        s, t = self.sched, self.flat.inputs[i]
        total = 0
        for k, a in zip(self.out_idx, c, strict=True):
            if s.run is not None and k == s.run.index:
                step = run_step(a, s.threads[k])
            else:
                step = a * s.threads[k] * (self.W if k == self.v else 1)
            total += t.strides[k] * step
        return total

    def local_name(self, i: int) -> str:
        """Input i's local tile: the array, or the current half of a double-buffered one."""
        return f"c_{i}" if self.pipe else f"s_{i}"

    def run_load(self, i: int, c: tuple[int, ...]) -> tuple[str, str, str]:
        """(variable, declaration, component) for a point of the run input: the run's vector,
        read once from local memory, and the point's component of it."""
        r = self.sched.run
        pos = self.out_idx.index(r.index)
        a = c[pos]
        start = c[:pos] + (a - a % RUN,) + c[pos + 1:]
        key = [x // RUN if k == r.index else x for k, x in zip(self.out_idx, c, strict=True)
               if self.flat.inputs[i].strides[k] != 0]
        var = f"xr{i}_" + "_".join(map(str, key))
        ctype = clexpr.COMPUTE[self.flat.inputs[i].dtype]
        off = self.local_offset(i, start)
        decl = f"const {ctype}{RUN} {var} = " \
            f"*((__local const {ctype}{RUN}*)({self.local_name(i)} + ({off})));"
        return var, decl, f"{var}.s{LANES[a % RUN]}"

    def constraint_text(self, ci: int, env: dict[int, str]) -> str:
        c = self.flat.constraints[ci]
        return f"({_lin([(x, env[k]) for k, x in enumerate(c.coeffs) if x])} <= {c.rhs})"

    # pieces ----------------------------------------------------------------------------------

    def masked_loads(self, mixed: list[int]) -> dict[int, tuple[int, ...]]:
        """Constraints to apply by zeroing an input's loaded value (input -> constraints).
        Only for a sum of products without hit flags, and only when the input's value already
        depends on every output index the constraint mentions."""
        f = self.flat
        if not mixed or f.agg != "+" or f.comb != "*" or self.need_hit:
            return {}
        out: dict[int, list[int]] = {}
        for ci in mixed:
            used = {k for k, x in enumerate(f.constraints[ci].coeffs) if x and k in self.out_idx}
            for i, t in enumerate(f.inputs):
                if all(t.strides[k] != 0 for k in used):
                    out.setdefault(i, []).append(ci)
                    break
            else:
                return {}
        return {i: tuple(cs) for i, cs in out.items()}
