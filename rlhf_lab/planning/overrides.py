"""A config override as typed data: :class:`Override` (a dotted key, its value parsed as the
trainer's ``--set`` parses it, and the ``key=value`` text it was written as).

A surface (the CLI's ``--set``, an MCP tool's ``overrides``) parses its strings once, at the
edge, with :meth:`Override.parse`; planning (resolve, shrink, match) takes the pairs from there
on. Rules the lab sets from code (a shrink rule, a matched setting) are built with
:meth:`Override.of`, written as ``--set`` reads them back. Torch-free.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rlhf_lab.errors import InvalidArgument, NextStep

__all__ = ["FIX_OVERRIDES", "Override", "as_overrides", "format_override", "texts"]

FIX_OVERRIDES = NextStep(
    "shrink_config", note="fix the dotted key or value in overrides that the message names"
)


def format_override(key: str, value: Any) -> str:
    """``key=value`` in the form ``--set`` parses back to the same value."""
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, float):
        text = repr(value)
    elif isinstance(value, (list, dict)):
        text = json.dumps(value)
    else:
        text = str(value)
    return f"{key}={text}"


class Override(BaseModel):
    """One config override: a dotted key and its value (YAML-parsed, as the trainer's ``--set``
    parses it), and the ``key=value`` text it was written as (kept for the run's record)."""

    model_config = ConfigDict(frozen=True)

    key: str = Field(description="dotted key, e.g. train.max_steps")
    value: Any = Field(description="the value, parsed as YAML")
    text: str = Field(description="key=value as written")

    @classmethod
    def parse(cls, text: str) -> Override:
        """``"train.max_steps=20"`` -> key ``train.max_steps``, value 20; a malformed item is an
        InvalidArgument pointing at fixing it."""
        return _parsed(text, FIX_OVERRIDES)

    @classmethod
    def of(cls, key: str, value: Any) -> Override:
        """An override set from code (a shrink rule, ``seed`` of a sweep arm), written as
        ``--set`` reads it."""
        return cls(key=key, value=value, text=format_override(key, value))


def _parsed(text: str, *next_steps: NextStep) -> Override:
    """``text`` as a pair; a malformed one is an InvalidArgument with the trainer's message."""
    from trainers.core.config import ConfigError, parse_override

    try:
        parts, value = parse_override(text)
    except ConfigError as err:
        raise InvalidArgument(str(err), next=list(next_steps)) from None
    return Override(key=".".join(parts), value=value, text=text)


def as_overrides(items: Iterable[Override | str] | None) -> list[Override]:
    """Overrides as pairs: pairs kept, each ``key=value`` string parsed once (a malformed one
    refused with the trainer's message alone, as resolving refuses it). What a surface (the CLI,
    an MCP tool, a pipeline stage's YAML) calls on the strings it was given: planning takes
    the pairs only."""
    return [o if isinstance(o, Override) else _parsed(o) for o in items or []]


def texts(overrides: Iterable[Override]) -> list[str]:
    """The overrides as written (``key=value``), in order: what a command line or a record
    shows."""
    return [o.text for o in overrides]
