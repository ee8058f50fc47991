"""Checks of the policy-gradient trainer run inside the ranks torchrun started (through
``dist_driver.py``: ``{"call": "pg_dist_driver:NAME", "args": [...]}``), and on one process by
the tests themselves: the same function, the same global batch.

* :func:`fixed_update` — one rollout step's update on FIXED rollouts (the same global batch on
  every rank, each rank taking its whole groups): losses, metrics, advantages, the updated
  weights.
* :func:`dapo_refill` — DAPO's dynamic sampling with a rollout whose groups' correctness is
  fixed per prompt: how many rounds each rank drew and which groups it kept.
* :func:`unequal_generation` — sampling on an FSDP2-sharded model where the ranks decode
  different numbers of tokens (different forward counts), then a sharded update.
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "trainers" / "policy_gradients" / "configs"
P, G = 4, 2  # prompts per step, rollouts per prompt: 8 sequences, 2 groups per rank on 2 ranks

FIXED = {
    # algorithm: overrides (beyond the micro-batch, set per world size)
    "grpo": ["loss.beta=0.05", "loss.updates_per_rollout=2"],
    "ppo": ["loss.beta=0.05"],
    "dapo": [],
    "reinforce_pp": ["loss.beta=0.05"],
}


def config(algorithm: str, world_size: int, extra: list[str] = ()):
    from trainers.core.config import load_config
    from trainers.policy_gradients.config import PolicyGradientConfig

    over = [
        "model.name=tiny",
        "model.gradient_checkpointing=false",
        "model.device=cpu",
        "model.dtype=fp32",
        "data.size=16",
        f"rollout.prompts_per_step={P}",
        f"rollout.num_rollouts={G}",
        "rollout.max_new_tokens=8",
        # one optimizer step per pass over the batch (4 sequences a rank x 2 ranks = 8)
        f"train.batch_size={4 // world_size}",
        "train.gradient_accumulation_steps=2",
        "train.learning_rate=1.0e-3",
        "train.max_grad_norm=1.0e9",
        *FIXED.get(algorithm, []),
        *extra,
    ]
    return load_config(CONFIGS / f"{algorithm}.yaml", PolicyGradientConfig, over)


def untruncated_experience(prompt_rows, completion_rows, owners, texts, rewards):
    """A rollout batch of these token rows (padded with 0), none cut at the token limit: each
    sequence's prompt (a ``Prompt``), text and rewards (name -> tensor, one value a sequence)."""
    import torch

    from trainers.policy_gradients.experience import Experience, assemble

    ids, attn, lens, cmask = assemble(prompt_rows, completion_rows, pad_id=0)
    return Experience(
        input_ids=ids,
        attention_mask=attn,
        prompt_lens=lens,
        completion_mask=cmask,
        truncated=torch.zeros(len(completion_rows), dtype=torch.bool),
        texts=texts,
        prompts=owners,
        rewards=rewards,
    )


