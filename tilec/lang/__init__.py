"""The language front end: Tile text in, a checked `ir.Program` (and its numpy reference) out.

parse (lark, `grammar/tile.lark`) -> `ast.Function` -> check (names, types, shapes, index
polynomials) -> `ir.Program`; `reference` evaluates a program with numpy and is the oracle every
kernel is compared with.  Depends only on `tilec.errors`, `tilec.config` and `tilec.memo`."""
