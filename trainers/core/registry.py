"""Functions of one kind by name, filled by a decorator where each function is defined (as verl's
``core_algos.py`` registers its advantage estimators and policy losses)::

    POLICY_LOSSES = Registry("policy loss", ("inp", "params"))

    @POLICY_LOSSES.register("gspo")
    def gspo_loss(inp, params): ...

One registry per kind of function, one signature per kind: :meth:`Registry.register` refuses a
function whose parameters are not the kind's (names and order), so every entry can be called
the same way. A registry reads like the dict it replaces (``REGISTRY[name]``, ``name in
REGISTRY``, iteration in registration order); an unknown name is a ``KeyError`` that lists the
known ones. Names are registered once.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class Registry(Mapping[str, Any]):
    """Functions of one ``kind`` by name; each takes exactly ``parameters``."""

    def __init__(self, kind: str, parameters: tuple[str, ...]) -> None:
        self.kind = kind
        self.parameters = tuple(parameters)
        self._entries: dict[str, Callable[..., Any]] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator: file the function under ``name`` and return it unchanged."""

        def add(fn: F) -> F:
            found = tuple(inspect.signature(fn).parameters)
            if found != self.parameters:
                raise TypeError(
                    f"{fn.__name__} cannot be a {self.kind}: it takes {found}, every {self.kind} "
                    f"takes {self.parameters}"
                )
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = fn
            return fn

        return add

    def __getitem__(self, name: str) -> Callable[..., Any]:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(
                f"no {self.kind} named {name!r}; known: {', '.join(self._entries)}"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"
