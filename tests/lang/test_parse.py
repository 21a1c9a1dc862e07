"""The parser: Tile text -> `ast.Function`, and syntax errors that point at the right place."""

from __future__ import annotations

import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilec
from tilec.errors import Source, TileError, TileSyntaxError
from tilec.lang import ast
from tilec.lang.parse import MAX_DEPTH


def at(text: str, line: int, col: int) -> str:
    """The source text from 1-based (line, col) to the end of that line."""
    return text.split("\n")[line - 1][col - 1:]


def stmt(body: str, header: str = "function (A[M, K], B[K, N]) -> (O)") -> ast.Statement:
    fn = tilec.parse(f"{header} {{\n  {body}\n}}\n")
    assert len(fn.stmts) == 1
    return fn.stmts[0]


def expr(text: str) -> ast.Expr:
    s = stmt(f"O = {text};")
    assert isinstance(s, ast.Assignment)
    return s.expr


def show(e: ast.Expr) -> str:
    """A fully parenthesised rendering, to test precedence and associativity."""
    match e:
        case ast.Num(value=v):
            return repr(v)
        case ast.Name(id=n):
            return n
        case ast.Unary(op=op, operand=x):
            return f"({op} {show(x)})"
        case ast.Binary(op=op, left=a, right=b):
            return f"({show(a)} {op} {show(b)})"
        case ast.Select(cond=c, then=a, other=b):
            return f"({show(c)} ? {show(a)} : {show(b)})"
        case ast.Call(fn=f, args=args):
            return f"{f}(" + ", ".join(show(a) for a in args) + ")"
    raise AssertionError(e)


# The function header ------------------------------------------------------------------------------

def test_header_inputs_outputs_and_dims():
    text = "function (A[M, K], B[K, N], S[], T, F[3, N]) -> (C, D) {\n  C = A;\n  D = B;\n}"
    fn = tilec.parse(text)
    assert [i.name for i in fn.inputs] == ["A", "B", "S", "T", "F"]
    assert [o.name for o in fn.outputs] == ["C", "D"]
    assert [(d.name, d.size) for d in fn.inputs[0].dims] == [("M", None), ("K", None)]
    assert fn.inputs[2].dims == () and fn.inputs[3].dims == ()
    assert [(d.name, d.size) for d in fn.inputs[4].dims] == [(None, 3), ("N", None)]
    assert (fn.inputs[4].dims[0].span.line, fn.inputs[4].dims[0].span.col) == (1, 39)
    assert at(text, 1, 39).startswith("3, N]")
    assert (fn.outputs[1].span.line, fn.outputs[1].span.col) == (1, 53)
    assert at(text, 1, 53).startswith("D) {")
    assert [s.name for s in fn.stmts] == ["C", "D"]
    assert [(s.span.line, s.span.col) for s in fn.stmts] == [(2, 3), (3, 3)]


def test_no_inputs_and_empty_body():
    fn = tilec.parse("function () -> (O) { }")
    assert fn.inputs == () and fn.stmts == () and [o.name for o in fn.outputs] == ["O"]


def test_parse_accepts_a_source_and_reports_its_name():
    src = Source("function (A[N]) -> (O) {\n  O = A +;\n}\n", "prog.tile")
    with pytest.raises(TileSyntaxError) as info:
        tilec.parse(src)
    assert str(info.value).startswith("prog.tile:2:10: ")


# Contractions -----------------------------------------------------------------------------------

def test_matmul_contraction():
    c = stmt("C[m, n : M, N] = +(A[m, k] * B[k, n]);", "function (A[M, K], B[K, N]) -> (C)")
    assert isinstance(c, ast.Contraction)
    assert c.output.name == "C" and [show(i) for i in c.output.idx] == ["m", "n"]
    assert [show(s) for s in c.sizes] == ["M", "N"]
    assert c.agg == "+" and c.comb == "*"
    assert [(o.name, [show(i) for i in o.idx]) for o in c.operands] == \
        [("A", ["m", "k"]), ("B", ["k", "n"])]
    assert c.constraints == () and not c.no_defract and c.default is None
    assert c.text == "C[m, n : M, N] = +(A[m, k] * B[k, n])"
    assert (c.span.line, c.span.col) == (2, 3)
    assert [(o.span.line, o.span.col) for o in c.operands] == [(2, 22), (2, 32)]


@pytest.mark.parametrize("agg", ["+", "*", ">", "<", "="])
def test_aggregations(agg):
    c = stmt(f"O[m : M] = {agg}(A[m, k]);")
    assert c.agg == agg and c.comb is None and len(c.operands) == 1


