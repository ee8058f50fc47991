"""Package attributes loaded on first use (PEP 562): a package names each attribute's module in
a table, and ``import package`` costs nothing until a name is read. ``rlhf_lab.api``,
``rlhf_lab.runs`` and ``rlhf_lab.index`` load their names this way. Torch-free."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

Wrap = Callable[[str, Any], Any]


def lazy_attributes(
    package: str, table: dict[str, str], wrap: Wrap | None = None
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: a name of ``table`` is imported from
    its module when first read (passed through ``wrap(name, value)`` when given) and kept on the
    package; any other name is an AttributeError."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        if wrap is not None:
            value = wrap(name, value)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(table))

    return __getattr__, __dir__
