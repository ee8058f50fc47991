"""A shipped recipe resolved the way the launcher resolves it (its YAML with ``key=value``
overrides applied), for tests that write synthetic run folders with a real config.yaml."""

from __future__ import annotations

from pathlib import Path

from trainers.core.config import parse_override, read_yaml

REPO = Path(__file__).resolve().parents[2]


def set_dotted(cfg: dict, key: str, value) -> None:
    """``cfg[a][b][c] = value`` for ``key="a.b.c"``, creating the missing levels."""
    node = cfg
    *parents, leaf = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def shipped_config(family: str, recipe: str, overrides=()) -> tuple[str, dict]:
    """The recipe's source path (relative to the repository) and its config with
    ``overrides`` (``"a.b=value"`` strings) applied."""
    source = f"trainers/{family}/configs/{recipe}.yaml"
    cfg = read_yaml(REPO / source)
    for item in overrides:
        parts, value = parse_override(item)
        set_dotted(cfg, ".".join(parts), value)
    return source, cfg
