"""Writing campaigns: ``ledger.json`` and the markdown (replaced atomically, under the campaign's
lock), creating a campaign, recording a run's row and a comparison, re-rendering. Every write
regenerates the index (:mod:`rlhf_lab.ledger.index`). Torch-free.

Files are written with ``rlhf_lab.ledger.atomic_write_text`` looked up at call time (tests slow
it down there to widen the window a torn read would need).
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from rlhf_lab.errors import InvalidArgument, LabError, NextStep, NotFound
from rlhf_lab.ledger.blocks import full_input, render_markdown, run_pieces
from rlhf_lab.ledger.campaigns import _load_data, _manual_status, resolve_campaign
from rlhf_lab.ledger.incremental import (
    block_input,
    keep_pieces,
    parse_record,
    piece_key,
    pieces_for,
    record_lines,
    split_ledger,
)
from rlhf_lab.ledger.index import regenerate_index
from rlhf_lab.ledger.inspect import _build_record
from rlhf_lab.ledger.layout import (
    _CAMPAIGN_RE,
    _acquire,
    _asset_dir,
    _check_campaign_name,
    _data_path,
    _locked,
    _md_path,
    check_campaign_slug,
)
from rlhf_lab.ledger.metrics import _metric_keys
from rlhf_lab.ledger.render import _campaign_model
from rlhf_lab.ledger.schema import (
    AnswerEntry,
    Campaign,
    ComparisonEntry,
    RunRecord,
    _CampaignMeta,
    _LedgerData,
)
from rlhf_lab.ledger.text import _now, _one_line
from rlhf_lab.paths import experiments_dir, find_run, today
from rlhf_lab.planning.catalog import FAMILIES as CATALOG_FAMILIES
from rlhf_lab.results.plots import PlotResult, plot_reward_vs_kl, plot_run_metrics
from rlhf_lab.runs import run_state
from rlhf_lab.runs.folder import read_metric_rows, read_record
from trainers.core.runfolder import ACTIVE_STATES

__all__ = [
    "answer_figure_path",
    "create_campaign",
    "record_answer",
    "record_comparison",
    "record_run",
    "render_campaign",
]

FAMILIES: tuple[str, ...] = tuple(CATALOG_FAMILIES)


def _writer() -> Callable[[Path, str], None]:
    """``atomic_write_text`` as the ledger package holds it now (see the module docstring)."""
    return sys.modules["rlhf_lab.ledger"].atomic_write_text


def _write_data(name: str, data: _LedgerData) -> None:
    _writer()(_data_path(name), data.model_dump_json(indent=1) + "\n")


def _write(name: str, data: _LedgerData) -> None:
    """Write ledger.json then regenerate the markdown (caller holds the campaign lock); the
    runs' pieces are kept for the next incremental write."""
    (_asset_dir(name) / "runs").mkdir(parents=True, exist_ok=True)
    (_asset_dir(name) / "plots").mkdir(parents=True, exist_ok=True)
    text = data.model_dump_json(indent=1) + "\n"
    _writer()(_data_path(name), text)
    md = _md_path(name)
    existing = md.read_text() if md.is_file() else None
    blocks = full_input(data)
    text_md = render_markdown(existing, blocks, str(md))
    if text_md != existing:
        _writer()(md, text_md)
    _remember(name, blocks.campaign)
    _keep_all_pieces(name, text, blocks.pieces)


def _remember(name: str, summary: Campaign) -> None:
    """Give the run index the campaign's new summary (the index of campaigns is then updated
    from it, not rebuilt by reading every campaign)."""
    from rlhf_lab.index.campaigns import remember

    manual = _manual_status(name)
    if manual is not None:
        summary = summary.model_copy(update={"status": manual})
    remember(name, (_data_path(name), _md_path(name)), summary.model_dump_json())


