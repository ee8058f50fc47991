"""Claude Code wiring: the skills shipped in ``skills/`` and the ``.mcp.json`` entry that starts
the lab's MCP server. ``install_skills(target)`` copies the skills into
``<target>/.claude/skills/`` and merges the ``rlhf-lab`` server into ``<target>/.mcp.json``,
keeping every other server there. Torch-free.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field

from rlhf_lab.errors import Conflict, Corrupt, NotFound
from trainers.core.rundir import atomic_write_text

__all__ = [
    "SERVER_KEY",
    "SkillInfo",
    "SkillsInstallResult",
    "install_skills",
    "list_skills",
    "mcp_entry",
    "merge_mcp_json",
    "parse_skill",
    "skills_source",
    "split_allowed_tools",
]

SERVER_KEY = "rlhf-lab"
SKILL_NAME_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
MAX_SKILL_NAME = 64
# What Claude Code runs to start the server from this checkout (.mcp.json at the repo root).
LOCAL_ENTRY: dict[str, Any] = {"type": "stdio", "command": "uv", "args": ["run", "rlhf-lab", "mcp"]}


class SkillInfo(BaseModel):
    name: str
    description: str
    allowed_tools: list[str] = Field(description="the tools pre-approved while the skill runs")
    path: str = Field(description="the SKILL.md file")
    front_matter: dict[str, Any] = Field(default_factory=dict)


class SkillsInstallResult(BaseModel):
    target: str = Field(description="the repository the skills were installed into")
    skills_dir: str = Field(description="<target>/.claude/skills")
    installed: list[str] = Field(description="skills copied (replacing an older copy)")
    unchanged: list[str] = Field(
        default_factory=list, description="skills whose destination already is the source"
    )
    mcp_json: str = Field(description="the .mcp.json that now registers the server")
    mcp_entry: dict[str, Any] = Field(description="the rlhf-lab entry written there")
    servers: list[str] = Field(description="every server in that .mcp.json after the merge")
    notes: list[str] = Field(default_factory=list)


def source_root() -> Path:
    """The checkout this package runs from (holds skills/, trainers/, pyproject.toml)."""
    return Path(__file__).resolve().parent.parent


def skills_source() -> Path:
    return source_root() / "skills"


def split_allowed_tools(value: Any) -> list[str]:
    """``allowed-tools`` as a list: a YAML list, or a string separated by commas or spaces
    (spaces inside parentheses, as in ``Bash(uv run rlhf-lab:*)``, do not split)."""
    if value is None:
        return []
    if isinstance(value, list):
        return [str(v).strip() for v in value if str(v).strip()]
    out: list[str] = []
    depth = 0
    current = ""
    for ch in str(value):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(depth - 1, 0)
        if depth == 0 and (ch == "," or ch.isspace()):
            if current.strip():
                out.append(current.strip())
            current = ""
            continue
        current += ch
    if current.strip():
        out.append(current.strip())
    return out


def parse_skill(path: Path) -> SkillInfo:
    """Read a SKILL.md: YAML front matter with name, description and allowed-tools."""
    path = Path(path)
    text = path.read_text()
    match = re.match(r"^---\n(.*?)\n---\n", text, re.DOTALL)
    if not match:
        raise Corrupt(f"{path}: no YAML front matter (a '---' block at the top)")
    try:
        meta = yaml.safe_load(match.group(1))
    except yaml.YAMLError as err:
        raise Corrupt(f"{path}: front matter is not valid YAML: {err}") from None
    if not isinstance(meta, dict):
        raise Corrupt(f"{path}: front matter must be a mapping")
    missing = [k for k in ("name", "description", "allowed-tools") if not meta.get(k)]
    if missing:
        raise Corrupt(f"{path}: front matter lacks {', '.join(missing)}")
    name = str(meta["name"])
    if len(name) > MAX_SKILL_NAME or not SKILL_NAME_RE.fullmatch(name):
        raise Corrupt(f"{path}: bad skill name {name!r} (lowercase letters, digits, hyphens)")
    if name != path.parent.name:
        raise Corrupt(f"{path}: name {name!r} differs from its folder {path.parent.name!r}")
    return SkillInfo(
        name=name,
        description=" ".join(str(meta["description"]).split()),
        allowed_tools=split_allowed_tools(meta["allowed-tools"]),
        path=str(path),
        front_matter=meta,
    )


def list_skills(source: Path | None = None) -> list[SkillInfo]:
    """Every skill under ``skills/`` (folders holding a SKILL.md), by name."""
    root = Path(source) if source is not None else skills_source()
    if not root.is_dir():
        raise NotFound(f"no skills folder at {root}")
    return [parse_skill(p) for p in sorted(root.glob("*/SKILL.md"))]


def mcp_entry(target: Path) -> dict[str, Any]:
    """The ``.mcp.json`` entry for ``target``: in this checkout ``uv run rlhf-lab mcp``; in any
    other repository the same command pointed at this checkout (``uv run --project``), with
    RLHF_LAB_ROOT set so its ledgers land in ``<target>/experiments``."""
    target = Path(target).resolve()
    src = source_root()
    if target == src:
        return json.loads(json.dumps(LOCAL_ENTRY))
    return {
        "type": "stdio",
        "command": "uv",
        "args": ["run", "--project", str(src), "rlhf-lab", "mcp"],
        "env": {"RLHF_LAB_ROOT": str(target)},
    }


def merge_mcp_json(path: Path, entry: dict[str, Any]) -> list[str]:
    """Put ``entry`` under ``mcpServers.rlhf-lab`` in ``path`` (created if missing), keeping
    every other key and server. Returns the server names. A file that is not a JSON object is
    an error, never overwritten."""
    path = Path(path)
    data: dict[str, Any] = {}
    if path.exists():
        try:
            data = json.loads(path.read_text() or "{}")
        except ValueError as err:
            raise Conflict(f"{path} is not valid JSON ({err}); fix or remove it first") from None
        if not isinstance(data, dict):
            raise Conflict(f"{path} must hold a JSON object with an 'mcpServers' key")
    servers = data.get("mcpServers")
    if servers is None:
        servers = {}
    if not isinstance(servers, dict):
        raise Conflict(f"{path}: 'mcpServers' must be an object")
    servers[SERVER_KEY] = entry
    data["mcpServers"] = servers
    atomic_write_text(path, json.dumps(data, indent=2) + "\n")
    return list(servers)


def install_skills(target: Path | str, source: Path | None = None) -> SkillsInstallResult:
    """Copy every skill into ``<target>/.claude/skills/<name>/`` (an older copy of the same
    skill is replaced; other skills are left alone) and register the MCP server in
    ``<target>/.mcp.json``."""
    target = Path(target).expanduser()
    if not target.is_dir():
        raise NotFound(f"target {target} is not a directory; pass an existing repository folder")
    target = target.resolve()
    skills = list_skills(source)
    if not skills:
        raise NotFound("no skills to install (skills/*/SKILL.md is empty)")
    dest_root = target / ".claude" / "skills"
    dest_root.mkdir(parents=True, exist_ok=True)
    installed, unchanged, notes = [], [], []
    for skill in skills:
        src = Path(skill.path).parent
        dest = dest_root / skill.name
        if dest.exists() and dest.resolve() == src.resolve():
            unchanged.append(skill.name)
            continue
        if dest.is_symlink() or dest.is_file():
            dest.unlink()
        elif dest.is_dir():
            shutil.rmtree(dest)
            notes.append(f"replaced the older copy of {skill.name}")
        shutil.copytree(src, dest, symlinks=False)
        installed.append(skill.name)
    entry = mcp_entry(target)
    mcp_path = target / ".mcp.json"
    servers = merge_mcp_json(mcp_path, entry)
    if target != source_root():
        notes.append(
            f"the server runs from {source_root()} (uv run --project) and writes ledgers to "
            f"{target}/experiments; Claude Code asks to approve project servers on first use"
        )
    return SkillsInstallResult(
        target=str(target),
        skills_dir=str(dest_root),
        installed=installed,
        unchanged=unchanged,
        mcp_json=str(mcp_path),
        mcp_entry=entry,
        servers=servers,
        notes=notes,
    )
