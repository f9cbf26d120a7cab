"""Commands that never hurt the user (issue 8, section 5).

Each case runs the real ``shinglefs`` console script in a subprocess, from a
working directory of the test's choosing, and checks three things: the exit
code documented in docs/cli.md, one ``shinglefs: error:`` line without a
traceback, and that nothing the command did not create was touched.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "shinglefs"

# A hint names a Python function when it shows ``Class.method``, ``func()`` or a
# keyword argument of ours; it suggests destroying data when it says so.
PYTHON_NAME = re.compile(r"\b[A-Z][a-z]+[A-Z]\w*\.\w+|\b[a-z_][a-z0-9_]*\(\)|\bcheckpoint_path\b")
DESTROYS = re.compile(r"\b(remove|delete|deleting|wipe|erase|rm)\b|start over|drop the old", re.I)


def _literal_text(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return ["".join(v.value for v in node.values
                        if isinstance(v, ast.Constant) and isinstance(v.value, str))]
    if isinstance(node, ast.BinOp):
        return _literal_text(node.left) + _literal_text(node.right)
    return []


def _hints() -> list[tuple[str, int, str]]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "hint":
                found += [(str(path.relative_to(SRC)), node.value.lineno, text)
                          for text in _literal_text(node.value)]
            elif (isinstance(node, ast.Assign) and len(node.targets) == 1
                  and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "hint"):
                found += [(str(path.relative_to(SRC)), node.lineno, text)
                          for text in _literal_text(node.value)]
    return found


def test_hints_never_name_python_functions_nor_suggest_deleting_data() -> None:
    hints = _hints()
    assert len(hints) > 50  # the scan sees the hints (a broken scan would pass vacuously)
    bad = [h for h in hints if PYTHON_NAME.search(h[2]) or DESTROYS.search(h[2])]
    assert bad == []
