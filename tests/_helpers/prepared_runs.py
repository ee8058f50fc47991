"""A run of a shipped recipe prepared in the lab the way the launcher prepares one before it
starts the trainer: its run folder with config.yaml and run.json, no process."""

from __future__ import annotations

from rlhf_lab.planning.catalog import find_recipe
from rlhf_lab.planning.configs import resolve_config
from rlhf_lab.planning.overrides import as_overrides
from rlhf_lab.runs import NewRun, RunInfo, prepare_run


def prepared_run(recipe: str, overrides: list[str], campaign: str, **prepare) -> RunInfo:
    """``recipe``'s shipped config with ``overrides``, prepared as a run of ``campaign`` in
    the lab at ``RLHF_LAB_ROOT``; ``prepare`` goes to ``prepare_run`` (``state="queued"``)."""
    found = find_recipe(recipe)
    config = resolve_config(found, as_overrides(overrides)).config
    run = NewRun(
        family=found.family,
        algorithm=found.algorithm,
        config=config,
        campaign=campaign,
        source=found.config_path,
    )
    return prepare_run(run, **prepare)
