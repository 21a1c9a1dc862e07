"""Tile text -> `ast.Function`.  lark's errors are turned into `TileSyntaxError`s with a caret."""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

import lark
from lark import Lark, Token, Tree

from ..errors import Source, Span, TileSyntaxError
from . import ast

_TERMINAL_TEXT = {
    "LPAR": "'('", "RPAR": "')'", "LSQB": "'['", "RSQB": "']'", "LBRACE": "'{'", "RBRACE": "'}'",
    "COMMA": "','", "SEMICOLON": "';'", "COLON": "':'", "EQUAL": "'='", "PLUS": "'+'",
    "MINUS": "'-'", "STAR": "'*'", "SLASH": "'/'", "LESSTHAN": "'<'", "MORETHAN": "'>'",
    "QMARK": "'?'", "BANG": "'!'", "TILDE": "'~'", "AMPERSAND": "'&'", "VBAR": "'|'",
    "CIRCUMFLEX": "'^'", "NAME": "a name", "INT": "an integer", "FLOAT": "a number",
    "$END": "the end of the text", "<END-OF-FILE>": "the end of the text",
}
MAX_DEPTH = 200  # operators nested in one expression; every later stage recurses this deep


def _grammar_text() -> str:
    try:
        return resources.files("tilec.grammar").joinpath("tile.lark").read_text()
    except (ModuleNotFoundError, FileNotFoundError):
        # Running from a checkout that was not installed: the grammar sits beside the package.
        return (Path(__file__).resolve().parents[2] / "grammar" / "tile.lark").read_text()


_OPTIONS = {"parser": "lalr", "propagate_positions": True,
            "maybe_placeholders": True}


@functools.cache
def _parser() -> Lark:
    """The LALR parser.  Building its tables takes lark about 0.3 s, most of a warm compile,
    so they are kept in tilec's cache directory (keyed by the grammar, lark's and Python's
    versions) and loaded from there by later processes."""
    import io
    import pickle
    import sys

    from .. import memo
    from ..memo import default_cache_root

    text = _grammar_text()
    key = memo.digest(text, sorted(_OPTIONS.items()), lark.__version__, sys.version_info[:2])
    try:
        path = default_cache_root() / "parser" / "tile.lark.bin"
    except Exception:  # pragma: no cover - no usable home directory
        path = None
    body = memo.read(path, key) if path is not None else None
    if body is not None:
        try:
            return Lark.load(io.BytesIO(body))
        except (pickle.UnpicklingError, EOFError, AttributeError, KeyError, TypeError,
                ValueError):
            pass
    parser = Lark(text, **_OPTIONS)
    if path is not None:
        buf = io.BytesIO()
        parser.save(buf)
        memo.write(path, key, buf.getvalue())
    return parser


def _describe_expected(names: set[str] | frozenset[str]) -> str:
    anonymous = {t.name: f"'{t.pattern.value}'" for t in _parser().terminals
                 if t.name.startswith("__ANON")}
    words = []
    for n in sorted(names):
        if n in _TERMINAL_TEXT:
            words.append(_TERMINAL_TEXT[n])
        elif n in anonymous:
            words.append(anonymous[n])
        elif n.startswith("_"):
            continue
        else:
            words.append(f"'{n.lower()}'" if n.isupper() and len(n) > 5 else n)
    words = sorted(set(words))
    if not words:
        return ""
    if len(words) > 8:
        return " (expected one of " + ", ".join(words[:8]) + ", ...)"
    return " (expected " + (words[0] if len(words) == 1 else "one of " + ", ".join(words)) + ")"


def parse(text: str, name: str = "<string>") -> ast.Function:
    """Parse a Tile program.  `name` is the file name shown in error messages."""
    source = Source(text, name)
    try:
        tree = _parser().parse(text)
    except lark.UnexpectedToken as e:
        tok = e.token
        if tok.type == "$END":
            # lark gives the end token the place of the last real one: point just after it.
            span = Span(tok.end_line, tok.end_column) if tok.end_line else _end_of(text)
            what = "the text ended early"
        else:
            span = Span(tok.line, tok.column, tok.end_line or tok.line,
                        tok.end_column or tok.column + 1)
            what = f"unexpected {tok.value!r}"
        raise TileSyntaxError(what + _describe_expected(e.expected), source=source,
                              span=span) from None
    except lark.UnexpectedCharacters as e:
        raise TileSyntaxError(f"unexpected character {text[e.pos_in_stream]!r}"
                              + _describe_expected(e.allowed or set()),
                              source=source, span=Span(e.line, e.column)) from None
    except lark.UnexpectedEOF as e:
        raise TileSyntaxError("the text ended early" + _describe_expected(set(e.expected)),
                              source=source, span=_end_of(text)) from None
    except lark.LarkError as e:  # any other lark failure is still the user's text
        raise TileSyntaxError(f"cannot parse: {e}", source=source) from None
    return _Builder(source).function(tree.children[0])


def _end_of(text: str) -> Span:
    lines = text.split("\n")  # lark counts lines by "\n" only; so must every span
    return Span(len(lines), len(lines[-1]) + 1)


def _span(node: Tree | Token) -> Span:
    if isinstance(node, Token):
        return Span(node.line, node.column, node.end_line or node.line,
                    node.end_column or node.column + len(node))
    m = node.meta
    return Span(m.line, m.column, m.end_line, m.end_column)


