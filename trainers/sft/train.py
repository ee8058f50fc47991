"""Supervised fine-tuning on demonstrations: masked cross-entropy on assistant turns.

    python -m trainers.sft.train --config trainers/sft/configs/sft.yaml --run-dir DIR \
        [--set data.dataset=builtin:reasoning-sft] [--set model.name=tiny] [--resume]

The loop, per optimizer step:
  1. take the next `batch_size × gradient_accumulation_steps` conversations and count the
     step's target tokens N (assistant tokens after the label shift, over all micro-batches);
  2. for each micro-batch (padded to its longest row): summed token NLL of its targets,
     backward on NLL_mb / N, so the step's gradient is that of sum(NLL) / N over the whole
     step, whatever the micro-batch split;
  3. clip, step, schedule; log `loss` (= sum NLL / N), `mean_token_accuracy` and the rest.
Held-out `eval/loss` and `eval/mean_token_accuracy` and sample generations every N steps; the
trained model and tokenizer go to <run-dir>/final_model (the warm start other families load
with model.name=<run-dir>/final_model).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from trainers.core.config import ConfigError, apply_overrides, read_yaml, validate_config
from trainers.core.flops import step_account
from trainers.core.generation import generate_completions, sample_held_out
from trainers.core.harness import (
    MetricsTracker,
    raise_if_stopping,
    trainer_main,
)
from trainers.core.logprobs import DEFAULT_CHUNK, hidden_to_logps, selective_log_softmax
from trainers.core.loop import (
    BestMetric,
    StepTimer,
    TrainingRun,
    data_info,
    step_metrics,
)
from trainers.core.lora import add_adapters
from trainers.core.models import (
    hub_offline,
    hub_reachable,
    load_causal_lm,
    load_tokenizer,
    pick_runtime,
)
from trainers.core.multiturn import check_tool_format
from trainers.core.rundir import RunDir
from trainers.core.runfolder import SummaryFile
from trainers.core.seq_packing import (
    PACKED_ATTENTION,
    Unit,
    attention_mask_for,
    attention_of,
    pack_for,
    pack_values,
)
from trainers.core.tasks import TASK_KITS, import_reasoning_gym
from trainers.core.tiny import BUILDER_VERSION, cache_root
from trainers.core.tool_demonstrations import check_tool_tasks, default_demonstration_tasks
from trainers.core.training import (
    StepMetrics,
    optimizer_step,
    ready_to_train,
    seed_everything,
)
from trainers.core.verifier import has_tag_format
from trainers.sft.config import BUILTIN_DATASET, TOOL_DATASET, SFTConfig, is_tool_dataset
from trainers.sft.data import (
    DatasetNotFoundError,
    SFTRecord,
    TokenizedSFT,
    builtin_hint,
    collate,
    load_sft_records,
    longest_tool_demonstration,
    looks_like_path,
    parse_builtin_name,
    score_record_response,
    split_train_eval,
    tokenize_records,
)

CONFIGS = Path(__file__).resolve().parent / "configs"

# ---------------------------------------------------------------------------------------------
# The warm-start recipe for policy-gradient runs on the tiny preset
# ---------------------------------------------------------------------------------------------

WARM_START_CONFIG = CONFIGS / "sft_tiny_warmstart.yaml"

WARM_START_TASKS: dict[str, dict] = {
    "chain_sum": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1},
}
"""The reasoning-gym tasks and settings the warm start is trained on. Policy-gradient runs that
start from the warm-start model should draw their prompts from the same tasks and settings (the
model gets some of these right; two-digit sums or spelling backward it mostly gets wrong)."""


def _flow(mapping: dict) -> str:
    return json.dumps(mapping, separators=(", ", ": "))


def warm_start_overrides() -> list[str]:
    """``--set`` overrides that turn ``configs/sft.yaml`` into the tiny warm-start recipe
    (the same config as ``configs/sft_tiny_warmstart.yaml``): one-digit chain sums, a few
    hundred steps at a high learning rate. About 1–2 minutes on 2 CPU cores; greedy completions
    then carry the <think>/<answer> format and get some, not all, answers right (README.md has
    the measured numbers)."""
    return [
        "model.name=tiny",
        "model.chat_template_source=null",
        "model.gradient_checkpointing=false",
        f"data.dataset={BUILTIN_DATASET}:{','.join(WARM_START_TASKS)}",
        "data.max_samples=2600",
        "data.eval_size=200",
        "data.max_length=160",
        f"data.builtin_task_configs={_flow(WARM_START_TASKS)}",
        "train.learning_rate=3.0e-3",
        "train.num_epochs=4",
        "train.batch_size=16",
        "train.gradient_accumulation_steps=1",
        "train.warmup_ratio=0.05",
        "eval.eval_every=100",
        "eval.sample_every=100",
        "eval.num_samples=4",
        "eval.sample_max_new_tokens=64",
        "eval.sample_do_sample=false",
        "logging.log_every=10",
        "checkpoint.save_every=null",
        "checkpoint.save_final_model=true",
    ]


def warm_start_config() -> SFTConfig:
    data = apply_overrides(read_yaml(CONFIGS / "sft.yaml"), warm_start_overrides())
    return validate_config(data, SFTConfig, source="warm-start recipe")


WARM_START_CHECKPOINT_EVERY = 250


def warm_start_model(root: str | Path | None = None) -> Path:
    """The tiny warm-start model folder, trained once and cached (under
    ``cache_root()/sft-warmstart/<key>`` unless ``root`` is given; the key hashes the recipe and
    the tiny preset's builder version). Safe to call from several processes: one trains under a
    file lock, the others wait. Trains with one torch thread (restored afterwards): for a model
    this small a second CPU thread costs more than it brings, and the results are the same.
    The run keeps its checkpoints at steps 250 and 500 of the 600 (``checkpoints/step-*``):
    partly trained models on the same schedule, e.g. a student to distil into."""
    from filelock import FileLock

    cfg = warm_start_config()
    # data.packing changes the layout, not the loss: a warm start cached before it existed stays
    config = cfg.model_dump(mode="json", exclude={"data": {"packing"}})
    recipe = {"config": config, "tiny": BUILDER_VERSION, "version": 2}
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]
    base = Path(root) if root is not None else cache_root() / "sft-warmstart"
    run_dir = base / key
    final = run_dir / "final_model"
    if (final / "config.json").is_file():
        return final
    base.mkdir(parents=True, exist_ok=True)
    with FileLock(str(base / f".{key}.lock")):
        if (final / "config.json").is_file():
            return final
        if run_dir.exists():  # a killed earlier attempt
            import shutil

            shutil.rmtree(run_dir)
        argv = ["--config", str(WARM_START_CONFIG), "--run-dir", str(run_dir)]
        argv += ["--set", f"checkpoint.save_every={WARM_START_CHECKPOINT_EVERY}"]
        argv += ["--set", "checkpoint.keep_last=3"]  # 250, 500 and the final step
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            code = main(argv)
        finally:
            torch.set_num_threads(threads)
        if code != 0:
            raise RuntimeError(f"the SFT warm-start run failed; see {run_dir / 'summary.json'}")
    return final


# ---------------------------------------------------------------------------------------------
# Checks before anything is written
# ---------------------------------------------------------------------------------------------


def preflight(cfg: SFTConfig) -> None:
    """Checks that need no model: fail before anything is written."""
    ds = cfg.data.dataset
    if ds.startswith("builtin:"):
        try:
            named = parse_builtin_name(ds)
        except DatasetNotFoundError as err:
            raise ConfigError(f"data.dataset: {err}") from None
        tasks = named or cfg.data.builtin_tasks or default_demonstration_tasks(ds)
        known = set(import_reasoning_gym().factory.DATASETS)
        unknown = [t for t in tasks if t not in known]
        if unknown:
            raise ConfigError(
                f"unknown reasoning-gym task(s) {unknown}; tasks with worked demonstrations: "
                f"{sorted(TASK_KITS)}"
            )
        if is_tool_dataset(ds):
            check_tool_demonstrations(cfg, tasks)
        return
    if cfg.data.builtin_tasks or cfg.data.builtin_task_configs:
        raise ConfigError(
            f"data.builtin_tasks / data.builtin_task_configs apply only to {BUILTIN_DATASET} "
            f"and {TOOL_DATASET}"
        )
    if looks_like_path(ds) or Path(ds).expanduser().exists():
        if not Path(ds).expanduser().exists():
            raise ConfigError(f"data.dataset: file not found: {ds}. " + builtin_hint())
        return
    # a hub id: offline or unreachable must fail here, with the offline alternatives
    if hub_offline():
        import datasets

        try:
            datasets.load_dataset_builder(ds)
        except Exception as err:
            raise ConfigError(
                f"data.dataset: {ds!r} is a hub id and is not in the local cache "
                f"(HF_HUB_OFFLINE is set: {type(err).__name__}). " + builtin_hint()
            ) from None
    elif not hub_reachable():
        raise ConfigError(
            f"data.dataset: {ds!r} is a hub id but the Hugging Face Hub cannot be reached. "
            "Set HF_HUB_OFFLINE=1 to use a cached copy. " + builtin_hint()
        )


def check_tool_demonstrations(cfg: SFTConfig, tasks) -> None:
    """For ``builtin:tool-sft``: every task gives expressions for the calculator, the model's
    tokenizer can write the tool-call format and render a ``tool`` message, and
    ``data.max_length`` holds the longest tool demonstration (the records are cheap to build,
    so the real set is measured)."""
    d = cfg.data
    try:
        check_tool_tasks(tasks, d.builtin_task_configs)
    except ValueError as err:
        raise ConfigError(f"data.dataset: {err}") from None
    tokenizer = load_tokenizer_with_template(cfg)
    try:
        check_tool_format(tokenizer)
    except ValueError as err:
        raise ConfigError(f"model.name: {err}; {d.dataset} needs both") from None
    records = load_run_records(cfg)
    longest = longest_tool_demonstration(records, tokenizer)
    if longest > d.max_length:
        raise ConfigError(
            f"data.max_length={d.max_length} cuts the tool demonstrations of {d.dataset} (the "
            f"longest is {longest} tokens with this tokenizer: the system message carries the "
            f"tool's instructions); set data.max_length={longest} or more"
        )


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def load_tokenizer_with_template(cfg: SFTConfig) -> Any:
    tokenizer = load_tokenizer(cfg.model.name)
    if getattr(tokenizer, "chat_template", None) is None and cfg.model.chat_template_source:
        donor = load_tokenizer(cfg.model.chat_template_source)
        if getattr(donor, "chat_template", None) is None:
            raise ConfigError(
                f"model.chat_template_source {cfg.model.chat_template_source!r} has no chat "
                "template either"
            )
        tokenizer.chat_template = donor.chat_template
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_run_records(cfg: SFTConfig, stats: dict | None = None) -> list[SFTRecord]:
    """The demonstrations ``data`` names (dataset, split, size, built-in tasks), drawn with the
    run's seed; ``stats`` is filled with how they were loaded."""
    d = cfg.data
    return load_sft_records(
        d.dataset,
        d.split,
        d.max_samples,
        seed=cfg.seed,
        builtin_tasks=d.builtin_tasks,
        builtin_task_configs=d.builtin_task_configs,
        stats=stats,
    )


def prepare_examples(
    cfg: SFTConfig, tokenizer: Any
) -> tuple[list[TokenizedSFT], list[TokenizedSFT], list[SFTRecord], dict[str, Any]]:
    d = cfg.data
    load_stats: dict = {}
    try:
        records = load_run_records(cfg, stats=load_stats)
    except DatasetNotFoundError as err:
        raise ConfigError(str(err)) from None
    if len(records) <= d.eval_size:
        raise ConfigError(
            f"{len(records)} usable conversations, not more than data.eval_size ({d.eval_size}); "
            "lower data.eval_size or use more data"
        )
    train_records, eval_records = split_train_eval(records, d.eval_size, cfg.seed)
    train, train_stats = tokenize_records(train_records, tokenizer, d.max_length, d.train_on)
    held_out, _ = tokenize_records(eval_records, tokenizer, d.max_length, d.train_on)
    if not train:
        raise ConfigError("no training examples left after tokenisation; raise data.max_length")
    return train, held_out, eval_records, {**load_stats, **train_stats}


# ---------------------------------------------------------------------------------------------
# The loss
# ---------------------------------------------------------------------------------------------


def token_nll(
    model,
    input_ids,
    attention_mask,
    loss_mask,
    chunk_size: int = DEFAULT_CHUNK,
    position_ids=None,
) -> tuple[torch.Tensor, int, int]:
    """Summed negative log-likelihood of the target tokens, their count, and how many of them
    the model's argmax predicts. Targets: positions t >= 1 with ``loss_mask[t] == 1``, predicted
    from positions < t. Only target positions go through the LM head (chunked, fp32
    log-softmax one chunk at a time). Packed rows (:func:`packed_batch`) bring their own
    ``attention_mask`` form and ``position_ids``."""
    labels = input_ids[:, 1:]
    mask = loss_mask[:, 1:].bool()
    targets = labels[mask]
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    lm_head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if position_ids is not None:
        inputs["position_ids"] = position_ids
    if decoder is not None and isinstance(lm_head, torch.nn.Linear):
        hidden = decoder(**inputs).last_hidden_state
        picked = hidden[:, :-1][mask]  # (N, H): the positions that predict a target
        logps = hidden_to_logps(picked.unsqueeze(0), lm_head, targets.unsqueeze(0), chunk_size)
        with torch.no_grad():
            hits = sum(
                int(
                    F.linear(picked[s : s + chunk_size].detach(), lm_head.weight, lm_head.bias)
                    .argmax(-1)
                    .eq(targets[s : s + chunk_size])
                    .sum()
                )
                for s in range(0, picked.shape[0], chunk_size)
            )
    else:  # generic fallback: the model builds logits itself
        logits = model(**inputs).logits[:, :-1][mask]
        logps = selective_log_softmax(logits.unsqueeze(0), targets.unsqueeze(0), chunk_size)
        hits = int(logits.detach().argmax(-1).eq(targets).sum())
    return -logps.sum(), int(targets.numel()), hits


def packed_batch(
    model: torch.nn.Module, examples: list[TokenizedSFT], pad_id: int, device: torch.device | str
) -> dict[str, Any] | None:
    """A micro-batch packed several conversations per row (``trainers.core.seq_packing``):
    ``token_nll``'s inputs; None when packing leaves as many token slots as padding (no two
    conversations share a row), where the plain causal layout is the faster one. Each
    conversation's first token is never a target (as in the padded layout, where no position
    predicts it), so the label shift never crosses two conversations."""
    decoder = model.get_decoder()
    packed = pack_for(decoder, [Unit(ex.input_ids) for ex in examples], pad_id)
    longest = max(len(ex.input_ids) for ex in examples)
    if packed.n_rows * packed.width >= len(examples) * longest:
        return None
    loss_mask = pack_values(packed, [[0, *ex.loss_mask[1:]] for ex in examples])
    packed = packed.to(device)
    dtype = decoder.get_input_embeddings().weight.dtype
    return {
        "input_ids": packed.input_ids,
        "attention_mask": attention_mask_for(decoder, packed, dtype),
        "position_ids": packed.position_ids,
        "loss_mask": loss_mask.to(device),
        "n_tokens": packed.n_tokens,
    }


def padded_batch(examples: list[TokenizedSFT], pad_id: int, device: torch.device | str) -> dict:
    """A micro-batch one conversation per row, right-padded to its longest: ``token_nll``'s
    inputs."""
    batch = {k: v.to(device) for k, v in collate(examples, pad_id).items()}
    return {**batch, "n_tokens": int(batch["attention_mask"].sum())}


def micro_batch_terms(
    model: torch.nn.Module,
    examples: list[TokenizedSFT],
    pad_id: int,
    device: torch.device | str,
    pack: bool = False,
) -> tuple[torch.Tensor, int, int, int]:
    """(summed NLL, target tokens, correct argmax tokens, non-pad tokens) of a micro-batch,
    packed (``pack``, where that saves token slots) or padded: the same targets either way."""
    batch = packed_batch(model, examples, pad_id, device) if pack else None
    if batch is None:
        batch = padded_batch(examples, pad_id, device)
    n_tokens = batch.pop("n_tokens")
    nll, n, hits = token_nll(model, **batch)
    return nll, n, hits, n_tokens


def packs(cfg: SFTConfig, model: torch.nn.Module) -> bool:
    """Whether micro-batches may be packed: ``data.packing`` and a decoder whose attention
    takes packed rows (``trainers.core.seq_packing.PACKED_ATTENTION``: every implementation
    ``model.attn_implementation`` offers); anything else keeps the padded layout."""
    if not cfg.data.packing or not hasattr(model, "get_decoder"):
        return False
    return attention_of(model.get_decoder()) in PACKED_ATTENTION


@torch.no_grad()
def evaluate(cfg: SFTConfig, model, examples, pad_id, device) -> dict[str, float]:
    """Token-weighted held-out loss and accuracy over the whole held-out set."""
    model.eval()
    nll_sum, n_sum, hit_sum = 0.0, 0, 0
    for start in range(0, len(examples), cfg.eval.eval_batch_size):
        raise_if_stopping("eval_batch")
        chunk = examples[start : start + cfg.eval.eval_batch_size]
        nll, n, hits, _ = micro_batch_terms(model, chunk, pad_id, device, packs(cfg, model))
        nll_sum, n_sum, hit_sum = nll_sum + float(nll), n_sum + n, hit_sum + hits
    model.train()
    return {"eval/loss": nll_sum / n_sum, "eval/mean_token_accuracy": hit_sum / n_sum}


# ---------------------------------------------------------------------------------------------
# Generations: periodic samples and the format / correctness measurement
# ---------------------------------------------------------------------------------------------


def score_generations(
    model,
    tokenizer,
    records: list[SFTRecord],
    *,
    max_new_tokens: int = 64,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    batch_size: int = 32,
) -> dict:
    """Generate one completion per record's prompt and measure it.

    Returns ``format_rate`` (share with exactly <think>…</think><answer>…</answer>),
    ``correct_rate`` (share scoring 1.0; built-in records only), ``score_mean`` and the
    ``completions`` themselves."""
    completions = generate_completions(
        model,
        tokenizer,
        [r.prompt for r in records],
        max_new_tokens=max_new_tokens,
        do_sample=do_sample,
        temperature=temperature,
        top_p=top_p,
        batch_size=batch_size,
    )
    fmt = [has_tag_format(c) for c in completions]
    scores = [score_record_response(c, r) for c, r in zip(completions, records, strict=True)]
    scored = [s for s in scores if s is not None]
    return {
        "n": len(records),
        "format_rate": sum(fmt) / max(len(fmt), 1),
        "correct_rate": sum(s == 1.0 for s in scored) / len(scored) if scored else None,
        "score_mean": sum(scored) / len(scored) if scored else None,
        "completions": completions,
    }


def last_user_text(record: SFTRecord) -> str:
    """The last user message of the record's prompt (the prompt's last message when it has no
    user message): what a sample row shows as its prompt. A tool demonstration's prompt ends
    with the tool's reply, not the question."""
    users = [m for m in record.prompt if m["role"] == "user"]
    return (users or record.prompt)[-1]["content"]


def sample_generations(
    cfg: SFTConfig,
    model: torch.nn.Module,
    tokenizer: Any,
    eval_records: list[SFTRecord],
    event: int,
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Completions for ``eval.num_samples`` held-out prompts, taken round-robin by event.
    Returns the sample rows and, for built-in data, their format rate and mean score."""
    picked, completions = sample_held_out(model, tokenizer, eval_records, event, cfg.eval)
    if not picked:
        return [], {}
    rows, scores, formats = [], [], []
    for rec, completion in zip(picked, completions, strict=True):
        row = {
            "prompt": last_user_text(rec),
            "completion": completion,
            "reference": rec.reference,
        }
        if "task" in rec.meta:
            row["task"] = rec.meta["task"]
            row["score"] = score_record_response(completion, rec)
            row["tag_format"] = has_tag_format(completion)
            scores.append(row["score"])
            formats.append(row["tag_format"])
        rows.append(row)
    metrics = {}
    if scores:
        metrics = {
            "eval/sample_score": sum(scores) / len(scores),
            "eval/sample_format_rate": sum(formats) / len(formats),
        }
    return rows, metrics


# ---------------------------------------------------------------------------------------------
# The training loop
# ---------------------------------------------------------------------------------------------


def train(
    cfg: SFTConfig, run: RunDir, resume: bool, *, tracker: MetricsTracker | None = None
) -> SummaryFile:
    """Tokenise, then the masked cross-entropy loop; see the module doc. ``tracker``: a W&B run
    lent by a pipeline that runs SFT as one of its stages (rejection sampling)."""
    seed_everything(cfg.seed)
    device, dtype, attn = pick_runtime(cfg.model)
    tokenizer = load_tokenizer_with_template(cfg)
    pad_id = tokenizer.pad_token_id

    run.update_phase("tokenizing")
    train_ex, eval_ex, eval_records, data_stats = prepare_examples(cfg, tokenizer)
    info = data_info(data_stats, len(train_ex), len(eval_ex))
    loop = TrainingRun.over_epochs(run, cfg, len(train_ex), tracker=tracker)

    run.update_phase("loading_model", loop.total_steps)
    model = load_causal_lm(
        cfg.model.name, device=device, dtype=dtype, attn_implementation=attn, trainable=True
    )
    model = add_adapters(model, cfg.model.lora)  # LoRA when model.lora.enabled
    ready_to_train(model, cfg.model)
    optimizer, scheduler, state = loop.optimizer_and_resume(
        model, model.parameters(), cfg.train, resume
    )
    account = step_account(model, device, dtype)  # the step's FLOPs and the peak: mfu/step
    loop.start_tracker(cfg.logging, cfg.model_dump(mode="json"), f"sft-{run.path.name}")
    best = BestMetric("eval/loss", higher=False)

    def eval_and_samples(at_start: bool) -> None:
        row: dict[str, Any] = {}
        if eval_ex and (loop.every(cfg.eval.eval_every) or (at_start and cfg.eval.eval_every)):
            loop.progress("evaluating")
            row.update(evaluate(cfg, model, eval_ex, pad_id, device))
            best.update(row)
        if loop.every(cfg.eval.sample_every) or (at_start and cfg.eval.sample_every):
            loop.progress("generating")
            event = loop.event(cfg.eval.sample_every)
            samples, sample_metrics = sample_generations(cfg, model, tokenizer, eval_records, event)
            loop.log_samples(samples)
            row.update(sample_metrics)
        if row:
            loop.log("eval", row)
            loop.last_eval = {**loop.last_eval, **row}

    if not resume:  # the starting point, for contrast
        eval_and_samples(at_start=True)
    if loop.redo_events:  # stopped during the evaluation after the checkpoint's step
        eval_and_samples(at_start=False)

    position = state["data_position"] if state else None
    pack = packs(cfg, model)
    for pos in loop.epoch_steps(len(train_ex), cfg.train, cfg.seed, position):
        timer = StepTimer(account)
        step_targets = sum(train_ex[i].n_targets for i in pos.ids)  # over every rank's share
        agg, step_tokens = StepMetrics(), 0
        for m in range(0, len(pos.local_ids), cfg.train.batch_size):
            raise_if_stopping("micro_batch")
            chunk = [train_ex[i] for i in pos.local_ids[m : m + cfg.train.batch_size]]
            nll, n, hits, n_tok = micro_batch_terms(model, chunk, pad_id, device, pack)
            (nll / step_targets).backward()
            agg.add({"loss": float(nll.detach()) / n, "mean_token_accuracy": hits / n}, weight=n)
            step_tokens += n_tok
        grad_norm, lr = optimizer_step(
            model.parameters(), optimizer, scheduler, cfg.train.max_grad_norm
        )
        row = step_metrics(
            agg.mean(),
            grad_norm,
            lr,
            step_tokens,
            timer,
            device,
            epoch=pos.epoch_progress,
            num_tokens=step_targets,
        )
        loop.step_done(row, step_tokens, cfg.logging.log_every, "mean_token_accuracy")
        loop.end_step(lambda: eval_and_samples(at_start=False), epoch=pos.epoch)

    final_model = loop.save_final_model(model, tokenizer)
    loop.finish()
    return loop.summary("sft", best, device, final_model=final_model, **info)


main = trainer_main(__doc__, SFTConfig, preflight, train)


if __name__ == "__main__":
    sys.exit(main())
