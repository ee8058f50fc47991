"""What every trainer's ``main()`` shares: the command line, config validation before anything is
written, the run directory, W&B, SIGTERM handling and the failure summary.

    python -m trainers.<family>.train --config FILE --run-dir DIR [--set k=v ...] [--resume]

Order of events: parse and validate the config and run the family's preflight checks (a bad key,
an unknown loss or a missing dataset file stops here, with one message and nothing written);
then create the run directory and write ``config.yaml``; then train. Any exception after that
point leaves ``summary.json`` with outcome ``failed`` and the error; SIGTERM stops the run with
outcome ``stopped`` (see "Stopping" below).

Stopping. The SIGTERM handler only sets a flag, with one exception: until the first optimizer
step of this attempt has completed there is nothing a checkpoint could add (a fresh run has no
step; a resumed one has its checkpoint on disk), so the handler raises :class:`StopRequested`
at once, wherever the trainer is (importing, loading the model, tokenising, reference
log-probs, the first step). After that, the loops look at the flag at their stop checks
(:func:`raise_if_stopping`: between micro-batches, evaluation batches and generated tokens,
and at the end of every step): the run's :class:`~trainers.core.loop.TrainingRun` then writes a
checkpoint of the last completed step (a partial step is dropped; a stop during the evaluation
after a step checkpoints that step and the evaluation runs again on resume) and the harness
writes outcome ``stopped`` with a detail saying what was saved.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

from trainers.core.config import ConfigError, LoggingSection, dump_config, load_config, read_yaml
from trainers.core.distributed import (
    init_from_env,
    prefix_output,
    world,
    world_from_env,
)
from trainers.core.lora import check_lora_targets
from trainers.core.rundir import SIGTERM_ENV as SIGTERM_ENV
from trainers.core.rundir import RunDir, reset_sigterm_hook, sigterm_self_at
from trainers.core.runfolder import SummaryFile

C = TypeVar("C", bound=BaseModel)

EXIT_CONFIG_ERROR = 2
EXIT_FAILED = 1
EXIT_STOPPED = 143


class StopRequested(BaseException):
    """The run stops on SIGTERM. Raised at a stop check (``where`` names it; nothing saved yet:
    the harness asks the stop handler to checkpoint) or by ``checkpoint_or_stop`` after its
    checkpoint (``checkpointed``). A BaseException, like KeyboardInterrupt, so that no
    ``except Exception`` on the way up swallows it."""

    def __init__(self, detail: str = "", *, where: str | None = None, checkpointed: bool = False):
        super().__init__(detail)
        self.where = where
        self.checkpointed = checkpointed


_stop_flag: dict[str, Any] = {"set": False, "anywhere": False, "handler": None}


def stop_requested() -> bool:
    """Whether SIGTERM arrived: the loop should checkpoint and stop at its next stop check."""
    return _stop_flag["set"]


def raise_if_stopping(where: str) -> None:
    """A stop check (cheap: a flag): raise :class:`StopRequested` when SIGTERM arrived. Call it
    only where dropping the work in progress is safe: between micro-batches before the step's
    optimizer update, between evaluation batches, between generated tokens. ``where`` names the
    check for the stop's detail and for :data:`SIGTERM_ENV`."""
    sigterm_self_at(where)
    if _stop_flag["set"] and not _several_ranks():  # under torchrun: at the step's end only
        raise StopRequested(f"SIGTERM during {where}", where=where)


def _several_ranks() -> bool:
    """Under torchrun a rank must not leave a step alone (the others would wait for it in a
    collective): a stop is decided by every rank together at the end of the step
    (:meth:`~trainers.core.loop.TrainingRun.checkpoint_or_stop`)."""
    from trainers.core.distributed import world

    return world().distributed


def stop_anywhere(on: bool) -> None:
    """Whether SIGTERM raises at once wherever the trainer is (``on``: nothing to checkpoint
    yet) or only sets the flag for the stop checks. :class:`~trainers.core.loop.TrainingRun`
    turns it off when the first step of the attempt completes."""
    _stop_flag["anywhere"] = on


def set_stop_handler(handler: Callable[[StopRequested], str] | None) -> None:
    """``handler(stop) -> detail``: what the harness calls when a stop check raised (the
    training loop writes its checkpoint there and says what it saved)."""
    _stop_flag["handler"] = handler