@pytest.mark.parametrize("text, comb, n", [
    ("A[m, k] * B[k, n]", "*", 2),
    ("A[m, k] + B[k, n]", "+", 2),
    ("A[m, k] == B[k, n]", "==", 2),
    ("A[m, k] == B[k, n] ? A[m, n]", "?", 3),
])
def test_combinations(text, comb, n):
    c = stmt(f"O[m, n : M, N] = >({text});")
    assert c.comb == comb and len(c.operands) == n


def test_output_sizes_are_expressions_of_size_symbols():
    c = stmt("O[n, x : N, (X - KX) / 2 + 1] = +(I[n, 2*x + k] * F[k]);",
             "function (I[N, X], F[KX]) -> (O)")
    assert [show(s) for s in c.sizes] == ["N", "(((X sub KX) div 2) add 1)"]
    assert show(c.operands[0].idx[1]) == "((2 mul x) add k)"


def test_omitted_sizes_scalar_output_and_empty_sizes():
    assert stmt("O[m, n] = +(A[m, k] * B[k, n]);").sizes is None
    c = stmt("O[] = +(A[m, k]);")
    assert c.output.idx == () and c.sizes is None
    c = stmt("O[ : ] = +(A[m, k]);")
    assert c.output.idx == () and c.sizes == ()


def test_constraints_no_defract_and_default():
    body = "O[x : M] = +(A[x + i, k]), i < 3, x + i < M, k < K no_defract default D;"
    c = stmt(body, "function (A[M, K], D[M]) -> (O)")
    assert [(show(k.poly), show(k.bound)) for k in c.constraints] == \
        [("i", "3"), ("(x add i)", "M"), ("k", "K")]
    line2 = "  " + body
    assert (c.constraints[1].span.line, c.constraints[1].span.col) == (2, 37)
    assert at(line2, 1, 37).startswith("x + i < M,")
    assert c.no_defract
    assert c.default.id == "D" and (c.default.span.line, c.default.span.col) == (2, 73)
    assert at(line2, 1, 73) == "D;"


def test_colon_inside_comments_and_brackets_does_not_split_indices_from_sizes():
    c = stmt("O[i /* : */, j /* ] */ : M, (N)] = +(A[i, j]);")
    assert [show(i) for i in c.output.idx] == ["i", "j"]
    assert [show(s) for s in c.sizes] == ["M", "N"]
    c = stmt("O[i, j // comment: ]\n    : M, N] = +(A[i, j]);")
    assert [show(s) for s in c.sizes] == ["M", "N"]


def test_attributes_before_statements():
    fn = tilec.parse("function (A[N]) -> (O, P) {\n"
                     "  [[unroll(4, N)]] [[hint]]\n"
                     "  O[i : N] = +(A[i]);\n"
                     "  [[name()]] P = O;\n"
                     "}")
    o, p = fn.stmts
    assert [(a.name, [show(x) for x in a.args]) for a in o.attributes] == \
        [("unroll", ["4", "N"]), ("hint", [])]
    assert (o.attributes[0].span.line, o.attributes[0].span.col) == (2, 5)
    assert [a.name for a in p.attributes] == ["name"] and p.attributes[0].args == ()


# Elementwise expressions ------------------------------------------------------------------------

@pytest.mark.parametrize("text, shown", [
    ("A + B * 2", "(A add (B mul 2))"),
    ("A - B - 1", "((A sub B) sub 1)"),
    ("A / B / 2", "((A div B) div 2)"),
    ("-A * B", "((neg A) mul B)"),
    ("-(A * B)", "(neg (A mul B))"),
    ("!A && B || ~A", "(((not A) and B) or (bitnot A))"),
    ("A < B == B > A", "((A lt B) eq (B gt A))"),
    ("A <= B != A >= B", "((A le B) ne (A ge B))"),
    ("A & B | A ^ B", "((A bitand B) bitor (A bitxor B))"),
    ("A | B ^ A & B", "(A bitor (B bitxor (A bitand B)))"),
    ("A << 1 + B >> 2", "((A shl (1 add B)) shr 2)"),
    ("A < B ? A : B", "((A lt B) ? A : B)"),
    ("A ? B : A ? 1 : 2", "(A ? B : (A ? 1 : 2))"),
    ("A ? B ? 1 : 2 : 3", "(A ? (B ? 1 : 2) : 3)"),
    ("(A)", "A"),
    ("max(A, min(B, 0)) + exp(-A)", "(max(A, min(B, 0)) add exp((neg A)))"),
    ("as_float(A, 16)", "as_float(A, 16)"),
])
def test_precedence_and_associativity(text, shown):
    assert show(expr(text)) == shown


@pytest.mark.parametrize("text, value, is_float", [
    ("1", 1, False), ("042", 42, False), ("1.5", 1.5, True), (".5", 0.5, True),
    ("1.", 1.0, True), ("1e-3", 1e-3, True), ("2E+2", 200.0, True), ("3.25e1", 32.5, True),
])
def test_literals(text, value, is_float):
    e = expr(text)
    assert isinstance(e, ast.Num) and e.value == value and e.is_float is is_float
    assert isinstance(e.value, float) is is_float