_BINARY = {"or_": "or", "and_": "and", "bitor": "bitor", "bitxor": "bitxor", "bitand": "bitand",
           "eq": "eq", "ne": "ne", "lt": "lt", "gt": "gt", "le": "le", "ge": "ge", "shl": "shl",
           "shr": "shr", "add": "add", "sub": "sub", "mul": "mul", "div": "div"}
_UNARY = {"neg": "neg", "not_": "not", "bitnot": "bitnot"}
_COMB = {"single": None, "comb_mul": "*", "comb_add": "+", "comb_eq": "==", "comb_cond": "?"}


class _Builder:
    def __init__(self, source: Source):
        self.source = source
        self.depth = 0

    def _text(self, node: Tree) -> str:
        m = node.meta
        return self.source.text[m.start_pos:m.end_pos]

    def function(self, t: Tree) -> ast.Function:
        inputs, outputs, stmts = [], [], []
        for c in t.children:
            if c is None:
                continue
            if c.data in ("scalar_input", "tensor_input"):
                inputs.append(self.input(c))
            elif c.data == "outname":
                outputs.append(ast.OutputName(str(c.children[0]), span=_span(c.children[0])))
            elif c.data == "stmt":
                stmts.append(self.stmt(c))
        return ast.Function(tuple(inputs), tuple(outputs), tuple(stmts), source=self.source,
                            span=_span(t))

    def input(self, t: Tree) -> ast.Input:
        name = t.children[0]
        dims = []
        for d in t.children[1:]:
            if d is None:
                continue
            tok = d.children[0]
            if d.data == "dim_name":
                dims.append(ast.Dim(str(tok), span=_span(tok)))
            else:
                dims.append(ast.Dim(None, int(tok), span=_span(tok)))
        return ast.Input(str(name), tuple(dims), any_shape=t.data == "scalar_input",
                         span=_span(name))

    def stmt(self, t: Tree) -> ast.Statement:
        attrs = tuple(self.attribute(a) for a in t.children[:-1])
        body = t.children[-1]
        if body.data == "assignment":
            name, expr = body.children
            return ast.Assignment(str(name), self.expr(expr), attrs, self._text(body),
                                  span=_span(name))
        return self.contraction(body, attrs)

    def attribute(self, t: Tree) -> ast.Attribute:
        name, *args = t.children
        return ast.Attribute(str(name), tuple(self.expr(a) for a in args if a is not None),
                             span=_span(name))

    def contraction(self, t: Tree, attrs: tuple[ast.Attribute, ...]) -> ast.Contraction:
        out_t, agg_t, ops_t, *rest = t.children
        out_name, *idx_t, sizes_t = out_t.children
        idx = tuple(self.expr(e) for e in idx_t if e is not None)
        sizes = None if sizes_t is None else \
            tuple(self.expr(e) for e in sizes_t.children if e is not None)
        output = ast.TensorRef(str(out_name), idx, span=_span(out_name))
        operands = tuple(self.access(a) for a in ops_t.children)
        constraints, no_defract, default = [], False, None
        for r in rest:
            if r.data == "constraint":
                poly, bound = r.children
                first, last = _span(poly), _span(r)  # from the polynomial, not the ','
                constraints.append(ast.Constraint(self.expr(poly), self.expr(bound),
                                                  span=Span(first.line, first.col,
                                                            last.end_line, last.end_col)))
            elif r.data == "no_defract":
                no_defract = True
            elif r.data == "default":
                tok = r.children[0]
                default = ast.Name(str(tok), span=_span(tok))
        return ast.Contraction(output, sizes, str(agg_t.children[0]), _COMB[ops_t.data],
                               operands, tuple(constraints), no_defract, default, attrs,
                               self._text(t), span=_span(out_name))

    def access(self, t: Tree) -> ast.TensorRef:
        name, *idx = t.children
        return ast.TensorRef(str(name), tuple(self.expr(e) for e in idx if e is not None),
                             span=_span(name))

    def expr(self, t: Tree | Token) -> ast.Expr:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise TileSyntaxError(f"expression nested more than {MAX_DEPTH} operators deep "
                                      "(split it into several statements)", source=self.source,
                                      span=_span(t))
            return self._expr(t)
        finally:
            self.depth -= 1

    def _expr(self, t: Tree | Token) -> ast.Expr:
        if isinstance(t, Token):  # a bare NAME/INT promoted by `?` rules
            return self._token_expr(t)
        kind = t.data
        sp = _span(t)
        if kind == "int_lit":
            return ast.Num(int(t.children[0]), False, span=sp)
        if kind == "float_lit":
            return ast.Num(float(t.children[0]), True, span=sp)
        if kind == "name":
            return ast.Name(str(t.children[0]), span=sp)
        if kind == "call":
            fn, *args = t.children
            return ast.Call(str(fn), tuple(self.expr(a) for a in args if a is not None),
                            span=_span(fn))
        if kind == "select":
            c, a, b = t.children
            return ast.Select(self.expr(c), self.expr(a), self.expr(b), span=sp)
        if kind in _UNARY:
            return ast.Unary(_UNARY[kind], self.expr(t.children[0]), span=sp)
        if kind in _BINARY:
            a, b = t.children
            return ast.Binary(_BINARY[kind], self.expr(a), self.expr(b), span=sp)
        raise TileSyntaxError(f"unsupported construct {kind}", source=self.source, span=sp)

    def _token_expr(self, tok: Token) -> ast.Expr:
        sp = _span(tok)
        if tok.type == "INT":
            return ast.Num(int(tok), False, span=sp)
        if tok.type == "FLOAT":
            return ast.Num(float(tok), True, span=sp)
        return ast.Name(str(tok), span=sp)

