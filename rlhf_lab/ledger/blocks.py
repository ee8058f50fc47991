"""The campaign markdown's managed blocks, each assembled from one rendered *piece* per run plus
what the campaign as a whole says (its summary, comparisons, pipeline stages). Torch-free.

A piece depends on its run's record (and the campaign's name) only, so a piece rendered once
can be kept (:mod:`rlhf_lab.ledger.incremental` keeps them in the run index, keyed by the
record's bytes in ``ledger.json``) and recording one run renders that run's pieces alone; the
block is then a join of K short strings. A full render and an incremental one go through the
same functions here, so their markdown is the same byte for byte.

Adding a block: write its per-run piece function into :data:`RUN_PIECES` (a function of the
run's record and the campaign name returning a string or JSON-able data) and its content
function into :data:`BLOCKS` (a function of :class:`BlockInput`). A block that needs more of a
run than its piece cannot be incremental: give it a piece with what it needs instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from rlhf_lab.evaluation.records import (
    evaluation_notes,
    evaluation_rows,
    is_evaluation,
    training_runs,
)
from rlhf_lab.ledger.followups import (
    NextItem,
    _comparison_items,
    _run_items,
    deduplicated_items,
    lower_lr_items,
    without_folded,
)
from rlhf_lab.ledger.metrics import TOOL_LEGEND, _expand_metric_names, _metric_keys
from rlhf_lab.ledger.render import (
    FAMILIES,
    _campaign_model,
    _cell,
    _code,
    _env,
    _fmt_num,
    _front_matter,
    _headline_text,
    _render,
    _run_view,
    _skeleton,
    _split_front_matter,
    _stages,
    replace_blocks,
)
from rlhf_lab.ledger.schema import (
    AnswerEntry,
    Campaign,
    ComparisonEntry,
    RunRecord,
    _CampaignMeta,
    _LedgerData,
    _RunBrief,
)
from rlhf_lab.planning.time import campaign_time_line
from rlhf_lab.results.headline import headline_for

__all__ = ["BLOCKS", "PIECES_VERSION", "RUN_PIECES", "BlockInput", "render_markdown", "run_pieces"]

# Bump when a piece's rendering changes: kept pieces of another version are rendered again.
PIECES_VERSION = 4


def _piece(template: str, **context: Any) -> str:
    return _env().get_template(template).render(**context)


def _brief(r: RunRecord, _campaign: str) -> dict[str, Any]:
    """What the campaign as a whole reads of a run: its summary fields, the metric names its
    row has, its headline metric, whether it is part of a chain of runs."""
    head = r.headline or headline_for(r.family, r.algorithm)
    return {
        "run_id": r.run_id,
        "state": r.state,
        "family": r.family,
        "model": r.model,
        "dataset": r.dataset,
        "seed": r.seed,
        "metrics": [m.name for m in r.metrics],
        "headline": head.metric if head else None,
        "lineage": r.lineage is not None,
        "heldout_regression": "heldout_regression" in r.flags,
        "evaluation_job": is_evaluation(r.family),
        "wall_s": r.wall_time_s,
        "predicted_s": r.predicted_wall_s,
    }


def _runs_row(r: RunRecord, _campaign: str) -> dict[str, Any]:
    """The run's line of the runs table, but for the metric columns (its family's table
    decides those): the cells before, the final value of each metric, the cells after."""
    v = _run_view(r)
    head = (
        f"| {_code(v['run_id'])} | {_cell(v['algorithm'])} | {_cell(v['seed'])} | "
        f"{_cell(v['state_text'])} | {_cell(v['steps_text'])} | {_cell(v['wall'])} |"
    )
    finals = {name: _fmt_num(value) for name, value in v["finals"].items()}
    return {"head": head, "finals": finals, "tail": f" {_cell(v['wandb'])} | {_cell(v['note'])} |"}


def _setup_row(r: RunRecord, _campaign: str) -> str:
    return (
        f"| {_code(r.run_id)} | {_cell(r.family)} | {_cell(r.model)} | {_cell(r.dataset)} | "
        f"{_cell(r.seed)} | {_cell(r.config_source)} | {_cell(r.config_file)} |"
    )


def _calibration_md(r: RunRecord) -> str:
    """The run's difficulty calibration under its changes (none: nothing)."""
    if not r.calibration:
        return ""
    return f"{_code(r.run_id)} — difficulty " + "\n".join(r.calibration) + "\n\n"