def _on_sigterm(signum: int, frame: object) -> None:  # noqa: ARG001
    first = not _stop_flag["set"]
    _stop_flag["set"] = True
    if first and _stop_flag["anywhere"]:
        _stop_flag["anywhere"] = False  # once: a second SIGTERM must not interrupt the summary
        raise StopRequested("SIGTERM before the first step of this attempt completed", where="")


FAULT_ENV = "RLHF_LAB_FAULT_AT_STEP"


class InjectedFault(RuntimeError):
    """Raised at the end of optimizer step ``$RLHF_LAB_FAULT_AT_STEP`` (before its checkpoint):
    fault injection for the reliability tests and for trying the lab's failure handling."""


def checkpoint_or_stop(
    step: int,
    total_steps: int | None,
    save_every: int | None,
    save: Callable[[], Any],
    tracker: MetricsTracker | None,
    *,
    stopping: bool,
) -> None:
    """The end of every optimizer step: checkpoint every ``save_every`` steps, at the last step
    and when SIGTERM asked to stop (``stopping``, from the caller's ``stop_requested()``); when
    stopping, close W&B and raise StopRequested so the harness writes outcome ``stopped``."""
    fault_at = os.environ.get(FAULT_ENV)
    if fault_at and fault_at.strip() == str(step):
        raise InjectedFault(f"injected fault at step {step} ({FAULT_ENV}={fault_at})")
    if stopping or step == total_steps or (save_every and step % save_every == 0):
        save()
    if stopping:
        if tracker is not None:
            tracker.finish(exit_code=EXIT_STOPPED)
        raise StopRequested(f"SIGTERM at step {step}; checkpoint written", checkpointed=True)


