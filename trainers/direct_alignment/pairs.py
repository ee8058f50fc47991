"""One step on preference pairs, shared by the offline loop (``train.py``), online DPO
(``online.py``) and the pair_accuracy evaluation suite: tokenised examples from the config's
data, the summed completion log-probs of a micro-batch (one forward, each prompt once), the
reference's log-probs of every example, and the loss (``LOSSES[cfg.loss]``) with its metrics.
"""

from __future__ import annotations

from typing import Any

import torch

from trainers.core.config import ConfigError
from trainers.core.harness import raise_if_stopping
from trainers.core.logprobs import split_completion_logps
from trainers.core.pair_packing import pack_examples, packed_response_logps
from trainers.core.preferences import configured_preference_records
from trainers.core.rundir import phase_progress
from trainers.core.training import StepMetrics
from trainers.direct_alignment.config import DirectAlignmentConfig
from trainers.direct_alignment.data import (
    TokenizedExample,
    attach_kl_responses,
    collate_split,
    split_train_eval,
    tokenize_records,
)
from trainers.direct_alignment.losses import LOSSES, LossInputs, LossParams

# ---------------------------------------------------------------------------------------------
# Examples
# ---------------------------------------------------------------------------------------------


def prepare_examples(
    cfg: DirectAlignmentConfig, tokenizer: Any
) -> tuple[list[TokenizedExample], list[TokenizedExample], list[Any], dict[str, Any]]:
    records = configured_preference_records(cfg.data, cfg.seed)
    train_records, eval_records = split_train_eval(
        records, eval_size=cfg.data.eval_size, seed=cfg.seed
    )
    train, train_stats = tokenize_records(
        train_records, tokenizer, cfg.data.max_length, cfg.data.max_prompt_length
    )
    held_out, _ = tokenize_records(
        eval_records, tokenizer, cfg.data.max_length, cfg.data.max_prompt_length
    )
    if cfg.loss == "kto":
        cap = cfg.data.max_length
        train = attach_kl_responses(train, max_length=cap)
        held_out = attach_kl_responses(held_out, max_length=cap)
    elif not all(ex.chosen_ids is not None and ex.rejected_ids is not None for ex in train):
        raise ConfigError(
            f"loss {cfg.loss} needs paired data (chosen and rejected); unpaired data works "
            "only with loss=kto"
        )
    if not train:
        raise ConfigError("no training pairs left after tokenisation; raise data.max_length")
    return train, held_out, eval_records, train_stats


# ---------------------------------------------------------------------------------------------
# Log-probs of a micro-batch, and the reference's
# ---------------------------------------------------------------------------------------------


def batch_logps(
    model: torch.nn.Module,
    examples: list[TokenizedExample],
    pad_id: int,
    device: torch.device,
    with_kl: bool,
) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], int]:
    """One concatenated forward over every sequence of the micro-batch, each example's prompt
    run once for its chosen, rejected (and KL) responses.
    Returns {"chosen"|"rejected"|"kl": (sum_logps, n_tokens)} and the token count.
    Pairs without KL responses are packed several to a row (``trainers.core.pair_packing``) where
    the attention implementation allows it: the same numbers, almost no padding and no cache to
    gather."""
    packed = None if with_kl else pack_examples(examples, pad_id, model)
    if packed is not None and isinstance(model.get_output_embeddings(), torch.nn.Linear):
        sums, counts = packed_response_logps(model, packed.to(device))
        n = packed.n_pairs
        return {
            "chosen": (sums[:n], counts[:n]),
            "rejected": (sums[n:], counts[n:]),
        }, packed.n_tokens
    batch = collate_split(examples, pad_id, with_kl=with_kl)
    sums, counts = split_completion_logps(
        model,
        batch["input_ids"].to(device),
        batch["attention_mask"].to(device),
        batch["prompt_width"],
        batch["completion_mask"].to(device),
    )
    parts = {}
    for name in ("chosen", "rejected", "kl"):
        idx = batch.get(f"{name}_index")
        if idx is not None and len(idx) > 0:
            idx = idx.to(device)
            parts[name] = (sums[idx], counts[idx])
    return parts, int(batch["attention_mask"].sum())