def _next_items(r: RunRecord, campaign: str) -> list[dict[str, Any]]:
    return [asdict(item) for item in _run_items(r, campaign)]


# piece name -> how a run's record becomes that piece
RUN_PIECES: dict[str, Callable[[RunRecord, str], Any]] = {
    "brief": _brief,
    "setup_row": _setup_row,
    "setup_changes": lambda r, _c: _piece("setup_changes.md.j2", r=r) + _calibration_md(r),
    "runs_row": _runs_row,
    "runs_section": lambda r, _c: _piece("run_section.md.j2", r=_run_view(r)),
    "plots": lambda r, _c: _piece("plots_run.md.j2", r=r),
    "observation": lambda r, _c: _piece("observation.md.j2", r=r, headline=_headline_text(r)),
    "next": _next_items,
    "evaluation": lambda r, _c: {"rows": evaluation_rows([r]), "notes": evaluation_notes([r])},
}


def run_pieces(r: RunRecord, campaign: str) -> dict[str, Any]:
    """Every piece of one run (see :data:`RUN_PIECES`), tagged with :data:`PIECES_VERSION`."""
    return {"v": PIECES_VERSION, **{name: make(r, campaign) for name, make in RUN_PIECES.items()}}


@dataclass
class BlockInput:
    """What the blocks are made of: the campaign's summary and settings, one piece set per run
    in ledger order, the recorded comparisons and the pipeline stages (empty when no run takes
    another run's model)."""

    campaign: Campaign
    meta: _CampaignMeta
    pieces: list[dict[str, Any]]
    comparisons: list[ComparisonEntry] = field(default_factory=list)
    stages: list[dict[str, Any]] = field(default_factory=list)
    answer: AnswerEntry | None = None


