"""The runs ``compare --campaign NAME`` takes: every run of the campaign that can carry a result,
of one family. Torch-free.

Taken: runs in a final state with a result to read (succeeded, stopped) or still running (the
comparison marks them), in creation order. Left out: queued, starting, failed, killed, died and
cancelled runs (no final held-out value), and the campaign's evaluation jobs when it also holds
training runs (a comparison of training runs already appends their evaluations). A campaign of
several families (a pipeline: SFT then DPO) needs ``family``; without it the error names each
family's command.
"""

from __future__ import annotations

from rlhf_lab.errors import InvalidArgument, NextStep

__all__ = ["COMPARED_STATES", "campaign_run_ids"]

COMPARED_STATES = frozenset({"succeeded", "stopped", "running"})
EVAL_FAMILY = "evaluation"


def campaign_run_ids(campaign: str, family: str | None = None) -> list[str]:
    """The ids of the campaign's runs to compare (see the module docstring). Raises
    InvalidArgument when the campaign holds none, or several families and ``family`` is None."""
    from rlhf_lab.ledger.campaigns import resolve_campaign
    from rlhf_lab.runs import list_runs

    name = resolve_campaign(campaign)
    runs = [r for r in list_runs(campaign=name) if r.state in COMPARED_STATES]
    by_family: dict[str, list[str]] = {}
    for r in runs:
        by_family.setdefault(r.family or "unknown", []).append(r.id)
    if len(by_family) > 1:
        by_family.pop(EVAL_FAMILY, None)
    if family is not None:
        by_family = {family: by_family.get(family, [])} if family in by_family else {}
    if not by_family:
        which = f" of family {family}" if family else ""
        raise InvalidArgument(
            f"campaign {name} has no run{which} to compare (succeeded, stopped or running)",
            next=NextStep("list_runs", {"campaign": name}, note="shows its runs and states"),
        )
    if len(by_family) > 1:
        names = ", ".join(f"{fam} ({len(ids)})" for fam, ids in by_family.items())
        raise InvalidArgument(
            f"campaign {name} holds runs of several families ({names}); each family has its own "
            "comparison rules: compare one family at a time",
            next=[NextStep("compare_runs", {"campaign": name, "family": fam}) for fam in by_family],
        )
    return next(iter(by_family.values()))
