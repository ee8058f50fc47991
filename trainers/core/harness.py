"""What every trainer's ``main()`` shares: the command line, config validation before anything is
written, the run directory, W&B, SIGTERM handling and the failure summary.

    python -m trainers.<family>.train --config FILE --run-dir DIR [--set k=v ...] [--resume]

Order of events: parse and validate the config and run the family's preflight checks (a bad key,
an unknown loss or a missing dataset file stops here, with one message and nothing written);
then create the run directory and write ``config.yaml``; then train. Any exception after that
point leaves ``summary.json`` with outcome ``failed`` and the error; SIGTERM asks the loop to
checkpoint and stop with outcome ``stopped``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

from trainers.core.config import ConfigError, LoggingSection, dump_config, load_config, read_yaml
from trainers.core.rundir import RunDir
from trainers.core.runfolder import SummaryFile

C = TypeVar("C", bound=BaseModel)

EXIT_CONFIG_ERROR = 2
EXIT_FAILED = 1
EXIT_STOPPED = 143


class StopRequested(Exception):
    """Raised by a training loop after it has checkpointed in response to SIGTERM."""


_stop_flag = {"set": False}


def stop_requested() -> bool:
    """Whether SIGTERM arrived: the loop should checkpoint and stop at the end of this step."""
    return _stop_flag["set"]


def _on_sigterm(signum: int, frame: object) -> None:  # noqa: ARG001
    _stop_flag["set"] = True


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
        raise StopRequested(f"SIGTERM at step {step}; checkpoint written")


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


def run_trainer(
    argv: list[str] | None,
    *,
    description: str,
    config_model: type[C],
    preflight: Callable[[C], None],
    train: Callable[[C, RunDir, bool], SummaryFile | dict[str, Any]],
    planned_steps: Callable[[C], int | None] | None = None,
) -> int:
    """Validate, create the run directory, call ``train(cfg, run, resume)``, record the outcome.

    ``train`` returns the summary of a successful run (a ``SummaryFile``, or its fields) and
    writes progress/metrics itself. ``planned_steps(cfg)``: the total steps when the config
    alone tells them (for the first progress.json). Returns the process exit code.
    """
    args = parse_args(argv, description)
    run_dir = Path(args.run_dir)
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
        preflight(cfg)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_CONFIG_ERROR

    run = RunDir(run_dir)
    run.write_config(dump_config(cfg))
    write_first_progress(run, args.resume, planned_steps(cfg) if planned_steps else None)
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        summary = train(cfg, run, args.resume)
    except StopRequested as stop:
        run.write_summary("stopped", detail=str(stop) or "SIGTERM: checkpoint written")
        print("stopped on SIGTERM after writing a checkpoint", file=sys.stderr)
        return EXIT_STOPPED
    except (Exception, KeyboardInterrupt) as err:
        run.write_summary(
            "failed",
            error=f"{type(err).__name__}: {err}",
            traceback=traceback.format_exc(limit=20),
        )
        traceback.print_exc()
        return EXIT_FAILED
    if isinstance(summary, SummaryFile):
        run.write_summary_file(summary)
    else:
        run.write_summary("succeeded", **summary)
    return 0


def trainer_main(
    doc: str,
    config_model: type[C],
    preflight: Callable[[C], None],
    train: Callable[[C, RunDir, bool], SummaryFile | dict[str, Any]],
    planned_steps: Callable[[C], int | None] | None = None,
) -> Callable[[list[str] | None], int]:
    """A family's ``main(argv) -> exit code``: :func:`run_trainer` with the family's pieces
    (the command's description is the first line of ``doc``, the module docstring)."""

    def main(argv: list[str] | None = None) -> int:
        return run_trainer(
            argv,
            description=doc.splitlines()[0],
            config_model=config_model,
            preflight=preflight,
            train=train,
            planned_steps=planned_steps,
        )

    return main
