"""Launches through the lab's one entry (``api.launch``) as the lab tests make them most often:
a shipped recipe, shrunk onto the tiny preset and queued (written as a queued run whatever the
machine's devices are doing; the queue worker starts it when the test's lab has one)."""

from __future__ import annotations

from typing import Any

from rlhf_lab import api


def queue_on_tiny(recipe: str, overrides: list[str] | None = None, **request: Any) -> Any:
    """``api.launch`` of ``recipe`` with ``overrides`` on the tiny model, queued; ``request``
    holds the other RunRequest fields (campaign, seed, device, ...)."""
    return api.launch(
        api.RunRequest(
            recipe=recipe, overrides=overrides or [], model="tiny", queue=True, **request
        )
    )
