"""Campaign ledgers: dated markdown files that record what each run did.

A campaign is one question. It owns ``experiments/YYYY-MM-DD-<slug>.md`` (the ledger a person
reads) and ``experiments/YYYY-MM-DD-<slug>/`` (``runs/``, ``plots/``, ``ledger.json``, helper
scripts). ``ledger.json`` holds the campaign's data (its settings, one record per run, recorded
comparisons); the markdown is rendered from it.

Ownership of the markdown: the YAML front matter and the blocks between
``<!-- rlhf-lab:begin NAME -->`` and ``<!-- rlhf-lab:end NAME -->`` (NAME = setup, runs, plots,
comparison, observations-auto, next) belong to the lab and are regenerated on every write; every
byte outside them (the Goal text, notes, hand-written lines of the Next section) is kept as it is. Keys a person adds to the
front matter are kept, and so is a status set by hand to one of ``MANUAL_STATUSES``.

Writers hold a file lock (``.YYYY-MM-DD-<slug>.md.lock`` beside the markdown) while they read,
update and replace ``ledger.json`` and the markdown; both are replaced atomically, so readers never
see half a file. ``experiments/README.md`` is the index of campaigns, regenerated the same way.

The package, by job: :mod:`~rlhf_lab.ledger.schema` (models), :mod:`~rlhf_lab.ledger.metrics`
(key metrics, directions, summaries), :mod:`~rlhf_lab.ledger.inspect` (run folder -> RunRecord),
:mod:`~rlhf_lab.ledger.render` (markdown, templates, front matter),
:mod:`~rlhf_lab.ledger.blocks` (the managed blocks from per-run pieces),
:mod:`~rlhf_lab.ledger.incremental` (recording one row without re-reading the others),
:mod:`~rlhf_lab.ledger.layout` (names, paths, lock), :mod:`~rlhf_lab.ledger.campaigns` (reading,
listing, showing), :mod:`~rlhf_lab.ledger.store` (creating and recording),
:mod:`~rlhf_lab.ledger.index` (experiments/README.md). Every name other modules and tests import
from ``rlhf_lab.ledger`` is re-exported here. Torch-free; every public function returns pydantic
models.
"""

from __future__ import annotations

from rlhf_lab.ledger import schema
from rlhf_lab.ledger.campaigns import list_campaigns, resolve_campaign, show_campaign
from rlhf_lab.ledger.index import regenerate_index
from rlhf_lab.ledger.inspect import _CONFIG_CLASSES, _config_model, inspect_run, read_metric_rows
from rlhf_lab.ledger.layout import LOCK_TIMEOUT_S, check_campaign_slug
from rlhf_lab.ledger.metrics import (
    FAMILY_METRICS,
    _expand_metric_names,
    _metric_keys,
    metric_direction,
    summarize_metrics,
    summarize_performance,
)
from rlhf_lab.ledger.render import (
    FAMILIES,
    _cell,
    _code,
    _fence,
    _fmt_num,
    _md_text,
    _split_front_matter,
    replace_blocks,
)
from rlhf_lab.ledger.schema import *  # noqa: F403  (the models, named once in schema.__all__)
from rlhf_lab.ledger.schema import _Model
from rlhf_lab.ledger.store import (
    answer_figure_path,
    create_campaign,
    record_answer,
    record_comparison,
    record_run,
    render_campaign,
)
from rlhf_lab.ledger.text import _one_line, load_yaml
from rlhf_lab.paths import check_run_id, experiments_dir, find_run
from trainers.core.rundir import atomic_write_text
from trainers.core.runfolder import ACTIVE_STATES, TERMINAL_STATES

__all__ = [
    *schema.__all__,
    "ACTIVE_STATES",
    "FAMILIES",
    "FAMILY_METRICS",
    "LOCK_TIMEOUT_S",
    "TERMINAL_STATES",
    "_CONFIG_CLASSES",
    "_Model",
    "_cell",
    "_code",
    "_config_model",
    "_expand_metric_names",
    "_fence",
    "_fmt_num",
    "_md_text",
    "_metric_keys",
    "_one_line",
    "_split_front_matter",
    "answer_figure_path",
    "atomic_write_text",
    "check_campaign_slug",
    "check_run_id",
    "create_campaign",
    "experiments_dir",
    "find_run",
    "inspect_run",
    "list_campaigns",
    "load_yaml",
    "metric_direction",
    "read_metric_rows",
    "record_answer",
    "record_comparison",
    "record_run",
    "regenerate_index",
    "render_campaign",
    "replace_blocks",
    "resolve_campaign",
    "show_campaign",
    "summarize_metrics",
    "summarize_performance",
]
