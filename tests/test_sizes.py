"""The size rules a reader relies on: no function over 120 lines and no module over 700 lines.

Checked over ``trainers/``. ``rlhf_lab/`` joins :data:`PACKAGES` once issue 27's lab rooms land
(its offenders on this branch: ``api.launch_experiment`` 136 lines, ``plan._plan_experiment``
130, ``logs.diagnose`` 122; modules plan.py, compare.py, logs.py, api/__init__.py,
runs/launch.py, runs/state.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("trainers",)
MAX_FUNCTION_LINES = 120
MAX_MODULE_LINES = 700


def long_functions(source: str, limit: int) -> list[tuple[str, int]]:
    """(qualified name, lines) of every function or method longer than ``limit`` lines
    (decorators excluded, docstring included)."""
    out = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lines = child.end_lineno - child.lineno + 1
                    if lines > limit:
                        out.append((name, lines))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return out


def offenders(packages: tuple[str, ...]) -> tuple[list[str], list[str]]:
    functions, modules = [], []
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            source = path.read_text()
            where = path.relative_to(ROOT)
            n = len(source.splitlines())
            if n > MAX_MODULE_LINES:
                modules.append(f"{where}: {n} lines")
            for name, lines in long_functions(source, MAX_FUNCTION_LINES):
                functions.append(f"{where}::{name}: {lines} lines")
    return functions, modules


def test_no_function_over_120_lines_and_no_module_over_700() -> None:
    functions, modules = offenders(PACKAGES)
    assert not functions, "functions over 120 lines:\n" + "\n".join(functions)
    assert not modules, "modules over 700 lines:\n" + "\n".join(modules)


def test_long_functions_are_found_nested_and_named() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(130))
    source = f"class A:\n    def f(self):\n    {body.replace(chr(10), chr(10) + '    ')}\n"
    source += f"def g():\n{body}\ndef h():\n    return 1\n"
    found = long_functions(source, MAX_FUNCTION_LINES)
    assert found == [("A.f", 131), ("g", 131)]
