"""Result models of the launch operations, and the agent-facing shape of a launch. Torch-free."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from rlhf_lab.runs import LaunchResult, StopResult

State = Literal[
    "queued", "starting", "running", "succeeded", "failed", "stopped", "killed", "died", "cancelled"
]


class SweepResult(BaseModel):
    campaign: str
    launches: list[LaunchResult]
    seeds: list[int] = Field(default_factory=list, description="the seeds every recipe ran with")


class LaunchRunResult(BaseModel):
    """A launch (or resume) as an agent reads it; run_status has the rest."""

    run_id: str
    campaign: str = Field(description="YYYY-MM-DD-<slug>; its ledger is ledger://<campaign>")
    family: str
    algorithm: str
    state: State
    device: str
    queued: bool
    queue_position: int | None = None
    message: str
    log_path: str = Field(description="the run's train.log (stdout + stderr of the trainer)")
    next_step: str
    warnings: list[str] = Field(
        default_factory=list, description="doubtful values the launch went ahead with"
    )


class StopRunResult(BaseModel):
    """A stop as an agent reads it (run_status has the rest of the run's status)."""

    id: str
    state: State
    alive: bool
    stop_requested: bool
    step: int | None = None
    total_steps: int | None = None
    outcome: str | None = None
    message: str = Field(description="what happened to the run and what was saved or lost")
    last_checkpoint_step: int | None = Field(
        default=None, description="the step resume_run continues from (null: no checkpoint)"
    )


def stop_run_result(result: StopResult) -> StopRunResult:
    """The fields of a stop an agent acts on."""
    return StopRunResult.model_validate(result.model_dump(include=set(StopRunResult.model_fields)))


def launch_run_result(result: LaunchResult) -> LaunchRunResult:
    """A launch (or resume) as an agent reads it: ids, log path and the call to make next."""
    info = result.run
    if result.queued and info.after:
        nxt = (
            f"queued after {', '.join(info.after)}: it starts once they have succeeded and is "
            f"cancelled if one fails; poll run_status('{info.id}')"
        )
    elif result.queued:
        nxt = (
            f"queued (position {result.queue_position}); poll run_status('{info.id}') until it "
            "is running, then follow it"
        )
    else:
        nxt = (
            f"poll run_status('{info.id}') every 10-30 s and read new output with "
            f"tail_logs('{info.id}', cursor=...); when it ends, call record_results"
        )
    return LaunchRunResult(
        run_id=info.id,
        campaign=info.campaign,
        family=info.family,
        algorithm=info.algorithm,
        state=result.state,
        device=result.device,
        queued=result.queued,
        queue_position=result.queue_position,
        message=result.message,
        log_path=f"{info.run_dir}/train.log",
        next_step=nxt,
        warnings=result.warnings,
    )
