"""One scorer for every family that reads a reward model: policy gradients (``reward.model``,
``reward.gold_model``), online DPO (``reward.model``), rejection sampling (``scorer.name``) and
evaluation (winrate, best_of_n).

    scorer = RewardScorer.from_pretrained("runs/orm-1/final_model")     # a reward-model run's
    scorer.score([[{"role": "user", "content": q}, {"role": "assistant", "content": a}], ...])
    scorer.score(["raw text scored as is", ...])                          # strings as they are
    scorer = RewardScorer.load(inspect_reward_model(name), policy_tokenizer=tokenizer)
    scorer.score_completions(PolicyCompletions(prompts, texts, prompt_ids, completion_ids, stops))

What a name may point to (:func:`inspect_reward_model` checks it before anything is written):

* a folder written by this project's reward-model trainer (``trainers/reward_models``: its
  ``final_model/`` holds the decoder, the tokenizer, ``reward_head.safetensors`` and
  ``reward_model.json``) of kind ``preference`` (the Bradley–Terry reward r) or ``orm``
  (P(correct) = σ(score)); a process RM (``prm``) scores steps, not completions, and is refused;
* any local folder or hub id of a sequence-classification checkpoint with one label
  (``*ForSequenceClassification`` in its config.json, ``num_labels`` 1): the raw logit.

What a score means: ``preference``, the Bradley–Terry reward r (only differences mean
something); ``orm``, P(correct) = σ(score at the last token); ``sequence_classification``, the
classifier's logit; ``prm`` (``score`` and ``score_steps`` only): items are
``{"problem": str, "steps": [str, ...]}`` and a solution's score is the smallest per-step
probability of "not bad" (one bad step spoils a solution), its windows as in training.

Conversations and texts (:meth:`RewardScorer.score`): a chat conversation is rendered with the
tokenizer's chat template exactly as in training (the last message is the assistant's answer);
a string is tokenised as is, without special tokens; an empty text is refused.

A policy's completions (:meth:`RewardScorer.score_completions`): the prompt's messages plus the
completion as the assistant turn,
rendered with the **reward model's** tokenizer and chat template, exactly as the reward-model
trainer renders a training pair (``add_generation_prompt=False``; ChatML ends with the newline
after ``<|im_end|>``). When the reward model's tokenizer is the policy's (same class, vocabulary,
special tokens and chat template), the policy's own token ids are reused: prompt ids + the
sampled completion ids without their end-of-turn token + the template's end of an assistant turn
(found once by rendering a probe); otherwise (or when the template does not render a prompt as a
prefix of the full conversation) the completion text is re-tokenised. A tokenizer without a chat
template gets the prompt text and the completion as a text pair (the encoder-RM convention).
Sequences longer than the model's ``max_length`` keep their last tokens (the score is read at
the end). Batches are sorted by length and right-padded; the model is frozen, in eval mode, on
the run's device, and runs under ``torch.inference_mode``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from trainers.core.config import ConfigError
from trainers.core.models import ModelError, load_tokenizer, resolve_model
from trainers.core.reward_model import (
    BAD_CLASS,
    HEAD_FILE,
    META_FILE,
    encode_solution,
    load_reward_model,
    window_solution,
)
from trainers.core.tokenization import (
    chat_template_ids,
    require_chat_template,
    right_pad,
    same_tokenizer,
    text_ids,
)

__all__ = [
    "SCORE_MEANING",
    "RewardModelInfo",
    "RewardScorer",
    "inspect_reward_model",
    "template_suffix",
]

RUN_REF_PREFIX = "run:"
SEQ_CLS_SUFFIX = "ForSequenceClassification"

SCORE_MEANING = {
    "preference": "Bradley–Terry reward r at the last token (only differences mean something)",
    "orm": "P(correct) = sigmoid of the head at the last token",
    "sequence_classification": "the classifier's single logit",
}


@dataclass(frozen=True)
class RewardModelInfo:
    """What :func:`inspect_reward_model` found: the config key, the name as given, the kind of
    scorer (``preference``, ``orm`` or ``sequence_classification``) and how to load it."""

    key: str
    name: str
    kind: str
    path: str | None  # local folder (None for a hub id)
    max_length: int | None

    @property
    def own(self) -> bool:
        """A folder written by this project's reward-model trainer."""
        return self.kind in ("preference", "orm")


