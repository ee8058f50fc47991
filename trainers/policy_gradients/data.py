"""Prompts for policy-gradient runs: a seeded reasoning-gym ``composite`` of ``data.specs``.

Each prompt is the chat ``[system: SYSTEM_PROMPT, user: question]`` plus what scoring needs
(``meta = {"task", "entry"}``: reasoning-gym scores an answer against its own entry). The
held-out split is drawn from the same task mixture with a different seed, and any question that
also appears in the training prompts is dropped from it.

Training prompts are served by :class:`PromptStream`: one seeded permutation per epoch, consumed
``prompts_per_step`` at a time (a short tail is dropped, as a ``drop_last`` loader would), with a
position that a checkpoint can save and restore.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainers.core.config import ConfigError
from trainers.core.tasks import SYSTEM_PROMPT, import_reasoning_gym

HELD_OUT_SEED_OFFSET = 1_000_003  # held-out items come from a different composite seed


@dataclass
class Prompt:
    messages: list[dict]  # [system, user]
    question: str
    answer: str  # the oracle answer (for samples.jsonl; scoring uses meta)
    meta: dict = field(repr=False)  # {"task": reasoning-gym task, "entry": the item}


def build_composite(specs, size: int, seed: int):
    """``reasoning_gym.create_dataset("composite", ...)``; bad specs raise ConfigError."""
    rg = import_reasoning_gym()
    from reasoning_gym.composite import DatasetSpec

    datasets = [DatasetSpec(name=s.name, weight=s.weight, config=dict(s.config)) for s in specs]
    try:
        return rg.create_dataset("composite", size=size, seed=seed, datasets=datasets)
    except (ValueError, TypeError, AssertionError, KeyError) as err:
        known = ""
        if "not registered" in str(err):
            from reasoning_gym.factory import DATASETS

            known = f" Known tasks include: {', '.join(sorted(DATASETS)[:30])}, ..."
        raise ConfigError(
            f"data.specs: reasoning-gym could not build the task mixture "
            f"({type(err).__name__}: {err}).{known}"
        ) from None


def to_prompt(item: dict) -> Prompt:
    question = str(item["question"]).strip()
    task = item["metadata"]["source_dataset"]
    return Prompt(
        messages=[
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": question},
        ],
        question=question,
        answer=str(item["answer"]),
        meta={"task": task, "entry": item},
    )


def load_prompts(specs, size: int, eval_size: int, seed: int) -> tuple[list[Prompt], list[Prompt]]:
    """(training prompts, held-out prompts). Held-out questions never occur in training."""
    train_ds = build_composite(specs, size, seed)
    train = [to_prompt(train_ds[i]) for i in range(size)]
    held_out: list[Prompt] = []
    if eval_size > 0:
        seen = {p.question for p in train}
        pool_size = 4 * eval_size + 16
        pool = build_composite(specs, pool_size, seed + HELD_OUT_SEED_OFFSET)
        for i in range(pool_size):
            prompt = to_prompt(pool[i])
            if prompt.question not in seen:
                seen.add(prompt.question)
                held_out.append(prompt)
                if len(held_out) == eval_size:
                    break
    return train, held_out


def check_specs(specs) -> None:
    """Preflight: build a one-item mixture so an unknown task or bad setting fails early."""
    ds = build_composite(specs, 1, 0)
    try:
        ds[0]
    except Exception as err:  # noqa: BLE001 - reasoning-gym raises many kinds
        raise ConfigError(
            f"data.specs: reasoning-gym could not generate an item ({type(err).__name__}: {err})"
        ) from None


class PromptStream:
    """Training prompts in a seeded order, ``n`` at a time, epoch after epoch."""

    def __init__(self, n_prompts: int, seed: int, epoch: int = 0, index: int = 0):
        self.n_prompts, self.seed = n_prompts, seed
        self.epoch, self.index = epoch, index
        self._order_epoch: int | None = None
        self._order: list[int] = []

    def _order_of(self, epoch: int) -> list[int]:
        if self._order_epoch != epoch:
            from trainers.core.training import epoch_order

            self._order, self._order_epoch = epoch_order(self.n_prompts, self.seed, epoch), epoch
        return self._order

    def take(self, n: int) -> list[int]:
        """The next ``n`` prompt indices (never straddling an epoch boundary)."""
        if n > self.n_prompts:
            raise ValueError(f"cannot take {n} prompts from {self.n_prompts}")
        if self.index + n > self.n_prompts:
            self.epoch, self.index = self.epoch + 1, 0
        ids = self._order_of(self.epoch)[self.index : self.index + n]
        self.index += n
        return ids

    def state(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}

    @classmethod
    def from_state(cls, n_prompts: int, seed: int, state: dict) -> PromptStream:
        return cls(n_prompts, seed, epoch=int(state["epoch"]), index=int(state["index"]))
