"""`rlhf-lab demo`: an offline campaign on the built-in `tiny` model that walks the whole lab flow:
plan → shrink → launch in the background (queued, one job at a time) → watch → record → compare,
ending with the path of the dated markdown ledger.

The campaign compares DPO and SimPO on the built-in reasoning-gym preference set with matched
settings (the shrink rules for `tiny`), which takes about a minute on two CPU cores.
"""

from __future__ import annotations

import time

# The tested direct-alignment recipe for the `tiny` model (the shrink rules reuse it): the built-in
# preference data, a few hundred pairs, one epoch, a learning rate suited to a 1M-parameter model.
DPO_SANITY_OVERRIDES = [
    "model.name=tiny",
    "model.gradient_checkpointing=false",
    "data.dataset=builtin:reasoning-preferences",
    "data.max_samples=640",
    "data.eval_size=128",
    "data.max_length=160",
    "train.num_epochs=1",
    "train.batch_size=16",
    "train.gradient_accumulation_steps=1",
    "train.learning_rate=3.0e-4",
    "eval.eval_every=10",
    "eval.sample_every=20",
    "eval.num_samples=2",
    "eval.sample_max_new_tokens=48",
    "logging.log_every=1",
    "checkpoint.save_every=null",
]

DEMO_RECIPES = ("dpo", "simpo")


def _say(text: str) -> None:
    print(text, flush=True)


def watch(run_ids: list[str], poll_s: float = 2.0, timeout_s: float = 1800.0) -> dict[str, str]:
    """Poll the runs until each ends; print one line per change (state, step, alerts)."""
    from rlhf_lab.api import run_status

    seen: dict[str, tuple] = {}
    final: dict[str, str] = {}
    deadline = time.time() + timeout_s
    while len(final) < len(run_ids) and time.time() < deadline:
        for run_id in run_ids:
            if run_id in final:
                continue
            view = run_status(run_id)
            s = view.status
            acc = s.last_eval.get("eval/accuracy")
            key = (s.state, acc)  # print when the state or the held-out accuracy changes
            if key != seen.get(run_id):
                seen[run_id] = key
                extra = f" eval/accuracy {acc:.3f}" if isinstance(acc, float) else ""
                _say(f"  {run_id}: {s.state} step {s.step or 0}/{s.total_steps or '?'}{extra}")
                for alert in view.alerts:
                    _say(f"    ! {alert.kind}: {alert.message} ({alert.hint})")
            if s.terminal:
                final[run_id] = s.state
        time.sleep(poll_s)
    return final


def run_demo(campaign_slug: str = "demo") -> str:
    from rlhf_lab.api import (
        RunRequest,
        compare_runs,
        launch,
        plan_experiment,
        record_run,
        show_campaign,
    )

    _say("== plan")
    plan = plan_experiment(
        "compare " + " and ".join(DEMO_RECIPES) + " sanity check",
        model="tiny",
        campaign=campaign_slug,
    )
    to_watch: dict[str, list[str]] = {}
    for crit in plan.criteria:
        for algorithm in crit.algorithms:
            to_watch.setdefault(algorithm, []).extend(crit.key_metrics)
    for run in plan.runs:
        _say(
            f"  {run.recipe}: {run.expected_optimizer_steps} optimizer steps; watch "
            + ", ".join(to_watch.get(run.algorithm, [])[:4])
        )
        _say(f"  launch: {run.launch_command}")
    for warning in plan.warnings:
        _say(f"  warning: {warning}")

    _say("== launch (background, queued one after another)")
    launched = []
    for recipe in DEMO_RECIPES:
        request = RunRequest(
            recipe=recipe,
            shrink=True,
            model="tiny",
            campaign=campaign_slug,
            question="Do DPO and SimPO both learn the built-in preferences on the tiny model?",
            queue=True,
        )
        result = launch(request)
        launched.append(result.run.id)
        _say(f"  {result.run.id}: {result.message}")
        _say(f"    log: {result.run.run_dir}/train.log")

    _say("== watch")
    final = watch(launched)

    _say("== record")
    for run_id in launched:
        rec = record_run(run_id, note="rlhf-lab demo")
        shown = ", ".join(
            f"{m.name} {m.final:.3f}" for m in rec.metrics if isinstance(m.final, float)
        )[:200]
        _say(f"  {run_id} [{final.get(run_id, rec.state)}]: {shown}")

    _say("== compare")
    comparison = compare_runs(launched, record_in=campaign_slug)
    _say(comparison.table)

    ledger = show_campaign(campaign_slug)
    _say(f"\nledger: {ledger.campaign.path}")
    failed = [r for r, state in final.items() if state != "succeeded"]
    if failed or len(final) < len(launched):
        raise SystemExit(f"demo runs did not all succeed: {final}")
    return ledger.campaign.path