def parse_args(argv: list[str] | None, description: str) -> argparse.Namespace:
    """The trainer command line (``--config``, ``--run-dir``, ``--set``, ``--resume``)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--config", required=True, help="YAML config file (see configs/)")
    p.add_argument(
        "--run-dir",
        required=True,
        help='run directory to write (docs/architecture.md, "The run folder")',
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="dotted override, e.g. --set train.learning_rate=1e-5 (repeatable)",
    )
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    return p.parse_args(argv)


class MetricsTracker(Protocol):
    """What a loop needs of a W&B run: :class:`Tracker`, or a stand-in a pipeline lends."""

    @property
    def url(self) -> str | None: ...

    def log(self, metrics: dict[str, Any], step: int) -> None: ...

    def finish(self, exit_code: int = 0) -> None: ...


class Tracker:
    """Weights & Biases, optional. Environment variables win over the config:
    WANDB_PROJECT, WANDB_ENTITY, WANDB_RUN_NAME, WANDB_MODE (online/offline/disabled).
    No project anywhere, or WANDB_MODE=disabled, means no W&B at all."""

    def __init__(
        self, cfg: LoggingSection, run_dir: Path, config: dict[str, Any], default_name: str
    ) -> None:
        self.run = None
        project = os.environ.get("WANDB_PROJECT") or cfg.wandb_project
        mode = os.environ.get("WANDB_MODE", "online")
        if project is None or mode == "disabled":
            return
        import wandb

        self.run = wandb.init(
            project=project,
            entity=os.environ.get("WANDB_ENTITY") or cfg.wandb_entity,
            name=os.environ.get("WANDB_RUN_NAME") or cfg.wandb_run_name or default_name,
            dir=str(run_dir),
            config=config,
            mode=mode,
        )

    @property
    def url(self) -> str | None:
        if self.run is None or self.run.settings.mode == "offline":
            return None
        return getattr(self.run, "url", None)

    @property
    def local_dir(self) -> str | None:
        return None if self.run is None else str(self.run.dir)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if self.run is not None:
            self.run.log(metrics, step=step)

    def finish(self, exit_code: int = 0) -> None:
        if self.run is not None:
            self.run.finish(exit_code=exit_code)


def write_first_progress(run: RunDir, resume: bool, planned_steps: int | None) -> None:
    """progress.json from the trainer's first second, before the model loads: phase
    ``loading_model`` with the planned total when the config alone tells it. A resumed run keeps
    the step its last progress showed until its loop reports again."""
    if resume:
        run.update_phase("loading_model", planned_steps)
    else:
        run.write_progress(0, planned_steps, phase="loading_model")


def _stop_detail(stop: StopRequested, run: RunDir) -> str:
    """The summary's detail for a stop: what was checkpointed. A stop raised at a stop check
    goes to the training loop's handler, which writes the checkpoint of the last completed step
    (when it is not on disk yet) and says so."""
    if stop.checkpointed or stop.where is None:  # the loop's own checkpoint, or a family's word
        return str(stop) or "SIGTERM: checkpoint written"
    where = stop.where or run.phase or "start-up"
    handler = _stop_flag["handler"]
    if handler is None:
        saved = sorted(
            int(p.name.removeprefix("step-"))
            for p in run.checkpoints_dir.glob("step-*")
            if p.name.removeprefix("step-").isdigit() and (p / "state.pt").is_file()
        )
        if saved:  # a resumed run stopped before its loop began
            return f"SIGTERM during {where}: the checkpoint of step {saved[-1]} is kept"
        return f"SIGTERM during {where}: nothing to checkpoint (no training step had run yet)"
    try:
        return handler(stop)
    except Exception as err:  # the stop still ends the run; the detail says what went wrong
        traceback.print_exc()
        return (
            f"SIGTERM during {where}: writing the checkpoint failed ({type(err).__name__}: "
            f"{err}); resume continues from the last checkpoint on disk, if any"
        )


def refuse_one_process_runs(config_model: type, cfg: Any, processes: int) -> None:
    """Under torchrun: one clear ConfigError, before anything is written, for a run that its
    family's spec keeps on one process (``trainers.core.spec.one_process_only``, which the lab
    asks too). The family is the one whose ``config`` module defines ``config_model``; a trainer
    outside the families (the evaluation job) is not refused."""
    from trainers.core.spec import FAMILY_NAMES, family_spec, one_process_only

    parts = config_model.__module__.split(".")
    family = parts[1] if len(parts) > 2 and parts[1] in FAMILY_NAMES else None
    if family is None:
        return
    field_name = family_spec(family).algorithm_field
    lora = getattr(getattr(cfg, "model", None), "lora", None)
    why = one_process_only(
        family,
        getattr(cfg, field_name, None) if field_name else None,
        bool(lora is not None and lora.enabled),
    )
    if why is None:
        return
    if why.kind == "lora":
        raise ConfigError(
            "LoRA runs on one process for this trainer in this version, not under torchrun "
            f"({why.subject} shard LoRA runs): start it with python -m, or train in full "
            "(model.lora.enabled=false) to shard it"
        )
    what = "this trainer" if why.kind == "family" else why.subject
    raise ConfigError(
        f"{what} runs on one process in this version, not under torchrun ({processes} "
        "processes; its sampling step is not split across ranks yet): start it with python -m"
    )


def run_trainer(
    argv: list[str] | None,
    *,
    description: str,
    config_model: type[C],
    preflight: Callable[[C], None],
    train: Callable[[C, RunDir, bool], SummaryFile | dict[str, Any]],
    planned_steps: Callable[[C], int | None] | None = None,
    run_folder: Callable[..., RunDir] = RunDir,
) -> int:
    """Validate, create the run directory, call ``train(cfg, run, resume)``, record the outcome.

    ``train`` returns the summary of a successful run (a ``SummaryFile``, or its fields) and
    writes progress/metrics itself. ``planned_steps(cfg)``: the total steps when the config
    alone tells them (for the first progress.json). Under torchrun, a run its family's spec
    keeps on one process is refused first (:func:`refuse_one_process_runs`). ``run_folder``:
    what writes the run folder (:class:`RunDir`, or a subclass that also records). Returns the
    exit code.
    """
    args = parse_args(argv, description)
    run_dir = Path(args.run_dir)
    ranks = world_from_env()  # under torchrun: this process's rank (one process: rank 0 of 1)
    if ranks.distributed:
        prefix_output(ranks.rank)
    try:
        if args.resume and (run_dir / "config.yaml").is_file() and not Path(args.config).exists():
            args.config = str(run_dir / "config.yaml")
        cfg = load_config(args.config, config_model, args.overrides)
        if args.resume and (run_dir / "config.yaml").is_file():
            recorded = read_yaml(run_dir / "config.yaml")
            if recorded != cfg.model_dump(mode="json"):
                raise ConfigError(
                    f"--resume: the config differs from {run_dir / 'config.yaml'}; resume with "
                    "that file (--config <run-dir>/config.yaml) or start a new run directory"
                )
        if not args.resume and (run_dir / "metrics.jsonl").exists():
            raise ConfigError(
                f"{run_dir} already holds a run; pass --resume to continue it or choose a new "
                "--run-dir (nothing was changed)"
            )
        if ranks.distributed:
            refuse_one_process_runs(config_model, cfg, ranks.size)
        preflight(cfg)
        check_lora_targets(getattr(cfg, "model", None))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_CONFIG_ERROR

    _stop_flag.update(set=False, anywhere=True, handler=None)
    reset_sigterm_hook()
    previous_handler = signal.signal(signal.SIGTERM, _on_sigterm)
    run = run_folder(run_dir, writer=ranks.is_main)  # rank 0 alone writes the run folder
    try:
        init_from_env(getattr(getattr(cfg, "model", None), "device", "auto"))
        run.write_config(dump_config(cfg))
        write_first_progress(run, args.resume, planned_steps(cfg) if planned_steps else None)
        summary = train(cfg, run, args.resume)
        stop_anywhere(False)  # it is done: a late SIGTERM only sets the flag
        if isinstance(summary, SummaryFile):
            run.write_summary_file(summary)
        else:
            run.write_summary("succeeded", **summary)
    except StopRequested as stop:
        stop_anywhere(False)
        if another_rank_failed(run):  # torchrun stopped this rank because another one failed
            return EXIT_FAILED
        detail = _stop_detail(stop, run)
        run.write_summary("stopped", detail=detail)
        print(f"stopped on SIGTERM: {detail}", file=sys.stderr, flush=True)
        return EXIT_STOPPED
    except (Exception, KeyboardInterrupt) as err:
        stop_anywhere(False)
        traceback.print_exc()
        if another_rank_failed(run):  # a collective broke because another rank crashed first
            return EXIT_FAILED
        who = f"rank {ranks.rank}: " if ranks.distributed else ""
        run.write_summary(
            "failed",
            error=f"{who}{type(err).__name__}: {err}",
            traceback=traceback.format_exc(limit=20),
        )
        return EXIT_FAILED
    finally:  # in-process callers (tests, a pipeline) get their own handler back
        stop_anywhere(False)
        set_stop_handler(None)
        signal.signal(signal.SIGTERM, previous_handler)
    return 0


def another_rank_failed(run: RunDir) -> bool:
    """Under torchrun: whether another rank already ended this attempt as ``failed`` (its
    summary, written after this process started, names it); that error is the run's."""
    from trainers.core.runfolder import read_file

    if not world().distributed:
        return False
    path = run.path / "summary.json"
    summary, _ = read_file(path, SummaryFile)
    return (
        summary is not None
        and summary.outcome == "failed"
        and (summary.error or "").startswith("rank ")
        and path.stat().st_mtime >= run.start_time
    )