def _config_error(key: str, name: str, why: str) -> ConfigError:
    return ConfigError(f"{key}={name!r}: {why}")


def _read_own_metadata(key: str, name: str, folder: Path) -> dict:
    try:
        meta = json.loads((folder / META_FILE).read_text())
    except (OSError, ValueError) as err:
        raise _config_error(key, name, f"{META_FILE} cannot be read ({err})") from None
    kind = meta.get("kind")
    if kind == "prm":
        raise _config_error(
            key,
            name,
            "a process reward model (kind prm) scores the steps of a solution, not a whole "
            "completion; pass a preference or orm reward-model run",
        )
    if kind not in ("preference", "orm") or meta.get("num_labels", 1) != 1:
        raise _config_error(
            key, name, f"{META_FILE} declares kind {kind!r}; expected preference or orm"
        )
    if not (folder / HEAD_FILE).is_file():
        raise _config_error(key, name, f"the reward head {HEAD_FILE} is missing from {folder}")
    return meta


def _hf_config(key: str, name: str, source: Any) -> Any:
    """The checkpoint's transformers config, loaded without weights (ConfigError naming the key
    when it cannot be loaded)."""
    from transformers import AutoConfig

    from trainers.core.models import _pretrained_args
    from trainers.core.tiny import quiet_hf

    try:
        first, kwargs = _pretrained_args(source, ("config.json",))
        kwargs.pop("gguf_file", None)
        with quiet_hf():
            return AutoConfig.from_pretrained(first, **kwargs)
    except (ModelError, OSError, ValueError, KeyError) as err:
        raise _config_error(key, name, f"its config cannot be loaded ({err})") from None


def inspect_reward_model(name: str, key: str = "reward.model") -> RewardModelInfo:
    """Check, before anything is written, that ``name`` is a scalar reward model whose config
    and tokenizer load here; raises :class:`ConfigError` naming ``key`` otherwise."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{key}: empty reward-model name")
    if name.startswith(RUN_REF_PREFIX):
        raise _config_error(
            key,
            name,
            "run:<id> references are resolved by the lab (rlhf-lab launch / launch_run); the "
            "trainer needs the folder itself, e.g. <runs root>/<id>/final_model",
        )
    try:
        source = resolve_model(name)
    except ModelError as err:
        raise _config_error(key, name, str(err)) from None
    folder = Path(source.path) if source.path is not None and source.kind == "local" else None
    if source.kind == "gguf":
        raise _config_error(key, name, "a .gguf file is a causal LM, not a reward model")
    if source.kind == "preset":
        raise _config_error(
            key,
            name,
            f"the preset {name!r} is a randomly initialised causal LM, not a reward model; "
            "train one first (trainers/reward_models, e.g. preference_rm on model.name=tiny) "
            "and pass its final_model/",
        )
    if folder is not None and (folder / META_FILE).is_file():
        meta = _read_own_metadata(key, name, folder)
        kind, max_length = meta["kind"], meta.get("max_length")
    else:
        config = _hf_config(key, name, source)
        architectures = list(getattr(config, "architectures", None) or [])
        if not any(a.endswith(SEQ_CLS_SUFFIX) for a in architectures):
            raise _config_error(
                key,
                name,
                f"not a reward model: its config.json declares {architectures or 'no'} "
                f"architecture(s) and there is no {META_FILE}. Pass a reward-model run's "
                "final_model/ (preference or orm) or a *ForSequenceClassification checkpoint "
                "with one label",
            )
        if getattr(config, "num_labels", 1) != 1:
            raise _config_error(
                key,
                name,
                f"a sequence classifier with {config.num_labels} labels is not a scalar reward "
                "model (num_labels must be 1)",
            )
        kind = "sequence_classification"
        max_length = getattr(config, "max_position_embeddings", None)
    try:
        load_tokenizer(name)
    except Exception as err:  # noqa: BLE001 - any failure means the tokenizer is unusable
        raise _config_error(
            key, name, f"its tokenizer cannot be loaded ({type(err).__name__}: {err})"
        ) from None
    return RewardModelInfo(
        key=key,
        name=name,
        kind=kind,
        path=str(folder) if folder is not None else None,
        max_length=int(max_length) if isinstance(max_length, int) and max_length > 0 else None,
    )


# ---------------------------------------------------------------------------------------------
# Tokenisation
# ---------------------------------------------------------------------------------------------

_PROBE = "Zq7 probe"


def template_suffix(tokenizer: Any) -> list[int] | None:
    """The ids the chat template puts after an assistant turn's content (ChatML:
    ``<|im_end|>``, ``\\n``), when the template renders the generation prompt + content as a
    prefix of the full conversation; None when it does not (then texts are re-tokenised)."""
    if getattr(tokenizer, "chat_template", None) is None:
        return None
    user = [{"role": "user", "content": "Hello there."}]
    try:
        prompt = tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
        full = tokenizer.apply_chat_template(
            [*user, {"role": "assistant", "content": _PROBE}],
            add_generation_prompt=False,
            tokenize=False,
        )
    except Exception:  # noqa: BLE001 - a template that cannot render this: re-tokenise
        return None
    head = prompt + _PROBE
    if not full.startswith(head):
        return None
    tail = full[len(head) :]
    return text_ids(tokenizer, tail) if tail else []


def _pair_text(prompt: list[dict]) -> str:
    """A prompt as plain text for a tokenizer without a chat template."""
    return "\n\n".join(m["content"] for m in prompt if m["content"])


@dataclass(frozen=True)
class PolicyCompletions:
    """A policy's completions to score: each one's prompt (its messages) and text; with the
    policy's token ids (the prompt's, the sampled completion's and the policy's end-of-turn
    ids) a reward model that shares the policy's tokenizer reuses them (see the module doc)."""

    prompts: list[list[dict]]
    texts: list[str]
    prompt_ids: list[list[int]] | None = None
    completion_ids: list[list[int]] | None = None
    stop_ids: set[int] | None = None


