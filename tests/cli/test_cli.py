"""The `tilec check` and `tilec eval` commands, called through `tilec.cli.main.main`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tilec
from tilec.cli.main import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

MATMUL = ("// shapes: A=3x5 B=5x2\n"
          "function (A[M, K], B[K, N]) -> (C, D) {\n"
          "  C[m, n : M, N] = +(A[m, k] * B[k, n]);\n"
          "  D = C * 2;\n"
          "}\n")


@pytest.fixture
def matmul(tmp_path: Path) -> Path:
    path = tmp_path / "mm.tile"
    path.write_text(MATMUL)
    return path


def table(out: str) -> dict[str, list[str]]:
    """`tilec check` output: name -> [dims, dtype, role]."""
    rows = [line.split() for line in out.strip().splitlines()]
    return {r[0]: r[1:] for r in rows}


def run_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: ")
    assert "Traceback" not in captured.err
    return captured.err


# check -------------------------------------------------------------------------------------------

def test_check_uses_the_shapes_comment(capsys, matmul):
    assert main(["check", str(matmul)]) == 0
    assert table(capsys.readouterr().out) == {
        "A": ["3x5", "float32", "input"],
        "B": ["5x2", "float32", "input"],
        "C": ["3x2", "float32", "output"],
        "D": ["3x2", "float32", "output"],
    }


def test_check_with_shapes_and_dtype(capsys, matmul):
    assert main(["check", str(matmul), "--shape", "A=7x4", "--shape", "B=4,9",
                 "--dtype", "float16"]) == 0
    rows = table(capsys.readouterr().out)
    assert rows["A"] == ["7x4", "float16", "input"]
    assert rows["C"] == ["7x9", "float16", "output"]


def test_check_shows_temporaries_and_scalars(capsys, tmp_path):
    path = tmp_path / "t.tile"
    path.write_text("function (A[N], S) -> (O) {\n  T[] = +(A[i]);\n  O = T * S;\n}\n")
    assert main(["check", str(path), "--shape", "A=4", "--shape", "S=scalar"]) == 0
    rows = table(capsys.readouterr().out)
    assert rows["T"] == ["scalar", "float32", "temporary"]
    assert rows["S"] == ["scalar", "float32", "input"]
    assert rows["O"] == ["scalar", "float32", "output"]


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.tile")), ids=lambda p: p.name)
def test_check_examples(capsys, path):
    assert main(["check", str(path)]) == 0
    rows = table(capsys.readouterr().out)
    program = tilec.check_program(path.read_text())
    assert set(rows) == set(program.tensors)
    for name, t in program.tensors.items():
        assert rows[name][0] == "x".join(map(str, t.shape))


# eval --------------------------------------------------------------------------------------------

def test_eval_saves_outputs_matching_evaluate(capsys, matmul, tmp_path):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((4, 6)).astype(np.float32)
    b = rng.standard_normal((6, 3)).astype(np.float32)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    out = tmp_path / "out"
    assert main(["eval", str(matmul), "--input", f"A={tmp_path / 'a.npy'}",
                 "--input", f"B={tmp_path / 'b.npy'}", "--save", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "C: shape [4, 3] float32" in printed and "D: shape [4, 3] float32" in printed
    want = tilec.evaluate(MATMUL, A=a, B=b)
    assert sorted(p.name for p in out.iterdir()) == ["C.npy", "D.npy"]
    for name, arr in want.items():
        saved = np.load(out / f"{name}.npy")
        assert saved.dtype == arr.dtype
        np.testing.assert_array_equal(saved, arr)
    np.testing.assert_allclose(want["C"], a @ b, rtol=1e-5, atol=1e-5)


def test_eval_keeps_the_element_type_of_input_arrays(capsys, matmul, tmp_path):
    a = np.arange(15, dtype=np.int32).reshape(3, 5)
    b = np.ones((5, 2), dtype=np.int32)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    assert main(["eval", str(matmul), "--input", f"A={tmp_path / 'a.npy'}",
                 "--input", f"B={tmp_path / 'b.npy'}", "--save", str(tmp_path / "o")]) == 0
    assert "C: shape [3, 2] int32" in capsys.readouterr().out
    saved = np.load(tmp_path / "o" / "C.npy")
    assert saved.dtype == np.int32
    np.testing.assert_array_equal(saved, a @ b)
    np.testing.assert_array_equal(saved, tilec.evaluate(MATMUL, A=a, B=b)["C"])


def test_eval_makes_up_the_inputs_not_given(capsys, matmul, tmp_path):
    a = np.ones((3, 5), dtype=np.float32)
    np.save(tmp_path / "a.npy", a)
    assert main(["eval", str(matmul), "--input", f"A={tmp_path / 'a.npy'}",
                 "--save", str(tmp_path / "o")]) == 0
    assert np.load(tmp_path / "o" / "C.npy").shape == (3, 2)
    capsys.readouterr()
    # Random inputs come from the seed: the same seed, the same outputs.
    for k in (1, 2):
        assert main(["eval", str(matmul), "--seed", "5", "--shape", "A=2x2", "--shape", "B=2x2",
                     "--save", str(tmp_path / f"s{k}")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "s1" / "D.npy"),
                                  np.load(tmp_path / "s2" / "D.npy"))
    assert "C: shape [2, 2] float32" in capsys.readouterr().out


def test_eval_example(capsys):
    assert main(["eval", str(EXAMPLES / "softmax.tile"), "--shape", "X=3x4"]) == 0
    assert capsys.readouterr().out.startswith("Y: shape [3, 4] float32 mean 0.25")


# errors ------------------------------------------------------------------------------------------

def test_syntax_error_is_reported_with_its_place(capsys, tmp_path):
    path = tmp_path / "bad.tile"
    path.write_text("function (A[N]) -> (O) {\n  O = A +;\n}\n")
    for command in ("check", "eval"):
        err = run_error(capsys, [command, str(path), "--shape", "A=3"])
        assert err.startswith(f"error: {path}:2:10: unexpected ';'")
        assert "\n      O = A +;\n" in err and "\n             ^\n" in err


def test_a_shape_given_replaces_the_comments_and_the_others_stay(capsys, matmul):
    assert main(["check", str(matmul), "--shape", "A=7x5"]) == 0
    rows = table(capsys.readouterr().out)
    assert rows["A"][0] == "7x5" and rows["B"][0] == "5x2" and rows["C"][0] == "7x2"


def test_check_error_is_reported_with_its_place(capsys, matmul):
    err = run_error(capsys, ["check", str(matmul), "--shape", "A=3x5", "--shape", "B=4x2"])
    assert err.startswith(f"error: {matmul}:2:22: size symbol K is 5 from dimension 1 of 'A' "
                          "but 4 from dimension 0 of 'B'")
    bare = matmul.with_name("bare.tile")  # no shapes comment to fall back on
    bare.write_text(MATMUL.split("\n", 1)[1])
    err = run_error(capsys, ["check", str(bare), "--shape", "A=3x5"])
    assert err.startswith(f"error: {bare}:1:20: no shape given for input 'B'")
    err = run_error(capsys, ["check", str(matmul), "--shape", "A=3x5", "--shape", "B=5x2",
                             "--shape", "Z=1"])
    assert err.startswith(f"error: {matmul}:2:1: a shape was given for 'Z'")


def test_bad_shapes_comment(capsys, tmp_path):
    path = tmp_path / "c.tile"
    path.write_text(MATMUL.replace("A=3x5", "A=3x0"))
    err = run_error(capsys, ["check", str(path)])
    assert err.startswith(f"error: {path}:1:12: shapes comment: the shape of A has a "
                          "non-positive size")


@pytest.mark.parametrize("argv, words", [
    (["check", "{missing}"], "cannot read the file"),
    (["check", "{file}", "--shape", "A=3xq"], "--shape: the shape of A must be integers"),
    (["check", "{file}", "--shape", "3x5"], "--shape: expected NAME=AxBxC"),
    (["check", "{file}", "--dtype", "int64"], "unsupported element type 'int64'"),
    (["eval", "{file}", "--input", "A"], "--input: expected NAME=FILE.npy"),
    (["eval", "{file}", "--input", "A={missing}"], "--input A: cannot load"),
    (["eval", "{file}", "--input", "A={text}"], "--input A: cannot load"),
])
def test_usage_errors(capsys, matmul, tmp_path, argv, words):
    names = {"file": str(matmul), "missing": str(tmp_path / "nope"), "text": str(matmul)}
    err = run_error(capsys, [a.format(**names) for a in argv])
    assert words in err


def test_input_of_an_unsupported_type(capsys, matmul, tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((3, 5), dtype=np.complex64))
    err = run_error(capsys, ["eval", str(matmul), "--input", f"A={tmp_path / 'a.npy'}"])
    assert "unsupported element type" in err


RESHAPE = ("// shapes: X=4x6\n"
           "function (X, D) -> (O) {\n"
           "  O = reshape(X, D, 24 / D);\n"
           "}\n")


def test_value_fixes_an_input_used_as_a_size(capsys, tmp_path: Path):
    path = tmp_path / "r.tile"
    path.write_text(RESHAPE)
    assert main(["check", str(path), "--value", "D=3"]) == 0
    t = table(capsys.readouterr().out)
    assert t["D"] == ["scalar", "int32", "input"] and t["O"][0] == "3x8"
    x = np.random.default_rng(0).uniform(-1, 1, (4, 6)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["eval", str(path), "--value", "D=2", "--input", f"X={tmp_path / 'x.npy'}",
                 "--save", str(tmp_path / "out")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "O.npy"), x.reshape(2, 12))
    capsys.readouterr()
    err = run_error(capsys, ["check", str(path)])
    assert ":3:18: the input 'D' is used as a size" in err and "--value D=N" in err
    err = run_error(capsys, ["check", str(path), "--value", "D=two"])
    assert "--value: expected NAME=INTEGER, got 'D=two'" in err