def test_calls_of_every_builtin_parse():
    for fn in ("exp", "log", "sqrt", "tanh", "sigmoid", "abs", "relu", "floor", "ceil"):
        assert show(expr(f"{fn}(A)")) == f"{fn}(A)"
    for fn in ("min", "max", "pow"):
        assert show(expr(f"{fn}(A, B)")) == f"{fn}(A, B)"
    assert show(expr("foo()")) == "foo()"


def test_expression_spans():
    e = expr("A +\n    exp(B)")
    assert (e.span.line, e.span.col, e.span.end_line) == (2, 7, 3)
    assert (e.right.span.line, e.right.span.col) == (3, 5)


def test_comments():
    fn = tilec.parse("// a leading comment\n"
                     "function (A[N]) /* inline */ -> (O) {\n"
                     "  /* a block\n"
                     "     comment over lines */\n"
                     "  O = A; // trailing\n"
                     "  // O = B;\n"
                     "}\n"
                     "// after\n")
    assert [s.name for s in fn.stmts] == ["O"]
    assert (fn.stmts[0].span.line, fn.stmts[0].span.col) == (5, 3)


def test_opencl_words_are_ordinary_names():
    fn = tilec.parse("function (float[N], kernel[M], half) -> (int, local) {\n"
                     "  int[exp, local : N, M] = +(float[exp] * kernel[local]);\n"
                     "  local = exp(int) + half;\n"
                     "}")
    assert [i.name for i in fn.inputs] == ["float", "kernel", "half"]
    c, a = fn.stmts
    assert c.output.name == "int" and [show(i) for i in c.output.idx] == ["exp", "local"]
    assert show(a.expr) == "(exp(int) add half)"


def test_keywords_of_the_grammar_are_still_names_where_a_name_is_expected():
    fn = tilec.parse("function (function[N]) -> (default) {\n"
                     "  default[i : N] = +(function[i]) default function;\n}")
    assert fn.inputs[0].name == "function" and fn.stmts[0].default.id == "function"


# Syntax errors ----------------------------------------------------------------------------------

SYNTAX_ERRORS = [
    # (text, line, col, the text at (line, col), words in the message)
    ("function (A[N]) -> (O) {\n  O = A +;\n}\n", 2, 10, ";", "unexpected ';'"),
    ("function (A[N]) -> (O) {\n  O[i : N] = +(A[i] - A[i]);\n}\n", 2, 21, "- A[i]",
     "unexpected '-' (expected one of ')', '*', '+', '==', '?')"),
    ("function (A[N]) -> (O) {\n  O[i : N] = max(A[i]);\n}\n", 2, 14, "max",
     "unexpected 'max'"),
    ("function (A[N]) (O) {\n}\n", 1, 17, "(O)", "(expected '->')"),
    ("function (A[N]) -> (O) {\n  O = A;\n} junk\n", 3, 3, "junk",
     "(expected the end of the text)"),
    ("function (A[N]) -> (O) {\n  O = A[0];\n}\n", 2, 8, "[0]", "unexpected '['"),
    ("function (A[N]) -> (O) {\n  O = A $ 2;\n}\n", 2, 9, "$ 2", "unexpected character '$'"),
    ("function (A[N]) -> (O) {\n  O = A;\n  P = 'x';\n}\n", 3, 7, "'x'",
     "unexpected character"),
    ("function (A[N]) -> (O) {\n  O = A;\n", 2, 9, "", "the text ended early"),
    ("function (A[N]) -> (O) {\n  O = exp(A\n\n  // more\n", 2, 12, "",
     "the text ended early (expected one of"),
    ("function", 1, 9, "", "the text ended early (expected '(')"),
    ("function (A[N]) -> (O) {\n  O = A; /* not closed\n}\n", 2, 10, "/* not",
     "unexpected '/'"),
    ("function (A[N]) -> (O) {\n  [[hint]]\n}\n", 3, 1, "}", "expected one of '[[', a name"),
]


@pytest.mark.parametrize("text, line, col, there, words", SYNTAX_ERRORS)
def test_syntax_errors_point_at_the_problem(text, line, col, there, words):
    with pytest.raises(TileSyntaxError) as info:
        tilec.parse(text, "bad.tile")
    err = info.value
    assert (err.line, err.col) == (line, col)
    assert at(text, line, col).startswith(there)
    assert words in err.message
    rendered = str(err)
    assert rendered.startswith(f"bad.tile:{line}:{col}: ")
    source_line = text.split("\n")[line - 1]
    assert f"\n    {source_line}\n    {' ' * (col - 1)}^" in rendered


