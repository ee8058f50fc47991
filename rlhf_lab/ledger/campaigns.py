"""Reading campaigns: which exist, resolving a slug to a campaign, loading its ``ledger.json``
(or rebuilding its settings from the markdown's front matter), listing and showing them.
Torch-free. Writers live in :mod:`rlhf_lab.ledger.store`; both share the lock of
:mod:`rlhf_lab.ledger.layout`.
"""

from __future__ import annotations

import json

from rlhf_lab.errors import Corrupt, LabError, NextStep, NotFound
from rlhf_lab.index.campaign_summary import _int_or_none
from rlhf_lab.ledger.layout import (
    _CAMPAIGN_RE,
    _acquire,
    _check_campaign_name,
    _data_path,
    _exists,
    _locked,
    _md_path,
    check_campaign_slug,
)
from rlhf_lab.ledger.render import _campaign_model, _split_front_matter
from rlhf_lab.ledger.schema import (
    MANUAL_STATUSES,
    Campaign,
    CampaignView,
    _CampaignMeta,
    _LedgerData,
    _RunBrief,
)
from rlhf_lab.ledger.text import _now, _one_line
from rlhf_lab.paths import experiments_dir, today

__all__ = ["list_campaigns", "resolve_campaign", "show_campaign"]


def resolve_campaign(slug: str) -> str:
    """The campaign name for ``slug``: 'YYYY-MM-DD-<slug>' as given, today's campaign with that
    slug, else the most recent one. Raises LabError when there is none."""
    check_campaign_slug(slug)
    if _CAMPAIGN_RE.fullmatch(slug):
        if _exists(slug):
            return slug
        raise NotFound(
            f"no campaign {slug!r} under {experiments_dir()}", next=NextStep("list_campaigns")
        )
    name = f"{today()}-{slug}"
    if _exists(name):
        return name
    found = sorted(
        {p.stem for p in experiments_dir().glob(f"*-{slug}.md")}
        | {p.parent.name for p in experiments_dir().glob(f"*-{slug}/ledger.json")}
    )
    found = [n for n in found if (m := _CAMPAIGN_RE.fullmatch(n)) and m.group(2) == slug]
    if not found:
        raise NotFound(
            f"no campaign with slug {slug!r} under {experiments_dir()}",
            next=[
                NextStep("create_campaign", {"slug": slug}, note="with its question"),
                NextStep("list_campaigns"),
            ],
        )
    return found[-1]


def _meta_from_front_matter(name: str) -> _CampaignMeta | None:
    md = _md_path(name)
    if not md.is_file():
        return None
    fm, _ = _split_front_matter(md.read_text(errors="replace"))
    date, slug = _check_campaign_name(name)
    fm = fm or {}
    seeds = fm.get("seeds")
    return _CampaignMeta(
        id=name,
        slug=slug,
        date=date,
        question=_one_line(fm.get("question") or f"(question not recorded for {name})"),
        family=fm.get("family") if isinstance(fm.get("family"), str) else None,
        model=fm.get("model") if isinstance(fm.get("model"), str) else None,
        dataset=fm.get("dataset") if isinstance(fm.get("dataset"), str) else None,
        seeds=[s for s in seeds if isinstance(s, int)] if isinstance(seeds, list) else None,
        created_at=_now(),
    )


def _load_data(name: str) -> _LedgerData | None:
    """The campaign's data; rebuilt from the front matter when only the markdown exists; None when
    the campaign does not exist. A corrupt ledger.json is an error (never silently replaced)."""
    path = _data_path(name)
    if path.is_file():
        try:
            return _LedgerData.model_validate_json(path.read_text())
        except (OSError, ValueError) as err:
            raise Corrupt(
                f"{path} is unreadable ({type(err).__name__}); fix it by hand, or move it aside "
                "and record the campaign's runs again (the markdown keeps the last rendered rows "
                "meanwhile)",
                next=NextStep("record_results", note="for each run of the campaign"),
            ) from None
    meta = _meta_from_front_matter(name)
    return None if meta is None else _LedgerData(campaign=meta)


def _light_data(name: str) -> tuple[_LedgerData, list[_RunBrief]] | None:
    """Only what the index needs from ledger.json (campaign settings, each run's state, family,
    model, dataset, seed), without validating every record: the index is rebuilt on every write."""
    path = _data_path(name)
    if not path.is_file():
        data = _load_data(name)
        return None if data is None else (data, [])
    try:
        raw = json.loads(path.read_text())
        meta = _CampaignMeta.model_validate(raw["campaign"])
        briefs = [
            _RunBrief(
                state=str(r.get("state", "unknown")),
                family=r.get("family"),
                model=r.get("model"),
                dataset=r.get("dataset"),
                seed=_int_or_none(r.get("seed")),
            )
            for r in raw.get("runs", [])
            if isinstance(r, dict)
        ]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        _load_data(name)  # raises the LabError that explains the problem
        raise
    return _LedgerData(campaign=meta), briefs


def _manual_status(name: str) -> str | None:
    try:
        with open(_md_path(name), errors="replace") as fh:
            head = fh.read(16384)
    except OSError:
        return None
    old, _ = _split_front_matter(head)
    status = str((old or {}).get("status", ""))
    return status if status in MANUAL_STATUSES else None


def _read_campaign(name: str, light: bool = False) -> tuple[Campaign, _LedgerData | None]:
    briefs = None
    try:
        if light:
            found = _light_data(name)
            data, briefs = found if found is not None else (None, None)
        else:
            data = _load_data(name)
    except LabError as err:
        date, slug = _check_campaign_name(name)
        meta = _meta_from_front_matter(name) or _CampaignMeta(
            id=name, slug=slug, date=date, question="(unreadable)"
        )
        camp = _campaign_model(_LedgerData(campaign=meta), status="unknown")
        camp.warnings.append(str(err))
        return camp, None
    if data is None:
        raise NotFound(f"no campaign {name}", next=NextStep("list_campaigns"))
    return _campaign_model(data, status=_manual_status(name), briefs=briefs or None), data


def _summary(name: str) -> tuple[str, bool]:
    """A campaign's summary as JSON, and whether it may be cached (not when unreadable)."""
    campaign = _read_campaign(name, light=True)[0]
    return campaign.model_dump_json(), not campaign.warnings


def list_campaigns(warnings: list[str] | None = None) -> list[Campaign]:
    """Every campaign under experiments/, newest first. Each summary comes from the run index
    while the campaign's ledger.json and markdown are unchanged (``warnings`` gets the index's
    own, e.g. that it was rebuilt)."""
    from rlhf_lab.index.campaigns import cached_summaries, campaign_files, campaign_names

    names = list(reversed(campaign_names()))
    texts = cached_summaries(names, campaign_files, _summary, [] if warnings is None else warnings)
    return [Campaign.model_validate_json(t) for t in texts]


def show_campaign(slug: str) -> CampaignView:
    """The campaign's markdown and its run records (read-only)."""
    name = resolve_campaign(slug)
    # Under the writers' lock: a writer replaces ledger.json, then the markdown, so an unlocked
    # reader could pair the new rows with the old markdown.
    with _acquire(_locked(name), name):
        campaign, data = _read_campaign(name)
        md = _md_path(name)
        markdown = md.read_text(errors="replace") if md.is_file() else ""
    return CampaignView(
        campaign=campaign,
        markdown=markdown,
        runs=list(data.runs) if data else [],
        comparisons=list(data.comparisons) if data else [],
    )
