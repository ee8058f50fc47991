"""No import cycle anywhere in the two packages: grimp's graph of ``rlhf_lab`` and ``trainers``
(every import, those inside functions included; ``if TYPE_CHECKING:`` ones excluded, as
import-linter does) has no strongly connected component of two or more modules. A package that
imports its own submodule which imports the package back counts as a cycle too: import-linter's
``acyclic_siblings`` contract cannot see those."""

from __future__ import annotations

import grimp
import pytest

PACKAGES = ("rlhf_lab", "trainers")


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Every set of modules that import one another in a loop (Tarjan's strongly connected
    components of two or more modules), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def describe_cycle(graph: grimp.ImportGraph, modules: list[str]) -> str:
    """The cycle's modules and each import between two of them, with its line."""
    inside = set(modules)
    lines = [f"cycle among {', '.join(modules)}:"]
    for importer in modules:
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & inside):
            for detail in graph.get_import_details(importer=importer, imported=imported):
                lines.append(
                    f"  {importer}:{detail['line_number']} -> {imported}"
                    f"  ({detail['line_contents'].strip()})"
                )
    return "\n".join(lines)


def test_no_module_of_the_lab_or_the_trainers_is_in_an_import_cycle() -> None:
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True)
    assert len(graph.modules) > 200  # both packages were read
    cycles = import_cycles(graph)
    assert not cycles, "\n\n".join(describe_cycle(graph, c) for c in cycles)


@pytest.mark.parametrize(
    "imports,expected",
    [
        ([("a", "b"), ("b", "c")], []),
        ([("a", "b"), ("b", "a"), ("c", "a")], [["a", "b"]]),
        (
            [("a", "b"), ("b", "c"), ("c", "a"), ("d", "e"), ("e", "d")],
            [["a", "b", "c"], ["d", "e"]],
        ),
        ([("p", "p.sub"), ("p.sub", "p")], [["p", "p.sub"]]),  # a package and its own submodule
    ],
)
def test_the_cycle_finder_finds_exactly_the_loops(imports, expected) -> None:
    graph = grimp.ImportGraph()
    for importer, imported in imports:
        graph.add_module(importer)
        graph.add_module(imported)
        graph.add_import(importer=importer, imported=imported, line_number=1, line_contents="x")
    assert import_cycles(graph) == expected
    for cycle in expected:
        assert f"{cycle[0]}:1 -> {cycle[1]}" in describe_cycle(graph, cycle)
