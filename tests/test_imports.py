"""The layout's rules: imports flow one way (import-linter's contracts in pyproject.toml), no
module grows past ~500 lines without saying why at its top, and the README's layout table names
every package."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tilec"
LONG = 500


def _lint_imports() -> list[str]:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.fail("lint-imports is not installed (pip install -e .[test])")
    return [exe, "--no-cache"]


def test_imports_flow_down_the_pipeline():
    proc = subprocess.run(_lint_imports(), cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


def test_an_upward_import_is_caught(tmp_path):
    """The contracts bite: a copy of the package with one upward import (lang -> compiler)
    fails the check."""
    copy = tmp_path / "tilec"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    bad = copy / "lang" / "source.py"
    bad.write_text(bad.read_text() + "\n\ndef _upward():\n    from ..compiler import compile\n\n"
                   "    return compile\n")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    proc = subprocess.run(_lint_imports(), cwd=tmp_path, capture_output=True, text=True,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode != 0
    assert "tilec.lang.source -> tilec.compiler" in proc.stdout


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_long_modules_say_why(path):
    lines = path.read_text().count("\n")
    if lines <= LONG:
        return
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert re.search(r"Long \(over 500 lines\) because", doc), \
        f"{path.relative_to(ROOT)} has {lines} lines and no reason at its top"


def test_readme_layout_table_matches_the_tree():
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Layout"):]
    packages = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
    for pkg in packages:
        assert f"`tilec/{pkg}/`" in table, f"README's layout table lacks tilec/{pkg}/"
    for module in sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"):
        assert f"`tilec/{module}`" in table or f"{module[:-3]}" in table, module
    for named in re.findall(r"`tilec/(\w+)/`", table):
        assert named in packages, f"README names tilec/{named}/, which does not exist"
