"""``@operation``: a lab API function whose arguments are validated by pydantic against its type
hints before it runs, and whose malformed arguments become a typed
:class:`~rlhf_lab.errors.InvalidArgument` (never a raw pydantic traceback).

pydantic is imported, and the validator built, on the first call: importing the API stays cheap
for the CLI's start-up. Stdlib only at import time.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable
from typing import Any, TypeVar

from rlhf_lab.errors import InvalidArgument

F = TypeVar("F", bound=Callable[..., Any])


def _describe(fn: Callable[..., Any], errors: list[dict[str, Any]]) -> str:
    """pydantic's error list as ``name: problem; ...``, naming positional arguments too."""
    names = list(inspect.signature(fn).parameters)
    parts = []
    for error in errors:
        loc = list(error.get("loc", ()))
        if loc and isinstance(loc[0], int) and loc[0] < len(names):
            loc[0] = names[loc[0]]
        # the argument, then list positions and keys (not pydantic's union-branch labels)
        kept = loc[:1] + [p for p in loc[1:] if isinstance(p, int) or str(p).isidentifier()]
        where = ".".join(str(p) for p in kept) or "arguments"
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    return "; ".join(parts)


def _arguments_only(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A twin of ``fn`` without its return annotation: only the arguments are validated, and a
    return type imported for type checkers only need not resolve."""
    if not isinstance(fn, types.FunctionType):
        return fn
    twin = types.FunctionType(
        fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )
    twin.__kwdefaults__ = fn.__kwdefaults__
    twin.__qualname__ = fn.__qualname__
    twin.__module__ = fn.__module__
    twin.__annotations__ = {k: v for k, v in fn.__annotations__.items() if k != "return"}
    return twin


def operation(fn: F) -> F:
    """Validate ``fn``'s arguments with pydantic (lax mode: "3" -> 3, tuple -> list) on each call."""
    validated: list[Callable[..., Any]] = []

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from pydantic import ValidationError, validate_call

        if not validated:
            validated.append(validate_call(_arguments_only(fn)))
        try:
            return validated[0](*args, **kwargs)
        except ValidationError as err:
            if err.title != fn.__name__:  # a model built inside the function: not the caller's
                raise
            raise InvalidArgument(
                f"bad arguments for {fn.__name__}: {_describe(fn, err.errors())}"
            ) from None

    wrapper.__lab_operation__ = True  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]
