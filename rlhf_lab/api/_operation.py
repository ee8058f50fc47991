"""``@operation``: a lab API function whose arguments are validated by pydantic against its type
hints before it runs, and whose malformed arguments become a typed
:class:`~rlhf_lab.errors.InvalidArgument` (never a raw pydantic traceback). A validator that
raises a :class:`~rlhf_lab.errors.LabError` (an override that is no ``key=value``) keeps that
error as it is (:func:`lab_error`).

:class:`Operation` is one row of the API's operation table (:mod:`rlhf_lab.api.operations`):
the name a surface offers it under, its description, its argument model (whose fields are the
function's keyword arguments, or which the function takes whole), its result model and its
read-only / destructive flags. The MCP server registers one tool per row.

A malformed argument reads the same on every surface: one line per argument,
``argument `max_points`: got "many"; expected an integer`` (:func:`argument_errors_text`), with
the expected type read from the JSON schema of the arguments (:func:`describe_schema`). The MCP
server renders the SDK's own argument validation with the same function.

pydantic is imported, and the validator built, on the first call: importing the API stays cheap
for the CLI's start-up. Stdlib only at import time.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from rlhf_lab.errors import InvalidArgument, LabError

F = TypeVar("F", bound=Callable[..., Any])

_PLURAL = {
    "string": "strings",
    "integer": "integers",
    "number": "numbers",
    "boolean": "booleans",
    "object": "objects",
    "array": "lists",
}
_SINGULAR = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "object": "an object",
    "array": "a list",
    "null": "null",
}
# pydantic error types that say "wrong type" (the expected type says the rest)
_TYPE_ERRORS = ("_type", "_parsing", "literal_error", "enum", "missing")


def _json(value: Any, limit: int = 60) -> str:
    """A value as the caller wrote it (JSON), shortened."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _range(schema: Mapping[str, Any]) -> str:
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    high = schema.get("maximum", schema.get("exclusiveMaximum"))
    if low is not None and high is not None:
        return f" from {low} to {high}"
    if low is not None:
        return f" of at least {low}" if "minimum" in schema else f" above {low}"
    if high is not None:
        return f" of at most {high}" if "maximum" in schema else f" below {high}"
    return ""


def describe_schema(schema: Mapping[str, Any] | None, *, plural: bool = False) -> str:
    """A JSON schema in words: ``an integer from 1 to 2000``, ``one of "train", "eval"``,
    ``a list of strings or null``. Unknown shapes read as ``any value``."""
    if not schema:
        return "any values" if plural else "any value"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            parts = [describe_schema(s, plural=plural) for s in schema[key]]
            return " or ".join(dict.fromkeys(p for p in parts if p))
    if "enum" in schema:
        return "one of " + ", ".join(_json(v, 30) for v in schema["enum"])
    if "const" in schema:
        return _json(schema["const"], 30)
    if "$ref" in schema:
        return "objects" if plural else "an object"
    kind = schema.get("type")
    if isinstance(kind, list):
        return " or ".join(describe_schema({**schema, "type": k}, plural=plural) for k in kind)
    if kind == "array":
        items = schema.get("items")
        inner = describe_schema(items, plural=True) if items else ""
        text = f"a list of {inner}" if inner and inner != "any values" else "a list"
        if schema.get("minItems"):
            text += f" (at least {schema['minItems']})"
        return f"lists ({text})" if plural else text
    if kind in ("integer", "number"):
        return (_PLURAL[kind] if plural else _SINGULAR[kind]) + _range(schema)
    if kind == "string":
        text = "strings" if plural else "a string"
        if "pattern" in schema:
            text += f" matching {schema['pattern']}"
        if schema.get("maxLength") is not None:
            text += f" of at most {schema['maxLength']} characters"
        return text
    if kind in _SINGULAR:
        return _PLURAL.get(kind, _SINGULAR[kind]) if plural else _SINGULAR[kind]
    return "any values" if plural else "any value"


def _where(loc: Sequence[Any]) -> str:
    """``overrides[1]`` / ``config.train``: the argument and the positions inside it (pydantic's
    union-branch labels such as ``literal['a']`` or ``function-after[...]`` are left out)."""
    text = str(loc[0])
    for part in loc[1:]:
        if isinstance(part, int):
            text += f"[{part}]"
        elif str(part).isidentifier():
            text += f".{part}"
    return text


def _what(error: Mapping[str, Any]) -> str:
    kind = str(error.get("type", ""))
    if kind in ("missing", "missing_argument"):
        return "missing (required)"
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        return "not an argument of this operation"
    got = f"got {_json(error.get('input'))}"
    if kind.endswith(_TYPE_ERRORS) or kind in _TYPE_ERRORS:
        return got
    msg = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    return f"{got} ({msg[:1].lower()}{msg[1:]})"


