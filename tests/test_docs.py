"""The project's documentation holds together: every relative link in the docs reaches a file
that exists (and a heading that exists, when the link names one), and nothing sends the reader to
the design notes that lived outside this repository (docs/ replaced them).

Anchors are computed the way GitHub renders them: the heading's text, lower-cased, with every
character that is not a letter, digit, space, hyphen or underscore removed and each space turned
into a hyphen; a repeated heading gets ``-1``, ``-2``, ... appended.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The markdown whose links must resolve (paths relative to the repository root).
DOC_GLOBS: tuple[str, ...] = (
    "README.md",
    "CLAUDE.md",
    "docs/*.md",
    "skills/**/*.md",
    "trainers/*/README.md",
    "bench/README.md",
    "tests/reliability/README.md",
    "experiments/README.md",
)

# Spelled in pieces so that this file does not mention what it looks for.
FORBIDDEN: tuple[str, ...] = ("../" + "shared", "ALGORITHMS" + ".md", "DESIGN" + ".md")
SKIP_DIRS: frozenset[str] = frozenset(
    {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", "node_modules", "wandb"}
)
MAX_SCANNED_BYTES = 2_000_000

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_LINK_TITLE = r"""(?:\s+(?:"[^"]*"|'[^']*'|\([^)]*\)))?"""
_INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?" + _LINK_TITLE + r"\s*\)"
)
_REF_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_HTML_ANCHOR = re.compile(r"<a\s+[^>]*(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.IGNORECASE)
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


# --------------------------------------------------------------------------------------------
# Helpers: reading markdown the way GitHub renders it
# --------------------------------------------------------------------------------------------


def prose_lines(text: str) -> list[str]:
    """The lines of a markdown text outside fenced code blocks, with inline code spans removed
    (a link or heading inside code is not one)."""
    lines: list[str] = []
    in_fence = False
    for line in text.splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            lines.append(_CODE_SPAN.sub("", line))
    return lines


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading's text (before duplicate numbering)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors_of(text: str) -> set[str]:
    """Every anchor a markdown text offers: its headings (numbered when repeated) and explicit
    HTML anchors."""
    seen: dict[str, int] = {}
    anchors: set[str] = set()
    for line in prose_lines(text):
        match = _HEADING.match(line)
        if match:
            base = github_anchor(match.group(2))
            count = seen.get(base, 0)
            anchors.add(base if count == 0 else f"{base}-{count}")
            seen[base] = count + 1
        anchors.update(_HTML_ANCHOR.findall(line))
    return anchors


def link_targets(text: str) -> list[str]:
    """The targets of the inline and reference-style links (and images) of a markdown text."""
    targets: list[str] = []
    for line in prose_lines(text):
        targets += _INLINE_LINK.findall(line)
        ref = _REF_LINK.match(line)
        if ref:
            targets.append(ref.group(1))
    return targets


def is_relative(target: str) -> bool:
    """True for a link into the repository (not a URL, a mail address or an empty target)."""
    return bool(target) and not _SCHEME.match(target) and not target.startswith("//")


def broken_links(doc: Path, root: Path = ROOT) -> list[str]:
    """Each relative link of ``doc`` that leaves the repository, names a missing file, or names
    a heading its markdown target does not have, as ``"<doc>: <target> (<why>)"``."""
    problems: list[str] = []
    where = doc.relative_to(root)
    for target in link_targets(doc.read_text(encoding="utf-8")):
        if not is_relative(target):
            continue
        path_part, _, anchor = target.partition("#")
        dest = (doc.parent / unquote(path_part)).resolve() if path_part else doc.resolve()
        if not dest.is_relative_to(root.resolve()):
            problems.append(f"{where}: {target} (points outside the repository)")
            continue
        if not dest.exists():
            problems.append(f"{where}: {target} (no such file)")
            continue
        if anchor and dest.is_file() and dest.suffix.lower() == ".md":
            if unquote(anchor).lower() not in anchors_of(dest.read_text(encoding="utf-8")):
                problems.append(f"{where}: {target} (no heading #{anchor} in {dest.name})")
    return problems


def documentation_files(root: Path = ROOT) -> list[Path]:
    """The markdown files whose links are checked."""
    found: set[Path] = set()
    for pattern in DOC_GLOBS:
        found.update(p for p in root.glob(pattern) if p.is_file())
    return sorted(found)


def repository_files(root: Path = ROOT) -> list[Path]:
    """The files of the repository: what git tracks or would track (ignored files left out);
    without git, every file outside the tool and cache folders."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
        names = [n for n in out.decode("utf-8", "surrogateescape").split("\0") if n]
        paths = [root / n for n in names]
    except (OSError, subprocess.SubprocessError):
        paths = [p for p in root.rglob("*") if not SKIP_DIRS.intersection(p.parts)]
    return sorted(p for p in paths if p.is_file() and not SKIP_DIRS.intersection(p.parts))


def mentions(path: Path, needles: tuple[str, ...] = FORBIDDEN) -> list[str]:
    """``"<file>:<line>: <needle>"`` for each line of a text file that names one of ``needles``;
    binary and very large files are skipped."""
    if path.stat().st_size > MAX_SCANNED_BYTES:
        return []
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return []
    text = data.decode("utf-8", errors="replace")
    label = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    hits: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        hits += [f"{label}:{number}: {n}" for n in needles if n in line]
    return hits


# --------------------------------------------------------------------------------------------
# The repository's documentation
# --------------------------------------------------------------------------------------------


def test_the_documentation_files_are_found() -> None:
    docs = {p.relative_to(ROOT).as_posix() for p in documentation_files()}
    for required in ("README.md", "CLAUDE.md", "docs/README.md", "docs/architecture.md"):
        assert required in docs
    assert "docs/algorithms.md" in docs
    assert any(d.startswith("skills/") for d in docs)
    assert any(d.startswith("trainers/") for d in docs)


def test_every_relative_link_in_the_docs_resolves() -> None:
    problems = [p for doc in documentation_files() for p in broken_links(doc)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_readme_and_claude_md_link_both_docs_pages() -> None:
    for name in ("README.md", "CLAUDE.md"):
        targets = set(link_targets((ROOT / name).read_text(encoding="utf-8")))
        assert {"docs/architecture.md", "docs/algorithms.md"} <= targets, name


def test_nothing_points_at_the_old_design_notes() -> None:
    hits = [hit for path in repository_files() for hit in mentions(path)]
    assert not hits, "still pointing outside docs/:\n" + "\n".join(hits)


def test_no_markdown_outside_the_trainers_points_at_the_old_design_notes() -> None:
    """The part of the check above that already holds: README.md, CLAUDE.md, docs/, skills/ and
    the other markdown outside trainers/ (the family READMEs and the .py files are fixed by
    their owners and the lead at merge)."""
    markdown = [p for p in repository_files() if p.suffix == ".md"]
    checked = [p for p in markdown if p.relative_to(ROOT).parts[0] != "trainers"]
    assert len(checked) >= 8
    hits = [hit for path in checked for hit in mentions(path)]
    assert not hits, "\n".join(hits)


# --------------------------------------------------------------------------------------------
# The helpers themselves (so a broken helper cannot pass the checks above silently)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Run states", "run-states"),
        ("Policy gradients: where we differ", "policy-gradients-where-we-differ"),
        ("The `loss_agg` modes", "the-loss_agg-modes"),
        ("Campaigns and the ledger", "campaigns-and-the-ledger"),
        ("SFT — supervised fine-tuning", "sft--supervised-fine-tuning"),
        ("See [the docs](docs/x.md) now", "see-the-docs-now"),
        ("Bradley–Terry (BT)", "bradleyterry-bt"),
    ],
)
def test_github_anchor(heading: str, anchor: str) -> None:
    assert github_anchor(heading) == anchor


def test_anchors_number_repeated_headings_and_ignore_code() -> None:
    text = '# A\n## Notes\n```\n# not a heading\n```\n## Notes\n<a id="custom"></a>\n'
    assert anchors_of(text) == {"a", "notes", "notes-1", "custom"}


def test_link_targets_skip_code_and_keep_references() -> None:
    text = (
        "see [a](x.md#h) and ![img](p.png 'x')\n"
        "`[no](code.md)` and `LOSSES[name](inputs)`\n"
        "```\n[no](fenced.md)\n```\n"
        "[ref]: other.md\n"
        "[with `code` text](y.md) [ext](https://example.org)\n"
    )
    assert link_targets(text) == ["x.md#h", "p.png", "other.md", "y.md", "https://example.org"]
    assert not is_relative("https://example.org") and not is_relative("mailto:a@b.c")
    assert is_relative("#anchor") and is_relative("../x.md")


def test_broken_links_are_reported(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Title\n## Run states\n")
    doc = tmp_path / "README.md"
    doc.write_text(
        "[ok](docs/a.md#run-states) [ok2](#top) [dir](docs)\n"
        "[gone](docs/missing.md) [bad anchor](docs/a.md#nope) [out](../elsewhere.md)\n"
        "# Top\n"
    )
    problems = broken_links(doc, root=tmp_path)
    assert len(problems) == 3, problems
    assert "no such file" in problems[0] and "docs/missing.md" in problems[0]
    assert "no heading #nope" in problems[1]
    assert "outside the repository" in problems[2]


def test_mentions_finds_each_forbidden_name(tmp_path: Path) -> None:
    note = tmp_path / "note.md"
    note.write_text("intro\n" + "\n".join(f"see {n} for more" for n in FORBIDDEN) + "\n")
    hits = mentions(note)
    assert [h.split(":", 2)[1] for h in hits] == ["2", "3", "4"], hits
    assert mentions(ROOT / "tests" / "test_docs.py") == []  # this file spells them in pieces
    (tmp_path / "blob.bin").write_bytes(b"\0" + FORBIDDEN[0].encode())
    assert mentions(tmp_path / "blob.bin") == []