def _keep_all_pieces(name: str, text: str, pieces: list[dict]) -> None:
    """Keep every run's pieces after a full render (a cache: a failure costs nothing)."""
    from rlhf_lab.index.store import with_index

    ledger = split_ledger(text)
    if ledger is None:
        return
    ids = ledger.run_ids()
    rows = [
        (name, run_id, piece_key(name, lines), json.dumps(p))
        for run_id, lines, p in zip(ids, ledger.records, pieces, strict=True)
    ]
    try:
        with_index(lambda conn: keep_pieces(conn, name, rows, ids), [])
    except sqlite3.Error:
        pass


def _record_incrementally(name: str, record: RunRecord, note: str | None, plot: bool) -> bool:
    """Put ``record`` into the campaign's ledger.json and markdown touching only its own row
    (:mod:`rlhf_lab.ledger.incremental`); False, with nothing written, when the campaign does
    not fit that path (the caller then renders it whole). Caller holds the campaign lock."""
    from rlhf_lab.index.store import with_index

    path = _data_path(name)
    if not path.is_file():
        return False
    ledger = split_ledger(path.read_text())
    if ledger is None:
        return False
    ids = ledger.run_ids()
    try:
        if record.run_id in ids:
            at = ids.index(record.run_id)
            _carry_over(record, parse_record(ledger.records[at]), note, plot)
            ledger.records[at] = record_lines(record)
        else:
            ledger.records.append(record_lines(record))
            ids.append(record.run_id)
    except ValueError:
        return False
    fresh = {record.run_id: run_pieces(record, name)}

    def work(conn: sqlite3.Connection) -> bool:
        try:
            pieces, rows = pieces_for(conn, name, ledger, fresh)
            blocks = block_input(ledger, pieces)
        except ValueError:  # a record or setting that does not validate: the full path says so
            return False
        if blocks is None:
            return False
        md = _md_path(name)
        existing = md.read_text() if md.is_file() else None
        text_md = render_markdown(existing, blocks, str(md))
        for sub in ("runs", "plots"):
            (_asset_dir(name) / sub).mkdir(parents=True, exist_ok=True)
        _writer()(path, ledger.text())
        if text_md != existing:
            _writer()(md, text_md)
        keep_pieces(conn, name, rows, ids)
        _remember(name, blocks.campaign)
        return True

    return with_index(work, [])


def _carry_over(record: RunRecord, old: RunRecord, note: str | None, plot: bool) -> None:
    """What recording a run again keeps of its earlier row: the note when none is given, the
    plots when none were drawn this time."""
    if note is None:
        record.note = old.note
    if not plot and record.plot is None:
        record.plot = old.plot
    if not plot and record.reward_kl_plot is None:
        record.reward_kl_plot = old.reward_kl_plot


def create_campaign(
    slug: str,
    question: str,
    family: str | None = None,
    model: str | None = None,
    dataset: str | None = None,
    seeds: Sequence[int] | None = None,
) -> Campaign:
    """Create experiments/YYYY-MM-DD-<slug>.md and its asset folder (runs/, plots/).

    Idempotent: when today's campaign with this slug (or the dated name given) exists it is
    returned unchanged (``created=False``); nothing is overwritten.
    """
    check_campaign_slug(slug)
    if not isinstance(question, str) or not question.strip():
        raise InvalidArgument("a campaign needs a question, e.g. 'does SimPO learn at gamma 0.5?'")
    if family is not None and family not in FAMILIES:
        raise InvalidArgument(
            f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}",
            next=NextStep("list_recipes"),
        )
    if seeds is not None and not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise InvalidArgument(f"seeds must be integers, got {list(seeds)!r}")
    name = slug if _CAMPAIGN_RE.fullmatch(slug) else f"{today()}-{slug}"
    date, bare = _check_campaign_name(name)
    with _acquire(_locked(name), name):
        data = _load_data(name)
        created = data is None
        if data is None:
            data = _LedgerData(
                campaign=_CampaignMeta(
                    id=name,
                    slug=bare,
                    date=date,
                    question=_one_line(question, 500),
                    family=family,
                    model=None if model is None else _one_line(model, 200),
                    dataset=None if dataset is None else _one_line(dataset, 200),
                    seeds=list(seeds) if seeds is not None else None,
                    created_at=_now(),
                )
            )
            _write(name, data)
        else:
            for sub in ("runs", "plots"):
                (_asset_dir(name) / sub).mkdir(parents=True, exist_ok=True)
            if not _data_path(name).is_file():
                _write_data(name, data)
            if not _md_path(name).is_file():
                _write(name, data)
    regenerate_index()
    return _campaign_model(data, created=created)


