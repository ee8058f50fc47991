"""No function of the lab takes more than 7 parameters (positional, keyword-only, ``*args`` and
``**kwargs`` each count; ``self`` and ``cls`` do not): what travels together is one typed value
(a launch is one :class:`rlhf_lab.api.RunRequest`, a CLI command with many flags takes one
dataclass of them, a memory estimate's shape and precision are each one value)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "rlhf_lab"
MAX_PARAMETERS = 7


def parameter_count(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = node.args
    named = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    named = [n for n in named if n not in ("self", "cls")]
    return len(named) + (args.vararg is not None) + (args.kwarg is not None)


def too_many(root: Path, base: Path = ROOT) -> dict[str, int]:
    """``path::function`` (the path relative to ``base``) -> its parameter count, for each
    function under ``root`` over the limit."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                count = parameter_count(node)
                if count > MAX_PARAMETERS:
                    found[f"{path.relative_to(base)}::{node.name}"] = count
    return found


def test_no_lab_function_takes_more_than_seven_parameters():
    over = too_many(LAB)
    assert not over, f"functions with more than {MAX_PARAMETERS} parameters: {over}"


def test_the_count_sees_keyword_only_and_star_parameters(tmp_path):
    (tmp_path / "m.py").write_text(
        "def ok(self, a, b, c, d, e, f, g): ...\n"
        "def kw(a, b, *, c, d, e, f, g, h): ...\n"
        "class C:\n"
        "    def star(self, a, b, c, d, e, f, *args, **kwargs): ...\n"
    )
    assert too_many(tmp_path, tmp_path) == {"m.py::kw": 8, "m.py::star": 8}
