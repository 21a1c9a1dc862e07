"""Kernels that differ only in names are built once (ncnn's pipeline digest).

A model repeats its blocks: ResNet-50's sixteen bottlenecks make 56 kernels of which 31 are
distinct.  Two generated kernels are the same function when their texts agree once comments
are dropped, the kernel's own name is set aside and every identifier made from a tensor name
(`b_X`, `v_X`, ...) is renamed by order of first appearance.  The program then holds only the
first kernel of each group; the others launch that kernel's entry point with their own
arguments, which correspond position by position.  On PoCL every kernel costs a machine-code
generation at its first launch (a few hundred milliseconds), so sharing halves a cold model
compile; the canonical text only decides equality and is never built."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Container, Sequence
from dataclasses import dataclass

from ..codegen.kernel_text import KernelSource

_COMMENTS = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
# A one-letter role prefix and a name: how the generators spell tensor-derived identifiers.
_TENSOR_IDENT = re.compile(r"\b([A-Za-z])_([A-Za-z_][A-Za-z0-9_]*)\b")


@dataclass(frozen=True)
class SharedKernels:
    text: str  # the program to build: the first kernel of each group, in launch order
    entries: dict[str, str]  # kernel name -> the entry point that runs it
    digests: dict[str, str]  # kernel name -> its canonical digest

    @property
    def distinct(self) -> int:
        return len(set(self.entries.values()))


def canonical(source: KernelSource, tensors: Container[str]) -> str:
    """The kernel's text with comments dropped, its name replaced and its tensor-derived
    identifiers renamed in order of first appearance (a `$` marks the new names, which no
    generated identifier contains, so the renaming is one-to-one)."""
    text = _COMMENTS.sub("", source.text)
    # The kernel's name, and its parts' where it runs several kernels (`codegen.siblings`).
    text = re.sub(rf"\b{re.escape(source.name)}(_part\d+)?\b", r"$kernel\1", text)
    alias: dict[str, str] = {}

    def rename(m: re.Match) -> str:
        # A generated name may carry numeric suffixes after the tensor's (`v_X_0`, the lane or
        # copy of an epilogue value): the longest prefix that names a tensor is renamed and
        # the suffixes kept, so the renaming stays one-to-one.
        name, suffix = m.group(2), ""
        while name not in tensors:
            head, sep, tail = name.rpartition("_")
            if not sep or not head or not tail.isdigit():
                return m.group(0)
            name, suffix = head, f"_{tail}{suffix}"
        return f"{m.group(1)}_${alias.setdefault(name, str(len(alias)))}{suffix}"

    return _TENSOR_IDENT.sub(rename, text)


def share_kernels(sources: Sequence[KernelSource], tensors: Container[str]) -> SharedKernels:
    """Group `sources` by canonical text; the program keeps the first of each group."""
    first: dict[str, str] = {}  # digest -> entry point
    entries, digests, texts = {}, {}, []
    for s in sources:
        d = hashlib.sha256(canonical(s, tensors).encode()).hexdigest()
        digests[s.name] = d
        if d not in first:
            first[d] = s.name
            texts.append(s.text)
        entries[s.name] = first[d]
    return SharedKernels("\n".join(texts), entries, digests)


__all__ = ["SharedKernels", "canonical", "share_kernels"]