def _refresh_state(run_id: str, path: Path) -> str | None:
    """Let the runs package settle a run that run.json still calls active (it checks the process
    table and writes the final state into run.json). Returns a warning when that failed."""
    state = (read_record(path).data or {}).get("state")
    if state not in ACTIVE_STATES:
        return None
    try:
        run_state(run_id)
    except Exception as err:  # the record is still built from what is on disk
        return f"state not refreshed from the process table ({type(err).__name__}: {err})"
    return None


def record_run(run_id: str, note: str | None = None, *, plot: bool = True) -> RunRecord:
    """Fill (or refresh) a run's row in its campaign ledger from the run folder.

    Reads run.json, config.yaml, summary.json, progress.json, metrics.jsonl and samples.jsonl;
    unreadable or missing files become warnings in the record. Draws the family's key metrics to
    <campaign>/plots/<run-id>.png, and for a run that logs ``kl_ref`` and ``proxy_reward`` the
    proxy and gold reward against √KL to <campaign>/plots/<run-id>-reward-kl.png. Recording again replaces the same row; ``note=None`` keeps the
    note recorded before. The campaign is created if the run's folder has none yet.
    """
    path = find_run(run_id)
    name = path.parent.parent.name
    try:
        _check_campaign_name(name)
    except LabError:
        raise InvalidArgument(
            f"run {run_id} sits in {path.parent.parent}, which is not a dated campaign folder "
            "(YYYY-MM-DD-<slug>); move it under one"
        ) from None
    refresh_warning = _refresh_state(run_id, path)
    record = _build_record(path, run_id)
    if refresh_warning:
        record.warnings.append(refresh_warning)
    if plot:
        _draw_plots(path, name, record)
    if note is not None:
        record.note = _one_line(note, 1000) if note.strip() else None
    with _acquire(_locked(name), name):
        if not _record_incrementally(name, record, note, plot):
            _record_whole(name, record, note, plot)
    regenerate_index()
    return record


def _current(png: Path, source: Path) -> bool:
    """Whether ``png`` was drawn after ``source`` last changed (then it need not be drawn)."""
    try:
        return png.stat().st_mtime_ns > source.stat().st_mtime_ns
    except OSError:
        return False


def _draw_plots(path: Path, name: str, record: RunRecord) -> None:
    """Draw the run's plots into the campaign's plots/ and name them in ``record``; a plot
    drawn after the run's metrics last changed is kept as it is (recording a finished run again
    draws nothing)."""
    metrics = path / "metrics.jsonl"
    rows: list[dict] | None = None
    plots = _asset_dir(name) / "plots"
    png, kl_png = plots / f"{record.run_id}.png", plots / f"{record.run_id}-reward-kl.png"
    if _current(png, metrics):
        record.plot = os.path.relpath(png, experiments_dir())
    else:
        rows = read_metric_rows(metrics).rows
        title = f"{record.run_id} ({record.algorithm or record.family or 'run'})"
        keys = _metric_keys(record.family)
        drawn = _drawn(record, "plot", lambda: plot_run_metrics(rows, keys, png, title=title))
        record.plot = drawn or record.plot
    if _current(kl_png, metrics):
        record.reward_kl_plot = os.path.relpath(kl_png, experiments_dir())
        return
    if rows is None and not kl_png.exists():
        return  # both were drawn (or tried) after the metrics last changed: this run has none

    def reward_vs_kl() -> PlotResult:
        return plot_reward_vs_kl(
            read_metric_rows(metrics).rows if rows is None else rows,
            kl_png,
            title=f"{record.run_id}: proxy and gold reward against KL to the reference",
        )

    drawn = _drawn(record, "reward-against-KL plot", reward_vs_kl)
    record.reward_kl_plot = drawn or record.reward_kl_plot


