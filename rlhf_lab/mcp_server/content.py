"""The MCP resources (the experiment index and each campaign's ledger; resources/list also names
every campaign, :class:`~rlhf_lab.mcp_server._core.LabServer`) and prompts (the sanity check and
comparison workflows, each argument described), served from :mod:`rlhf_lab.api`."""

from typing import Annotated

from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError
from pydantic import Field

from rlhf_lab import api
from rlhf_lab.errors import LabError
from rlhf_lab.mcp_server._core import render_error, server

# ---------------------------------------------------------------------------------------------
# Resources
# ---------------------------------------------------------------------------------------------


@server.resource(
    "ledger://index",
    name="ledger-index",
    title="Experiment index",
    description="experiments/README.md: every campaign with its status, question and run count",
    mime_type="text/markdown",
)
def ledger_index() -> str:
    try:
        return api.ledger_index_markdown()
    except LabError as err:
        raise ResourceError(render_error(err, "call list_campaigns.")) from None


@server.resource(
    "ledger://{campaign}",
    name="ledger-campaign",
    title="Campaign ledger",
    description="A campaign's markdown ledger (front matter, setup, runs, plots, comparison, "
    "observations); campaign = YYYY-MM-DD-<slug> or a slug (most recent campaign with it)",
    mime_type="text/markdown",
)
def ledger_campaign(campaign: str) -> str:
    try:
        return api.campaign_markdown(campaign)
    except LabError as err:
        raise ResourceNotFoundError(
            render_error(err, "read ledger://index or call list_campaigns for the campaign names.")
        ) from None


# ---------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------

_FAMILY_RULES = """\
Comparison rules by family (docs/algorithms.md):
- policy gradients: avg_correctness, avg_format, avg_binary, loss, and whether sampled groups
  carry reward contrast (frac_reward_zero_std well below 1); the loss alone says little.
- direct alignment: accuracy, margins, chosen_rewards, rejected_rewards (eval/ versions) and
  sample generations; IPO's loss scale is not comparable to DPO's, so never compare losses.
- reward models: held-out margins or correctness scores (eval/accuracy, eval/reward_margin,
  eval/auroc, eval/step_accuracy vs eval/majority_baseline), never the training loss.
- rejection sampling: each reward-selected strategy beside its matched random control
  (top_per_prompt vs random_per_prompt, top_k_overall vs random_k_overall).
- sft: eval/loss and held-out samples at matched steps."""


def _acceptance(algorithm: str) -> str:
    return api.acceptance_text(algorithm)


@server.prompt(
    name="sanity_check",
    title="Sanity-check an algorithm",
    description="Run one short sanity experiment end to end with the rlhf-lab tools and report it",
)
def sanity_check(
    algorithm: Annotated[
        str, Field(description="algorithm or recipe to check, e.g. dpo, grpo, preference_rm")
    ],
    model: Annotated[
        str, Field(description="model to run it on; 'tiny' (the default) works offline")
    ] = "tiny",
    campaign: Annotated[str, Field(description="ledger slug; empty: <algorithm>-sanity")] = "",
) -> str:
    camp = f"campaign='{campaign}'" if campaign else "the default campaign (<algorithm>-sanity)"
    return f"""\
Run a short sanity experiment for {algorithm} on model '{model}' with the rlhf-lab tools, in
{camp}. One step at a time:

1. plan_experiment(algorithm='{algorithm}', model='{model}') — note the shrunk config, the
   expected steps, the metrics to watch and the acceptance criteria.
2. shrink_config(recipe='{algorithm}', model='{model}', overrides=[...]) — validate any change.
3. estimate_memory(...) with the same arguments — launch only if it fits. One training job per
   device unless this check says both fit.
4. launch_run(recipe='{algorithm}', model='{model}', ...) — it returns the run id at once.
5. Poll run_status(run_id) every 10-30 s; read new output with tail_logs(run_id, cursor=...)
   passing the cursor each call returns. Watch for loss/metric lines, the W&B link, OOMs,
   download errors (use model 'tiny' offline) and stalls (no new output for minutes).
6. When it ends (any state): record_results(run_id, note='<one-line observation>').
7. Report: the exact command, model, dataset, seed, config file, values changed from the shipped
   recipe, final metrics against the acceptance criteria, the failure mode if any, the W&B link,
   and one follow-up sweep worth running. The ledger is the resource ledger://<campaign>.

{_acceptance(algorithm)}
"""


@server.prompt(
    name="compare_algorithms",
    title="Compare algorithms",
    description="Compare several algorithms of one family with matched settings and the "
    "family's comparison rules",
)
def compare_algorithms(
    algorithms: Annotated[
        str,
        Field(description="two or more algorithms of one family, comma-separated: 'dpo, ipo'"),
    ],
    model: Annotated[
        str, Field(description="model for every run; 'tiny' (the default) works offline")
    ] = "tiny",
    campaign: Annotated[str, Field(description="ledger slug; empty: <a>-vs-<b>")] = "",
) -> str:
    names = [a.strip() for a in algorithms.replace(" ", ",").split(",") if a.strip()]
    listed = ", ".join(names) or algorithms
    camp = campaign or "-vs-".join(n.replace("_", "-") for n in names)[:60] or "comparison"
    criteria = "\n\n".join(_acceptance(n) for n in names)
    return f"""\
Compare {listed} on model '{model}' with matched settings, in campaign '{camp}'.

1. plan_experiment(request='compare {" and ".join(names)}', model='{model}',
   campaign='{camp}'). The plan matches the runs (same seed, data and shrink; policy
   gradients also the same prompts and completions per step) and lists what it held equal
   under `matched`: launch each run with exactly the overrides of its launch_command, so that
   only the algorithm differs.
2. estimate_memory for each recipe. Launch them one after another with launch_run(...,
   campaign='{camp}', queue=true) so the device runs one job at a time (queue=false with
   force=true only if the memory check says they fit together). Runs with `after` wait for
   those runs to succeed (the plan's `steps` say how).
3. Poll run_status for each run; tail_logs(cursor=...) when something looks wrong.
4. record_results for every run (any final state), then
   compare_runs(run_ids=[...], record_in='{camp}').
5. Report the table with the family's rules below, which runs met the acceptance criteria, the
   failure modes, and a follow-up sweep (e.g. a learning-rate or beta sweep for the winner,
   or more seeds where the gap is small).

{_FAMILY_RULES}

{criteria}
"""
