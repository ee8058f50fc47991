"""The answer of a best-of-n campaign (PRM vs ORM, Lightman et al. 2023), read from one or more
``best_of_n`` evaluation jobs. Torch-free.

:func:`analyse_best_of_n` reads each job's ``items.jsonl`` (every sample's verdict, extracted
answer, ORM and PRM scores), recomputes the per-prompt expected accuracy of each selector at
n = 1, 2, 4, … n_max (:mod:`trainers.evaluation.best_of_n_stats`), averages several jobs of the
same prompts prompt by prompt (sampling seeds: the prompt stays the resampled unit), and returns
a :class:`BestOfNAnswer`: the verdict (does the PRM's lead over the ORM grow with n?), the table,
each job's own lead (reward-model seeds: does every seed agree?) and the figure (accuracy against n on a log2 axis, a band per selector). The ledger renders it
in a campaign's ``## Answer`` block.

Verdict rules (95 % prompt-bootstrap intervals): the lead is PRM − ORM at n_max; it *grows* when
its interval is above 0 and the growth (lead at n_max − lead at the smallest n > 1, per prompt)
has an interval above 0 as well; a lead whose interval holds 0 is "no lead".
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlhf_lab.errors import InvalidArgument, NextStep

__all__ = [
    "QUESTION",
    "BestOfNAnswer",
    "analyse_best_of_n",
    "plot_best_of_n",
    "verdict_text",
]

QUESTION = (
    "Does best-of-n chosen by a process reward model (PRM) beat an outcome reward model (ORM), "
    "majority vote and random choice, and does the PRM's lead grow with n?"
)
LABELS = {"orm": "ORM", "prm": "PRM", "majority": "majority vote", "random": "random"}
COLORS = {"orm": "tab:blue", "prm": "tab:orange", "majority": "tab:green", "random": "tab:gray"}
AGGREGATES = ("product", "min")


@dataclass
class BestOfNAnswer:
    """What a campaign's ``## Answer`` block shows."""

    question: str
    verdict: str
    table: list[dict[str, Any]]  # one row per n: n, orm, prm, majority, random, prm-orm, ...
    figure: str | None
    n_prompts: int
    evaluations: list[str]  # the jobs' run folders
    sizes: list[int]
    prm_aggregate: str
    stats: dict[str, Any] = field(default_factory=dict)  # BestOfNTable.as_dict()
    per_evaluation: list[str] = field(default_factory=list)  # each job's lead at n_max

    def markdown_table(self) -> str:
        """The table as markdown: accuracy [95 % interval] per selector, then the leads."""
        if not self.table:
            return ""
        keys = [k for k in self.table[0] if k != "n"]
        head = "| n | " + " | ".join(keys) + " |"
        rule = "|---:|" + "---|" * len(keys)
        body = ["| " + " | ".join(str(r[k]) for k in ("n", *keys)) + " |" for r in self.table]
        return "\n".join([head, rule, *body])


def _fmt(e: Any, signed: bool = False) -> str:
    if e is None or e.value is None:
        return "n/a"
    sign = "+" if signed else ""
    if e.low is None:
        return f"{e.value:{sign}.3f}"
    return f"{e.value:{sign}.3f} [{e.low:{sign}.3f}, {e.high:{sign}.3f}]"


def verdict_text(table: Any) -> str:
    """One or two sentences on the PRM's lead over the ORM (module doc), then PRM − majority."""
    last = table.sizes[-1]
    first = next((n for n in table.sizes if n > 1), last)
    lead, growth = table.lead["prm-orm"], table.growth["prm-orm"]
    end, start = lead[last], lead[first]
    vs_majority = (
        f"PRM − majority vote at n={last}: {_fmt(table.lead['prm-majority'][last], True)}."
    )
    share = table.accuracy["random"][table.sizes[0]]
    if share.value in (0.0, 1.0):  # every sample wrong (or right): no selector can differ
        return (
            f"no answer: {'none' if share.value == 0.0 else 'every one'} of the policy's samples "
            f"is correct (verifier accuracy {_fmt(share)} over {table.n_prompts} prompts), so "
            "every selector scores the same; best-of-n needs a policy whose samples disagree."
        )
    if end.low is None:
        return f"not enough prompts for an interval (n={table.n_prompts}). {vs_majority}"
    if end.low > 0 and growth.low is not None and growth.low > 0:
        head = (
            f"PRM's lead over ORM grows with n: {start.value:+.3f} at n={first} → "
            f"{_fmt(end, True)} at n={last} (growth {_fmt(growth, True)})."
        )
    elif end.low > 0:
        head = (
            f"PRM leads ORM at n={last} ({_fmt(end, True)}), but its growth from n={first} "
            f"({_fmt(growth, True)}) is not resolved."
        )
    elif end.high is not None and end.high < 0:
        head = f"no PRM lead: ORM is ahead at n={last} (PRM − ORM {_fmt(end, True)})."
    else:
        head = f"no lead: PRM − ORM at n={last} is {_fmt(end, True)}, an interval that holds 0."
    return f"{head} {vs_majority}"


def _lead_label(name: str) -> str:
    """``prm-majority`` -> ``PRM − majority vote``."""
    a, b = name.split("-")
    return f"{LABELS[a]} − {LABELS[b]}"


