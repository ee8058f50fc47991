"""Reward models: Bradley–Terry preference RM, outcome RM and process RM, one loop for all three.

    python -m trainers.reward_models.train --config trainers/reward_models/configs/orm.yaml \
        --run-dir DIR [--set model.name=tiny] [--set data.dataset=builtin:reasoning-outcomes] \
        [--resume]

The loop, per optimizer step:
  1. take the next `batch_size × gradient_accumulation_steps` training units (preference pairs,
     ORM completions, PRM solution windows) in a per-epoch seeded order;
  2. for each micro-batch, one forward pass of the backbone + head and the kind's loss
     (losses.py), scaled by the micro-batch's share of the step (pairs, completions, or
     labelled steps for the PRM), backward;
  3. clip, step, schedule; log the step's metrics aggregated over all its micro-batches.
Held-out evaluation (`eval/` metrics, computed over the whole held-out set at once) runs at
step 0, every `eval.eval_every` steps and at the end, with a few scored held-out examples
written to samples.jsonl. The trained model is saved with `save_reward_model` to final_model/.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from trainers.core.config import ConfigError
from trainers.core.distributed import plan_precision, rank_device, shard_model
from trainers.core.flops import step_account
from trainers.core.harness import raise_if_stopping, trainer_main
from trainers.core.loop import (
    BestMetric,
    StepTimer,
    TrainingRun,
    round_robin,
    step_metrics,
)
from trainers.core.lora import add_adapters
from trainers.core.models import ModelError, load_tokenizer, pick_device, pick_dtype, resolve_model
from trainers.core.pair_packing import pack_examples
from trainers.core.reward_model import RewardModel, build_reward_model, save_reward_model
from trainers.core.rundir import RunDir
from trainers.core.runfolder import SummaryFile
from trainers.core.training import (
    StepMetrics,
    optimizer_step,
    seed_everything,
    use_gradient_checkpointing,
)
from trainers.reward_models.config import DataSection, RewardModelConfig
from trainers.reward_models.data import (
    DatasetNotFoundError,
    collate_outcomes,
    collate_pairs_split,
    collate_steps,
    load_outcome_records,
    load_preference_records,
    load_step_records,
    split_train_eval,
    tokenize_outcomes,
    tokenize_records,
    tokenize_steps,
)
from trainers.reward_models.losses import auroc as auroc_metric
from trainers.reward_models.losses import (
    bradley_terry_loss,
    first_error_accuracy,
    first_error_baseline,
    last_token_index,
    majority_baseline,
    orm_loss,
    orm_per_sequence_loss,
    prm_loss,
    ranking_accuracy,
    step_accuracy,
    top1_accuracy,
)

DATA_EXTENSIONS = (".json", ".jsonl", ".parquet", ".csv")
KEY_METRIC = {
    "preference": "eval/accuracy",
    "orm": "eval/ranking_accuracy",
    "prm": "eval/step_accuracy",
}

# ---------------------------------------------------------------------------------------------
# Checks that need no model
# ---------------------------------------------------------------------------------------------


def preflight(cfg: RewardModelConfig) -> None:
    ds = cfg.data.dataset or ""
    looks_local = ds.startswith((".", "/", "~")) or ds.endswith(DATA_EXTENSIONS)
    if looks_local and not Path(ds).expanduser().exists():
        raise ConfigError(
            f"data.dataset: file not found: {ds}. Use an existing file, a hub id, or the "
            f"offline set for kind {cfg.kind} (see configs/{cfg.algorithm}.yaml)"
        )
    try:
        resolve_model(cfg.model.name)
    except ModelError as err:
        raise ConfigError(f"model.name: {err}") from None


# ---------------------------------------------------------------------------------------------
# One class per kind: data, micro-batch loss, held-out evaluation, samples
# ---------------------------------------------------------------------------------------------


def _decode(tokenizer, ids) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)


def _held_out_split(records: list, cfg: RewardModelConfig, unit: str) -> tuple[list, list]:
    """The training and held-out records (``data.eval_size`` held out, drawn with ``seed``); a
    ConfigError when that would leave no training record (``unit`` names the records)."""
    eval_size = cfg.data.eval_size
    if eval_size >= len(records):
        raise ConfigError(
            f"data.eval_size ({eval_size}) must be smaller than the {len(records)} {unit}"
        )
    return split_train_eval(records, eval_size=eval_size, seed=cfg.seed)


@dataclass(frozen=True)
class LoadedData:
    """A kind's data on its way in: the loader's stats, the training and held-out records, and
    the tokenisation stats of each side (``both`` adds a count over the two)."""

    load: dict
    train_records: list
    eval_records: list
    train: dict
    eval: dict

    def both(self, key: str) -> int:
        return self.train[key] + self.eval[key]


class Kind:
    """What every kind shares: loading its data (``load``: the records, checked), holding
    ``data.eval_size`` of them out (``unit`` names them) and tokenising both sides
    (``tokenize``) into ``train``, ``held_out`` and ``stats`` (``describe``); a training
    example's weight (1 unless the kind says otherwise), the held-out set read in evaluation
    batches, and the held-out items samples are drawn from. A kind adds its micro-batch loss,
    its evaluation and its samples."""

    unit: str
    held_out: list

    def __init__(self, cfg: RewardModelConfig, tokenizer):
        self.cfg, self.tokenizer, self.pad_id = cfg, tokenizer, tokenizer.pad_token_id
        load_stats: dict = {}
        records = self.load(cfg.data, cfg.seed, load_stats)
        train_r, eval_r = _held_out_split(records, cfg, self.unit)
        self.train, train_stats = self.tokenize(train_r)
        self.held_out, eval_stats = self.tokenize(eval_r)
        self.stats = self.describe(LoadedData(load_stats, train_r, eval_r, train_stats, eval_stats))

    def load(self, d: DataSection, seed: int, stats: dict) -> list:
        raise NotImplementedError

    def tokenize(self, records: list) -> tuple[list, dict]:
        raise NotImplementedError

    def describe(self, data: LoadedData) -> dict[str, Any]:
        raise NotImplementedError

    def weight(self, example) -> float:
        return 1.0

    def held_out_batches(self, size: int):
        """The held-out examples ``size`` at a time, a stop check before each batch."""
        for start in range(0, len(self.held_out), size):
            raise_if_stopping("eval_batch")
            yield self.held_out[start : start + size]

    def n_sample_sources(self) -> int:
        """How many held-out items samples are drawn from, round-robin."""
        return len(self.held_out)


class PreferenceKind(Kind):
    """Bradley–Terry on (prompt, chosen, rejected) pairs; score = head at the last token."""

    unit = "pairs"

    def load(self, d: DataSection, seed: int, stats: dict) -> list:
        records = load_preference_records(
            d.dataset, d.split, "auto", d.max_samples, seed=seed, stats=stats
        )
        if not all(r.paired for r in records):
            raise ConfigError(
                "kind preference needs paired data (chosen and rejected); this dataset is "
                "unpaired (prompt, completion, label)"
            )
        return records

    def tokenize(self, records: list) -> tuple[list, dict]:
        return tokenize_records(records, self.tokenizer, self.cfg.data.max_length)

    def describe(self, data: LoadedData) -> dict[str, Any]:
        return {
            **{f"load_{k}": v for k, v in data.load.items() if k != "format"},
            "format": data.load.get("format", "builtin"),
            "n_train": len(self.train),
            "n_eval": len(self.held_out),
            "dropped_identical": data.both("dropped_identical"),
            "truncated_response": data.both("truncated_response"),
        }

    def scores(self, model: RewardModel, examples):
        packed = pack_examples(examples, self.pad_id, model.backbone)  # pairs share rows
        if packed is not None:
            s = model.packed_pair_scores(packed.to(model.device))
            n = packed.n_pairs
            return s[:n], s[n:], packed.n_tokens
        batch = collate_pairs_split(examples, self.pad_id)  # one prompt forward per pair
        ids, mask = batch["input_ids"].to(model.device), batch["attention_mask"].to(model.device)
        s = model.split_sequence_scores(ids, mask, batch["prompt_width"])
        n = len(examples)
        return s[:n], s[n:], int(mask.sum())

    def micro_batch(self, model, examples):
        r_c, r_r, n_tok = self.scores(model, examples)
        loss, metrics = bradley_terry_loss(r_c, r_r)
        return loss, metrics, n_tok

    @torch.no_grad()
    def evaluate(self, model) -> tuple[dict, dict]:
        chosen, rejected = [], []
        for batch in self.held_out_batches(max(1, self.cfg.eval.eval_batch_size // 2)):
            r_c, r_r, _ = self.scores(model, batch)
            chosen.append(r_c.float().cpu())
            rejected.append(r_r.float().cpu())
        r_c, r_r = torch.cat(chosen), torch.cat(rejected)
        _, metrics = bradley_terry_loss(r_c, r_r)
        return metrics, {"r_chosen": r_c.tolist(), "r_rejected": r_r.tolist()}

    def samples(self, cache: dict, picks: list[int]) -> list[dict]:
        out = []
        for i in picks:
            ex = self.held_out[i]
            out.append(
                {
                    "prompt": _decode(self.tokenizer, ex.prompt_ids),
                    "chosen": _decode(self.tokenizer, ex.chosen_ids),
                    "rejected": _decode(self.tokenizer, ex.rejected_ids),
                    "r_chosen": cache["r_chosen"][i],
                    "r_rejected": cache["r_rejected"][i],
                }
            )
        return out


class OutcomeKind(Kind):
    """ORM: BCE on correctness labels; score = head at the last completion token."""

    unit = "prompts"

    def load(self, d: DataSection, seed: int, stats: dict) -> list:
        return load_outcome_records(
            d.dataset,
            d.split,
            d.max_samples,
            d.rollouts_per_prompt,
            seed=seed,
            stats=stats,
            task_configs=d.builtin_task_configs,
        )

    def tokenize(self, records: list) -> tuple[list, dict]:
        return tokenize_outcomes(records, self.tokenizer, self.cfg.data.max_length)

    def describe(self, data: LoadedData) -> dict[str, Any]:
        return {
            **{f"load_{k}": v for k, v in data.load.items()},
            "n_train_prompts": len(data.train_records),
            "n_eval_prompts": len(data.eval_records),
            "n_train": len(self.train),
            "n_eval": len(self.held_out),
            "train_correct_share": _share(ex.label for ex in self.train),
            "eval_correct_share": _share(ex.label for ex in self.held_out),
            "dropped_too_long": data.both("dropped_too_long"),
        }

    def _forward(self, model, examples):
        batch = collate_outcomes(examples, self.pad_id)
        dev = model.device
        ids, mask = batch["input_ids"].to(dev), batch["attention_mask"].to(dev)
        logits = model.token_scores(ids, mask)
        return logits, batch["labels"].to(dev), batch["completion_mask"].to(dev), int(mask.sum())

    def micro_batch(self, model, examples):
        logits, labels, cmask, n_tok = self._forward(model, examples)
        loss, metrics = orm_loss(logits, labels, cmask, self.cfg.orm_loss_tokens)
        return loss, metrics, n_tok

    @torch.no_grad()
    def evaluate(self, model) -> tuple[dict, dict]:
        scores, losses = [], []
        for batch in self.held_out_batches(self.cfg.eval.eval_batch_size):
            logits, labels, cmask, _ = self._forward(model, batch)
            last = last_token_index(cmask)
            scores.append(logits.gather(1, last.unsqueeze(1)).squeeze(1).float().cpu())
            per_seq = orm_per_sequence_loss(logits, labels, cmask, self.cfg.orm_loss_tokens)
            losses.append(per_seq.float().cpu())
        s = torch.cat(scores)
        labels = [ex.label for ex in self.held_out]
        groups = [ex.group for ex in self.held_out]
        probs = torch.sigmoid(s)
        y = torch.tensor(labels, dtype=torch.bool)
        metrics = {
            "loss": float(torch.cat(losses).mean()),
            "accuracy": float(((s > 0) == y).float().mean()),
            "auroc": auroc_metric(s.tolist(), labels),
            "ranking_accuracy": ranking_accuracy(s.tolist(), labels, groups),
            "top1_accuracy": top1_accuracy(s.tolist(), labels, groups),
            "reward_correct_mean": float(probs[y].mean()) if bool(y.any()) else math.nan,
            "reward_incorrect_mean": float(probs[~y].mean()) if bool((~y).any()) else math.nan,
        }
        return metrics, {"scores": s.tolist()}

    def samples(self, cache: dict, picks: list[int]) -> list[dict]:
        groups: dict[int, list[int]] = {}
        for i, ex in enumerate(self.held_out):
            groups.setdefault(ex.group, []).append(i)
        keys = sorted(groups)
        out = []
        for p in picks:
            members = groups[keys[p % len(keys)]]
            first = self.held_out[members[0]]
            out.append(
                {
                    "prompt": _decode(self.tokenizer, first.input_ids[: first.prompt_len]),
                    "completions": [
                        {
                            "completion": _decode(
                                self.tokenizer,
                                self.held_out[i].input_ids[self.held_out[i].prompt_len :],
                            ),
                            "label": self.held_out[i].label,
                            "score": cache["scores"][i],
                            "p_correct": 1 / (1 + math.exp(-cache["scores"][i])),
                        }
                        for i in members
                    ],
                }
            )
        return out

    def n_sample_sources(self) -> int:
        return len({ex.group for ex in self.held_out})


class StepKind(Kind):
    """PRM: cross-entropy at step separators; per-step class probabilities."""

    unit = "solutions"

    def load(self, d: DataSection, seed: int, stats: dict) -> list:
        return load_step_records(
            d.dataset,
            d.split,
            d.max_samples,
            seed=seed,
            stats=stats,
            task_configs=d.builtin_task_configs,
        )

    def tokenize(self, records: list) -> tuple[list, dict]:
        d = self.cfg.data
        return tokenize_steps(records, self.tokenizer, d.max_length, d.step_separator, d.num_labels)

    def describe(self, data: LoadedData) -> dict[str, Any]:
        return {
            **{f"load_{k}": v for k, v in data.load.items()},
            "n_train_solutions": len(data.train_records),
            "n_eval_solutions": len(data.eval_records),
            "n_train": len(self.train),
            "n_eval": len(self.held_out),
            "n_train_steps": data.train["n_steps"],
            "n_eval_steps": data.eval["n_steps"],
            "split_solutions": data.both("split_solutions"),
            "truncated_solutions": data.both("truncated_solutions"),
        }

    def weight(self, example) -> float:
        return float(sum(1 for y in example.labels if y != -100))

    def _forward(self, model, examples):
        batch = collate_steps(examples, self.pad_id)
        dev = model.device
        ids, mask = batch["input_ids"].to(dev), batch["attention_mask"].to(dev)
        logits = model(ids, mask)
        step_logits = logits[batch["rows"].to(dev), batch["positions"].to(dev)]
        return step_logits, batch["labels"].to(dev), int(mask.sum())

    def micro_batch(self, model, examples):
        step_logits, labels, n_tok = self._forward(model, examples)
        loss, metrics = prm_loss(step_logits, labels)
        return loss, metrics, n_tok

    @torch.no_grad()
    def evaluate(self, model) -> tuple[dict, dict]:
        all_logits = []
        for batch in self.held_out_batches(self.cfg.eval.eval_batch_size):
            step_logits, _, _ = self._forward(model, batch)
            all_logits.append(step_logits.float().cpu())
        logits = torch.cat(all_logits)
        labels = torch.tensor([y for ex in self.held_out for y in ex.labels])
        preds = logits.argmax(dim=-1)
        keep = labels != -100
        loss = F.cross_entropy(logits[keep], labels[keep]) if bool(keep.any()) else math.nan
        per_solution: dict[int, list[tuple[int, int, int]]] = {}
        k = 0
        for ex in self.held_out:
            for j, y in enumerate(ex.labels):
                per_solution.setdefault(ex.solution, []).append(
                    (ex.first_step + j, int(preds[k]), y)
                )
                k += 1
        ordered = [sorted(v) for _, v in sorted(per_solution.items())]
        metrics = {
            "loss": float(loss),
            "step_accuracy": step_accuracy(preds.tolist(), labels.tolist()),
            "majority_baseline": majority_baseline(labels.tolist()),
            "first_error_accuracy": first_error_accuracy(
                [[p for _, p, _ in sol] for sol in ordered],
                [[y for _, _, y in sol] for sol in ordered],
            ),
            "first_error_baseline": first_error_baseline([[y for _, _, y in s] for s in ordered]),
        }
        probs = torch.softmax(logits, dim=-1)
        return metrics, {"probs": probs.tolist()}

    def samples(self, cache: dict, picks: list[int]) -> list[dict]:
        offsets, k = [], 0
        for ex in self.held_out:
            offsets.append(k)
            k += len(ex.labels)
        names = ["bad", "good"] if self.cfg.data.num_labels == 2 else ["bad", "neutral", "good"]
        out = []
        for i in picks:
            ex = self.held_out[i]
            probs = cache["probs"][offsets[i] : offsets[i] + len(ex.labels)]
            out.append(
                {
                    "text": _decode(self.tokenizer, ex.input_ids),
                    "solution": ex.solution,
                    "first_step": ex.first_step,
                    "labels": [names[y] if y != -100 else None for y in ex.labels],
                    "predicted": [names[max(range(len(p)), key=p.__getitem__)] for p in probs],
                    "p_bad": [p[0] for p in probs],
                }
            )
        return out


def _share(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else math.nan


KINDS = {"preference": PreferenceKind, "orm": OutcomeKind, "prm": StepKind}


def prepare_kind(cfg: RewardModelConfig, tokenizer: Any) -> Kind:
    try:
        kind = KINDS[cfg.kind](cfg, tokenizer)
    except DatasetNotFoundError as err:
        raise ConfigError(f"data.dataset: {err}") from None
    if not kind.train:
        raise ConfigError(
            "no training examples left after tokenisation; raise data.max_length or "
            "data.max_samples"
        )
    return kind


# ---------------------------------------------------------------------------------------------
# The training loop
# ---------------------------------------------------------------------------------------------


def train(cfg: RewardModelConfig, run: RunDir, resume: bool) -> SummaryFile:
    """Load and tokenise the kind's data, then the reward-model loop; see the module doc."""
    seed_everything(cfg.seed)
    device = rank_device(pick_device(cfg.model.device))
    dtype = plan_precision(device, pick_dtype(cfg.model.dtype, device))
    tokenizer = load_tokenizer(cfg.model.name)
    if tokenizer.pad_token_id is None:
        raise ConfigError("the tokenizer has neither a pad nor an eos token")

    run.update_phase("tokenizing")
    kind = prepare_kind(cfg, tokenizer)
    info: dict[str, Any] = {"data": kind.stats}
    print(f"data: {kind.stats}", flush=True)
    loop = TrainingRun.over_epochs(run, cfg, len(kind.train))

    run.update_phase("loading_model", loop.total_steps)
    model = build_reward_model(
        cfg.model.name,
        cfg.kind,
        num_labels=cfg.head_size,
        separator=cfg.data.step_separator if cfg.kind == "prm" else None,
        max_length=cfg.data.max_length,
        device=device,
        dtype=dtype,
        attn_implementation=cfg.model.attn_implementation,
        trainable=True,
        freeze_backbone=cfg.freeze_backbone,
    )
    model.backbone = add_adapters(model.backbone, cfg.model.lora)  # the head stays trainable
    use_gradient_checkpointing(
        model.backbone, cfg.model.gradient_checkpointing and not cfg.freeze_backbone
    )
    shard_model(model)  # FSDP2 under torchrun; nothing on one process
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    info["trainable_parameters"] = sum(p.numel() for p in trainable)
    optimizer, scheduler, state = loop.optimizer_and_resume(model, trainable, cfg.train, resume)
    account = step_account(model, device, dtype)  # the step's FLOPs and the peak: mfu/step
    name = f"{cfg.algorithm}-{run.path.name}"
    loop.start_tracker(cfg.logging, cfg.model_dump(mode="json"), name)
    best = BestMetric(KEY_METRIC[cfg.kind])

    def run_eval() -> None:
        loop.progress("evaluating")
        model.eval()
        t0 = time.time()
        metrics, cache = kind.evaluate(model)
        model.train()
        row = {f"eval/{k}": v for k, v in metrics.items()}
        row["timing/eval_s"] = time.time() - t0
        loop.log("eval", row)
        best.update(row)
        n = min(cfg.eval.num_samples, len(kind.held_out))
        if n:
            picks = round_robin(kind.n_sample_sources(), n, loop.event(cfg.eval.eval_every))
            loop.log_samples(kind.samples(cache, picks))
        loop.last_eval = row

    def after_step() -> None:  # the step's evaluation and samples, when due
        if loop.every(cfg.eval.eval_every) and kind.held_out:
            run_eval()

    if not resume and cfg.eval.eval_every > 0 and kind.held_out:
        run_eval()  # the starting point, for contrast
    if loop.redo_events:  # stopped during the evaluation after the checkpoint's step
        after_step()

    position = state["data_position"] if state else None
    for pos in loop.epoch_steps(len(kind.train), cfg.train, cfg.seed, position):
        timer = StepTimer(account)
        step_weight = sum(kind.weight(kind.train[i]) for i in pos.ids)  # over every rank's share
        agg, step_tokens = StepMetrics(), 0
        for m in range(0, len(pos.local_ids), cfg.train.batch_size):
            raise_if_stopping("micro_batch")
            batch = [kind.train[i] for i in pos.local_ids[m : m + cfg.train.batch_size]]
            weight = sum(kind.weight(ex) for ex in batch)
            if weight <= 0:
                continue
            loss, metrics, n_tok = kind.micro_batch(model, batch)
            (loss * weight / step_weight).backward()
            agg.add(metrics, weight=weight)
            step_tokens += n_tok
        grad_norm, lr = optimizer_step(trainable, optimizer, scheduler, cfg.train.max_grad_norm)
        row = step_metrics(
            agg.mean(), grad_norm, lr, step_tokens, timer, device, epoch=pos.epoch_progress
        )
        loop.step_done(row, step_tokens, cfg.logging.log_every)
        loop.end_step(after_step, epoch=pos.epoch)

    final_model = loop.save_final_model(model, tokenizer, save=save_reward_model)
    if final_model is not None:
        info["final_model"] = final_model
    loop.finish()
    return loop.summary(cfg.algorithm, best, device, kind=cfg.kind, **info)


main = trainer_main(__doc__, RewardModelConfig, preflight, train)


if __name__ == "__main__":
    sys.exit(main())
