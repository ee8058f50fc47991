"""The lab's import contract (pyproject.toml, [tool.importlinter]), checked with import-linter:

(a) the CLI and the MCP server import no lab module but rlhf_lab.api and rlhf_lab.errors;
(b) nothing under rlhf_lab imports torch or transformers itself, and importing any lab module
    leaves both out of sys.modules (a subprocess: import-linter does not follow `trainers`);
(c) no import cycles among the lab's modules.
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

import rlhf_lab
from tests._helpers.imports import python_output

ROOT = Path(__file__).resolve().parents[2]
ADAPTERS = ("rlhf_lab.cli", "rlhf_lab.mcp_server")
# what the adapters may import among lab modules (besides each other: `rlhf-lab mcp` serves)
ADAPTER_ALLOWED = ("rlhf_lab", "rlhf_lab.api", "rlhf_lab.errors", *ADAPTERS)
# removed by the architecture work in other branches (catalog<->configs, logs<->runs)


def lab_modules() -> list[str]:
    """Every module and package under rlhf_lab, by dotted name."""
    found = ["rlhf_lab"]
    for info in pkgutil.walk_packages(rlhf_lab.__path__, prefix="rlhf_lab."):
        if not info.name.endswith(".__main__"):  # running it is not importing it
            found.append(info.name)
    return sorted(found)


def contracts() -> dict[str, dict]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in config["contracts"]}


def lint(contract_id: str) -> subprocess.CompletedProcess:
    """lint-imports on one contract of pyproject.toml (exit 0 = kept)."""
    exe = Path(sys.executable).with_name("lint-imports")
    return subprocess.run(
        [str(exe), "--contract", contract_id, "--no-cache"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )


def covered(module: str, forbidden: list[str]) -> bool:
    return any(module == f or module.startswith(f + ".") for f in forbidden)


def is_allowed_for_adapters(module: str) -> bool:
    if module in ADAPTER_ALLOWED:
        return True
    return any(module.startswith(f"{m}.") for m in ("rlhf_lab.api", *ADAPTERS))


# ------------------------------------------------------------------------------------- (a)


def test_adapters_import_only_the_api_layer():
    out = lint("adapters-use-the-api")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "KEPT" in out.stdout


def test_the_adapter_contract_forbids_every_other_lab_module():
    """A new lab module must be added to the forbidden list (or be part of the API layer or an adapter)."""
    forbidden = contracts()["adapters-use-the-api"]["forbidden_modules"]
    missing = [
        m for m in lab_modules() if not is_allowed_for_adapters(m) and not covered(m, forbidden)
    ]
    assert not missing, f"add to [tool.importlinter] adapters-use-the-api: {missing}"
    assert set(contracts()["adapters-use-the-api"]["source_modules"]) == set(ADAPTERS)


# ------------------------------------------------------------------------------------- (b)


def test_no_lab_module_imports_torch_or_transformers_itself():
    out = lint("lab-is-torch-free")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]


def module_level_imports(tree: ast.Module) -> list[str]:
    """Modules imported by the top-level statements of a file (not inside functions/classes,
    not under ``if TYPE_CHECKING:``)."""
    found: list[str] = []
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append(node.module)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
            stack += node.body + node.orelse
        elif isinstance(node, ast.Try):
            stack += node.body + node.orelse + node.finalbody
            stack += [s for h in node.handlers for s in h.body]
    return found


def test_no_lab_module_imports_torch_or_transformers_at_module_level():
    offenders = []
    for path in sorted((ROOT / "rlhf_lab").rglob("*.py")):
        for name in module_level_imports(ast.parse(path.read_text())):
            if name.split(".")[0] in ("torch", "transformers"):
                offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert not offenders, offenders
    # the check itself sees a module-level import, and not one inside a function
    sample = ast.parse("import torch\ndef f():\n    import transformers\n")
    assert module_level_imports(sample) == ["torch"]


def test_importing_any_lab_module_leaves_torch_and_transformers_out():
    modules = lab_modules()
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "    heavy = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "    if heavy:\n"
        "        sys.exit(f'{name} imported {heavy}')\n"
        "print('CLEAN', len(sys.modules))\n"
    )
    assert "CLEAN" in python_output(code, timeout=300)
    assert len(modules) > 20 and "rlhf_lab.api.watching" in modules


# ------------------------------------------------------------------------------------- (c)


def test_lab_modules_have_no_import_cycles():
    out = lint("lab-modules-acyclic")
    assert out.returncode == 0, out.stdout[-3000:]