def _table_rows(table: Any) -> list[dict[str, Any]]:
    rows = []
    for n in table.sizes:
        row: dict[str, Any] = {"n": n}
        row.update({LABELS[s]: _fmt(table.accuracy[s][n]) for s in table.accuracy})
        row.update({_lead_label(k): _fmt(v[n], True) for k, v in table.lead.items()})
        rows.append(row)
    return rows


def _read_job(run_dir: Path, aggregate: str | None) -> tuple[dict[str, Any], dict[str, dict]]:
    """(eval.json as a dict, prompt id -> items.jsonl row with ``prm`` set to ``aggregate``)."""
    eval_path, items_path = run_dir / "eval.json", run_dir / "items.jsonl"
    if not eval_path.is_file() or not items_path.is_file():
        raise InvalidArgument(
            f"{run_dir} holds no finished best_of_n evaluation (eval.json and items.jsonl)",
            next=NextStep("list_runs", {"state": "succeeded"}),
        )
    ev = json.loads(eval_path.read_text())
    if ev.get("suite") != "best_of_n":
        raise InvalidArgument(f"{run_dir} is a {ev.get('suite')} evaluation, not best_of_n")
    rows = {}
    for line in items_path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            if aggregate is not None:
                for s in row["samples"]:
                    s["prm"] = s[f"prm_{aggregate}"]
            rows[row["id"]] = row
    return ev, rows


def _common_ids(jobs: Sequence[dict[str, dict]]) -> list[str]:
    ids = [i for i in jobs[0] if all(i in j for j in jobs[1:])]
    if not ids:
        raise InvalidArgument("the evaluations share no prompt: pool jobs of the same prompts")
    return ids


def analyse_best_of_n(
    run_dirs: Sequence[str | Path],
    figure: str | Path | None = None,
    *,
    aggregate: str | None = None,
    resamples: int = 1000,
    seed: int = 0,
) -> BestOfNAnswer:
    """The answer from the best_of_n jobs in ``run_dirs`` (module doc); ``aggregate`` recomputes
    the PRM score as the product or the min of its steps (None: each job's own setting);
    ``figure``: where to write the PNG (None: no figure)."""
    from trainers.evaluation import best_of_n_stats as bs

    if not run_dirs:
        raise InvalidArgument("name at least one best_of_n evaluation run folder")
    if aggregate is not None and aggregate not in AGGREGATES:
        raise InvalidArgument(f"aggregate {aggregate!r}: use one of {', '.join(AGGREGATES)}")
    jobs = [_read_job(Path(d), aggregate) for d in run_dirs]
    n_max = {int(ev["settings"]["sampling"]["n"]) for ev, _ in jobs}
    if len(n_max) != 1:
        raise InvalidArgument(f"the evaluations drew different n_max: {sorted(n_max)}")
    sizes = bs.subset_sizes(n_max.pop())
    ids = _common_ids([rows for _, rows in jobs])
    per_job = []
    for ev, rows in jobs:
        s = ev["settings"]
        draws = int((s.get("best_of_n") or {}).get("majority_draws", bs.DRAWS))
        per_job.append(
            [
                bs.prompt_values(
                    bs.PromptSamples.from_row(rows[i]), sizes, seed=int(s["seed"]), draws=draws
                )
                for i in ids
            ]
        )
    kw = {"resamples": resamples, "seed": seed}
    table = bs.best_of_n_table(bs.pooled_values(per_job), **kw)
    last = sizes[-1]
    each = [
        f"{Path(d).name}: PRM − ORM at n={last} "
        f"{_fmt(bs.best_of_n_table(v, **kw).lead['prm-orm'][last], True)}"
        for d, v in zip(run_dirs, per_job, strict=True)
    ]
    used = aggregate or str((jobs[0][0]["settings"].get("best_of_n") or {}).get("prm_aggregate"))
    path = plot_best_of_n(table, figure, f"best-of-n, {len(ids)} prompts") if figure else None
    return BestOfNAnswer(
        question=QUESTION,
        verdict=verdict_text(table),
        table=_table_rows(table),
        figure=path,
        n_prompts=len(ids),
        evaluations=[str(d) for d in run_dirs],
        sizes=sizes,
        prm_aggregate=used,
        stats=table.as_dict(),
        per_evaluation=each if len(per_job) > 1 else [],
    )


def plot_best_of_n(table: Any, out_path: str | Path, title: str = "") -> str:
    """Accuracy (y) against n (x, log2 axis) per selector, each with its 95 % band; PNG."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from rlhf_lab.results.plots import save_figure

    fig = Figure(figsize=(6.0, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for sel in ("prm", "orm", "majority", "random"):
        est = [table.accuracy[sel][n] for n in table.sizes]
        y = [e.value for e in est]
        ax.plot(table.sizes, y, marker="o", ms=4, lw=1.6, color=COLORS[sel], label=LABELS[sel])
        if all(e.low is not None for e in est):
            low, high = [e.low for e in est], [e.high for e in est]
            ax.fill_between(table.sizes, low, high, color=COLORS[sel], alpha=0.15, lw=0)
    ax.set_xscale("log", base=2)
    ax.set_xticks(table.sizes)
    ax.set_xticklabels([str(n) for n in table.sizes])
    ax.set_xlabel("n (samples to choose from)", fontsize=9)
    ax.set_ylabel("verifier accuracy of the chosen answer", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    if title:
        ax.set_title(title, fontsize=10)
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.13, top=0.9)
    return str(save_figure(fig, out_path))
