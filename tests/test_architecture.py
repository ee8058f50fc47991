"""The claims docs/architecture.md makes about the code's shape, checked on the tree: the lab in
rooms (few loose modules, each room a package that says what it owns), modules and functions of
a readable size, no import cycle between modules, and one place that asks for the GPUs."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rlhf_lab", "trainers")
MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 120
MAX_LOOSE_LAB_MODULES = 8
ROOMS = ("api", "cli", "evaluation", "index", "ledger", "mcp_server", "planning", "results", "runs")


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def long_functions(source: str, limit: int) -> list[tuple[str, int]]:
    """(name, lines) of every function or method in ``source`` longer than ``limit`` lines."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            length = node.end_lineno - first + 1
            if length > limit:
                out.append((node.name, length))
    return out


def test_long_functions_finds_a_long_one_and_passes_a_short_one():
    body = "\n".join(f"    x{i} = {i}" for i in range(5))
    source = f"def short():\n{body}\n\n@decorated\ndef long():\n{body}\n{body}\n"
    assert long_functions(source, 8) == [("long", 12)]
    assert long_functions(source, 12) == []


def test_the_lab_keeps_few_loose_modules_and_each_room_says_what_it_owns():
    loose = sorted(p.name for p in (ROOT / "rlhf_lab").glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= MAX_LOOSE_LAB_MODULES, loose
    for room in ROOMS:
        init = ROOT / "rlhf_lab" / room / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.split()) >= 15, f"rlhf_lab/{room} has no docstring saying its job"


def test_no_source_module_is_over_the_size_limit():
    over = {_rel(p): n for p in _sources() if (n := p.read_text().count("\n")) > MAX_MODULE_LINES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines: {over}"


def test_no_function_is_over_the_size_limit():
    over = {
        f"{_rel(p)}::{name}": n
        for p in _sources()
        for name, n in long_functions(p.read_text(), MAX_FUNCTION_LINES)
    }
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines: {over}"


def _import_graph():
    grimp = pytest.importorskip("grimp")
    return grimp.build_graph(*PACKAGES, include_external_packages=False, cache_dir=None)


def module_cycles(graph) -> list[list[str]]:
    """Strongly connected groups of more than one module (each one import cycle or more),
    counting every import, function-level ones included. Packages' ``__init__`` modules count
    as modules (importing ``a.b`` runs ``a/__init__``), so a package that imports its own
    submodule which imports the package back is a cycle too."""
    modules = sorted(graph.modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    counter = 0

    def visit(start: str) -> None:  # iterative Tarjan (the graph is deep)
        nonlocal counter
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges.get(child, []))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))

    for module in modules:
        if module not in index:
            visit(module)
    return groups


class _Graph:
    def __init__(self, edges: dict[str, list[str]]):
        self.modules = set(edges) | {m for v in edges.values() for m in v}
        self._edges = edges

    def find_modules_directly_imported_by(self, module: str) -> list[str]:
        return self._edges.get(module, [])


def test_module_cycles_finds_a_cycle_and_passes_a_chain():
    assert module_cycles(_Graph({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]})) == [
        ["a", "b", "c"]
    ]
    assert module_cycles(_Graph({"a": ["b"], "b": ["c"], "d": ["a", "c"]})) == []


