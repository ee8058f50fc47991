"""Reading cost of a trainer: the project files, and their lines, that a reader opens to follow
one training step from the trainer's ``main`` (setup included), measured from the source alone.

    uv run python bench/reading_cost.py                  # every family's trainer, three views
    uv run python bench/reading_cost.py --files          # ... and the files each one opens, and why
    git archive main trainers rlhf_lab | tar -x -C /tmp/old
    uv run python bench/reading_cost.py --baseline /tmp/old   # before/after side by side

Method (static: nothing is imported, no torch). Start at the definition ``main`` of the trainer
module (``trainers/<family>/train.py``; ``evaluation/run.py``) and follow names the way a
reader follows them:

* a reached function, class or module-level assignment is read whole: every name it uses that
  resolves to a definition of a project module (``trainers`` or ``rlhf_lab``) is reached in turn,
  whether imported at the top of the file, imported inside the function (a lazy import counts
  once the function that holds it is reached: moving an import into a function does not lower
  the count, only not calling it does) or defined in the same file; ``module.name`` through an
  imported project module counts the same. A reached class brings every method.
* a module that is opened also runs its import-time registrations, so a top-level function whose
  decorator is a project definition (``@ADVANTAGES.register("grpo")``) is reached with its
  module: the reader of a registry opens what it holds.
* every branch counts: the walk does not know the config, so ``if cfg.x: ...`` is followed
  whichever way the step takes it (the PPO and reward-model branches count toward GRPO's
  figure, online DPO's dispatch toward DPO's). Type annotations are not followed (they are not
  called), nor are names built at run time (``importlib``, ``getattr`` on strings).

A file is opened when any definition in it is reached; its whole length counts toward "lines".
Empty package ``__init__.py`` files are not counted. Three views of the same walk:

* ``family``: the files of the families the step reaches (its own, and any other family it
  borrows from): the algorithm's code, with ``trainers/core`` read as a library;
* ``+core``: those, plus every ``trainers/core`` module the family code calls into, opened once
  for the names used but not followed further inside core;
* ``all``: everything the walk reaches, core's own calls followed too (model loading, LoRA,
  torchrun, the run folder...).

Targets (issue 27): one GRPO step (``policy_gradients``) <= 12 files / <= 4,000 lines, one DPO
step (``direct_alignment``) <= 8 files / <= 2,500 lines; ``met`` is judged on the ``family``
view, the one a shared core can lower only by holding what several families share (moving one
family's code into core to lower it would be gaming it: the ``+core`` and ``all`` views show
what the boundary hides). Writes bench/results/reading_cost.json. A measurement of the source,
not of time: the figures do not depend on the machine's load.
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
CORE = "trainers.core."


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


def walk(root: Path, trainer: str, library: tuple[str, ...] = ()) -> dict:
    """Files, their lines, the reached definitions' lines and why each file was opened, from
    ``trainer``'s ``main``; modules under ``library`` are opened but not followed."""
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
        "files": len(files),
        "lines": sum(files.values()),
        "def_lines": sum(len(v) for k, v in reader.def_lines.items() if k in files),
        "opened": files,
        "why": chains,
    }


def figures(opened: dict[str, int]) -> dict:
    return {"files": len(opened), "lines": sum(opened.values()), "opened": opened}


def reading_cost(root: Path, trainer: str) -> dict[str, dict]:
    """The three views (module doc) of one trainer."""
    with_core = walk(root, trainer, library=(CORE,))
    family = {m: n for m, n in with_core["opened"].items() if not m.startswith(CORE)}
    return {
        "family": figures(family),
        "+core": {**figures(with_core["opened"]), "why": with_core["why"]},
        "all": walk(root, trainer),
    }


VIEWS = ("family", "+core", "all")


def table_rows(results: dict, baseline: bool) -> list[list]:
    rows = []
    for label in TRAINERS:
        row: list = [label]
        for view in VIEWS:
            now = results["now"][label][view]
            if baseline:
                before = results["baseline"][label][view]
                row.append(f"{before['files']} -> {now['files']}")
                row.append(f"{before['lines']} -> {now['lines']}")
            else:
                row += [now["files"], now["lines"]]
        target = TARGETS.get(label)
        fam = results["now"][label]["family"]
        met = None if target is None else fam["files"] <= target[0] and fam["lines"] <= target[1]
        row.append(target and f"{target[0]} / {target[1]}")
        rows.append([*row, None if met is None else ("yes" if met else "no")])
    return rows


def recorded(results: dict) -> dict:
    """What the results file keeps: every view's figures, and the files of this tree's
    ``+core`` view (the ``all`` view's list is ``--files`` away)."""
    figures_only = {
        tree: {
            label: {view: {k: cost[view][k] for k in ("files", "lines")} for view in VIEWS}
            for label, cost in by_trainer.items()
        }
        for tree, by_trainer in results.items()
    }
    files = {label: cost["+core"]["opened"] for label, cost in results["now"].items()}
    return {"figures": figures_only, "files_now_core_view": files}


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
    headers = ["trainer"]
    for view in VIEWS:
        headers += [f"{view} files", f"{view} lines"]
    print_table([*headers, "target (family)", "met"], table_rows(results, bool(args.baseline)))
    if args.files:
        for label, cost in results["now"].items():
            print(f"\n{label} (+core view; why: the definition that opened it):")
            view = cost["+core"]
            for name, lines in sorted(view["opened"].items(), key=lambda kv: -kv[1]):
                print(f"  {lines:5d}  {name}  <- {' <- '.join(view['why'][name][:2])}")
    write_results("reading_cost", {"method": __doc__, "targets": TARGETS, **recorded(results)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