def _present(examples: list[TokenizedExample], name: str) -> list[int]:
    attr = {"chosen": "chosen_ids", "rejected": "rejected_ids", "kl": "kl_response_ids"}[name]
    return [i for i, ex in enumerate(examples) if getattr(ex, attr) is not None]


@torch.no_grad()
def compute_reference_logps(
    model: torch.nn.Module,
    examples: list[TokenizedExample],
    pad_id: int,
    device: torch.device,
    batch_size: int,
    with_kl: bool,
) -> dict[str, torch.Tensor]:
    """Summed reference log-prob of every example's chosen / rejected / kl response (NaN where
    absent), as {"chosen": tensor(n), ...}."""
    model.eval()
    out = {k: torch.full((len(examples),), float("nan")) for k in ("chosen", "rejected", "kl")}
    for start in range(0, len(examples), batch_size):
        raise_if_stopping("reference_batch")
        chunk = examples[start : start + batch_size]
        parts, _ = batch_logps(model, chunk, pad_id, device, with_kl)
        for name, (sums, _) in parts.items():
            rows = torch.tensor(_present(chunk, name)) + start
            out[name][rows] = sums.float().cpu()
        phase_progress(start + len(chunk), len(examples))  # "reference log-probs 120/640"
    return out


# ---------------------------------------------------------------------------------------------
# Loss on one micro-batch
# ---------------------------------------------------------------------------------------------


def loss_params(cfg: DirectAlignmentConfig) -> LossParams:
    return LossParams(
        beta=cfg.beta,
        gamma=cfg.gamma,
        label_smoothing=cfg.label_smoothing,
        lambda_d=cfg.lambda_d,
        lambda_u=cfg.lambda_u,
        ipo_sum=cfg.ipo_sum,
    )


def micro_batch_loss(
    cfg: DirectAlignmentConfig,
    model: torch.nn.Module,
    examples: list[TokenizedExample],
    ids: list[int],
    ref: dict[str, torch.Tensor] | None,
    pad_id: int,
    device: torch.device,
) -> tuple[torch.Tensor, dict[str, Any], int]:
    """Loss and metrics of the examples at dataset indices ``ids``."""
    batch = [examples[i] for i in ids]
    parts, n_tokens = batch_logps(model, batch, pad_id, device, with_kl=cfg.loss == "kto")
    empty = torch.zeros(0, device=device)
    (c_sum, c_n), (r_sum, r_n) = (
        parts.get("chosen", (empty, empty)),
        parts.get("rejected", (empty, empty)),
    )

    def ref_of(name: str) -> torch.Tensor | None:
        rows = [ids[i] for i in _present(batch, name)]
        return ref[name][rows].to(device) if ref is not None else None

    inputs = LossInputs(
        chosen_logps=c_sum,
        rejected_logps=r_sum,
        chosen_tokens=c_n,
        rejected_tokens=r_n,
        ref_chosen_logps=ref_of("chosen"),
        ref_rejected_logps=ref_of("rejected"),
        paired=all(ex.chosen_ids is not None and ex.rejected_ids is not None for ex in batch),
    )
    if "kl" in parts:
        inputs.kl_logps, inputs.kl_tokens = parts["kl"]
        inputs.ref_kl_logps = ref_of("kl")
    loss, metrics = LOSSES[cfg.loss](inputs, loss_params(cfg))
    return loss, metrics, n_tokens


@torch.no_grad()
def evaluate(cfg, model, examples, ref, pad_id, device) -> dict[str, float]:
    model.eval()
    agg = StepMetrics()
    for start in range(0, len(examples), cfg.eval.eval_batch_size):
        raise_if_stopping("eval_batch")
        ids = list(range(start, min(start + cfg.eval.eval_batch_size, len(examples))))
        _, metrics, _ = micro_batch_loss(cfg, model, examples, ids, ref, pad_id, device)
        agg.add(metrics, weight=len(ids))
    model.train()
    return {f"eval/{k}": v for k, v in agg.mean().items()}
