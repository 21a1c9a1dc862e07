"""The order in which a CPU kernel's innermost step writes its loads and updates.

PoCL's LLVM keeps the written order of a step's statements.  With every load written first, a
14-pixel x 32-channel convolution tile held its 14 broadcast pixels beside 28 accumulators and 2
filter vectors, more than AVX-512's 32 registers, and kept 14 accumulators on the stack (a
load, a multiply-add and a store each, every step).  Streamed, the input with the most distinct
loads (the broadcast pixels) is read one value at a time, each followed at once by the updates
it completes, after the other inputs' loads (the filter vectors): one streamed value is live at
a time, as in a BLAS microkernel (the layer ran 1.4x faster single-threaded on Zen 4).  GPU
models keep every load first: their compilers schedule for latency themselves.
"""

from __future__ import annotations

Key = tuple[int, tuple]  # (input, the accumulator point's coordinates that input reads)


def streamed(groups: list[tuple[Key, list[str]]], updates: list[tuple[list[Key], str]],
             spans: list[int], where: dict[Key, int] | None = None,
             shared: int | None = None) -> list[str]:
    """`groups`: each load's statements in the order they were made (a load's declarations
    before its value); `updates`: each update's loads and text; `spans`: the elements one read
    of each input covers (1: a value every lane shares).  `where`: each load's place in its
    input's memory; the loads of one input are written in that order (below).  Input
    `shared`'s loads keep the order they were made in: a declaration one of them shares with
    a later one (a run's vector) stays ahead of it.

    Loads in memory order: a 2x2 stride-2 max pool's tile of 7 pixels x 4 channel vectors,
    made channel vector by channel vector, read every other 256 bytes of a 3.5 KB run four
    times over; in memory order the same kernel ran 1.1-1.3x faster (N=4 224x224x64 on a Zen
    4, PoCL 3.1: 3.71 -> 2.92 ms median, 2.48 -> 2.18 ms best), a hardware prefetcher
    following one rising stream instead of four interleaved ones."""
    if not groups:
        return [u for _, u in updates]
    if where:
        made = {key: n for n, (key, _) in enumerate(groups)}
        groups = sorted(groups, key=lambda g: (g[0][0], made[g[0]] if g[0][0] == shared
                                               else where[g[0]], made[g[0]]))
    count = {i: 0 for i in range(len(spans))}
    for (i, _), _ in groups:
        count[i] += 1
    # Most distinct loads; on a tie the one read as a broadcast (its value is one element).
    stream = max(count, key=lambda i: (count[i], spans[i] == 1, i))
    body = [line for (i, _), lines in groups if i != stream for line in lines]
    loaded = {key for key, _ in groups if key[0] != stream}
    done = [False] * len(updates)
    for key, lines in groups:
        if key[0] != stream:
            continue
        body += lines
        loaded.add(key)
        for n, (keys, text) in enumerate(updates):
            if not done[n] and all(k in loaded for k in keys):
                body.append(text)
                done[n] = True
    return body + [text for n, (_, text) in enumerate(updates) if not done[n]]
