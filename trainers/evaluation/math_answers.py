"""GSM8K-style exact match: gold answers, the answer checker and the offline arithmetic set.

The checker is Hugging Face's ``math-verify`` (a maintained parser of LaTeX and plain answers
into SymPy, then a symbolic / numeric comparison): ``1,000``, ``1000.0``, ``\\boxed{1000}``,
``#### 1,000`` and ``\\frac{1}{2}`` vs ``0.5`` all compare as the same number. What it is given:
the content of the response's last ``<answer>…</answer>`` block when there is one (the trainers'
tag format), else the whole response (math-verify then takes the last ``\\boxed{}``, else the
last number-like expression it finds).

Data: a GSM8K-schema file or hub dataset (``question``; ``answer`` = worked solution ending in a
``#### <number>`` line), or :data:`~trainers.evaluation.config.BUILTIN_ARITHMETIC`: templated
one- and two-step word problems generated offline with integer answers (some above 1000, so
thousands separators get exercised), in the same schema.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from pathlib import Path

from trainers.core.tasks import extract_answer

_GOLD_RE = re.compile(r"####\s*([^\n]*)")

__all__ = [
    "builtin_arithmetic_rows",
    "gold_answer",
    "is_correct",
    "prediction_text",
    "read_gsm8k_rows",
]


def gold_answer(answer: str) -> str | None:
    """The gold of a GSM8K ``answer`` field: the text after its last ``####``, without
    thousands separators, '$' or a final '.'; None when there is no ``####`` line."""
    found = _GOLD_RE.findall(answer)
    if not found:
        return None
    gold = found[-1].strip().replace(",", "").replace("$", "").replace("\u2212", "-").strip()
    gold = gold[:-1] if gold.endswith(".") else gold
    return gold or None


def prediction_text(response: str) -> str:
    """What the checker reads: the last ``<answer>`` block's content, else the response."""
    tagged = extract_answer(response)
    return tagged if tagged is not None else response


def _parse(text: str):
    from math_verify import parse

    return parse(text)


def is_correct(response: str, gold: str) -> tuple[bool, str | None]:
    """(whether ``response`` states ``gold``, the answer the checker extracted or None)."""
    from math_verify import verify

    gold_parsed = _parse(gold)
    pred = _parse(prediction_text(response))
    if not gold_parsed or not pred:
        return False, None
    ok = bool(verify(gold_parsed, pred))
    return ok, str(pred[-1])


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def read_gsm8k_rows(dataset: str, subset: str | None, split: str) -> list[dict]:
    """Rows ``{question, answer}`` of a local GSM8K-schema file (.jsonl/.json/.parquet/.csv) or
    a hub dataset; ValueError naming what is wrong."""
    from trainers.core.datasets import looks_like_path, read_json_rows

    path = Path(dataset).expanduser()
    if path.is_file() and path.suffix.lower() in (".jsonl", ".json"):
        rows = read_json_rows(path)
    elif path.exists() or looks_like_path(dataset):
        if not path.exists():
            raise ValueError(f"math.dataset: file not found: {dataset}")
        import datasets

        if path.is_file():
            builder = {".parquet": "parquet", ".csv": "csv"}.get(path.suffix.lower())
            if builder is None:
                raise ValueError(f"math.dataset: unsupported file type {path.suffix!r}")
            ds = datasets.load_dataset(builder, data_files={"train": str(path)}, split="train")
        else:
            ds = datasets.load_dataset(str(path), split=split)
        rows = [dict(r) for r in ds]
    else:
        import datasets

        try:
            ds = datasets.load_dataset(dataset, subset, split=split)
        except Exception as err:  # noqa: BLE001 - hub, cache and connection errors alike
            raise ValueError(
                f"math.dataset: could not load {dataset!r} ({subset}, {split}) from the hub or "
                f"its cache ({type(err).__name__}: {err}); offline, use a local GSM8K-schema "
                "file or builtin:arithmetic"
            ) from None
        rows = [dict(r) for r in ds]
    if rows and not {"question", "answer"} <= set(rows[0]):
        raise ValueError(
            f"math.dataset {dataset!r}: expected the GSM8K schema (question, answer), found "
            f"columns {sorted(rows[0])}"
        )
    return rows


_ITEMS = ("apples", "books", "stickers", "marbles", "tickets", "bottles", "pencils", "coins")
_NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Farah", "Goran", "Hana")


def _problem(rng: random.Random) -> tuple[str, list[str], int]:
    """One templated word problem: (question, solution lines, integer answer)."""
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    kind = rng.randrange(5)
    if kind == 0:
        a, b = rng.randint(120, 2400), rng.randint(130, 2600)
        q = f"{name} has {a} {item} and buys {b} more. How many {item} does {name} have now?"
        return q, [f"{a} + {b} = {a + b}"], a + b
    if kind == 1:
        a = rng.randint(50, 900)
        b = rng.randint(10, a - 1)
        q = f"{name} had {a} {item} and gave away {b}. How many {item} are left?"
        return q, [f"{a} - {b} = {a - b}"], a - b
    if kind == 2:
        a, b = rng.randint(3, 40), rng.randint(12, 95)
        q = f"{name} fills {a} boxes with {b} {item} each. How many {item} is that in total?"
        return q, [f"{a} * {b} = {a * b}"], a * b
    if kind == 3:
        per, groups = rng.randint(3, 25), rng.randint(2, 30)
        total = per * groups
        q = f"{name} shares {total} {item} equally among {groups} friends. How many does each get?"
        return q, [f"{total} / {groups} = {per}"], per
    a, b, c = rng.randint(5, 60), rng.randint(2, 12), rng.randint(1, 40)
    q = (
        f"{name} buys {b} packs of {a} {item} and then loses {c} of them. "
        f"How many {item} does {name} have?"
    )
    return q, [f"{b} * {a} = {a * b}", f"{a * b} - {c} = {a * b - c}"], a * b - c


def builtin_arithmetic_rows(n: int, seed: int) -> list[dict]:
    """``n`` GSM8K-schema rows ``{question, answer}`` (answer: the worked steps, then
    ``#### <number>``), deterministic in ``(n, seed)``, questions unique."""
    rng = random.Random(seed)
    rows, seen = [], set()
    while len(rows) < n:
        question, steps, value = _problem(rng)
        if question in seen:
            continue
        seen.add(question)
        rows.append({"question": question, "answer": "\n".join([*steps, f"#### {value}"])})
    return rows


def gold_of_rows(rows: Sequence[dict], source: str) -> list[str]:
    """The gold answer of every row; ValueError for a row without a ``####`` line."""
    golds = []
    for i, row in enumerate(rows):
        gold = gold_answer(str(row["answer"]))
        if gold is None:
            raise ValueError(f"{source}: row {i} has no final '#### <answer>' line in 'answer'")
        golds.append(gold)
    return golds
