"""Runs several trainer invocations one after another inside the processes torchrun started
(one start-up for several runs: importing torch and transformers dominates a tiny run here).

    torchrun --nproc-per-node 2 tests/trainers/core/dist_driver.py SPEC.json

SPEC.json: a list of {"module": "trainers.sft.train", "argv": [...], "env": {...},
"rank_env": {"1": {...}}} (a trainer's own ``main(argv)``, exactly as ``python -m`` runs it;
``env`` for that invocation only, ``rank_env`` on one rank only) or {"call": "dist_driver:NAME",
"args": [...]} (a check below). Rank 0 writes the exit codes to ``SPEC.json.codes``, another
rank r to ``SPEC.json.codes.rank<r>``. A trainer
that fails ends the process with its code, as ``python -m`` would (torchrun then stops the
other rank).
"""

from __future__ import annotations

import importlib
import json
import os
import sys


def main(spec_path: str) -> int:
    specs = json.loads(open(spec_path).read())
    codes = []
    rank = os.environ.get("RANK", "0")
    for spec in specs:
        env = {**spec.get("env", {}), **spec.get("rank_env", {}).get(rank, {})}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            if "call" in spec:
                module, _, name = spec["call"].partition(":")
                code = getattr(importlib.import_module(module), name)(*spec.get("args", []))
            else:
                code = importlib.import_module(spec["module"]).main(spec["argv"])
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        codes.append(code)
        # every rank writes its codes, whole file or none: torchrun may kill a rank right after
        # another one failed (rank 0 may then never write the failed run's code)
        out = spec_path + ".codes" + ("" if rank == "0" else f".rank{rank}")
        with open(out + ".tmp", "w") as f:
            json.dump(codes, f)
        os.replace(out + ".tmp", out)
        if code not in (0, 143):
            return code
    return 0


# ---------------------------------------------------------------------------------------------
# Checks run inside the ranks
# ---------------------------------------------------------------------------------------------

GRAD_BATCH_SEED = 11


def grad_model():
    import torch

    from trainers.core.models import load_causal_lm

    return load_causal_lm(
        "tiny",
        device=torch.device("cpu"),
        dtype=torch.float32,
        attn_implementation="eager",
        trainable=True,
    )


def _batch():
    import torch

    g = torch.Generator().manual_seed(GRAD_BATCH_SEED)
    return torch.randint(5, 1000, (4, 12), generator=g)


GRAD_BATCH = _batch()


def sequence_losses(model, batch):
    """Mean token cross-entropy of each sequence (B,)."""
    import torch.nn.functional as F

    logits = model(input_ids=batch).logits[:, :-1].float()
    nll = F.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none")
    return nll.mean(dim=1)


def mean_loss(model, batch):
    """The objective: the mean over the batch's sequences (one process, whole batch)."""
    return sequence_losses(model, batch).mean()


def gradient_check(out_path: str) -> int:
    """Each rank back-propagates its share of the global mean (its sequences' sum / 4); rank 0
    saves the whole gradient of every parameter."""
    import torch

    from trainers.core import distributed as D

    D.init_from_env("cpu")
    model = grad_model()
    D.shard_model(model)
    mine = GRAD_BATCH[D.rank_share(list(range(len(GRAD_BATCH))))]
    (sequence_losses(model, mine).sum() / len(GRAD_BATCH)).backward()
    grads = {}
    for name, p in model.named_parameters():
        grads[name] = D.local_value(p.grad).detach().clone()
    if D.world().is_main:
        torch.save(grads, out_path)
    return 0


def bf16_step(out_path: str) -> int:
    """One optimizer step of a 2-rank FSDP2 model with the CUDA policy (bf16 params, fp32
    reductions) next to the same step in fp32: losses and gradient norms."""
    import torch

    from trainers.core import distributed as D
    from trainers.core.config import OptimSection
    from trainers.core.training import build_optimizer, optimizer_step

    D.init_from_env("cpu")
    result = {}
    mine = GRAD_BATCH[D.rank_share(list(range(len(GRAD_BATCH))))]
    for label, compute in (("fp32", None), ("bf16", torch.bfloat16)):
        D.world().mixed_precision = compute
        model = grad_model()
        D.shard_model(model)
        seen = []
        layer = D.decoder_layers(model)[0]
        hook = layer.mlp.down_proj.register_forward_hook(
            lambda m, i, o, seen=seen: seen.append(str(m.weight.dtype))
        )
        optimizer, scheduler = build_optimizer(model.parameters(), OptimSection(), 2)
        loss = sequence_losses(model, mine).sum() / len(GRAD_BATCH)
        loss.backward()
        grad_norm, _ = optimizer_step(model.parameters(), optimizer, scheduler, None)
        hook.remove()
        result[f"{label}_loss"] = D.sum_over_ranks(float(loss))
        result[f"{label}_grad_norm"] = grad_norm
        if compute is not None:
            result["param_dtype_in_forward"] = seen[0]
            result["sharded_param_dtype"] = str(next(model.parameters()).dtype)
    D.world().mixed_precision = None
    if D.world().is_main:
        with open(out_path, "w") as f:
            json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
