"""Cluster runs through Slurm: the job script, ``sbatch``, the run's state from Slurm and the
lab's own exit record, stop (``scancel``) and resume (a new job). Torch-free.

A Slurm run is an ordinary run folder whose run.json has a ``slurm`` block (the options and the
job ids). The job script is written into the run folder (``job.sh``) and submitted with
``sbatch``; its output goes to the run's ``train.log`` (append), so ``tail`` reads it as for a
local run. Inside the job the lab's wrapper (:mod:`rlhf_lab._wrapper`, on the first node) runs
``srun`` with one task per node, each task a ``torchrun`` that meets the others at a c10d
rendezvous on the first node; the wrapper writes ``process.json`` and ``exit.json`` into the run
folder as for a local run (the folder must be on a filesystem every node sees).

States: a job Slurm holds ``PENDING`` is ``queued``; ``RUNNING`` is ``running``; once the job has
left Slurm's queue the lab reads its final state from ``scontrol show job`` (kept by slurmctld
for ``MinJobAge`` seconds) or ``sacct`` (only where the cluster has accounting), and the lab's
exit record: a time limit (``TIMEOUT``), a node failure, preemption or an out-of-memory kill is
``failed`` with that reason; otherwise the trainer's exit decides as for a local run
(``succeeded``, ``failed``, ``stopped`` after a stop). The state seen is kept in run.json.

Time limit: a job with ``time`` asks Slurm for SIGTERM to its batch step a little before the limit
(``#SBATCH --signal=B:TERM@s``, :func:`signal_lead_s`); the wrapper passes it to the job's tasks
as a stop does, so the trainer checkpoints and exits, and records it in exit.json; the run is then
``failed`` with the time limit as its reason, with a checkpoint ``resume`` continues from.

``stop`` sends SIGTERM to the job's steps (``scancel --signal=TERM``: the trainer checkpoints and
exits; the batch step is left alone so the wrapper can record the exit), waits the grace period,
then cancels the job (``scancel``: ``killed``). ``srun`` must not get the SIGTERM itself: on a
SIGTERM it kills its tasks at once, so in a job the wrapper does not forward it.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from rlhf_lab.errors import Conflict, InvalidArgument, NextStep, Unavailable

__all__ = [
    "SlurmOptions",
    "check_slurm_available",
    "job_script",
    "slurm_run_state",
    "stop_slurm_run",
    "submit",
]

JOB_SCRIPT = "job.sh"
QUEUED_STATES = {"PENDING", "CONFIGURING", "REQUEUED", "RESV_DEL_HOLD", "SUSPENDED"}
RUNNING_STATES = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING"}
# Final job states that end a run as failed whatever the trainer did, with the reason in words.
FAILED_BY_SLURM = {
    "TIMEOUT": "Slurm ended the job at its time limit",
    "NODE_FAIL": "a node of the job failed",
    "PREEMPTED": "the job was preempted",
    "OUT_OF_MEMORY": "the job ran out of memory (Slurm's OOM kill)",
    "BOOT_FAIL": "the job's node did not boot",
    "DEADLINE": "the job reached its deadline",
}
TIME_RE = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")
# How long before its time limit a job's trainer gets SIGTERM to checkpoint (#SBATCH --signal):
# 5% of the limit, at least 30 s and at most 5 minutes, never more than half the limit. Slurm
# may send it up to a minute earlier than asked (its event loop's resolution).
SIGNAL_LEAD_MIN_S, SIGNAL_LEAD_MAX_S = 30, 300
NAME_RE = re.compile(r"^[A-Za-z0-9_.,-]{1,64}$")
SLURM_CALL_TIMEOUT_S = 30
# SIGTERM to every step of a job but its batch step (a stop; the wrapper passing on the warning
# before a time limit): the trainer checkpoints and exits, the wrapper records the exit
SIGNAL_TASKS = ("scancel", "--signal=TERM")


class SlurmOptions(BaseModel):
    """What a Slurm job asks for. ``time`` is Slurm's format: minutes, ``H:MM:SS`` or
    ``D-HH:MM:SS``."""

    nodes: int = Field(default=1, ge=1, le=1024)
    gpus_per_node: int = Field(default=0, ge=0, le=64, description="0: a CPU job")
    nproc_per_node: int | None = Field(
        default=None, ge=1, le=256, description="ranks per node (default: gpus_per_node, or 1)"
    )
    partition: str | None = None
    time: str | None = None
    account: str | None = None
    cpus_per_task: int | None = Field(default=None, ge=1, le=1024)

    @property
    def ranks_per_node(self) -> int:
        return self.nproc_per_node or self.gpus_per_node or 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node


def checked_options(options: SlurmOptions) -> SlurmOptions:
    """``options`` when every value is one Slurm accepts, else one InvalidArgument."""
    if options.time is not None and not TIME_RE.fullmatch(options.time.strip()):
        raise InvalidArgument(
            f"bad Slurm time {options.time!r}: minutes (30), H:MM:SS (2:00:00) or D-HH:MM:SS"
        )
    for name in ("partition", "account"):
        value = getattr(options, name)
        if value is not None and not NAME_RE.fullmatch(value):
            raise InvalidArgument(f"bad Slurm {name} {value!r}: letters, digits, '_', '-', '.'")
    if options.gpus_per_node and options.nproc_per_node not in (None, options.gpus_per_node):
        raise InvalidArgument(
            f"nproc {options.nproc_per_node} differs from gpus_per_node {options.gpus_per_node}: "
            "one process per GPU (leave nproc out)"
        )
    return options


def time_limit_s(text: str) -> int:
    """Seconds of a Slurm time limit: minutes, M:S, H:M:S, D-H, D-H:M or D-H:M:S (pure)."""
    days, _, rest = text.strip().rpartition("-")
    parts = [int(x) for x in rest.split(":")]
    if days:  # D-H[:M[:S]]
        h, m, sec = (parts + [0, 0])[:3]
        return ((int(days) * 24 + h) * 60 + m) * 60 + sec
    if len(parts) == 1:
        return parts[0] * 60
    if len(parts) == 2:
        return parts[0] * 60 + parts[1]
    return (parts[0] * 60 + parts[1]) * 60 + parts[2]


def signal_lead_s(time: str) -> int:
    """Seconds before the time limit ``time`` at which the trainer is told to checkpoint."""
    limit = time_limit_s(time)
    lead = min(max(limit // 20, SIGNAL_LEAD_MIN_S), SIGNAL_LEAD_MAX_S)
    return max(1, min(lead, limit // 2))


def check_slurm_available() -> None:
    """Refuse (Unavailable) when ``sbatch`` is not on PATH: nothing can be submitted here."""
    missing = [tool for tool in ("sbatch", "squeue", "scontrol", "scancel") if not _which(tool)]
    if missing:
        raise Unavailable(
            f"Slurm is not installed here ({', '.join(missing)} not found on PATH); submit "
            "from a cluster's login node, or run on this machine",
            next=[NextStep("launch_run", note="without slurm: runs on this machine")],
        )


def _which(tool: str) -> str | None:
    return shutil.which(tool)


# ---------------------------------------------------------------------------------------------
# The job script
# ---------------------------------------------------------------------------------------------


def job_script(
    run_id: str,
    family: str,
    run_dir: str | Path,
    options: SlurmOptions,
    *,
    source_dir: str | Path,
    resume: bool = False,
    python: str | None = None,
) -> str:
    """The sbatch script of a run: Slurm's directives, then the wrapper on the first node
    running ``srun`` (one task per node), each task a ``torchrun`` meeting at a c10d rendezvous
    on the first node (port from the job id, so jobs sharing a node do not collide)."""
    py = python or sys.executable
    run_dir = str(run_dir)
    directives = [
        f"--job-name=rlhf-{run_id}",
        f"--output={run_dir}/train.log",
        "--open-mode=append",
        f"--nodes={options.nodes}",
        "--ntasks-per-node=1",
    ]
    if options.gpus_per_node:
        directives.append(f"--gpus-per-node={options.gpus_per_node}")
    if options.cpus_per_task:
        directives.append(f"--cpus-per-task={options.cpus_per_task}")
    for key in ("partition", "time", "account"):
        value = getattr(options, key)
        if value:
            directives.append(f"--{key}={value}")
    if options.time:  # SIGTERM to the batch step before the limit; the wrapper passes it on
        directives.append(f"--signal=B:TERM@{signal_lead_s(options.time)}")
    trainer = [
        "-m",
        f"trainers.{family}.train",
        "--config",
        f"{run_dir}/config.yaml",
        "--run-dir",
        run_dir,
        *(["--resume"] if resume else []),
    ]
    torchrun = [py, "-m", "torch.distributed.run", "--nnodes", str(options.nodes)]
    torchrun += ["--nproc-per-node", str(options.ranks_per_node), "--rdzv-backend", "c10d"]
    # srun: one task (one torchrun) per node, said explicitly rather than inherited; the CPUs per
    # task are passed on too (srun no longer inherits --cpus-per-task from sbatch, Slurm 22.05+)
    srun = ["srun", f"--nodes={options.nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    if options.cpus_per_task:
        srun.append(f"--cpus-per-task={options.cpus_per_task}")
    wrapper = [py, "-m", "rlhf_lab._wrapper", run_dir, "--", *srun]
    lines = [
        "#!/bin/bash",
        *(f"#SBATCH {d}" for d in directives),
        f"# Written by rlhf-lab for run {run_id}; the lab submits it with sbatch and reads its",
        "# state from squeue/scontrol and the run folder (exit.json, summary.json).",
        "set -euo pipefail",
        f"cd {shlex.quote(str(source_dir))}",
        f'export PYTHONPATH={shlex.quote(str(source_dir))}"${{PYTHONPATH:+:$PYTHONPATH}}"',
        "export PYTHONUNBUFFERED=1 RLHF_LAB_SLURM=1",
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "rdzv_port=$((20000 + SLURM_JOB_ID % 20000))",
        'echo "[rlhf-lab] Slurm job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, rendezvous '
        '$head_node:$rdzv_port"',
        f"exec {shlex.join(wrapper)} \\",
        f"  {shlex.join(torchrun)} \\",
        '  --rdzv-endpoint "$head_node:$rdzv_port" --rdzv-id "$SLURM_JOB_ID" \\',
        f"  {shlex.join(trainer)}",
        "",
    ]
    return "\n".join(lines)


def _slurm(*argv: str, check: bool = False) -> subprocess.CompletedProcess:
    """One Slurm command; an OSError or a timeout is an Unavailable."""
    try:
        done = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=SLURM_CALL_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError) as err:
        raise Unavailable(f"{argv[0]} could not be run: {err}") from None
    if check and done.returncode != 0:
        raise Unavailable(
            f"{shlex.join(argv)} failed (exit {done.returncode}): "
            f"{(done.stderr or done.stdout).strip()[-500:]}",
            next=NextStep("check_resources"),
        )
    return done


def submit(run_dir: Path, script: str) -> str:
    """Write ``job.sh`` into the run folder and submit it; returns the job id."""
    path = Path(run_dir) / JOB_SCRIPT
    path.write_text(script)
    path.chmod(0o755)
    done = _slurm("sbatch", "--parsable", str(path), check=True)
    job_id = done.stdout.strip().split(";", 1)[0]
    if not job_id.isdigit():
        raise Unavailable(f"sbatch did not answer with a job id: {done.stdout.strip()!r}")
    return job_id


# ---------------------------------------------------------------------------------------------
# State
# ---------------------------------------------------------------------------------------------


def job_state(job_id: str) -> tuple[str | None, str | None]:
    """(Slurm's state of the job, its reason) from squeue, else scontrol, else sacct; (None,
    None) when Slurm answered that it does not know the job any more. Raises ``Unavailable``
    when the controller could not be asked (down, or too busy to answer in time): a job Slurm
    was never heard to forget is not a job that is gone."""
    done = _slurm("squeue", "-h", "-j", job_id, "-o", "%T|%r")
    if done.returncode == 0 and done.stdout.strip():
        state, _, reason = done.stdout.strip().splitlines()[0].partition("|")
        return state.strip(), reason.strip() or None
    answered = done.returncode == 0 or _says_unknown_job(done)
    why = (done.stderr or done.stdout).strip()
    done = _slurm("scontrol", "show", "job", "-o", job_id)
    if done.returncode == 0 and "JobState=" in done.stdout:
        fields = dict(
            part.split("=", 1) for part in done.stdout.split() if "=" in part and part[0] != "="
        )
        return fields.get("JobState"), fields.get("Reason")
    answered = answered or _says_unknown_job(done)
    if _which("sacct"):
        done = _slurm("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State")
        lines = [x.strip() for x in done.stdout.splitlines() if x.strip()]
        if done.returncode == 0 and lines:
            return lines[0].split()[0], None
    if not answered:
        raise Unavailable(
            f"Slurm's controller did not answer about job {job_id} ({why[-300:] or 'no reply'})",
            next=NextStep("check_resources"),
        )
    return None, None


def _says_unknown_job(done: subprocess.CompletedProcess) -> bool:
    """squeue and scontrol exit 1 both for a job the controller has forgotten and for a
    controller they cannot reach; only the first says so."""
    return "invalid job id" in (done.stderr or "").lower()


def slurm_run_state(
    record: dict,
    exit_known: bool,
    local: tuple[str, str | None],
    time_limit_signal: bool = False,
) -> tuple[str, str | None, bool, str | None]:
    """(run state, error, alive, Slurm state) of a Slurm run. ``local``: the state and error the
    lab's exit record and the trainer's summary give once the job is over (the local rule with
    no live process); ``exit_known``: the wrapper wrote exit.json. A job counts as running until
    it has left Slurm's queue (``COMPLETING`` included), so Slurm's final state is never missed.
    ``time_limit_signal``: the wrapper got Slurm's SIGTERM before the time limit, so a trainer
    that checkpointed and exited on it still ends the run ``failed`` with the time limit."""
    slurm = record.get("slurm") or {}
    job_id = str(slurm.get("job_id") or "")
    recorded = record.get("state")
    if recorded in ("succeeded", "failed", "stopped", "killed", "died", "cancelled"):
        return recorded, record.get("error"), False, slurm.get("state")
    if not job_id:
        return "failed", "the Slurm job was never submitted", False, None
    try:
        state, reason = job_state(job_id)
    except Unavailable:  # unknown now: the last state seen stands, and nothing is written
        last = recorded if recorded in ("queued", "running") else "queued"
        return last, None, last == "running", slurm.get("state")
    if state in QUEUED_STATES:
        return "queued", None, False, state
    if state in RUNNING_STATES:  # COMPLETING too: Slurm's final word (TIMEOUT ...) comes next
        return "running", None, True, state
    if state in FAILED_BY_SLURM:
        why = FAILED_BY_SLURM[state]
        if state == "TIMEOUT" and slurm.get("time"):
            why += f" ({slurm['time']})"
        return "failed", f"{why}; job {job_id}" + (f" ({reason})" if reason else ""), False, state
    if time_limit_signal and not record.get("stop_requested_at"):
        limit = f" ({slurm['time']})" if slurm.get("time") else ""
        return (
            "failed",
            f"Slurm's time limit{limit} was near: the trainer got SIGTERM before it and "
            f"checkpointed (resume continues from the checkpoint); job {job_id}",
            False,
            state,
        )
    if state == "CANCELLED" and not record.get("stop_requested_at"):
        return "failed", f"the Slurm job {job_id} was cancelled outside the lab", False, state
    if state is None and not exit_known:
        return "died", f"Slurm no longer knows job {job_id} and it left no exit record", False, None
    run_state, error = local
    return run_state, error, False, state


def stop_slurm_run(job_id: str, state: str | None, grace_s: float) -> bool:
    """SIGTERM to the steps of job ``job_id`` (the trainer checkpoints and exits), or cancel it
    when it has not started; after ``grace_s`` seconds still in Slurm's queue, cancel it.
    ``state``: Slurm's state of the job, asked by the caller before it recorded the stop (a
    controller that does not answer refuses the stop before anything is written). True when it
    had to cancel a running job (the run is then ``killed``)."""
    if not job_id:
        return False
    if state in QUEUED_STATES:
        _slurm("scancel", job_id)
        return False
    if state not in RUNNING_STATES:
        return False
    _slurm(*SIGNAL_TASKS, job_id)
    deadline = time.time() + max(grace_s, 0.0)
    while time.time() < deadline:
        try:
            if job_state(job_id)[0] not in RUNNING_STATES:
                return False
        except Unavailable:  # a busy controller: the job is still taken to run
            pass
        time.sleep(0.5)
    _slurm("scancel", job_id)
    return True


def slurm_block(options: SlurmOptions, job_id: str | None, previous: dict | None = None) -> dict:
    """run.json's ``slurm`` block: the options, the current job and every earlier job."""
    jobs = list((previous or {}).get("jobs") or [])
    if job_id:
        jobs.append(job_id)
    block: dict[str, Any] = {k: v for k, v in options.model_dump().items() if v is not None}
    block.update(job_id=job_id, jobs=jobs, script=JOB_SCRIPT)
    return block


def refuse_local_only(what: str) -> Conflict:
    """A local-only request (queue, after, a device) combined with a Slurm submission."""
    return Conflict(
        f"{what} does not apply to a Slurm job (Slurm queues and places it)",
        next=NextStep("launch_run", note="without it"),
    )
