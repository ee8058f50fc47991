"""Rendering a campaign: markdown formatting filters, the jinja2 templates of the lab-owned
blocks, splicing blocks into a hand-edited ledger (bytes outside the markers are kept), and the
YAML front matter. Pure functions of the ledger's data; the only file read is a template.
Torch-free."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from rlhf_lab.errors import Corrupt, NextStep
from rlhf_lab.index.campaign_summary import _distinct, _scalar_or_list
from rlhf_lab.ledger.layout import _asset_dir, _md_path
from rlhf_lab.ledger.metrics import _expand_metric_names, _metric_keys, _performance_text
from rlhf_lab.ledger.schema import (
    MANUAL_STATUSES,
    Campaign,
    RunRecord,
    _LedgerData,
    _RunBrief,
)
from rlhf_lab.ledger.text import _YAML_LOADER, _one_line
from rlhf_lab.planning.catalog import FAMILIES as CATALOG_FAMILIES
from rlhf_lab.planning.time import wall_with_prediction
from rlhf_lab.results.headline import PROXY_HEADLINE, PROXY_LABEL, headline_for
from rlhf_lab.results.plots import as_float
from rlhf_lab.results.stages import time_split
from trainers.core.runfolder import ACTIVE_STATES

__all__ = ["replace_blocks"]

FAMILIES: tuple[str, ...] = tuple(CATALOG_FAMILIES)

_ENV: Environment | None = None


def _fmt_num(value: Any) -> str:
    number = as_float(value)
    if number is None:
        return "—" if value in (None, "") else _cell(value)
    if math.isnan(number):
        return "nan"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return f"{number:.4g}"


def _cell(value: Any) -> str:
    if value is None or value == "" or value == []:
        return "—"
    if isinstance(value, list):
        value = ", ".join(str(v) for v in value)
    return _md_text(value).replace("|", "\\|")


def _md_text(value: Any, limit: int = 400) -> str:
    """One line of plain text for markdown: whitespace collapsed, '<' escaped so that text such
    as <think> shows instead of being taken for HTML."""
    return _one_line(value, limit).replace("<", "\\<")


def _value(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, default=str)


def _code(value: Any) -> str:
    text = " ".join(str(value).split())
    if "`" not in text:
        return f"`{text}`"
    return f"`` {text} ``"


def _fence(text: Any) -> str:
    text = str(text)
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}\n{text}\n{ticks}"


def _transcript(turns: Sequence[Any]) -> str:
    """A trajectory turn by turn: ``model:`` and ``tool:`` lines, a turn's further lines
    indented under its first."""
    lines = []
    for turn in turns:
        if turn.role == "more":  # the turns left out of the excerpt
            lines.append(f"({turn.text})")
            continue
        label = f"{turn.role}:".ljust(7)
        first, *rest = str(turn.text).split("\n")
        lines.append(f"{label}{first}".rstrip())
        lines += [f"{' ' * 7}{line}".rstrip() for line in rest]
    return "\n".join(lines)


def _scores(scores: dict[str, float]) -> str:
    if not scores:
        return ""
    return " — " + ", ".join(f"{k} {_fmt_num(v)}" for k, v in scores.items())


def _env() -> Environment:
    global _ENV
    if _ENV is None:
        env = Environment(
            loader=FileSystemLoader(str(Path(__file__).resolve().parents[1] / "templates")),
            autoescape=False,
            undefined=StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=True,
        )
        env.filters.update(
            num=_fmt_num,
            scores=_scores,
            cell=_cell,
            value=_value,
            code=_code,
            fence=_fence,
            oneline=_md_text,
            transcript=_transcript,
        )
        _ENV = env
    return _ENV


def _render(template: str, **context: Any) -> str:
    text = _env().get_template(template).render(**context).strip("\n")
    # Data (a completion, a note) must never forge a marker comment.
    return text.replace("rlhf-lab:begin", "rlhf-lab: begin").replace(
        "rlhf-lab:end", "rlhf-lab: end"
    )


def _begin(name: str) -> str:
    return f"<!-- rlhf-lab:begin {name} -->"


def _end(name: str) -> str:
    return f"<!-- rlhf-lab:end {name} -->"


def _block_spans(text: str, names: Sequence[str], where: str) -> dict[str, tuple[int, int]]:
    """{name: (start of content, end of content)} for the blocks present; LabError when a block's
    markers are duplicated, unbalanced, out of order or overlap another block. One scan of the
    text for every marker (a campaign of thousands of runs has a markdown of megabytes)."""
    if not names:
        return {}
    found: dict[tuple[str, str], list[int]] = {}
    alternatives = "|".join(re.escape(n) for n in names)
    for match in re.finditer(f"<!-- rlhf-lab:(begin|end) ({alternatives}) -->", text):
        found.setdefault((match.group(1), match.group(2)), []).append(match.start())
    spans: dict[str, tuple[int, int]] = {}
    for name in names:
        begins, ends = found.get(("begin", name), []), found.get(("end", name), [])
        nb, ne = len(begins), len(ends)
        if nb == 0 and ne == 0:
            continue
        b, e = (begins or [-1])[0], (ends or [-1])[0]
        if nb != 1 or ne != 1 or e < b:
            raise Corrupt(
                f"{where}: the '{name}' block markers are broken ({nb} begin, {ne} end marker(s)); "
                f"leave exactly one `{_begin(name)}` followed by one `{_end(name)}` (or delete "
                "both to have the block re-added), then show the campaign again. "
                "The campaign data is safe in ledger.json.",
                next=NextStep("show_campaign"),
            )
        spans[name] = (b + len(_begin(name)), e)
    ordered = sorted(spans.items(), key=lambda kv: kv[1][0])
    for (n1, (_, e1)), (n2, (b2, _)) in zip(ordered, ordered[1:], strict=False):
        if b2 - len(_begin(n2)) < e1 + len(_end(n1)):
            raise Corrupt(f"{where}: the '{n1}' and '{n2}' blocks overlap; fix their markers")
    return spans


# blocks that open the report: re-added under the campaign's title, not at the end
_UNDER_TITLE = frozenset({"answer"})


def replace_blocks(
    text: str, contents: dict[str, str], headings: dict[str, str], where: str
) -> str:
    """Replace the content between each block's markers; bytes outside markers are kept. A block
    whose markers are both gone is re-added right under its heading, else (the answer) under the
    title, else at the end."""
    spans = _block_spans(text, list(contents), where)
    parts, done = [], 0  # the blocks do not overlap (checked): one pass, one join
    for name, (start, stop) in sorted(spans.items(), key=lambda kv: kv[1][0]):
        parts += [text[done:start], "\n", contents[name], "\n"]
        done = stop
    text = "".join([*parts, text[done:]])
    for name, content in contents.items():
        if name in spans:
            continue
        block = f"{_begin(name)}\n{content}\n{_end(name)}"
        heading = headings.get(name)
        match = re.search(rf"^## {re.escape(heading)}[ \t]*$", text, re.M) if heading else None
        title = re.search(r"^# .*$", text, re.M) if name in _UNDER_TITLE else None
        if match:
            at = match.end()
            text = text[:at] + "\n\n" + block + text[at:]
        elif title and heading:
            at = title.end()
            text = f"{text[:at]}\n\n## {heading}\n\n{block}{text[at:]}"
        else:
            sep = "" if text.endswith("\n") or not text else "\n"
            title = f"## {heading}\n\n" if heading else ""
            text = f"{text}{sep}\n{title}{block}\n"
    return text


_FRONT_RE = re.compile(r"---\r?\n(.*?\r?\n)?---(?:\r?\n|\Z)", re.S)


def _split_front_matter(text: str) -> tuple[dict | None, str]:
    """(front matter mapping or None, the rest of the text byte-for-byte)."""
    match = _FRONT_RE.match(text)
    if not match:
        return None, text
    try:
        data = yaml.load(match.group(1) or "", Loader=_YAML_LOADER)
    except yaml.YAMLError:
        data = {}
    return (data if isinstance(data, dict) else {}), text[match.end() :]


def _campaign_status(runs: Sequence[RunRecord | _RunBrief]) -> str:
    if not runs:
        return "planned"
    states = [r.state for r in runs]
    if any(s in ACTIVE_STATES for s in states):
        return "running"
    if any(s == "succeeded" for s in states):
        return "completed"
    return "failed"


def _campaign_model(
    data: _LedgerData,
    status: str | None = None,
    created: bool = False,
    briefs: Sequence[_RunBrief] | None = None,
) -> Campaign:
    meta = data.campaign
    runs: Sequence[RunRecord | _RunBrief] = data.runs if briefs is None else briefs
    # the seeds the runs actually used (reward-model recipes ship different ones); the seeds
    # given when the campaign was created only until a run is recorded
    seeds = _distinct(r.seed for r in runs) or meta.seeds or []
    return Campaign(
        id=meta.id,
        slug=meta.slug,
        date=meta.date,
        status=status or _campaign_status(runs),
        question=meta.question,
        family=_scalar_or_list(meta.family, _distinct(r.family for r in runs)),
        model=_scalar_or_list(meta.model, _distinct(r.model for r in runs)),
        dataset=_scalar_or_list(meta.dataset, _distinct(r.dataset for r in runs)),
        seeds=[int(s) for s in seeds],
        path=str(_md_path(meta.id)),
        asset_dir=str(_asset_dir(meta.id)),
        runs=len(runs),
        created=created,
    )


def _front_matter(campaign: Campaign, old: dict | None) -> str:
    status = campaign.status
    if old and str(old.get("status", "")) in MANUAL_STATUSES:
        status = str(old["status"])
    data: dict[str, Any] = {
        "id": campaign.id,
        "date": campaign.date,
        "status": status,
        "question": campaign.question,
        "family": campaign.family,
        "model": campaign.model,
        "dataset": campaign.dataset,
        "seeds": campaign.seeds,
    }
    for key, value in (old or {}).items():
        if key not in data:
            data[key] = value
    text = yaml.safe_dump(
        data, sort_keys=False, allow_unicode=True, default_flow_style=None, width=1000
    )
    return f"---\n{text}---\n"


def _duration(seconds: float | None) -> str | None:
    if seconds is None or not math.isfinite(seconds):
        return None
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _state_text(r: RunRecord) -> str:
    """The run's outcome in one line: the state, how it ended when it did not succeed (never the
    state twice), and the number of attempts when it was resumed."""
    state = r.state
    failure = _one_line(r.failure, 90) if r.failure and r.state != "succeeded" else None
    if failure and failure.startswith(r.state):
        state = failure  # "stopped on request at step 3; ...", never "stopped: stopped"
    elif failure:
        state = f"{r.state}: {failure}"
    if len(r.attempts) > 1:
        state += f" (after {len(r.attempts)} attempts)"
    return state


def _attempts_text(r: RunRecord) -> list[str]:
    """One line per attempt, when the run was resumed: outcome, steps, wall time, command."""
    if len(r.attempts) < 2:
        return []
    lines = []
    for a in r.attempts:
        parts = [a.state or "unknown"]
        if a.resumed_from_step is not None:
            parts.append(f"from checkpoint step {a.resumed_from_step}")
        if a.steps is not None:
            parts.append(f"reached step {a.steps}")
        if (wall := _duration(a.wall_time_s)) is not None:
            parts.append(wall)
        text = f"{a.number}. " + ", ".join(parts)
        if a.detail and a.detail != a.state:
            text += f" — {_md_text(a.detail, 160)}"
        if a.number == 1:
            text += " — the lab command above"
        elif a.command:
            text += f" — {_code(a.command)}"
        lines.append(text)
    return lines


def _headline_text(r: RunRecord) -> str | None:
    h = r.headline
    if h is None:
        return None
    if h.value is None:
        return f"held-out {h.metric}: not evaluated"
    text = f"held-out {h.metric} {_fmt_num(h.value)}"
    if h.step is not None:
        text += f" at step {h.step}"
    if h.low is not None and h.high is not None:
        text += f" (95% sampling noise {_fmt_num(h.low)}–{_fmt_num(h.high)} on n={h.n})"
    elif h.n is not None:
        text += f" (n={h.n})"
    if h.start_value is not None and h.start_step != h.step:
        where = "step 0" if h.start_step in (0, None) else f"first eval, step {h.start_step}"
        text += f"; {where}: {_fmt_num(h.start_value)}"
    if h.metric == PROXY_HEADLINE:
        text += f" [{PROXY_LABEL}]"
    if h.training_signal and h.training_value is not None:
        text += (
            f"; training signal {h.training_signal} {_fmt_num(h.training_value)} (secondary, "
            "not the result)"
        )
    return text


def _run_view(r: RunRecord) -> dict[str, Any]:
    steps = "—" if r.steps is None else str(r.steps)
    if r.total_steps:
        steps = f"{steps}/{r.total_steps}"
    return {
        "run_id": r.run_id,
        "algorithm": r.algorithm,
        "state_text": _state_text(r),
        "steps_text": steps,
        "wall": wall_with_prediction(_duration(r.wall_time_s), r.wall_time_s, r.predicted_wall_s),
        "attempts": _attempts_text(r),
        "headline": _headline_text(r),
        "trainer_command": r.trainer_command,
        "seed": r.seed,
        "finals": {m.name: m.final for m in r.metrics},
        "wandb": f"[W&B]({r.wandb_url})" if r.wandb_url else None,
        "note": r.note,
        "command": r.command,
        "metrics": r.metrics,
        "performance": _performance_text(r.performance),
        "time_split": time_split(r.performance),
    }


def _column_header(name: str, headlines: set[str]) -> str:
    if name in headlines:
        return f"**{name}** (held-out headline)"
    if not name.startswith("eval/"):
        return f"{name} (training signal)"
    return name


def _runs_groups(runs: Sequence[RunRecord]) -> list[dict[str, Any]]:
    """The runs table of each family: the held-out headline first, then the other held-out
    metrics, then the training metrics, labelled as the training signal."""
    groups: dict[str, list[RunRecord]] = {}
    for r in runs:
        groups.setdefault(r.family or "unknown family", []).append(r)
    out = []
    for family, members in groups.items():
        present = {m.name for r in members for m in r.metrics}
        heads = [r.headline or headline_for(r.family, r.algorithm) for r in members]
        headlines = {h.metric for h in heads if h}
        names = [
            n
            for n in _expand_metric_names(_metric_keys(family if family in FAMILIES else None))
            if n in present
        ]
        names.sort(key=lambda n: (n not in headlines, not n.startswith("eval/")))
        columns = [{"name": n, "header": _column_header(n, headlines)} for n in names]
        out.append({"family": family, "columns": columns, "runs": [_run_view(r) for r in members]})
    return out


def _stages(runs: Sequence[RunRecord]) -> list[dict[str, Any]]:
    """The pipeline stages of a campaign as one story: per run that is a stage (or hands its
    model to another run), its stage, run, state, the runs it waited for and where its final
    model went (``final_model → reward.model of ppo``). Empty for a campaign without either."""
    linked = [r for r in runs if r.lineage is not None]
    if not linked:
        return []
    name = {
        r.run_id: (r.lineage.stage if r.lineage and r.lineage.stage else r.run_id) for r in runs
    }
    given: dict[str, dict[str, list[str]]] = {}
    for r in linked:
        assert r.lineage is not None
        for key, up in r.lineage.references.items():
            given.setdefault(up, {}).setdefault(name[r.run_id], []).append(key)
    rows = []
    for r in runs:
        stage = r.lineage.stage if r.lineage else None
        if stage is None and r.run_id not in given and r.lineage is None:
            continue
        handoff = [
            f"final_model → {', '.join(keys)} of {to}"
            for to, keys in given.get(r.run_id, {}).items()
        ]
        rows.append(
            {
                "stage": stage or "—",
                "pipeline": r.lineage.pipeline if r.lineage else None,
                "run_id": r.run_id,
                "state": _state_text(r),
                "after": [name.get(a, a) for a in (r.lineage.after if r.lineage else [])],
                "handoff": handoff,
            }
        )
    return rows


def _skeleton(question: str) -> str:
    question = _one_line(question).replace("rlhf-lab:", "rlhf-lab: ")
    return _env().get_template("campaign.md.j2").render(question=question)
