"""Reading cost of a trainer: the project files, and their lines, that a reader opens to follow
one training step from the trainer's ``main`` (setup included), measured from the source alone.

    uv run python bench/reading_cost.py                  # every family's trainer
    uv run python bench/reading_cost.py --files          # ... and the files each one opens
    git archive main trainers rlhf_lab | tar -x -C /tmp/old
    uv run python bench/reading_cost.py --baseline /tmp/old   # before/after side by side

Method (static, no import, no torch). Start at the definition ``main`` of the trainer module
(``trainers/<family>/train.py``) and follow names the way a reader follows them:

* a reached function, class or module-level assignment is read whole: every name it uses that
  resolves to a definition of a project module (``trainers`` or ``rlhf_lab``) is reached in turn,
  whether imported at the top of the file, imported inside the function (a lazy import counts
  once the function that holds it is reached) or defined in the same file; ``module.name``
  through an imported project module counts the same. A reached class brings every method.
* a module that is opened also runs its import-time registrations, so a top-level function whose
  decorator is a project definition (``@register_adv_est("grpo")``) is reached with its module:
  the reader of a registry opens what it holds.
* every branch counts: the walk does not know the config, so a ``if cfg.x: ...`` path is followed
  whichever way the step takes it. Type annotations are not followed (they are not called), nor
  are names built at run time (``importlib``, ``getattr`` on strings).

A file is opened when any definition in it is reached; its whole length counts toward "lines"
(the reader opens the file), and the reached definitions alone toward "def lines". Empty
package ``__init__.py`` files are not counted. This is an upper bound of what one algorithm's
step needs (the PPO branch counts toward GRPO's figure) and a lower bound of what a curious
reader opens (attribute calls on objects whose class is never named are not followed).

Targets (issue 27): one GRPO step (``policy_gradients``) <= 12 files / <= 4,000 lines, one DPO
step (``direct_alignment``) <= 8 files / <= 2,500 lines. Writes bench/results/reading_cost.json.
A measurement of the source, not of time: figures do not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

from _common import ROOT, print_table, write_results

PACKAGES = ("trainers", "rlhf_lab")
TRAINERS = {
    "grpo (policy_gradients)": "trainers.policy_gradients.train",
    "dpo (direct_alignment)": "trainers.direct_alignment.train",
    "sft": "trainers.sft.train",
    "reward_models": "trainers.reward_models.train",
    "rejection_sampling": "trainers.rejection_sampling.train",
    "distillation": "trainers.distillation.train",
    "evaluation": "trainers.evaluation.run",
}
TARGETS = {"grpo (policy_gradients)": (12, 4000), "dpo (direct_alignment)": (8, 2500)}


@dataclass
class Module:
    """One parsed project module: its top-level definitions and the names its imports bind."""

    name: str
    path: Path
    lines: int
    defs: dict[str, list[ast.AST]] = field(default_factory=dict)
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)


def module_path(root: Path, name: str) -> Path | None:
    base = root / Path(*name.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def import_bindings(node: ast.AST, module: str, is_package: bool, root: Path) -> dict:
    """Local name -> (module, attribute or None) for the project imports of one statement."""
    out: dict[str, tuple[str, str | None]] = {}
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.split(".")[0] in PACKAGES:
                if alias.asname:
                    out[alias.asname] = (alias.name, None)
                else:
                    out[alias.name.split(".")[0]] = (alias.name.split(".")[0], None)
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parts = module.split(".")[: len(module.split(".")) - node.level + int(is_package)]
            base = ".".join([*parts, base] if base else parts)
        if base.split(".")[0] not in PACKAGES:
            return out
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            target = (sub, None) if module_path(root, sub) else (base, alias.name)
            out[alias.asname or alias.name] = target
    return out


def parse_module(root: Path, name: str) -> Module | None:
    path = module_path(root, name)
    if path is None:
        return None
    text = path.read_text()
    mod = Module(name, path, len(text.splitlines()))
    tree = ast.parse(text)
    is_package = path.name == "__init__.py"
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            mod.defs.setdefault(stmt.name, []).append(stmt)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name):
                        mod.defs.setdefault(leaf.id, []).append(stmt)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            mod.imports.update(import_bindings(stmt, name, is_package, root))
    return mod


def annotation_nodes(node: ast.AST) -> set[int]:
    """ids of the nodes inside type annotations (not followed)."""
    skip: set[int] = set()
    for sub in ast.walk(node):
        parts: list[ast.AST | None] = []
        if isinstance(sub, ast.arg):
            parts.append(sub.annotation)
        elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
            parts.append(sub.returns)
        elif isinstance(sub, ast.AnnAssign):
            parts.append(sub.annotation)
        for part in parts:
            if part is not None:
                skip.update(id(n) for n in ast.walk(part))
    return skip


class Reader:
    """Walks definitions from a start, opening modules as their definitions are reached."""

    def __init__(self, root: Path, library: tuple[str, ...] = ()) -> None:
        self.root = root
        self.library = library
        self.modules: dict[str, Module | None] = {}
        self.opened: set[str] = set()
        self.reached: set[tuple[str, str]] = set()
        self.def_lines: dict[str, set[int]] = {}
        self.came_from: dict[str, tuple[str, str]] = {}  # module -> the definition that opened it
        self.current: tuple[str, str] = ("", "")

    def module(self, name: str) -> Module | None:
        if name not in self.modules:
            self.modules[name] = parse_module(self.root, name)
        return self.modules[name]

    def open(self, name: str) -> None:
        mod = self.module(name)
        if mod is None or name in self.opened:
            return
        self.opened.add(name)
        self.came_from[name] = self.current
        for defs in mod.defs.values():
            for node in defs:
                decorators = getattr(node, "decorator_list", [])
                if any(self.resolves_to_project(name, d) for d in decorators):
                    self.reach(name, node.name)

    def resolves_to_project(self, module: str, decorator: ast.AST) -> bool:
        head = decorator.func if isinstance(decorator, ast.Call) else decorator
        while isinstance(head, ast.Attribute):
            head = head.value
        mod = self.module(module)
        return isinstance(head, ast.Name) and (head.id in mod.defs or head.id in mod.imports)

    def reach(self, module: str, name: str, depth: int = 0) -> None:
        mod = self.module(module)
        if mod is None or (module, name) in self.reached or depth > 20:
            return
        if name not in mod.defs:
            if name in mod.imports:  # a re-export: follow it to its definition
                target, attr = mod.imports[name]
                self.reach_binding(target, attr, depth + 1)
            elif module_path(self.root, f"{module}.{name}"):
                self.open(f"{module}.{name}")
            return
        self.reached.add((module, name))
        self.open(module)
        for node in mod.defs[name]:
            start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
            self.def_lines.setdefault(module, set()).update(range(start, node.end_lineno + 1))
            if not module.startswith(self.library):
                outer, self.current = self.current, (module, name)
                self.walk(mod, node)
                self.current = outer

    def reach_binding(self, target: str, attr: str | None, depth: int = 0) -> None:
        if attr is None:
            return  # a module bound to a name: opened when one of its attributes is used
        self.reach(target, attr, depth)

    def walk(self, mod: Module, node: ast.AST) -> None:
        local: dict[str, tuple[str, str | None]] = {}
        is_package = mod.path.name == "__init__.py"
        for sub in ast.walk(node):
            if isinstance(sub, (ast.Import, ast.ImportFrom)):
                local.update(import_bindings(sub, mod.name, is_package, self.root))
        skip = annotation_nodes(node)
        for sub in ast.walk(node):
            if id(sub) in skip:
                continue
            if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Load):
                dotted = self.dotted_module(sub.value, mod, local)
                if dotted:
                    self.reach(dotted, sub.attr)
            elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
                if sub.id in local:
                    self.reach_binding(*local[sub.id])
                elif sub.id in mod.defs:
                    self.reach(mod.name, sub.id)
                elif sub.id in mod.imports:
                    self.reach_binding(*mod.imports[sub.id])

    def dotted_module(self, node: ast.AST, mod: Module, local: dict) -> str | None:
        """The project module an expression such as ``pipeline`` or ``trainers.core.x`` names."""
        if isinstance(node, ast.Name):
            binding = local.get(node.id) or mod.imports.get(node.id)
            if binding is None:
                return None
            target, attr = binding
            full = target if attr is None else f"{target}.{attr}"
            return full if module_path(self.root, full) else None
        if isinstance(node, ast.Attribute):
            base = self.dotted_module(node.value, mod, local)
            if base and module_path(self.root, f"{base}.{node.attr}"):
                return f"{base}.{node.attr}"
        return None


def reading_cost(root: Path, trainer: str, library: tuple[str, ...] = ()) -> dict:
    """Files, their lines and the reached definitions' lines from ``trainer``'s ``main``."""
    reader = Reader(root, library)
    reader.reach(trainer, "main")
    files = {
        name: reader.modules[name].lines
        for name in sorted(reader.opened)
        if reader.modules[name] is not None and reader.modules[name].lines > 0
    }
    chains = {}
    for name in files:
        chain, at = [], name
        while at in reader.came_from and reader.came_from[at][0] and len(chain) < 30:
            by = reader.came_from[at]
            chain.append(f"{by[0]}.{by[1]}")
            at = by[0]
        chains[name] = chain
    return {
        "why": chains,
        "files": len(files),
        "lines": sum(files.values()),
        "def_lines": sum(len(v) for k, v in reader.def_lines.items() if k in files),
        "opened": files,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", action="store_true", help="list the files each trainer opens")
    parser.add_argument("--baseline", type=Path, help="another tree to measure beside this one")
    parser.add_argument("--quick", action="store_true", help="same as the default (a static scan)")
    args = parser.parse_args()
    trees = {"now": ROOT} | ({"baseline": args.baseline} if args.baseline else {})
    results = {
        tree: {k: reading_cost(p, m) for k, m in TRAINERS.items()} for tree, p in trees.items()
    }
    rows = []
    for label in TRAINERS:
        row: list = [label]
        if args.baseline:
            base = results["baseline"][label]
            row += [base["files"], base["lines"]]
        now = results["now"][label]
        target = TARGETS.get(label)
        met = None if target is None else now["files"] <= target[0] and now["lines"] <= target[1]
        row += [
            now["files"],
            now["lines"],
            now["def_lines"],
            target and f"{target[0]} / {target[1]}",
        ]
        rows.append([*row, None if met is None else ("yes" if met else "no")])
    before = ["files before", "lines before"] if args.baseline else []
    print_table(["trainer", *before, "files", "lines", "def lines", "target", "met"], rows)
    if args.files:
        for label, cost in results["now"].items():
            print(f"\n{label}:")
            for name, lines in sorted(cost["opened"].items(), key=lambda kv: -kv[1]):
                print(f"  {lines:5d}  {name}  <- {' <- '.join(cost['why'][name][:3])}")
    write_results("reading_cost", {"method": __doc__, "targets": TARGETS, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
