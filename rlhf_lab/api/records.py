"""The ledger side of the lab API: recording a run, listing campaigns, and the markdown the MCP
resources serve (the experiment index and one campaign). Torch-free."""

from __future__ import annotations

from pydantic import BaseModel, Field

from rlhf_lab.api._operation import operation
from rlhf_lab.errors import InvalidArgument, LabError, NextStep
from rlhf_lab.ledger import Campaign, RunRecord, record_run, show_campaign
from rlhf_lab.ledger import list_campaigns as ledger_campaigns
from rlhf_lab.paths import experiments_dir
from rlhf_lab.results.compare import Comparison


class RecordResult(RunRecord):
    ledger_uri: str = Field(description="the MCP resource holding the campaign's markdown")
    ledger_path: str = Field(description="the markdown file")


# what record_results returns over MCP: the row's identity, outcome and numbers; the rest of the
# record (argv, settings, attempts, samples, plots...) is in the ledger it names
class RecordSummary(BaseModel):
    """A recorded row, compact: what the agent reports from; the ledger holds the rest."""

    run_id: str
    campaign: str
    state: str
    outcome: str | None = None
    failure: str | None = None
    model: str | None = None
    seed: int | None = None
    command: str | None = None
    changes: list[dict] = Field(default_factory=list)
    metrics: list[dict] = Field(default_factory=list)
    headline: dict | None = None
    flags: list[str] = Field(default_factory=list)
    diagnostics: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    note: str | None = None
    run_dir: str
    ledger_uri: str
    ledger_path: str

    @classmethod
    def of(cls, rec: RecordResult) -> RecordSummary:
        return cls.model_validate(rec.model_dump(include=set(cls.model_fields)))


class CampaignList(BaseModel):
    campaigns: list[Campaign] = Field(description="newest first")
    total: int = Field(default=0, description="campaigns before the limit")
    note: str | None = None
    warnings: list[str] = Field(
        default_factory=list, description="the run index was rebuilt (and why)"
    )


@operation
def record_results(run_id: str, note: str | None = None) -> RecordResult:
    """Write (or refresh) a run's row in its campaign ledger; says where the ledger is."""
    rec = record_run(run_id, note)
    return RecordResult(
        **rec.model_dump(),
        ledger_uri=f"ledger://{rec.campaign}",
        ledger_path=str(experiments_dir() / f"{rec.campaign}.md"),
    )


@operation
def list_campaigns(limit: int | None = 20) -> CampaignList:
    """The newest ``limit`` campaigns (None: all), with a note when there are none yet or when
    some were left out."""
    if limit is not None and limit < 1:
        raise InvalidArgument("limit must be at least 1")
    warnings: list[str] = []
    camps = ledger_campaigns(warnings)
    note = None if camps else "no campaigns yet: launch_run creates one (default <algo>-sanity)"
    if limit is not None and len(camps) > limit:
        note = f"the newest {limit} of {len(camps)} campaigns; ledger://index lists them all"
    shown = camps if limit is None else camps[:limit]
    return CampaignList(campaigns=shown, total=len(camps), note=note, warnings=warnings)


@operation
def compare_runs(
    run_ids: list[str] | None = None,
    record_in: str | None = None,
    campaign: str | None = None,
    family: str | None = None,
) -> Comparison:
    """The comparison table of runs of one family by that family's rules (recorded in a
    campaign with ``record_in``); mixing families points at comparing one family at a time.
    ``campaign``: its runs (of ``family`` when it holds several), besides any ``run_ids``."""
    from rlhf_lab.results.compare import compare_runs as compare

    ids = list(run_ids or [])
    if campaign is not None:
        from rlhf_lab.results.campaign_runs import campaign_run_ids

        ids += [r for r in campaign_run_ids(campaign, family) if r not in ids]
    elif family is not None:
        raise InvalidArgument("family selects among a campaign's runs: give campaign too")
    try:
        return compare(ids, record_in)
    except LabError as err:
        if _mixes_families(ids):
            step = NextStep("compare_runs", note="with the run ids of one family at a time")
            raise err.with_next(step) from None
        raise


def _mixes_families(run_ids: list[str]) -> bool:
    """Whether the runs belong to more than one family (False when one cannot be read)."""
    from rlhf_lab.runs import run_state

    try:
        return len({run_state(r).family for r in run_ids}) > 1
    except LabError:
        return False


def ledger_index_markdown() -> str:
    """experiments/README.md, or a generated index of the campaigns when there is none."""
    path = experiments_dir() / "README.md"
    if path.is_file():
        return path.read_text(errors="replace")
    camps = ledger_campaigns()
    lines = ["# Experiments", ""]
    if not camps:
        lines.append("No campaigns yet. launch_run creates one (experiments/YYYY-MM-DD-<slug>.md).")
    else:
        lines += ["| campaign | status | runs | question |", "|---|---|---|---|"]
        lines += [f"| {c.id} | {c.status} | {c.runs} | {c.question} |" for c in camps]
    return "\n".join(lines) + "\n"


def campaign_markdown(campaign: str) -> str:
    """A campaign's markdown ledger (a slug names its most recent campaign)."""
    try:
        return show_campaign(campaign).markdown
    except LabError as err:
        raise err.with_next(NextStep("list_campaigns")) from None