def _drawn(record: RunRecord, what: str, draw: Callable[[], PlotResult]) -> str | None:
    """The plot ``draw`` wrote, relative to experiments/ (None: nothing to draw); a failure is a
    warning on ``record`` instead, for a plot must never lose the record."""
    try:
        result = draw()
        return os.path.relpath(result.path, experiments_dir()) if result.path else None
    except Exception as err:
        record.warnings.append(f"{what} not drawn: {type(err).__name__}: {err}")
        return None


def _record_whole(name: str, record: RunRecord, note: str | None, plot: bool) -> None:
    """Put ``record`` into the campaign's whole data and render it all (the campaign is
    created when it has no ledger yet). Caller holds the campaign lock."""
    data = _load_data(name)
    if data is None:
        date, slug = _check_campaign_name(name)
        data = _LedgerData(
            campaign=_CampaignMeta(
                id=name,
                slug=slug,
                date=date,
                question=f"(campaign created when {record.run_id} was recorded: write its question)",
                created_at=_now(),
            )
        )
        record.warnings.append("the campaign had no ledger yet; it was created")
    for i, old in enumerate(data.runs):
        if old.run_id == record.run_id:
            _carry_over(record, old, note, plot)
            data.runs[i] = record
            break
    else:
        data.runs.append(record)
    _write(name, data)


def _update(slug: str, change: Callable[[_LedgerData], None]) -> Campaign:
    """Apply ``change`` to the campaign's data and write it, under the campaign's lock."""
    name = resolve_campaign(slug)
    with _acquire(_locked(name), name):
        data = _load_data(name)
        if data is None:
            raise NotFound(
                f"campaign {name} has no ledger.json (it disappeared, or no run was recorded "
                "into it yet); create it again",
                next=NextStep("create_campaign", {"slug": name}),
            )
        change(data)
        _write(name, data)
    regenerate_index()
    return _campaign_model(data)


def _stamped(entry: ComparisonEntry | AnswerEntry) -> ComparisonEntry | AnswerEntry:
    return entry if entry.recorded_at else entry.model_copy(update={"recorded_at": _now()})


def record_comparison(slug: str, entry: ComparisonEntry) -> Campaign:
    """Put ``entry`` into the campaign's Comparison section (same key: replaced)."""
    entry = _stamped(entry)

    def put(data: _LedgerData) -> None:
        keys = [old.key for old in data.comparisons]
        if entry.key in keys:
            data.comparisons[keys.index(entry.key)] = entry
        else:
            data.comparisons.append(entry)

    return _update(slug, put)


def answer_figure_path(slug: str) -> Path:
    """Where the campaign's answer figure goes (its asset folder's plots/answer.png)."""
    return _asset_dir(resolve_campaign(slug)) / "plots" / "answer.png"


def record_answer(slug: str, entry: AnswerEntry) -> Campaign:
    """Put ``entry`` into the campaign's Answer block (it replaces the one recorded before)."""
    entry = _stamped(entry)
    return _update(slug, lambda data: setattr(data, "answer", entry))


def render_campaign(slug: str) -> Campaign:
    """Regenerate the campaign's markdown from ledger.json (e.g. after fixing its markers)."""
    name = resolve_campaign(slug)
    with _acquire(_locked(name), name):
        data = _load_data(name)
        if data is None:
            raise NotFound(f"no campaign {name}", next=NextStep("list_campaigns"))
        _write(name, data)
    regenerate_index()
    return _campaign_model(data)