def test_no_import_cycle_between_modules_of_the_lab_and_the_trainers():
    cycles = module_cycles(_import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def _imports_of(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_one_place_asks_for_the_gpus():
    # the lab: NVML through runs/resources.py; the trainers: torch's device count in
    # trainers/core/distributed.py (docs/architecture.md, "Devices, placement and Slurm")
    nvml = [_rel(p) for p in _sources() if "pynvml" in _imports_of(p)]
    assert nvml == ["rlhf_lab/runs/resources.py"]
    counting = [_rel(p) for p in _sources() if "cuda.device_count(" in p.read_text()]
    assert counting == ["trainers/core/distributed.py"]


def _readme_layout_paths() -> list[str]:
    """The folders README.md's Layout section names. Each line of its tree is ``names   what``
    (names comma-separated, two spaces of indent per level under the line above); a lone
    ``folder/`` further along a line is a top-level folder of a second column."""
    block = (ROOT / "README.md").read_text().split("## Layout", 1)[1].split("```", 2)[1]
    paths: list[str] = []
    parents: list[str] = []
    for line in block.strip("\n").splitlines():
        depth = (len(line) - len(line.lstrip(" "))) // 2
        chunks = re.split(r" {3,}", line.strip())
        names = [n.strip().rstrip("/") for n in chunks[0].split(", ")]
        parents = [*parents[:depth], names[0]]
        paths += ["/".join([*parents[:depth], n]) for n in names]
        paths += [c.rstrip("/") for c in chunks[1:] if re.fullmatch(r"[\w.]+/", c)]
    return paths


def test_the_readme_layout_names_folders_that_exist():
    paths = _readme_layout_paths()
    assert "rlhf_lab/planning" in paths and "trainers/core" in paths
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"README.md's Layout names what the tree lacks: {missing}"
    rooms = {p.split("/")[1] for p in paths if p.startswith("rlhf_lab/")}
    assert {"planning", "runs", "results", "evaluation", "ledger", "index", "api"} <= rooms


# ------------------------------------------------------------------ a config travels typed

# Every function of the lab takes a trainer config only as the typed view (TrainerConfig), built
# where a config is resolved or read off disk, never as a plain mapping: the launch chain (api,
# runs, cli, mcp_server) and the rooms that plan runs and read their results alike.
DICT_CONFIG_ALLOWED: dict[str, str] = {
    "rlhf_lab/planning/config_models.py::validate_data(data)": "the validation boundary: raw "
    "YAML or user data, validated into the family's pydantic model",
    "rlhf_lab/planning/trainer_config.py::__init__(data)": "the view's constructor: the data "
    "it wraps",
    "rlhf_lab/planning/trainer_config.py::_validate(data)": "the view validating the data it holds",
    "rlhf_lab/planning/memory/architecture.py::arch_from_config(cfg)": "a model's Hugging Face "
    "config.json, not a trainer config",
    "rlhf_lab/planning/memory/architecture.py::_int(cfg)": "a model's Hugging Face config.json",
}
"""``path::function(param)`` -> why that parameter is a true boundary where a config arrives
as plain data."""
_CONFIG_NAME = re.compile(r"(^|_)(config|cfg|conf)(_|$)|^config_?data$")
_MAPPING_TYPE = re.compile(r"\b(dict|Dict|Mapping|MutableMapping|ConfigArg)\b")


def _annotation_text(node: ast.expr | None) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value  # a quoted annotation
    return ast.unparse(node) if node is not None else ""


def _is_config_param(arg: ast.arg, names: set[str]) -> bool:
    """Named like a config (``config``, ``cfg``, ``base_config``, ``config_data``), or ``data``
    beside a ``family`` (a config's values passed with the family they belong to)."""
    return bool(_CONFIG_NAME.search(arg.arg)) or (arg.arg == "data" and "family" in names)


def dict_config_params(paths: Iterable[Path]) -> list[str]:
    """``path::function(param: annotation)`` of every parameter in ``paths`` that takes a
    config as a ``dict`` / ``Mapping`` / ``ConfigArg`` (nested functions and methods
    included; :data:`DICT_CONFIG_ALLOWED` left out)."""
    out = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            names = {a.arg for a in args}
            for arg in args:
                shown = _annotation_text(arg.annotation)
                if not (_is_config_param(arg, names) and _MAPPING_TYPE.search(shown)):
                    continue
                where = f"{_rel(path) if path.is_relative_to(ROOT) else path.name}::{node.name}"
                if f"{where}({arg.arg})" not in DICT_CONFIG_ALLOWED:
                    out.append(f"{where}({arg.arg}: {shown})")
    return out


def test_dict_config_params_finds_a_config_passed_as_a_mapping(tmp_path):
    source = tmp_path / "example.py"
    source.write_text(
        "def check(family: str, data: dict, device: str): ...\n"
        "def run(config: 'Mapping[str, Any]' = None): ...\n"
        "def arm(base_config: ConfigArg | None): ...\n"
        "def typed(family: str, config: TrainerConfig, refs: dict[str, str]): ...\n"
        "def record(run_dir: Path, data: dict[str, Any]): ...\n"
        "class A:\n"
        "    def method(self, *, cfg: dict | None = None):\n"
        "        def inner(config_data: dict): ...\n"
    )
    assert dict_config_params([source]) == [
        "example.py::check(data: dict)",
        "example.py::run(config: Mapping[str, Any])",
        "example.py::arm(base_config: ConfigArg | None)",
        "example.py::method(cfg: dict | None)",
        "example.py::inner(config_data: dict)",
    ]


def test_no_lab_function_takes_a_config_as_a_mapping():
    found = dict_config_params((ROOT / "rlhf_lab").rglob("*.py"))
    assert not found, "a config as a plain mapping (take a TrainerConfig):\n" + "\n".join(found)
    allowed = {key.split("::")[0] for key in DICT_CONFIG_ALLOWED}
    assert all((ROOT / path).is_file() for path in allowed), "an allowed entry names no file"