def _training(pieces: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pieces of training runs: evaluation jobs appear only in the Evaluation block."""
    return [p for p in pieces if not p["brief"].get("evaluation_job")]


def _evaluation_block(data: BlockInput) -> str:
    pieces = [p["evaluation"] for p in data.pieces if p["brief"].get("evaluation_job")]
    return _render(
        "evaluation.md.j2",
        rows=[row for p in pieces for row in p["rows"]],
        notes=[line for p in pieces for line in p["notes"]],
    )


def _groups(pieces: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs table of each family: the held-out headline first, then the other held-out
    metrics, then the training metrics, labelled as the training signal."""
    from rlhf_lab.ledger.render import _column_header

    groups: dict[str, list[dict[str, Any]]] = {}
    for p in pieces:
        groups.setdefault(p["brief"]["family"] or "unknown family", []).append(p)
    out = []
    for family, members in groups.items():
        present = {n for p in members for n in p["brief"]["metrics"]}
        headlines = {p["brief"]["headline"] for p in members if p["brief"]["headline"]}
        names = [
            n
            for n in _expand_metric_names(_metric_keys(family if family in FAMILIES else None))
            if n in present
        ]
        names.sort(key=lambda n: (n not in headlines, not n.startswith("eval/")))
        columns = [{"name": n, "header": _column_header(n, headlines)} for n in names]
        missing = _fmt_num(None)
        lines = [
            p["runs_row"]["head"]
            + "".join(f" {p['runs_row']['finals'].get(n, missing)} |" for n in names)
            + p["runs_row"]["tail"]
            for p in members
        ]
        out.append({"family": family, "columns": columns, "lines": lines})
    return out


def _runs_block(data: BlockInput) -> str:
    """The runs tables, each run's section, the campaign's time and, when a table shows a
    multi-turn run's tool metrics, what they mean."""
    groups = _groups(_training(data.pieces))
    tools = any("tools/" in c["name"] for g in groups for c in g["columns"])
    return _render(
        "runs.md.j2",
        groups=groups,
        sections=[p["runs_section"] for p in _training(data.pieces)],
        time_total=campaign_time_line([p["brief"] for p in data.pieces]),
        tools_legend=TOOL_LEGEND if tools else None,
    )


class _Seed(NamedTuple):
    """The one field of a run record the comparisons' follow-ups read."""

    seed: int | None


def _next_block(data: BlockInput) -> str:
    campaign = data.meta.id
    regressed = {p["brief"]["run_id"] for p in data.pieces if p["brief"].get("heldout_regression")}
    items, folded = lower_lr_items(data.comparisons, regressed, campaign)
    if data.comparisons:
        # the comparisons' follow-ups read only the seeds the runs used
        seeds: Any = [_Seed(p["brief"]["seed"]) for p in data.pieces]
        for entry in data.comparisons:
            items += list(_comparison_items(entry, seeds, campaign))
    for p in _training(data.pieces):
        run_items = [NextItem(**item) for item in p["next"]]
        items += without_folded(run_items, p["brief"]["run_id"], folded)
    recorded = bool(_training(data.pieces) or data.comparisons)
    return _render("next.md.j2", items=deduplicated_items(items), recorded=recorded)


def _per_run_block(template: str, piece: str) -> Callable[[BlockInput], str]:
    """A block that renders ``template`` over the training runs and each one's ``piece``."""

    def block(data: BlockInput) -> str:
        runs = _training(data.pieces)
        return _render(template, runs=runs, pieces=[p[piece] for p in runs])

    return block


# block name -> (its heading, how its content is made)
BLOCKS: dict[str, tuple[str, Callable[[BlockInput], str]]] = {
    "answer": (
        "Answer",
        lambda d: _render("answer.md.j2", answer=d.answer, campaign=d.meta.id),
    ),
    "setup": (
        "Setup",
        lambda d: _render(
            "setup.md.j2",
            runs=_training(d.pieces),
            meta=d.campaign,
            stages=d.stages,
            rows=[p["setup_row"] for p in _training(d.pieces)],
            changes=[p["setup_changes"] for p in _training(d.pieces)],
        ),
    ),
    "runs": ("Runs", lambda d: _runs_block(d)),
    "plots": ("Plots", _per_run_block("plots.md.j2", "plots")),
    "evaluation": ("Evaluation", _evaluation_block),
    "comparison": (
        "Comparison",
        lambda d: _render("comparison.md.j2", comparisons=d.comparisons, campaign=d.campaign.id),
    ),
    "observations-auto": ("Observations", _per_run_block("observations.md.j2", "observation")),
    "next": ("Next", _next_block),
}


def campaign_of(meta: _CampaignMeta, pieces: Sequence[dict[str, Any]]) -> Campaign:
    """The campaign's summary (front matter, index of campaigns) from the runs' briefs."""
    briefs = [
        _RunBrief(
            state=str(b["state"]),
            family=b["family"],
            model=b["model"],
            dataset=b["dataset"],
            seed=b["seed"],
        )
        for b in (p["brief"] for p in pieces)
    ]
    data = _LedgerData(campaign=meta)
    if not briefs:
        return _campaign_model(data)
    return _campaign_model(data, briefs=briefs)


def render_markdown(existing: str | None, data: BlockInput, where: str) -> str:
    """The campaign's markdown: the blocks regenerated in ``existing`` (the hand-written text
    around them kept), the front matter rewritten (keys a person added kept)."""
    if existing is None:
        old, body = None, "\n" + _skeleton(data.meta.question)
    else:
        old, body = _split_front_matter(existing)
        if old is None:
            body = "\n" + body
    contents = {name: make(data) for name, (_, make) in BLOCKS.items()}
    headings = {name: heading for name, (heading, _) in BLOCKS.items()}
    body = replace_blocks(body, contents, headings, where)
    return _front_matter(data.campaign, old) + body


def full_input(data: _LedgerData) -> BlockInput:
    """The blocks' input from the campaign's whole data (every run's pieces rendered now)."""
    pieces = [run_pieces(r, data.campaign.id) for r in data.runs]
    return BlockInput(
        campaign=_campaign_model(data),
        meta=data.campaign,
        pieces=pieces,
        comparisons=list(data.comparisons),
        stages=_stages(training_runs(data.runs)),
        answer=data.answer,
    )