# ---------------------------------------------------------------------------------------------
# The scorer
# ---------------------------------------------------------------------------------------------


class RewardScorer:
    """A reward model that scores texts, conversations, PRM solutions (:meth:`score`) or a
    policy's completions (:meth:`score_completions`); see the module doc. Scores are read
    batched (sorted by length, right-padded) under ``torch.inference_mode`` with the model in
    eval mode (its training mode restored afterwards), and come back in the input order.

    ``RewardScorer(model, tokenizer)`` wraps a :class:`~trainers.core.reward_model.RewardModel`
    in memory; :meth:`from_pretrained` loads a reward-model run's folder; :meth:`load` loads
    whatever :func:`inspect_reward_model` accepted (a sequence classifier too), frozen, and
    reuses the policy's token ids when ``policy_tokenizer`` is the reward model's own."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        batch_size: int = 16,
        *,
        info: RewardModelInfo | None = None,
        policy_tokenizer: Any = None,
    ):
        self.model, self.tokenizer = model, tokenizer
        self.batch_size = batch_size
        self.info = info
        self.own = info is None or info.own  # a RewardModel (else a sequence classifier)
        self.kind = model.kind if info is None else info.kind
        self.max_length = model.max_length if self.own else info.max_length
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.suffix = None
        if policy_tokenizer is not None and same_tokenizer(policy_tokenizer, tokenizer):
            self.suffix = template_suffix(tokenizer)
        self.reuse_ids = self.suffix is not None

    @classmethod
    def from_pretrained(
        cls,
        folder: str | Path,
        *,
        device="auto",
        dtype="auto",
        attn_implementation: str = "auto",
        batch_size: int = 16,
    ) -> RewardScorer:
        """A folder written by the reward-model trainer (any kind, PRM included)."""
        model, tokenizer = load_reward_model(
            folder, device=device, dtype=dtype, attn_implementation=attn_implementation
        )
        return cls(model, tokenizer, batch_size=batch_size)

    @classmethod
    def load(
        cls,
        info: RewardModelInfo,
        *,
        device: Any = "auto",
        dtype: Any = "auto",
        attn_implementation: str = "auto",
        batch_size: int = 16,
        policy_tokenizer: Any = None,
    ) -> RewardScorer:
        """The scalar reward model :func:`inspect_reward_model` found, frozen, in eval mode."""
        from trainers.core.models import pick_device

        device = pick_device(device)
        if info.own:
            model, tokenizer = load_reward_model(
                info.path, device=device, dtype=dtype, attn_implementation=attn_implementation
            )
        else:
            model, tokenizer = _load_sequence_classifier(info, device, dtype, attn_implementation)
        model.eval()
        model.requires_grad_(False)
        return cls(model, tokenizer, batch_size, info=info, policy_tokenizer=policy_tokenizer)

    # ---- ids ---------------------------------------------------------------------------------

    def _truncate(self, sequences: list[list[int]]) -> list[list[int]]:
        limit = self.max_length
        return [ids[-limit:] if limit else ids for ids in sequences]

    def encode(self, items: Sequence[str | list[dict]]) -> list[list[int]]:
        """Token ids of each text (as is) or chat conversation (chat template)."""
        ids: list[list[int] | None] = [None] * len(items)
        convs = [(i, x) for i, x in enumerate(items) if isinstance(x, list)]
        for i, x in enumerate(items):
            if isinstance(x, str):
                ids[i] = text_ids(self.tokenizer, x)
            elif not isinstance(x, list):
                raise TypeError(
                    f"score() takes strings or chat conversations (lists of messages), got "
                    f"{type(x).__name__}"
                )
        if convs:
            require_chat_template(
                self.tokenizer,
                "reward models format prompts with apply_chat_template. Use a tokenizer with "
                "one or set tokenizer.chat_template.",
            )
            encoded = chat_template_ids(
                self.tokenizer, [c for _, c in convs], add_generation_prompt=False
            )
            for (i, _), e in zip(convs, encoded, strict=True):
                ids[i] = e
        if any(not seq for seq in ids):
            raise ValueError("cannot score an empty text")
        return self._truncate(ids)

    def encode_completions(self, batch: PolicyCompletions) -> list[list[int]]:
        """The reward model's input ids of each (prompt, completion)."""
        prompts, texts = batch.prompts, batch.texts
        if self.reuse_ids and batch.prompt_ids is not None and batch.completion_ids is not None:
            stops = batch.stop_ids or set()
            out = []
            for p, c in zip(batch.prompt_ids, batch.completion_ids, strict=True):
                body = list(c[:-1]) if c and c[-1] in stops else list(c)
                out.append(list(p) + body + list(self.suffix or []))
        elif getattr(self.tokenizer, "chat_template", None) is not None:
            conversations = [
                [*p, {"role": "assistant", "content": t}]
                for p, t in zip(prompts, texts, strict=True)
            ]
            out = chat_template_ids(self.tokenizer, conversations, add_generation_prompt=False)
        else:
            out = [
                list(self.tokenizer(_pair_text(p), t)["input_ids"])
                for p, t in zip(prompts, texts, strict=True)
            ]
        return self._truncate(out)

    # ---- scores ------------------------------------------------------------------------------

    @torch.inference_mode()
    def raw_scores(self, sequences: list[list[int]]) -> Tensor:
        """The scalar at the last token of each id sequence (N,), float32 on the CPU."""
        if self.own and self.model.num_labels != 1:
            raise ValueError("raw_scores needs a scalar reward model (preference or orm)")
        if not sequences:
            return torch.zeros(0)
        device = self.model.device
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
        out = torch.zeros(len(sequences), dtype=torch.float32)
        was_training = self.model.training
        self.model.eval()
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            ids, mask = right_pad([sequences[i] or [self.pad_id] for i in chunk], self.pad_id)
            ids, mask = ids.to(device), mask.to(device)
            if self.own:
                s = self.model.sequence_scores(ids, mask)
            else:
                s = self.model(input_ids=ids, attention_mask=mask).logits[:, 0]
            out[torch.tensor(chunk)] = s.float().cpu()
        self.model.train(was_training)
        return out.clone()  # an ordinary tensor (inference-mode tensors refuse in-place edits)

    def score(self, items: Sequence[Any]) -> list[float]:
        """One float per text, conversation or (PRM) solution; see the module doc."""
        items = list(items)
        if not items:
            return []
        if self.kind == "prm":
            return [min(1.0 - p[BAD_CLASS] for p in probs) for probs in self._prm_items(items)]
        scores = self.raw_scores(self.encode(items)).tolist()
        if self.kind == "orm":
            return torch.sigmoid(torch.tensor(scores, dtype=torch.float64)).tolist()
        return scores

    def score_completions(self, batch: PolicyCompletions) -> Tensor:
        """One reward per completion of a policy (float32, CPU): see :data:`SCORE_MEANING`."""
        raw = self.raw_scores(self.encode_completions(batch))
        return torch.sigmoid(raw) if self.kind == "orm" else raw

    # ---- a PRM's steps -----------------------------------------------------------------------

    def _prm_items(self, items: Sequence[Any]) -> list[list[list[float]]]:
        for x in items:
            if not (isinstance(x, dict) and "problem" in x and "steps" in x):
                raise TypeError('a PRM scores items {"problem": str, "steps": [str, ...]}')
        return self.score_steps([x["problem"] for x in items], [x["steps"] for x in items])

    def _prm_windows(self, problems: Sequence[str], solutions: Sequence[Sequence[str]]) -> list:
        """(solution index, first step, ids, positions) of every window of every solution."""
        limit = self.model.max_length or 10**9
        windows = []
        for s_idx, (problem, steps) in enumerate(zip(problems, solutions, strict=True)):
            if not steps:
                raise ValueError(f"solution {s_idx} has no steps")
            prompt, pieces = encode_solution(
                self.tokenizer, problem, list(steps), self.model.separator
            )
            if len(prompt) > limit // 2:  # an over-long problem keeps its end
                prompt = prompt[-(limit // 2) :]
            budget = limit - len(prompt)
            pieces = [p[-budget:] for p in pieces]  # an over-long step keeps its end
            found, _ = window_solution(prompt, pieces, limit)
            windows += [(s_idx, first, ids, pos) for ids, pos, first, _ in found]
        return windows

    @torch.no_grad()
    def score_steps(
        self, problems: Sequence[str], solutions: Sequence[Sequence[str]]
    ) -> list[list[list[float]]]:
        """Per solution, per step: class probabilities ([bad, neutral, good] or [bad, good])."""
        if self.kind != "prm":
            raise ValueError(f"score_steps needs a prm reward model, this one is {self.kind}")
        if self.model.separator is None:
            raise ValueError("the saved PRM has no step separator in reward_model.json")
        windows = self._prm_windows(problems, solutions)
        was_training = self.model.training
        self.model.eval()
        out: list[list[list[float]]] = [[[] for _ in steps] for steps in solutions]
        for start in range(0, len(windows), self.batch_size):
            chunk = windows[start : start + self.batch_size]
            ids, mask = right_pad([w[2] for w in chunk], self.pad_id)
            logits = self.model(ids.to(self.model.device), mask.to(self.model.device))
            for row, (s_idx, first, _, positions) in enumerate(chunk):
                probs = torch.softmax(logits[row, positions].float(), dim=-1).cpu().tolist()
                for j, p in enumerate(probs):
                    out[s_idx][first + j] = p
        self.model.train(was_training)
        return out


def _load_sequence_classifier(info: RewardModelInfo, device, dtype, attn_implementation):
    """A ``*ForSequenceClassification`` checkpoint with one label, and its tokenizer."""
    from transformers import AutoModelForSequenceClassification

    from trainers.core.models import _pretrained_args, pick_attn_implementation, pick_dtype
    from trainers.core.tiny import quiet_hf

    torch_dtype = pick_dtype(dtype, device)
    attn = pick_attn_implementation(attn_implementation, device, torch_dtype)
    source = resolve_model(info.name)
    first, kwargs = _pretrained_args(source, ("config.json",))
    with quiet_hf():
        model = AutoModelForSequenceClassification.from_pretrained(
            first, dtype=torch_dtype, attn_implementation=attn, **kwargs
        )
    model.to(device)
    tokenizer = load_tokenizer(info.name)
    if model.config.pad_token_id is None:  # HF reads the last non-pad token by pad id
        model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer
