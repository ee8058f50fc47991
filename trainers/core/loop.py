"""What every training loop does around its algorithm: helpers, not a framework.

A family's ``train()`` keeps its algorithm's lines (forward, loss, backward) and calls these for
the bookkeeping each loop shares::

    loop = TrainingRun.over_epochs(run, cfg, n_examples)  # checkpoints, steps of the epochs
    ...                                                       # load the model
    optimizer, scheduler, state = loop.optimizer_and_resume(  # what a checkpoint holds;
        model, model.parameters(), cfg.train, resume          # restored when resuming
    )
    loop.start_tracker(cfg.logging, config, name)             # W&B, optional
    if loop.redo_events:                                      # stopped during them: again
        after_step()
    position = state["data_position"] if state else None
    for pos in loop.epoch_steps(n_examples, cfg.train, cfg.seed, position):
        for micro_batch in ...:
            raise_if_stopping("micro_batch")                  # a stop check
            ...                                               # forward, loss, backward
        ...                                                   # the optimizer step
        loop.step_done(train_row, step_tokens, cfg.logging.log_every)  # log, print the line
        loop.end_step(after_step, epoch=pos.epoch)  # evaluation when due; checkpoint or stop
    loop.save_final_model(model, tokenizer)
    loop.finish()
    return loop.summary(algorithm, best, device, **family_fields)

Stopping (see :mod:`trainers.core.harness`): a stop check that finds SIGTERM raises
``StopRequested``; the harness then calls this run's stop handler, which checkpoints the last
completed step. Between ``step_done`` (the update applied) and ``checkpoint_or_stop`` that is
the step just done: its checkpoint holds the random state from before the evaluation
(``progress("evaluating")`` marks it) and how many rows the step had logged by then, so that on
resume the rows the evaluation wrote are dropped and ``loop.redo_events`` tells the family to
run it again. Anywhere else it is the step before: the partial step is dropped (its gradients are
never applied) and the random state of the end of that step is restored before saving, so the
resumed run takes the same steps as an uninterrupted one.

At the end of a step :meth:`TrainingRun.checkpoint_or_stop` reads SIGTERM's flag itself
(:func:`~trainers.core.harness.stop_requested`); it is also the stop point ``step_end`` of
``RLHF_LAB_SIGTERM_AT`` (:func:`~trainers.core.rundir.sigterm_self_at`), which the tests use to
stop a run after a given step with a real SIGTERM.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainers.core.config import (
    CheckpointSection,
    ConfigError,
    LoggingSection,
    OptimSection,
)
from trainers.core.harness import (
    EXIT_STOPPED,
    MetricsTracker,
    StopRequested,
    Tracker,
    set_stop_handler,
    stop_anywhere,
    stop_requested,
)
from trainers.core.harness import checkpoint_or_stop as _checkpoint_or_stop
from trainers.core.rundir import RunDir, sigterm_self_at
from trainers.core.runfolder import Phase, SummaryFile

# ---------------------------------------------------------------------------------------------
# Start
# ---------------------------------------------------------------------------------------------


def data_info(stats: dict[str, Any], n_train: int, n_eval: int, **more: Any) -> dict[str, Any]:
    """What the summary records about the data (the loader's figures and the two split sizes)
    and ``more`` family fields (e.g. the teacher); printed once as the run starts."""
    info: dict[str, Any] = {"data": {**stats, "n_train": n_train, "n_eval": n_eval}, **more}
    print("; ".join(f"{key}: {value}" for key, value in info.items()), flush=True)
    return info


# ---------------------------------------------------------------------------------------------
# Step arithmetic (pure)
# ---------------------------------------------------------------------------------------------


def every(step: int, n: int | None, total_steps: int | None, *, at_end: bool = True) -> bool:
    """Whether something done "every ``n`` steps" happens after optimizer step ``step``.

    ``n`` of 0 or None means never on a schedule; ``at_end`` adds the last step (the default:
    a run always ends with an evaluation, a sample, a log row)."""
    if at_end and total_steps is not None and step == total_steps:
        return True
    return bool(n) and n > 0 and step % n == 0


def count_steps(
    n_examples: int, per_step: int, num_epochs: int, max_steps: int | None, world_size: int = 1
) -> tuple[int, int]:
    """(optimizer steps per epoch, total optimizer steps) of an epoch-based loop: the last
    partial batch of an epoch is a step of its own (under ``world_size`` processes, when it
    holds at least one example per process); ``max_steps`` caps the total."""
    steps_per_epoch = n_examples // per_step + (n_examples % per_step >= world_size)
    total = steps_per_epoch * num_epochs
    if max_steps:
        total = min(total, max_steps)
    return steps_per_epoch, total


def examples_per_step(train: OptimSection, world_size: int | None = None) -> int:
    """Examples in one optimizer step (the global batch): micro-batch size x gradient
    accumulation steps x the number of processes (``batch_size`` is per rank)."""
    from trainers.core.distributed import world

    size = world().size if world_size is None else world_size
    return train.batch_size * train.gradient_accumulation_steps * size


def epoch_total_steps(n_examples: int, train: OptimSection) -> int:
    """Total optimizer steps of an epoch-based run over ``n_examples`` (see
    :func:`count_steps`)."""
    from trainers.core.distributed import world

    per_step = examples_per_step(train)
    return count_steps(n_examples, per_step, train.num_epochs, train.max_steps, world().size)[1]


@dataclass(frozen=True)
class EpochStep:
    """One optimizer step of an epoch-based loop: where it is and which examples it takes."""

    epoch: int
    batch: int
    ids: list[int]  # the step's examples, on every rank (the global batch)
    steps_per_epoch: int

    @property
    def local_ids(self) -> list[int]:
        """This rank's share of :attr:`ids` (all of them on one process); loops run their
        micro-batches over it and normalise by counts over :attr:`ids`."""
        from trainers.core.distributed import rank_share

        return rank_share(self.ids)

    @property
    def epoch_progress(self) -> float:
        """Epochs completed once this step is done (the ``epoch`` metric)."""
        return self.epoch + (self.batch + 1) / self.steps_per_epoch

    @property
    def next_position(self) -> dict[str, int]:
        """The data position a checkpoint written after this step resumes from."""
        if self.batch + 1 < self.steps_per_epoch:
            return {"epoch": self.epoch, "batch": self.batch + 1}
        return {"epoch": self.epoch + 1, "batch": 0}


def round_robin(n_items: int, n: int, event: int) -> list[int]:
    """Indices of the ``n`` items that periodic sampling event ``event`` shows: k·n .. k·n+n-1,
    wrapping around ``n_items``, so successive events walk through the held-out set."""
    return [(event * n + j) % n_items for j in range(n)]


# ---------------------------------------------------------------------------------------------
# The run's bookkeeping
# ---------------------------------------------------------------------------------------------


@dataclass
class SafePoint:
    """The end of a completed step: what a stop before the next update checkpoints."""

    step: int
    save: Callable[[], Any] | None = None  # writes this step's checkpoint (None: nothing to)
    rng: dict[str, Any] | None = None  # the random state at this point
    saved: bool = False  # its checkpoint is on disk


def eval_line(step: int, total: int | None, metrics: dict[str, Any], limit: int = 6) -> str:
    """An evaluation's line in train.log: ``eval step 8/32: accuracy 0.620 loss 0.512``
    (``eval/`` left off the names; timings and non-numbers left out; at most ``limit``)."""
    shown = []
    for key, value in metrics.items():
        if key.startswith(("timing/", "eval/timing/")) or isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            shown.append(f"{key.removeprefix('eval/')} {value:.4g}")
    of = f"/{total}" if total is not None else ""
    return f"eval step {step}{of}: " + (" ".join(shown[:limit]) or "(no numeric metric)")


class TrainingRun:
    """The step cursor and everything a loop writes about itself: progress.json (with a phase),
    metrics.jsonl rows mirrored to W&B, checkpoints, the final model and the summary.

    ``tracker`` given means the W&B run belongs to a caller (a pipeline running this loop as one
    of its stages): this loop then neither finishes it nor marks the run ``done``."""

    def __init__(
        self,
        run: RunDir,
        checkpoint: CheckpointSection,
        total_steps: int | None = None,
        *,
        tracker: MetricsTracker | None = None,
    ) -> None:
        self.run = run
        self.checkpointing = checkpoint
        self.total_steps = total_steps
        self.tracker: MetricsTracker | None = tracker
        self.borrowed_tracker = tracker is not None
        self.step = 0
        self.tokens_seen = 0
        self.last_train: dict[str, Any] = {}
        self.last_eval: dict[str, Any] = {}
        # stopping (module doc): the last completed step, the step whose update is applied but
        # not yet checkpointed, where an epoch loop stands, and what a checkpoint holds
        self.safe = SafePoint(0)
        self.after_update: dict[str, Any] | None = None
        self.redo_events = False
        self._position: dict[str, int] | None = None
        self._stepping: EpochStep | None = None
        self._checkpointer: tuple | None = None
        set_stop_handler(self.on_stop)

    @classmethod
    def over_epochs(
        cls, run: RunDir, cfg: Any, n_examples: int, *, tracker: MetricsTracker | None = None
    ) -> TrainingRun:
        """The run of an epoch-based loop over ``n_examples``: ``cfg.checkpoint`` and the total
        steps of ``cfg.train``'s epochs (:func:`epoch_total_steps`)."""
        total_steps = epoch_total_steps(n_examples, cfg.train)
        return cls(run, cfg.checkpoint, total_steps, tracker=tracker)

    # W&B ---------------------------------------------------------------------------------------
    def start_tracker(self, logging: LoggingSection, config: dict[str, Any], name: str) -> None:
        """Open the W&B run (unless a caller lent one) named ``name``; under torchrun rank 0
        alone logs to W&B."""
        from trainers.core.distributed import world

        if self.tracker is None and world().is_main:
            self.tracker = Tracker(logging, self.run.path, config, name)

    @property
    def wandb_url(self) -> str | None:
        return None if self.tracker is None else self.tracker.url

    # resume ------------------------------------------------------------------------------------
    def resume(self, model: Any, optimizer: Any, scheduler: Any) -> dict[str, Any]:
        """Restore the last checkpoint (model, optimizer, scheduler, RNG), move the step cursor
        to it and drop the metric/sample rows logged after it. Returns the checkpoint's state
        (``data_position``, ``extra``)."""
        from trainers.core.training import list_checkpoints, load_checkpoint

        checkpoints = list_checkpoints(self.run.checkpoints_dir)
        if not checkpoints:
            raise ConfigError(f"--resume: no checkpoint in {self.run.checkpoints_dir}")
        from trainers.core.lora import checkpointable  # LoRA: the adapters only

        state = load_checkpoint(checkpoints[-1], checkpointable(model), optimizer, scheduler)
        self.step = state["step"]
        extra = state.get("extra", {})
        self.tokens_seen = extra.get("tokens_seen", 0)
        redo = extra.get("redo_events")
        self.run.truncate_metrics_after(self.step, tuple(redo) if redo else None)
        self.redo_events = redo is not None
        self.safe = SafePoint(self.step, saved=True)
        again = "; the evaluation it was stopped in runs again" if self.redo_events else ""
        print(f"resumed from {checkpoints[-1].name}{again}", flush=True)
        return state

    # the cursor --------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.total_steps is not None and self.step >= self.total_steps

    def advance(self, step_tokens: int = 0) -> None:
        """One optimizer step (or rollout step) done, having seen ``step_tokens`` tokens. From
        here until :meth:`checkpoint_or_stop` a stop checkpoints this step (module doc)."""
        from trainers.core.training import rng_state

        self.step += 1
        self.tokens_seen += step_tokens
        if self._stepping is not None:
            self._position = self._stepping.next_position
            self._stepping = None
        self.after_update = {"rng": rng_state(), "rows": None}
        stop_anywhere(False)  # from now on there is work a checkpoint must keep

    def step_done(
        self,
        train_row: dict[str, Any],
        step_tokens: int,
        log_every: int,
        accuracy_key: str | None = None,
        *,
        show: bool = True,
    ) -> None:
        """:meth:`advance`, keep ``train_row`` as the last train metrics, log it when due
        (every ``log_every`` steps and at the last one) and print the step's line
        (:meth:`print_step`; ``show=False``: the caller prints its own). ``step_tokens``: this
        rank's; the tokens seen count every rank's."""
        from trainers.core.distributed import sum_over_ranks

        self.advance(int(sum_over_ranks(step_tokens)))
        self.last_train = train_row
        if self.should_log(log_every):
            self.log("train", train_row)
        if show:
            self.print_step(train_row, accuracy_key)

    def end_step(self, after_step: Callable[[], None], **progress: Any) -> None:
        """The rest of a step whose update is done (:meth:`step_done`): its evaluation and
        samples when due (``after_step()``), progress.json back to ``training`` (with the
        family's ``progress`` extras), then :meth:`checkpoint_or_stop`."""
        after_step()
        self.progress("training", **progress)
        self.checkpoint_or_stop()

    def epoch_steps(
        self,
        n_examples: int,
        train: OptimSection,
        seed: int,
        position: dict[str, int] | None = None,
    ) -> Iterator[EpochStep]:
        """The optimizer steps of an epoch-based loop from ``position`` (a checkpoint's
        ``data_position``, or the start) until ``total_steps``: each of ``train.num_epochs``
        epochs in its seeded order (:func:`trainers.core.training.epoch_order`),
        :func:`examples_per_step` examples a step. The caller calls :meth:`advance` (or
        :meth:`step_done`) once per step."""
        from trainers.core.distributed import even_length, world
        from trainers.core.training import epoch_order

        per_step, num_epochs = examples_per_step(train), train.num_epochs
        steps_per_epoch = count_steps(n_examples, per_step, 1, None, world().size)[0]
        start_epoch = position["epoch"] if position else 0
        start_batch = position["batch"] if position else 0
        self._position = {"epoch": start_epoch, "batch": start_batch}
        if not self.done:
            self.progress("training", epoch=start_epoch)
        for epoch in range(start_epoch, num_epochs):
            if self.done:
                return
            order = epoch_order(n_examples, seed, epoch)
            first = start_batch if epoch == start_epoch else 0
            for b in range(first, steps_per_epoch):
                if self.done:
                    return
                ids = order[b * per_step : (b + 1) * per_step]
                ids = ids[: even_length(len(ids))]  # every rank gets as many (module doc)
                self._stepping = EpochStep(epoch, b, ids, steps_per_epoch)
                yield self._stepping

    def event(self, every_n: int) -> int:
        """Which periodic event (every ``every_n`` steps) the current step is: samples differ
        from one event to the next (:func:`round_robin`)."""
        return self.step // max(every_n, 1)

    def every(self, n: int | None, *, at_end: bool = True) -> bool:
        """:func:`every` at the current step."""
        return every(self.step, n, self.total_steps, at_end=at_end)

    def should_log(self, log_every: int) -> bool:
        """Train rows are logged every ``log_every`` steps and at the last step."""
        return self.every(log_every)

    # writing -----------------------------------------------------------------------------------
    def progress(self, phase: Phase, **extra: Any) -> None:
        """Replace progress.json: the current step, the total, the phase, the tokens seen and
        family extras (``epoch``, ``data`` ...). ``evaluating`` / ``generating`` after a step's
        update mark where that step's evaluation begins (module doc)."""
        if phase in ("evaluating", "generating"):
            self._events_begin()
        self.run.write_progress(
            self.step, self.total_steps, phase=phase, tokens_seen=self.tokens_seen, **extra
        )

    def _events_begin(self) -> None:
        """The step's evaluation starts: keep the random state and the rows logged so far."""
        if self.after_update is not None and self.after_update["rows"] is None:
            from trainers.core.training import rng_state

            self.after_update = {"rng": rng_state(), "rows": self.run.rows_at(self.step)}

    def log(self, phase: str, metrics: dict[str, Any], step: int | None = None) -> None:
        """One metrics.jsonl row (phase train / eval / rollout), mirrored to W&B; an eval row
        also prints its line in train.log (:func:`eval_line`)."""
        at = self.step if step is None else step
        self.run.log_metrics(at, phase, metrics)
        if self.tracker is not None:
            self.tracker.log(metrics, at)
        if phase == "eval":
            print(eval_line(at, self.total_steps, metrics), flush=True)

    def log_samples(self, samples: list[dict[str, Any]]) -> None:
        self.run.log_samples(self.step, samples)

    def log_start(self, metrics: dict[str, Any]) -> None:
        """The starting point's evaluation (step 0, for contrast): metrics.jsonl and train.log."""
        self.run.log_metrics(0, "eval", metrics)
        print(eval_line(0, self.total_steps, metrics), flush=True)

    # checkpoints -------------------------------------------------------------------------------
    def save_checkpoint(
        self,
        model: Any,
        optimizer: Any,
        scheduler: Any,
        data_position: dict[str, Any],
        extra: dict[str, Any] | None = None,
        *,
        step: int | None = None,
    ) -> Path:
        """``checkpoints/step-<N>`` at the current step (or ``step``: a stop saving the last
        completed one), keeping ``keep_last`` of them."""
        from trainers.core.training import save_checkpoint

        return save_checkpoint(
            self.run.checkpoints_dir,
            self.step if step is None else step,
            model,
            optimizer,
            scheduler,
            data_position,
            extra=extra,
            keep_last=self.checkpointing.keep_last,
        )

    def checkpoint_with(
        self,
        model: Any,
        optimizer: Any,
        scheduler: Any,
        *,
        position: Callable[[], dict[str, Any]] | None = None,
        extra: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        """What this run's checkpoints hold: the model, optimizer and scheduler, the data
        position (``position()``; an epoch loop's own by default) and family state
        (``extra()``; the tokens seen are always added). Both are read when a step completes."""
        from trainers.core.lora import checkpointable  # LoRA: the adapters only

        self._checkpointer = (checkpointable(model), optimizer, scheduler, position, extra)

    def optimizer_and_resume(
        self, model: Any, params: Any, train: OptimSection, resume: bool
    ) -> tuple[Any, Any, dict[str, Any] | None]:
        """AdamW and its schedule over ``params`` for this run's steps
        (:func:`~trainers.core.training.build_optimizer`), registered with ``model`` as what a
        checkpoint holds (:meth:`checkpoint_with`); with ``resume``, the last checkpoint restored
        into the three (:meth:`resume`). Returns (optimizer, scheduler, the resumed state or
        None)."""
        from trainers.core.training import build_optimizer

        optimizer, scheduler = build_optimizer(params, train, self.total_steps)
        self.checkpoint_with(model, optimizer, scheduler)
        state = self.resume(model, optimizer, scheduler) if resume else None
        return optimizer, scheduler, state

    def _snapshot(self) -> Callable[..., Path]:
        """A save of the checkpoint as things stand now (data position and family state read
        now), to call now or later: ``save(**more_extra)``."""
        if self._checkpointer is None:
            raise RuntimeError("TrainingRun.checkpoint_with was not called")
        model, optimizer, scheduler, position, extra = self._checkpointer
        where = position() if position is not None else dict(self._position or {})
        state = {"tokens_seen": self.tokens_seen, **(extra() if extra is not None else {})}
        step = self.step

        def save(**more: Any) -> Path:
            return self.save_checkpoint(
                model, optimizer, scheduler, where, {**state, **more}, step=step
            )

        return save

    def print_step(self, row: dict[str, Any], accuracy_key: str | None = None) -> None:
        """The step's line in train.log: ``step s/T loss x [acc y] (t s)``."""
        acc = ""
        if accuracy_key is not None:
            acc = f"acc {row.get(accuracy_key, float('nan')):.3f} "
        print(
            f"step {self.step}/{self.total_steps} loss {row.get('loss', float('nan')):.4f} "
            f"{acc}({row['timing/step_s']:.2f}s)",
            flush=True,
        )

    def checkpoint_or_stop(
        self, save: Callable[[], Any] | None = None, *, stopping: bool | None = None
    ) -> None:
        """The end of every step (the stop point ``step_end``): save (``save()``, or what
        :meth:`checkpoint_with` named) every ``save_every`` steps, at the last step and when
        stopping; then raise StopRequested when stopping (see the harness). Otherwise the step
        is the new safe point a later stop falls back to. ``stopping``: whether SIGTERM asked
        to stop (:func:`~trainers.core.harness.stop_requested`) unless the caller decides."""
        from trainers.core.distributed import any_rank
        from trainers.core.training import rng_state

        if stopping is None:
            sigterm_self_at("step_end")
            stopping = stop_requested()
        stopping = any_rank(stopping)  # every rank stops at the same step (harness)
        snapshot = save if save is not None else self._snapshot()
        saved: list[bool] = []

        def saving() -> Any:
            saved.append(True)
            return snapshot()

        _checkpoint_or_stop(
            self.step,
            self.total_steps,
            self.checkpointing.save_every,
            saving,
            self.tracker,
            stopping=stopping,
        )
        self.safe = SafePoint(self.step, snapshot, rng_state(), saved=bool(saved))
        self.after_update = None

    def on_stop(self, stop: StopRequested) -> str:
        """The harness's stop handler (module doc): checkpoint the last completed step when it
        is not on disk yet; close W&B; return the summary's detail."""
        from trainers.core.training import set_rng_state

        where = stop.where or self.run.phase or "start-up"
        last = self.safe
        if self.after_update is not None and self._checkpointer is None:
            detail = (  # a loop without checkpoint_with: its own save names the step before
                f"SIGTERM during {where} after step {self.step}: not checkpointed"
                + (f" (the last checkpoint is step {last.step})" if last.saved else "")
            )
        elif self.after_update is not None:
            rows = self.after_update["rows"]
            if rows is None:
                rows = self.run.rows_at(self.step)
            set_rng_state(self.after_update["rng"])
            self._snapshot()(redo_events=list(rows))
            detail = (
                f"SIGTERM during {where} after step {self.step}: checkpoint of step "
                f"{self.step} written; the evaluation it interrupted runs again on resume"
            )
        elif last.saved:
            detail = (
                f"SIGTERM during {where}: the checkpoint of step {last.step} was already on "
                "disk; nothing after it was lost but the step in progress"
            )
        elif last.save is None:
            detail = f"SIGTERM during {where}: nothing to checkpoint (no step had completed)"
        else:
            if last.rng is not None:
                set_rng_state(last.rng)
            last.save()
            detail = (
                f"SIGTERM during {where} in step {last.step + 1}: the partial step was "
                f"dropped; checkpoint of step {last.step} written"
            )
        if self.tracker is not None and not self.borrowed_tracker:
            self.tracker.finish(exit_code=EXIT_STOPPED)
        return detail

    def save_final_model(
        self, model: Any, tokenizer: Any, save: Callable[[Any, Any, Path], None] | None = None
    ) -> str | None:
        """Write ``final_model/`` when the config asks for it (``save(model, tokenizer, path)``
        for models that are not plain transformers); returns its path, or None. A model with
        LoRA adapters also writes ``final_adapter/`` and merges them into ``final_model/``
        (:func:`trainers.core.lora.save_final`; on one process the model is merged
        afterwards; under torchrun rank 0 writes both from the consolidated state and the model
        is left as it is). Under torchrun the shards are consolidated into one ordinary folder that rank 0
        writes (``save`` then gets the whole state dict as ``state_dict=``)."""
        from trainers.core.lora import has_adapters, save_final, save_final_from_state

        if not self.checkpointing.save_final_model:
            return None
        from trainers.core.distributed import barrier, full_state_dict, world

        self.progress("saving")
        path = self.run.path / "final_model"
        whole = {"state_dict": full_state_dict(model)} if world().distributed else {}
        if has_adapters(model) and world().distributed:  # LoRA under torchrun: rank 0
            if world().is_main:
                save_final_from_state(model, tokenizer, path, whole["state_dict"], save)
        elif has_adapters(model):
            save_final(model, tokenizer, path, save)
        elif world().is_main and save is not None:
            save(model, tokenizer, path, **whole)
        elif world().is_main:
            from trainers.core.tiny import quiet_hf

            with quiet_hf():
                model.save_pretrained(path, **whole)
                tokenizer.save_pretrained(path)
        barrier()
        return str(path)

    def finish(self, **extra: Any) -> None:
        """Close W&B and mark the run ``done`` with the tokens seen and family fields (not when a
        caller lent the tracker: the caller's run goes on)."""
        if self.borrowed_tracker:
            return
        if self.tracker is not None:
            self.tracker.finish()
        self.progress("done", **extra)

    # the summary -------------------------------------------------------------------------------
    def summary(
        self,
        algorithm: str,
        best: BestMetric | dict[str, Any],
        device: Any,
        *,
        final_metrics: dict[str, Any] | None = None,
        final_eval: dict[str, Any] | None = None,
        **extra: Any,
    ) -> SummaryFile:
        """The typed summary of a run that succeeded: steps, last train and eval rows, the best
        key metric, peak memory on ``device``, tokens seen, W&B; family fields ride along."""
        from trainers.core.distributed import describe
        from trainers.core.training import peak_memory_gb

        extra.setdefault("wandb_url", self.wandb_url)
        if describe():
            extra.setdefault("distributed", describe())
        return SummaryFile(
            outcome="succeeded",
            algorithm=algorithm,
            steps=self.step,
            total_steps=self.total_steps,
            final_metrics=self.last_train if final_metrics is None else final_metrics,
            final_eval=self.last_eval if final_eval is None else final_eval,
            best_metrics=best.as_dict() if isinstance(best, BestMetric) else best,
            peak_memory_gb=peak_memory_gb(device),
            tokens_seen=self.tokens_seen,
            **extra,
        )


class StepTimer:
    """Wall time of one step: ``dt`` seconds since it was created; with the run's ``account``
    (:func:`trainers.core.flops.step_account`) :func:`step_metrics` adds the step's MFU."""

    def __init__(self, account: Any = None) -> None:
        self.start = time.time()
        self.account = account

    @property
    def dt(self) -> float:
        return time.time() - self.start


def step_metrics(
    aggregated: dict[str, float],
    grad_norm: float,
    learning_rate: float,
    step_tokens: int,
    timer: StepTimer,
    device: Any,
    *,
    epoch: float | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The train row of a step, in the order every family logs it: the step's aggregated
    metrics, grad_norm, learning_rate, epoch, family extras, then throughput (tokens per second
    since ``timer`` started), the step's wall time, peak memory on ``device`` and, when the
    timer carries the run's account, ``mfu/step``."""
    from trainers.core.distributed import sum_over_ranks
    from trainers.core.training import peak_memory_gb

    step_tokens = int(sum_over_ranks(step_tokens))  # throughput of the whole step
    dt = timer.dt
    row: dict[str, Any] = {**aggregated, "grad_norm": grad_norm, "learning_rate": learning_rate}
    if epoch is not None:
        row["epoch"] = epoch
    row.update(extra)
    row["throughput/tokens_per_s"] = step_tokens / max(dt, 1e-9)
    row["timing/step_s"] = dt
    row["memory/peak_gb"] = peak_memory_gb(device)
    if timer.account is not None:
        row["mfu/step"] = timer.account.mfu(step_tokens, dt)
    return row


class BestMetric:
    """The best value a metric reached (``higher`` is better, or lower); NaN never counts."""

    def __init__(self, name: str, *, higher: bool = True, value: float | None = None) -> None:
        self.name, self.higher, self.value = name, higher, value

    def update(self, metrics: dict[str, Any]) -> None:
        v = metrics.get(self.name)
        if v is None or v != v:
            return
        if self.value is None or (v > self.value if self.higher else v < self.value):
            self.value = v

    def as_dict(self) -> dict[str, float | None]:
        return {self.name: self.value}
