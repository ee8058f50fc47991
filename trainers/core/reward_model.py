"""The saved reward model: what the reward-model trainer (``trainers/reward_models``) writes and
every scorer reads (:mod:`trainers.core.reward_scorer`, used by policy gradients, online DPO,
rejection sampling and evaluation).

Reward model = a causal LM's decoder body + a linear head on its last hidden states.

The LM head (vocabulary projection) is kept in memory so the backbone can be saved and reloaded
as an ordinary causal LM, but it is never used: hidden states come from ``get_decoder()``.
The head runs in float32 whatever the backbone's dtype.

* preference / orm: scalar head (no bias, as in the book); the sequence's score is the head's
  output at its last non-pad token (sequences are right-padded).
* prm: ``num_labels``-class head with bias; logits are read at the step-separator positions.

Saved folder (:func:`save_reward_model`): the backbone and tokenizer via ``save_pretrained``
(so the folder also loads as a causal LM), ``reward_head.safetensors`` (head weights) and
``reward_model.json`` (kind, num_labels, separator, max_length, format version).

A PRM reads a solution as ``"Problem: {problem}\\nReasoning trace:\\n"`` followed by each step
as ``step.strip() + separator`` (:func:`encode_solution`), in windows that fit ``max_length``
(:func:`window_solution`); the class :data:`BAD_CLASS` is a bad step.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from trainers.core.logprobs import shared_prompt_hidden
from trainers.core.models import load_causal_lm, load_tokenizer
from trainers.core.pair_packing import PackedPairs, packed_last_hidden
from trainers.core.rundir import atomic_write_json
from trainers.core.tokenization import text_ids

KINDS = ("preference", "orm", "prm")
"""The reward-model kinds (the reward-model family's algorithm names; a test holds them equal)."""
HEAD_FILE = "reward_head.safetensors"
META_FILE = "reward_model.json"
FORMAT_VERSION = 1
PRM_LABEL_NAMES = {2: ["bad", "good"], 3: ["bad", "neutral", "good"]}
BAD_CLASS = 0
"""Index of the 'bad' class of a PRM head, for 2 and 3 labels alike (rating_to_class)."""
PRM_PROMPT = "Problem: {problem}\nReasoning trace:\n"


class RewardModelError(ValueError):
    """A folder is not a saved reward model, or its files disagree."""


class RewardModel(nn.Module):
    def __init__(
        self,
        backbone: nn.Module,
        kind: str,
        num_labels: int = 1,
        separator: str | None = None,
        max_length: int | None = None,
    ):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"unknown reward-model kind {kind!r}")
        if kind == "prm" and num_labels not in (2, 3):
            raise ValueError(f"a prm head has 2 or 3 labels, got {num_labels}")
        if kind != "prm" and num_labels != 1:
            raise ValueError(f"a {kind} head is scalar (num_labels=1), got {num_labels}")
        self.backbone = backbone
        self.kind = kind
        self.num_labels = num_labels
        self.separator = separator
        self.max_length = max_length
        hidden = getattr(backbone.config, "hidden_size", None)
        if hidden is None:
            hidden = backbone.get_input_embeddings().embedding_dim
        device = next(backbone.parameters()).device
        self.head = nn.Linear(hidden, num_labels, bias=num_labels > 1).to(device, torch.float32)

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    def hidden_states(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        out = self.backbone.get_decoder()(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False
        )
        return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Head logits at every position, float32: (B, T, num_labels)."""
        return self.head(self.hidden_states(input_ids, attention_mask).float())

    def token_scores(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Scalar head at every position (B, T); scalar kinds only."""
        if self.num_labels != 1:
            raise ValueError("token_scores needs a scalar head (preference or orm)")
        return self.forward(input_ids, attention_mask).squeeze(-1)

    def sequence_scores(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Scalar score of each right-padded sequence at its last non-pad token (B,)."""
        scores = self.token_scores(input_ids, attention_mask)
        last = attention_mask.long().sum(dim=1) - 1
        return scores.gather(1, last.clamp(min=0).unsqueeze(1)).squeeze(1)

    def split_sequence_scores(
        self, input_ids: Tensor, attention_mask: Tensor, width_p: int
    ) -> Tensor:
        """:meth:`sequence_scores` for ``[left-padded prompt | right-padded response]`` rows
        (``trainers.core.logprobs.split_rows``): the scalar head at each row's last token, with
        each distinct prompt (a pair's chosen and rejected share one) forwarded once."""
        if self.num_labels != 1:
            raise ValueError("split_sequence_scores needs a scalar head (preference or orm)")
        decoder = self.backbone.get_decoder()
        hidden = shared_prompt_hidden(decoder, input_ids, attention_mask, width_p)
        last = attention_mask[:, width_p:].long().sum(dim=1)  # hidden[:, j] is position P − 1 + j
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        return self.head(hidden[rows, last].float()).squeeze(-1)

    def packed_pair_scores(self, packed: PackedPairs) -> Tensor:
        """:meth:`sequence_scores` of N packed pairs (``trainers.core.pair_packing``, any number
        of pairs a row): (2N,), every chosen score then every rejected one."""
        if self.num_labels != 1:
            raise ValueError("packed_pair_scores needs a scalar head (preference or orm)")
        hidden = packed_last_hidden(self.backbone.get_decoder(), packed)
        return self.head(hidden.float()).squeeze(-1)

    def metadata(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "kind": self.kind,
            "num_labels": self.num_labels,
            "label_names": PRM_LABEL_NAMES.get(self.num_labels) if self.kind == "prm" else None,
            "separator": self.separator,
            "max_length": self.max_length,
            "hidden_size": self.head.in_features,
            "score": {
                "preference": "scalar head at the last token (Bradley–Terry reward)",
                "orm": "sigmoid of the scalar head at the last token = P(correct)",
                "prm": "softmax over classes at each step separator's last token",
            }[self.kind],
        }


def build_reward_model(
    name: str,
    kind: str,
    *,
    num_labels: int = 1,
    separator: str | None = None,
    max_length: int | None = None,
    device="auto",
    dtype="auto",
    attn_implementation: str = "auto",
    trainable: bool = True,
    freeze_backbone: bool = False,
) -> RewardModel:
    """A fresh reward model on top of the causal LM ``name`` (preset, folder, gguf or hub id).
    The head is initialised by ``nn.Linear``'s default under the current torch seed."""
    backbone = load_causal_lm(
        name, device=device, dtype=dtype, attn_implementation=attn_implementation, trainable=True
    )
    model = RewardModel(backbone, kind, num_labels, separator, max_length)
    _set_trainable(model, trainable, freeze_backbone)
    return model


def _set_trainable(model: RewardModel, trainable: bool, freeze_backbone: bool) -> None:
    model.requires_grad_(trainable)
    if trainable and freeze_backbone:
        model.backbone.requires_grad_(False)
    model.train(trainable)


def save_reward_model(
    model: RewardModel, tokenizer, folder: str | Path, state_dict: dict | None = None
) -> Path:
    """Write backbone + tokenizer (save_pretrained), head weights and ``reward_model.json``.
    The json is written last: its presence marks a complete folder. ``state_dict``: the whole
    model's weights when ``model`` itself is sharded (a run under torchrun)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    parts: dict[str, dict | None] = {"backbone.": None, "head.": None}
    if state_dict is not None:
        parts = {
            p: {k[len(p) :]: v for k, v in state_dict.items() if k.startswith(p)} for p in parts
        }
    model.backbone.save_pretrained(folder, state_dict=parts["backbone."])
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    head_sd = parts["head."] if parts["head."] is not None else model.head.state_dict()
    head = {k: v.detach().float().cpu().contiguous() for k, v in head_sd.items()}
    save_file(head, str(folder / HEAD_FILE))
    atomic_write_json(folder / META_FILE, model.metadata())
    return folder


def read_reward_metadata(folder: str | Path) -> dict[str, Any]:
    folder = Path(folder)
    meta_path = folder / META_FILE
    if not meta_path.is_file():
        raise RewardModelError(
            f"{folder} is not a saved reward model (no {META_FILE}); pass a folder written by "
            "save_reward_model, e.g. a reward-model run's final_model/"
        )
    meta = json.loads(meta_path.read_text())
    if meta.get("format_version") != FORMAT_VERSION:
        raise RewardModelError(
            f"{meta_path}: format_version {meta.get('format_version')!r}, expected {FORMAT_VERSION}"
        )
    return meta


def load_reward_model(
    folder: str | Path,
    *,
    device="auto",
    dtype="auto",
    attn_implementation: str = "auto",
    trainable: bool = False,
):
    """Load a folder written by :func:`save_reward_model`; returns ``(model, tokenizer)``.
    ``trainable=False`` (default) gives eval mode with every parameter frozen."""
    from safetensors.torch import load_file

    folder = Path(folder)
    meta = read_reward_metadata(folder)
    backbone = load_causal_lm(
        str(folder), device=device, dtype=dtype, attn_implementation=attn_implementation
    )
    model = RewardModel(
        backbone, meta["kind"], meta["num_labels"], meta.get("separator"), meta.get("max_length")
    )
    head = load_file(str(folder / HEAD_FILE))
    try:
        model.head.load_state_dict({k: v.to(model.device) for k, v in head.items()})
    except RuntimeError as err:
        raise RewardModelError(f"{folder / HEAD_FILE} does not fit the backbone: {err}") from None
    _set_trainable(model, trainable, freeze_backbone=False)
    return model, load_tokenizer(str(folder))


# ---------------------------------------------------------------------------------------------
# A PRM's view of a solution
# ---------------------------------------------------------------------------------------------


def encode_solution(
    tokenizer: Any, problem: str, steps: Sequence[str], separator: str
) -> tuple[list[int], list[list[int]]]:
    """(prompt ids, [ids of ``step.strip()`` + separator ids for each step]). Pieces are
    tokenised separately, so the separator's tokens are the same after every step and its last
    token marks where the step's label is read."""
    prompt = text_ids(tokenizer, PRM_PROMPT.format(problem=problem.strip()))
    sep = text_ids(tokenizer, separator)
    if not sep:
        raise ValueError(f"the step separator {separator!r} encodes to no token")
    pieces = [text_ids(tokenizer, s.strip()) + sep for s in steps]
    return prompt, pieces


def window_solution(
    prompt: list[int], pieces: list[list[int]], max_length: int
) -> tuple[list[tuple[list[int], list[int], int, int]], bool]:
    """Split one encoded solution into windows that fit ``max_length``.

    Each window is (ids, separator positions, first labelled step, end step): the prompt, then
    steps ``[context, end)`` where steps ``[first, end)`` are labelled and steps
    ``[context, first)`` are earlier steps kept as context, as many as fit. Returns the windows
    and whether a step had to be dropped (a single step longer than the budget ends the
    solution there)."""
    budget = max_length - len(prompt)
    windows = []
    start, n = 0, len(pieces)
    while start < n:
        if budget <= 0 or len(pieces[start]) > budget:
            return windows, True
        end, used = start, 0
        while end < n and used + len(pieces[end]) <= budget:
            used += len(pieces[end])
            end += 1
        context = start
        while context > 0 and used + len(pieces[context - 1]) <= budget:
            context -= 1
            used += len(pieces[context])
        ids = list(prompt)
        positions = []
        for k in range(context, end):
            ids.extend(pieces[k])
            if k >= start:
                positions.append(len(ids) - 1)
        windows.append((ids, positions, start, end))
        start = end
    return windows, False
