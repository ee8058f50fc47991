"""Machine paths out of what a campaign commits: repository-relative paths instead of the
absolute paths of the machine that ran it. Torch-free.

A run records where it ran (the interpreter ``/…/.venv/bin/python``, its folder
``/…/experiments/<campaign>/runs/<id>``, the lab's cache ``/root/.cache/rlhf-lab/…``); committed
as they are, a campaign names one machine's folders and is unreadable anywhere else. The rules
(:func:`portable_path`):

* an interpreter or tool of a virtual environment (``…/.venv/bin/python3``) -> its name
  (``python3``: the command runs under ``uv run`` from the repository root);
* a path through a repository's ``experiments/`` -> ``experiments/…`` (relative to the root);
* a path inside a home folder (``/root/…``, ``/home/<user>/…``, ``/Users/<user>/…``) -> ``~/…``;
* a run's working folder (``cwd`` in run.json) -> ``.`` (the repository root).

The ledger stores a run's argv this way (:func:`portable_argv`);
:func:`rlhf_lab.results.portable_campaign.make_campaign_portable` rewrites a campaign's committed
files by these rules and renders its markdown again with the lab's renderer (the migration of
the campaigns recorded before the rule). :data:`MACHINE_PATH` finds what is left (the test over
``experiments/``). Pure functions of strings: no lab import (the ledger imports this module).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = [
    "MACHINE_PATH",
    "TEXT_SUFFIXES",
    "portable_argv",
    "portable_path",
    "portable_text",
]

# An absolute path under a folder that belongs to one machine (not a system path such as /usr).
# So is any absolute path through a virtual environment's bin/ or a repository's experiments/,
# wherever the checkout lives (a CI clone under /check, /srv, /builds, ...). Not after ':' or '/'
# (a URL's path is not a machine path).
_CHARS = r"[^\s\"'(),;`<>|]"
MACHINE_PATH = re.compile(
    rf"(?<![\w.~:/-])(?:/(?:root|home|tmp|work|Users|private|mnt|scratch)(?:/{_CHARS}*)?"
    rf"|/{_CHARS}*?/(?:\.venv/bin|experiments)/{_CHARS}*)"
)
_HOME = re.compile(r"/(?:root|home/[^/]+|Users/[^/]+)(?:/(.*))?$")
TEXT_SUFFIXES = frozenset({".json", ".jsonl", ".yaml", ".yml", ".log", ".md", ".txt", ".csv"})


def portable_path(path: str) -> str:
    """``path`` without its machine part by the rules of the module docstring (a path none of
    them applies to is returned as it is)."""
    if "/.venv/bin/" in path:
        return path.rsplit("/", 1)[1]
    if "/experiments/" in path:
        return "experiments/" + path.split("/experiments/", 1)[1]
    home = _HOME.match(path)
    if home is not None:
        return "~/" + (home.group(1) or "")
    return path


def portable_text(text: str) -> str:
    """Every machine path in ``text`` made portable (:func:`portable_path`)."""
    return MACHINE_PATH.sub(lambda m: portable_path(m.group(0)), text)


def portable_argv(argv: Sequence[str]) -> list[str]:
    """A recorded argv with its machine paths made portable (an argument that holds a path,
    ``--config=/…``, too)."""
    return [portable_text(str(a)) for a in argv]