@dataclass(frozen=True)
class TrainerMain:
    """A family's ``main(argv) -> exit code``: :func:`run_trainer` with the family's pieces
    (the command's description is the first line of ``doc``, the module docstring).

    :meth:`with_options` gives the same command with keyword arguments for ``train`` that no
    config holds: the functions a run is built from, such as the verifier that scores the
    policy-gradient samples (``pg_train.main.with_options(verifier=my_rewards)``)."""

    doc: str
    config_model: type[BaseModel]
    preflight: Callable[[Any], None]
    train: Callable[..., SummaryFile | dict[str, Any]]
    planned_steps: Callable[[Any], int | None] | None = None

    def __call__(self, argv: list[str] | None = None) -> int:
        return run_trainer(
            argv,
            description=self.doc.splitlines()[0],
            config_model=self.config_model,
            preflight=self.preflight,
            train=self.train,
            planned_steps=self.planned_steps,
        )

    def with_options(self, **options: Any) -> TrainerMain:
        """This command, its ``train`` called with ``options`` as keyword arguments."""
        return replace(self, train=functools.partial(self.train, **options))


def trainer_main(
    doc: str,
    config_model: type[C],
    preflight: Callable[[C], None],
    train: Callable[[C, RunDir, bool], SummaryFile | dict[str, Any]],
    planned_steps: Callable[[C], int | None] | None = None,
) -> TrainerMain:
    """A family's ``main`` (:class:`TrainerMain`) from its pieces."""
    return TrainerMain(doc, config_model, preflight, train, planned_steps)
