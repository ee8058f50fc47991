"""What a tool's error must look like: the model reads it as an observation, so it is one short
line that names what was wrong."""

from __future__ import annotations

import pytest


def assert_short_error(error_type: type[Exception], call, fragment: str) -> None:
    """``call()`` raises ``error_type`` with a one-line message under 120 characters that
    contains ``fragment``."""
    with pytest.raises(error_type) as raised:
        call()
    message = str(raised.value)
    assert fragment in message
    assert "\n" not in message and len(message) < 120