def test_empty_text():
    with pytest.raises(TileSyntaxError) as info:
        tilec.parse("")
    assert (info.value.line, info.value.col) == (1, 1)
    assert "ended early (expected 'function')" in str(info.value)
    with pytest.raises(TileSyntaxError) as info:
        tilec.parse("// only a comment\n\n")
    assert (info.value.line, info.value.col) == (3, 1)


def test_lines_are_counted_by_newlines_only():
    # Form feeds are white space and U+2028 may sit in a comment; neither starts a line.
    text = "function (A[N]) \f -> (O) { // \u2028 x\n  O = A +;\n}"
    with pytest.raises(TileSyntaxError) as info:
        tilec.parse(text)
    assert (info.value.line, info.value.col) == (2, 10)
    assert "\n      O = A +;\n" in str(info.value)


def test_windows_line_endings():
    text = "function (A[N]) -> (O) {\r\n  O = A +;\r\n}\r\n"
    with pytest.raises(TileSyntaxError) as info:
        tilec.parse(text)
    assert (info.value.line, info.value.col) == (2, 10)
    assert "\n      O = A +;\n" in str(info.value)


def test_caret_lines_up_under_tabs():
    with pytest.raises(TileSyntaxError) as info:
        tilec.parse("function (A[N]) -> (O) {\n\tO =\tA +;\n}")
    assert (info.value.line, info.value.col) == (2, 9)
    assert str(info.value).endswith("\n    \tO =\tA +;\n    \t   \t   ^")


def test_deep_nesting_is_a_syntax_error_not_a_crash():
    deep = " + A" * (MAX_DEPTH + 50)
    with pytest.raises(TileSyntaxError) as info:
        tilec.parse(f"function (A[N]) -> (O) {{\n  O = A{deep};\n}}")
    assert info.value.line == 2 and "nested more than" in info.value.message
    with pytest.raises(TileSyntaxError):
        tilec.parse("function (A[N]) -> (O) {\n  O = " + "-" * 5000 + "A;\n}")
    # Parentheses alone do not nest the tree.
    fn = tilec.parse("function (A[N]) -> (O) {\n  O = " + "(" * 3000 + "A" + ")" * 3000 + ";\n}")
    assert show(fn.stmts[0].expr) == "A"
    assert tilec.parse("function (A[N]) -> (O) {\n  O = A" + " + A" * (MAX_DEPTH - 5) + ";\n}")


# No lark exception escapes ------------------------------------------------------------------------

TOKENS = [
    "function", "(", ")", "[", "]", "{", "}", "->", ",", ";", ":", "=", "+", "-", "*", "/",
    "<", ">", "==", "!=", "<=", ">=", "?", "&&", "||", "!", "~", "&", "|", "^", "<<", ">>",
    "[[", "]]", "no_defract", "default", "A", "B", "N", "i", "j", "0", "3", "2.5", ".5",
    "1e-3", "exp", "max", "as_float", "// c\n", "/* c */", "/*", "*/", "\n", "\t", "\r\n",
    "\f", "\u2028", "é", "$", "@", "'", '"', "#",
]
VALID = ("function (A[N], B[N]) -> (O) {\n"
         "  O[i : N] = +(A[i] * B[i]), i < 3;\n"
         "  P = exp(O) + 1;\n"
         "}\n")


@st.composite
def mutated(draw) -> str:
    words = VALID.split(" ")
    for _ in range(draw(st.integers(1, 4))):
        k = draw(st.integers(0, len(words) - 1))
        choice = draw(st.sampled_from(["drop", "insert", "replace"]))
        if choice == "drop" and len(words) > 1:
            words.pop(k)
        elif choice == "insert":
            words.insert(k, draw(st.sampled_from(TOKENS)))
        else:
            words[k] = draw(st.sampled_from(TOKENS))
    return " ".join(words)


SOUP = st.one_of(
    st.lists(st.sampled_from(TOKENS), max_size=40).map(" ".join),
    st.lists(st.sampled_from(TOKENS), max_size=40).map("".join),
    st.text(string.printable, max_size=80),
    st.text(max_size=40),
    mutated(),
)


def assert_inside(err: TileError, text: str) -> None:
    if err.line is None:
        return
    lines = text.split("\n")
    assert 1 <= err.line <= len(lines), (err.line, err.col)
    assert 1 <= err.col <= len(lines[err.line - 1]) + 1, (err.line, err.col)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SOUP)
def test_token_soup_raises_only_tile_errors_inside_the_source(text):
    try:
        fn = tilec.parse(text, "soup.tile")
    except TileError as e:
        assert isinstance(e, TileSyntaxError)
        assert_inside(e, text)
        assert "soup.tile" in str(e)
        return
    # What parses must also check (or fail) with a TileError only.
    try:
        tilec.check_program(fn, {"A": (3,), "B": (3,)})
    except TileError as e:
        assert_inside(e, text)