def fixed_experience(seed: int = 5):
    """A rollout batch of P groups of G sequences: random prompt and completion tokens of
    unequal lengths, graded rewards with contrast in each group (the same on every rank)."""
    import torch

    from trainers.core.records import Prompt

    g = torch.Generator().manual_seed(seed)
    prompts, completions, owners = [], [], []
    for p in range(P):
        prompt = torch.randint(10, 900, (3 + p,), generator=g).tolist()
        owner = Prompt(
            messages=[{"role": "user", "content": f"q{p}"}], question=f"q{p}", answer="", meta={}
        )
        for _ in range(G):
            length = int(torch.randint(2, 9, (1,), generator=g))
            completions.append(torch.randint(10, 900, (length,), generator=g).tolist())
            prompts.append(prompt)
            owners.append(owner)
    n = len(completions)
    correct = torch.tensor([float((i * 7 + i // G) % 3 == 0) for i in range(n)])
    total = correct + 0.1 * torch.rand(n, generator=g)
    rewards = {"total": total, "correctness": correct, "binary": correct}
    return untruncated_experience(
        prompts, completions, owners, [f"t{i}" for i in range(n)], rewards
    )


def fixed_update(algorithm: str, out_path: str | None = None) -> dict:
    """prepare_update + update on this rank's groups of :func:`fixed_experience`; rank 0
    saves (or returns) the update's metrics, the rollout-side info, every rank's advantages
    in order and the updated weights (policy, and PPO's value model)."""
    import torch

    from trainers.core import distributed as D
    from trainers.core.models import load_causal_lm
    from trainers.core.training import build_optimizer, seed_everything
    from trainers.policy_gradients import train as pg_train
    from trainers.policy_gradients.rollout import prepare_update
    from trainers.policy_gradients.token_passes import load_value_model

    D.init_from_env("cpu")
    w = D.world()
    cfg = config(algorithm, w.size)
    seed_everything(cfg.seed)
    cpu = torch.device("cpu")
    load = dict(device=cpu, dtype=torch.float32, attn_implementation="eager")
    policy = D.shard_model(load_causal_lm("tiny", trainable=True, **load))
    ref = D.shard_model(load_causal_lm("tiny", trainable=False, **load)) if cfg.uses_kl else None
    value = None
    params = [p for p in policy.parameters() if p.requires_grad]
    if cfg.spec.needs_value_model:
        value = D.shard_model(load_value_model("tiny", **load))
        value.train()
        params += [p for p in value.parameters() if p.requires_grad]
    steps = cfg.loss.updates_per_rollout * pg_train.optimizer_steps_per_update(cfg, w.size)
    optimizer, scheduler = build_optimizer(params, cfg.train, steps)
    whole = fixed_experience()
    mine = whole.select(D.rank_chunk(list(range(whole.num_sequences))))
    exp, info = prepare_update(mine, cfg, policy, ref, value, cpu)
    metrics = pg_train.update(cfg, policy, value, optimizer, scheduler, params, exp, 0, cpu)
    width = whole.completion_mask.shape[1]
    adv = torch.zeros(exp.num_sequences, width)
    adv[:, : exp.advantages.shape[1]] = exp.advantages
    advantages = torch.cat(D.gather_objects(adv))
    weights = {}
    for label, module in (("policy", policy), ("value", value)):
        if module is None:
            continue
        whole = D.full_state_dict(module) or {}
        for name in D.tied_names(module):  # stored once, as a consolidated folder does
            whole.pop(name, None)
        weights.update({f"{label}/{k}": v for k, v in whole.items()})
    result = {
        "metrics": metrics,
        "info": info,
        "advantages": advantages,
        "weights": weights,
        "optimizer_steps": steps,
    }
    if out_path is None:
        return result
    if w.is_main:
        torch.save(result, out_path)
    return 0


# ---------------------------------------------------------------------------------------------
# DAPO's refill
# ---------------------------------------------------------------------------------------------

# correctness of each prompt's G rollouts, by prompt index: contrast (kept) or all equal
KEPT_PATTERN = {0: (1.0, 0.0), 3: (0.0, 1.0), 5: (1.0, 0.0), 6: (0.0, 1.0), 9: (1.0, 0.0)}


def _pattern_draw(rounds: list[list[int]]):
    import torch

    def draw(prompts):
        idx = [int(p.messages[-1]["content"][1:]) for p in prompts]
        rounds.append(idx)
        correct = [c for i in idx for c in KEPT_PATTERN.get(i, (0.0,) * G)]
        exp = untruncated_experience(
            [[5 + i] for i in idx for _ in range(G)],
            [[7]] * len(correct),
            [p for p in prompts for _ in range(G)],
            [f"p{i}" for i in idx for _ in range(G)],
            {"correctness": torch.tensor(correct), "total": torch.tensor(correct)},
        )
        return exp

    return draw


def dapo_refill(out_path: str | None = None, max_draw_factor: int = 8) -> dict:
    """DAPO's rollout step with :data:`KEPT_PATTERN` correctness, prompts in the stream's
    order 0, 1, 2 ...: what each rank drew, kept, and whether it gave up (raised)."""
    from trainers.core import distributed as D
    from trainers.core.prompts import PromptStream
    from trainers.core.records import Prompt
    from trainers.policy_gradients.rollout import DynamicSamplingError, rollout_step

    class Tok:
        pad_token_id = 0

    D.init_from_env("cpu")
    cfg = config("dapo", D.world().size, [f"loss.max_draw_factor={max_draw_factor}"])
    prompts = [
        Prompt(
            messages=[{"role": "user", "content": f"q{i}"}], question=f"q{i}", answer="", meta={}
        )
        for i in range(16)
    ]
    stream = PromptStream(16, cfg.seed)
    stream._order, stream._order_epoch = list(range(16)), 0  # the stream in index order
    rounds: list[list[int]] = []
    result: dict = {"rank": D.world().rank}
    try:
        exp, info = rollout_step(None, Tok(), stream, prompts, cfg, draw=_pattern_draw(rounds))
        result.update(kept=exp.texts, groups_kept=info.groups_kept, drawn=info.prompts_drawn)
    except DynamicSamplingError as err:
        result["raised"] = str(err)
    result["rounds"] = rounds
    everyone = D.gather_objects(result)
    if out_path is None:
        return everyone[0]
    if D.world().is_main:
        Path(out_path).write_text(json.dumps(everyone))
    return 0


# ---------------------------------------------------------------------------------------------
# Generation on a sharded model, ranks decoding different lengths
# ---------------------------------------------------------------------------------------------


def unequal_generation(out_path: str) -> int:
    """Rank r samples ``2 + 9r`` new tokens for ``1 + 2r`` prompts (no stop token), so the ranks
    run different numbers of forward passes; then a sharded forward/backward and a collective.
    A forward that needed a collective per token would hang here (the test's timeout)."""
    import torch

    from trainers.core import distributed as D
    from trainers.core.decoding import Sampling, sample_tokens
    from trainers.core.models import load_causal_lm
    from trainers.policy_gradients.generation import generate_group_batch

    D.init_from_env("cpu")
    rank = D.world().rank
    torch.manual_seed(D.rank_seed(3))
    model = D.shard_model(
        load_causal_lm(
            "tiny",
            device=torch.device("cpu"),
            dtype=torch.float32,
            attn_implementation="eager",
            trainable=True,
        )
    )
    calls = []
    hook = model.register_forward_hook(lambda *_: calls.append(1))
    model.eval()
    rows = sample_tokens(
        model,
        [[11 + k, 12, 13] for k in range(1 + 2 * rank)],
        max_new_tokens=2 + 9 * rank,
        stop_ids=set(),
        pad_id=0,
        sampling=Sampling(temperature=1.0),
    )
    forwards = len(calls)
    hook.remove()
    # the rollout path itself: the tiny tokenizer's prompts, G rollouts each, unequal max tokens
    from trainers.core.models import load_tokenizer
    from trainers.core.records import Prompt

    cfg = config("grpo", D.world().size, [f"rollout.max_new_tokens={3 + 5 * rank}"])
    tok = load_tokenizer("tiny")
    prompts = [
        Prompt(
            messages=[{"role": "user", "content": f"add {k} and {rank}"}],
            question="",
            answer="",
            meta={},
        )
        for k in range(2)
    ]
    batch = generate_group_batch(model, tok, prompts, cfg)
    model.train()
    loss = model(input_ids=torch.tensor([[5, 6, 7, 8]])).logits.float().pow(2).mean()
    loss.backward()
    total = D.sum_over_ranks(float(loss))
    report = D.gather_objects(
        {
            "rank": rank,
            "forwards": forwards,
            "lengths": [len(r) for r in rows],
            "rollouts": batch.num_sequences,
            "loss_sum": total,
        }
    )
    if D.world().is_main:
        Path(out_path).write_text(json.dumps(report))
    return 0


# ---------------------------------------------------------------------------------------------
# A short GRPO run (train() itself) with a reward the random tiny model can learn
# ---------------------------------------------------------------------------------------------

LEARN_STEPS = 10


def upper_rewards(texts, metas, lengths, *, format_weight=0.5, penalty=None):
    """A reward a randomly initialised model can learn within a few steps: the share of the
    completion's characters that are capital letters (rollouts differ, so groups have
    contrast)."""
    import torch

    share = torch.tensor([sum(c.isupper() for c in t) / max(1, len(t)) for t in texts])
    zero = torch.zeros(len(texts))
    return {"correctness": share, "format": zero, "penalty": zero, "binary": zero, "total": share}


def learn_overrides(world_size: int) -> list[str]:
    return [
        "model.name=tiny",
        "model.gradient_checkpointing=false",
        "model.device=cpu",
        "model.dtype=fp32",
        "data.size=64",
        "data.eval_size=2",
        "rollout.prompts_per_step=4",
        "rollout.num_rollouts=4",
        "rollout.max_new_tokens=8",
        "rollout.temperature=1.0",
        "rollout.top_k=0",
        "rollout.top_p=1.0",
        f"train.batch_size={8 // world_size}",
        "train.gradient_accumulation_steps=2",
        "train.learning_rate=2.0e-2",
        f"train.max_steps={LEARN_STEPS}",
        "loss.beta=0.02",
        "eval.eval_every=0",
        "eval.sample_every=4",
        "eval.num_samples=1",
        "checkpoint.save_every=4",
        "checkpoint.save_final_model=false",
    ]


def pg_run(
    algorithm: str, run_dir: str, world_size: int = 2, extra: list[str] = (), resume: bool = False
) -> int:
    """pg_train.main on ``algorithm``'s config with :func:`upper_rewards` as the verifier."""
    from trainers.policy_gradients import train as pg_train

    argv = ["--config", str(CONFIGS / f"{algorithm}.yaml"), "--run-dir", run_dir]
    argv += ["--resume"] if resume else []
    for item in [*learn_overrides(world_size), *extra]:
        argv += ["--set", item]
    return pg_train.main.with_options(verifier=upper_rewards)(argv)