def argument_errors_text(
    errors: Sequence[Mapping[str, Any]],
    properties: Mapping[str, Any] | None = None,
    names: Sequence[str] = (),
) -> str:
    """pydantic's argument errors as one line per argument,
    ``argument `x`: <what is wrong>; expected <type>`` (no pydantic wording of unions, no URL).

    ``properties`` is the JSON schema of the arguments (name -> schema), ``names`` the
    positional order, so that an error located at a position names its argument."""
    properties = properties or {}
    lines: dict[str, str] = {}
    for error in errors:
        loc = list(error.get("loc", ())) or ["arguments"]
        if isinstance(loc[0], int) and loc[0] < len(names):
            loc[0] = names[loc[0]]
        where = _where(loc)
        if where in lines:  # one line per argument (a union reports each of its branches)
            continue
        expected = describe_schema(properties.get(str(loc[0])))
        if len(loc) > 1 and isinstance(loc[1], int):
            schema = properties.get(str(loc[0])) or {}
            items = next(
                (s.get("items") for s in [schema, *schema.get("anyOf", [])] if "items" in s), None
            )
            expected = describe_schema(items) if items else expected
        text = f"argument `{where}`: {_what(error)}"
        lines[where] = f"{text}; expected {expected}" if expected != "any value" else text
    return "\n".join(lines.values()) or "the arguments are invalid"


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


def _argument_schemas(fn: Callable[..., Any]) -> dict[str, Any]:
    """The JSON schema of each of ``fn``'s arguments ({} when pydantic cannot write one)."""
    from pydantic import TypeAdapter

    try:
        schema = TypeAdapter(_arguments_only(fn)).json_schema()
    except Exception:  # noqa: BLE001 - only the wording of an error depends on it
        return {}
    return dict(schema.get("properties") or {})


def raised_lab_error(errors: Sequence[Mapping[str, Any]]) -> LabError | None:
    """The LabError a validator raised among pydantic's ``errors`` (its ``ctx.error``), if any."""
    for error in errors:
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, LabError):
            return cause
    return None


def lab_error(
    errors: Sequence[Mapping[str, Any]],
    properties: Mapping[str, Any] | None = None,
    names: Sequence[str] = (),
) -> LabError:
    """pydantic's ``errors`` as one LabError: the one a validator raised, else an
    InvalidArgument with one line per argument (:func:`argument_errors_text`)."""
    return raised_lab_error(errors) or InvalidArgument(
        argument_errors_text(errors, properties, names)
    )


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
            names = list(inspect.signature(fn).parameters)
            errors = err.errors(include_url=False)
            raise lab_error(errors, _argument_schemas(fn), names) from None

    wrapper.__lab_operation__ = True  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


# ------------------------------------------------------------------------- the operation table


@dataclass(frozen=True)
class Operation:
    """One operation a surface offers: a row of :data:`rlhf_lab.api.operations.OPERATIONS`.

    ``function`` names the :mod:`rlhf_lab.api` function it calls (looked up at call time);
    ``arguments`` is its argument model: the function takes those fields as keyword arguments,
    or the model itself when ``whole`` (``launch`` takes a :class:`RunRequest`). ``shape``
    names an API function that turns the function's result into ``result`` (the compact form
    an agent gets), ``hint`` is what to do next when an error names no next step."""

    name: str
    title: str
    description: str
    arguments: type
    result: type
    function: str
    hint: str
    read_only: bool = False
    destructive: bool = False
    idempotent: bool = False
    open_world: bool = False
    whole: bool = False
    shape: str | None = None

    def fields(self) -> dict[str, Any]:
        """The argument model's fields a caller may set: those its JSON schema publishes
        (a field marked ``SkipJsonSchema`` is the lab's own, e.g. a pipeline stage)."""
        published = self.arguments.model_json_schema().get("properties", {})
        return {k: f for k, f in self.arguments.model_fields.items() if k in published}

    def parameters(self) -> list[inspect.Parameter]:
        """The published fields as keyword-only parameters: ``Annotated[type, constraints,
        Field(description=...)]`` with the field's default (what a tool's signature is)."""
        from typing import Annotated

        from pydantic import Field

        out = []
        for name, field in self.fields().items():
            annotation = Annotated[
                (field.annotation, *field.metadata, Field(description=field.description))
            ]
            default = (
                inspect.Parameter.empty
                if field.is_required()
                else field.get_default(call_default_factory=True)
            )
            out.append(
                inspect.Parameter(
                    name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
                )
            )
        return out

    def call(self, arguments: Mapping[str, Any]) -> Any:
        """Run the operation on already-validated ``arguments`` (field name -> value) and
        return its ``result`` model."""
        api = importlib.import_module("rlhf_lab.api")
        fn = getattr(api, self.function)
        if self.whole:
            value = fn(self.arguments.model_construct(**arguments))
        else:
            value = fn(**arguments)
        if self.shape is None:
            return value
        shaper: Any = api
        for part in self.shape.split("."):
            shaper = getattr(shaper, part)
        return shaper(value)
