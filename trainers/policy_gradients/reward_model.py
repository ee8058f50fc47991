"""Rewards from a trained reward model (``reward.model``) and the held-out gold reward model
(``reward.gold_model``).

What a name may point to (:func:`inspect_reward_model` checks it before anything is written):

* a folder written by this project's reward-model trainer (``trainers/reward_models``: its
  ``final_model/`` holds the decoder, the tokenizer, ``reward_head.safetensors`` and
  ``reward_model.json``) of kind ``preference`` (the Bradley–Terry reward r) or ``orm``
  (P(correct) = σ(score)); a process RM (``prm``) scores steps, not completions, and is refused;
* any local folder or hub id of a sequence-classification checkpoint with one label
  (``*ForSequenceClassification`` in its config.json, ``num_labels`` 1): the raw logit.

Scoring (:class:`ModelReward`): the prompt's messages plus the completion as the assistant turn,
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from trainers.core.config import ConfigError
from trainers.core.models import ModelError, load_tokenizer, resolve_model
from trainers.core.tokenization import chat_template_ids, right_pad, text_ids

__all__ = [
    "SCORE_MEANING",
    "ModelReward",
    "RewardModelInfo",
    "inspect_reward_model",
    "same_tokenizer",
    "template_suffix",
]

META_FILE = "reward_model.json"
HEAD_FILE = "reward_head.safetensors"
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


def same_tokenizer(a: Any, b: Any) -> bool:
    """Whether two tokenizers turn text and chats into the same ids (same class, vocabulary,
    special tokens and chat template)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if getattr(a, "chat_template", None) != getattr(b, "chat_template", None):
        return False
    if list(a.all_special_ids) != list(b.all_special_ids):
        return False
    return a.get_vocab() == b.get_vocab()


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


# ---------------------------------------------------------------------------------------------
# The scorer
# ---------------------------------------------------------------------------------------------


class ModelReward:
    """A frozen scalar reward model that scores (prompt, completion) pairs; see the module doc.

    ``score(prompts, texts, prompt_ids=None, completion_ids=None, truncated=None)`` returns a
    float32 CPU tensor (N,): the Bradley–Terry reward, P(correct) for an ORM, or the logit of a
    sequence classifier. Token ids are used only when the tokenizers are the same.
    """

    def __init__(
        self,
        info: RewardModelInfo,
        *,
        device: Any = "auto",
        dtype: Any = "auto",
        attn_implementation: str = "auto",
        batch_size: int = 16,
        policy_tokenizer: Any = None,
    ):
        from trainers.core.models import pick_device

        self.info = info
        self.batch_size = batch_size
        self.device = pick_device(device)
        if info.own:
            from trainers.reward_models.model import load_reward_model

            model, tokenizer = load_reward_model(
                info.path,
                device=self.device,
                dtype=dtype,
                attn_implementation=attn_implementation,
            )
            self.max_length = model.max_length
        else:
            model, tokenizer = self._load_sequence_classifier(info, dtype, attn_implementation)
            self.max_length = info.max_length
        model.eval()
        model.requires_grad_(False)
        self.model, self.tokenizer = model, tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.reuse_ids = policy_tokenizer is not None and same_tokenizer(
            policy_tokenizer, tokenizer
        )
        self.suffix = template_suffix(tokenizer) if self.reuse_ids else None
        if self.suffix is None:
            self.reuse_ids = False

    @property
    def kind(self) -> str:
        return self.info.kind

    def _load_sequence_classifier(self, info: RewardModelInfo, dtype, attn_implementation):
        from transformers import AutoModelForSequenceClassification

        from trainers.core.models import (
            _pretrained_args,
            pick_attn_implementation,
            pick_dtype,
        )
        from trainers.core.tiny import quiet_hf

        torch_dtype = pick_dtype(dtype, self.device)
        attn = pick_attn_implementation(attn_implementation, self.device, torch_dtype)
        source = resolve_model(info.name)
        first, kwargs = _pretrained_args(source, ("config.json",))
        with quiet_hf():
            model = AutoModelForSequenceClassification.from_pretrained(
                first, dtype=torch_dtype, attn_implementation=attn, **kwargs
            )
        model.to(self.device)
        tokenizer = load_tokenizer(info.name)
        if model.config.pad_token_id is None:  # HF reads the last non-pad token by pad id
            model.config.pad_token_id = tokenizer.pad_token_id
        return model, tokenizer

    # ---- ids ---------------------------------------------------------------------------------

    def encode(
        self,
        prompts: list[list[dict]],
        texts: list[str],
        prompt_ids: list[list[int]] | None = None,
        completion_ids: list[list[int]] | None = None,
        stop_ids: set[int] | None = None,
    ) -> list[list[int]]:
        """The reward model's input ids of each (prompt, completion)."""
        if self.reuse_ids and prompt_ids is not None and completion_ids is not None:
            stops = stop_ids or set()
            out = []
            for p, c in zip(prompt_ids, completion_ids, strict=True):
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
        limit = self.max_length
        return [ids[-limit:] if limit else ids for ids in out]

    # ---- scores ------------------------------------------------------------------------------

    @torch.inference_mode()
    def raw_scores(self, sequences: list[list[int]]) -> Tensor:
        """The scalar at the last token of each id sequence, batched by length (N,)."""
        if not sequences:
            return torch.zeros(0)
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
        out = torch.zeros(len(sequences), dtype=torch.float32)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            ids, mask = right_pad([sequences[i] or [self.pad_id] for i in chunk], self.pad_id)
            ids, mask = ids.to(self.device), mask.to(self.device)
            if self.info.own:
                s = self.model.sequence_scores(ids, mask)
            else:
                s = self.model(input_ids=ids, attention_mask=mask).logits[:, 0]
            out[torch.tensor(chunk)] = s.float().cpu()
        return out

    def score(
        self,
        prompts: list[list[dict]],
        texts: list[str],
        prompt_ids: list[list[int]] | None = None,
        completion_ids: list[list[int]] | None = None,
        stop_ids: set[int] | None = None,
    ) -> Tensor:
        """One reward per completion (float32, CPU): see :data:`SCORE_MEANING`."""
        raw = self.raw_scores(self.encode(prompts, texts, prompt_ids, completion_ids, stop_ids))
        raw = raw.clone()  # an ordinary tensor (inference-mode tensors refuse in-place edits)
        return torch.sigmoid(raw) if self.kind == "orm" else raw
