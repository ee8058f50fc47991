"""bench/reading_cost.py's walk: which files a reader of a trainer's step opens, on a small tree
whose answer is known."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"

FILES = {
    "trainers/__init__.py": "",
    "trainers/core/__init__.py": "",
    "trainers/core/lib.py": "from trainers.core.deep import inner\n\ndef helper():\n    return inner()\n",
    "trainers/core/deep.py": "def inner():\n    return 1\n",
    "trainers/core/unused.py": "def never():\n    return 0\n",
    "trainers/fam/__init__.py": "",
    "trainers/fam/registry.py": (
        "from trainers.fam.kinds import register\n\n"
        "@register('a')\n"
        "def estimator():\n"
        "    from trainers.fam.math import formula\n"
        "    return formula()\n"
    ),
    "trainers/fam/kinds.py": "TABLE = {}\n\ndef register(name):\n    return lambda fn: fn\n",
    "trainers/fam/math.py": "def formula():\n    return 2\n",
    "trainers/fam/rare.py": "def rarely():\n    return 3\n",
    "trainers/fam/train.py": (
        "from trainers.core import lib\n"
        "from trainers.fam import registry\n\n"
        "def step():\n"
        "    return lib.helper() + registry.estimator()\n\n"
        "def not_called():\n"
        "    from trainers.fam.rare import rarely\n"
        "    from trainers.core.unused import never\n"
        "    return rarely() + never()\n\n"
        "main = step\n"
    ),
}


@pytest.fixture
def reading_cost(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    sys.modules.pop("reading_cost", None)
    import reading_cost

    return reading_cost


def test_the_walk_follows_the_step_not_every_import(tmp_path, reading_cost) -> None:
    for name, text in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    cost = reading_cost.reading_cost(tmp_path, "trainers.fam.train")
    family = set(cost["family"]["opened"])
    # the registry's decorated function is reached with its module, and what it imports lazily
    assert family == {
        "trainers.fam.train",
        "trainers.fam.registry",
        "trainers.fam.kinds",
        "trainers.fam.math",
    }
    assert set(cost["+core"]["opened"]) == family | {"trainers.core.lib"}  # core: one hop
    assert set(cost["all"]["opened"]) == family | {"trainers.core.lib", "trainers.core.deep"}
    lines = {name: len(text.splitlines()) for name, text in FILES.items()}
    assert cost["family"]["lines"] == sum(lines[f"{m.replace('.', '/')}.py"] for m in family)
    # a module imported only inside a function no step calls is never opened
    assert "trainers.fam.rare" not in cost["all"]["opened"]
    assert "trainers.core.unused" not in cost["all"]["opened"]
