"""Built-in model presets, built deterministically on first use.

A preset is a randomly initialised small decoder (Qwen2 or Llama) plus a byte-level BPE
tokenizer trained on text generated offline from reasoning-gym tasks. Nothing is downloaded:
the first call to :func:`ensure_preset` builds the preset into
``cache_root()/models/<preset>-v<BUILDER_VERSION>`` in a few seconds, later calls return the
folder at once. The folder is an ordinary Hugging Face model folder (``config.json``,
``model.safetensors``, ``tokenizer.json``, ``generation_config.json``), so every loader that
takes a local path takes it.

Same inputs give the same files: the corpus is generated from fixed seeds in a fixed order, the
tokenizer trainer sees it in that order, and the weights come from a fixed ``torch`` seed.

This module imports neither torch nor transformers at import time (the lab imports
:data:`PRESETS` to resolve model names); the builders import them inside.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from trainers.core.tasks import SYSTEM_PROMPT, import_reasoning_gym

# Bump whenever the corpus, the tokenizer recipe, the architecture or the init change: the
# version is part of the folder name, so an old build is never mistaken for a new one.
BUILDER_VERSION = 2  # bump whenever the built preset changes

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
# Control tokens: dropped by ``decode(skip_special_tokens=True)``.
CONTROL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
# Tag tokens: single ids, but kept by ``decode(skip_special_tokens=True)`` so that reward
# functions can still find ``<answer>...</answer>`` in decoded completions.
TAG_TOKENS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)
SPECIAL_TOKENS = CONTROL_TOKENS + TAG_TOKENS
# tokenizer.model_max_length of every preset
PRESET_MAX_LENGTH = 2048

# ChatML. Assistant turns are wrapped in ``{% generation %}`` so that
# ``apply_chat_template(..., return_assistant_tokens_mask=True)`` can mark them; the markers do
# not change the rendered text.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['role'] == 'assistant' -%}"
    "{% generation %}{{- message['content'] + '<|im_end|>' -}}{% endgeneration %}"
    "{{- '\\n' -}}"
    "{%- else -%}"
    "{{- message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# Files whose presence marks a finished build (written last: build_info.json).
_REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "build_info.json",
)

# reasoning-gym tasks the corpus is drawn from. Each is cheap to generate (well under a second
# for thousands of items) and produces a short question with a short exact answer.
CORPUS_TASKS = (
    "spell_backward",
    "basic_arithmetic",
    "chain_sum",
    "letter_counting",
    "word_sorting",
    "leg_counting",
    "number_sorting",
    "gsm_symbolic",
    "count_primes",
    "letter_jumble",
    "caesar_cipher",
    "sentence_reordering",
)


# Openings of the reasoning inside <think>; picked by a seeded generator.
_THINK_OPENINGS = (
    "Let me work through this step by step.",
    "I will read the question carefully first.",
    "First I check what is being asked.",
    "Let me think about the task.",
    "The question asks for one exact result.",
    "I should be careful with every step here.",
)
_THINK_CLOSINGS = (
    "So the result is {answer}.",
    "That gives {answer}.",
    "The answer should be {answer}.",
    "Checking once more, I get {answer}.",
)

# Plain English so the tokenizer sees ordinary prose as well as task text.
_FILLER = (
    "The morning was cold and clear, and the river ran fast under the old stone bridge.",
    "She opened the window, looked at the garden, and decided that the roses needed water.",
    "A good experiment starts with a question, a small test, and an honest record of results.",
    "When the numbers do not add up, check the inputs before you blame the method.",
    "He counted the apples twice, wrote the total in his notebook, and closed the box.",
    "Most mistakes come from rushing; slow down, read the task again, and then answer.",
    "The library was quiet except for the sound of pages turning and a clock on the wall.",
    "Simple tools, used carefully, often beat complicated ones that nobody understands.",
    "On Monday the team planned the work, on Tuesday they built it, and on Friday they tested it.",
    "If you want to learn a skill, practise a little every day and keep notes on what you find.",
    "The train left the station at seven, crossed the valley, and reached the coast by noon.",
    "Write the answer clearly, explain how you found it, and say what you are unsure about.",
    "Water boils at one hundred degrees at sea level, but at a lower temperature on a mountain.",
    "The children sorted the cards by colour, then by number, and finally by the letter on top.",
    "Thank you for your question. Here is a short and clear answer.",
    "Please be concise, be correct, and show your reasoning when it helps the reader.",
)


@dataclass(frozen=True)
class TinySpec:
    """Everything that defines a preset: architecture, sizes, vocabulary and corpus."""

    name: str
    architecture: str  # "qwen2" or "llama"
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = True
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    examples_per_task: int = 400
    seed: int = 1234
    description: str = ""

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


_TINY = TinySpec(
    name="tiny",
    architecture="qwen2",
    vocab_size=2048,
    hidden_size=128,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=384,
    description="~1M-parameter Qwen2 decoder, random init; for fast CPU tests and sanity runs",
)

PRESETS: dict[str, TinySpec] = {
    "tiny": _TINY,
    # tiny's sizes and tokenizer recipe in the Llama architecture
    "tiny-llama": replace(
        _TINY,
        name="tiny-llama",
        architecture="llama",
        description="~1M-parameter Llama decoder, random init; same tokenizer recipe as tiny",
    ),
    "small": TinySpec(
        name="small",
        architecture="qwen2",
        vocab_size=16384,
        hidden_size=512,
        num_layers=8,
        num_heads=8,
        num_kv_heads=4,
        intermediate_size=1280,
        examples_per_task=2500,
        description="~30M-parameter Qwen2 decoder, random init; for benchmarks",
    ),
}


class PresetError(ValueError):
    """An unknown preset name."""


def cache_root() -> Path:
    """``$RLHF_LAB_CACHE`` if set, else ``~/.cache/rlhf-lab``."""
    env = os.environ.get("RLHF_LAB_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "rlhf-lab"


def get_spec(name: str) -> TinySpec:
    try:
        return PRESETS[name]
    except KeyError:
        raise PresetError(
            f"Unknown preset {name!r}. Built-in presets: {', '.join(PRESETS)}."
        ) from None


def preset_dir(name: str) -> Path:
    """Where preset ``name`` lives (or will live once built)."""
    get_spec(name)
    return cache_root() / "models" / f"{name}-v{BUILDER_VERSION}"


def is_complete(folder: Path) -> bool:
    return folder.is_dir() and all((folder / f).is_file() for f in _REQUIRED_FILES)


def ensure_preset(name: str) -> Path:
    """Return the folder of preset ``name``, building it first if needed.

    Safe to call from several processes at once: one builds (under a file lock, into a temporary
    folder that is renamed into place) and the others wait and reuse the result.
    """
    target = preset_dir(name)
    if is_complete(target):
        return target

    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / f".{target.name}.lock")):
        if is_complete(target):
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            build_preset(get_spec(name), tmp)
            # mkdtemp (and save_pretrained's temporary files) are private; the cache may be shared
            tmp.chmod(0o755)
            for file in tmp.iterdir():
                file.chmod(0o644)
            if target.exists():  # an incomplete leftover (killed build, deleted files)
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target


# --------------------------------------------------------------------------------------------
# corpus


def render_chat(messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
    """Pure-Python rendering of :data:`CHAT_TEMPLATE` (used for the corpus; no jinja needed)."""
    out = [f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages]
    if add_generation_prompt:
        out.append(f"{IM_START}assistant\n")
    return "".join(out)


def format_completion(answer: str, rng: random.Random) -> str:
    """``<think>...</think><answer>...</answer>`` for one answer."""
    think = f"{rng.choice(_THINK_OPENINGS)} {rng.choice(_THINK_CLOSINGS).format(answer=answer)}"
    return f"{THINK_OPEN}{think}{THINK_CLOSE}{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"


def iter_corpus(spec: TinySpec) -> Iterator[str]:
    """The training text of a preset's tokenizer, in a fixed order.

    One chat-formatted conversation per reasoning-gym item (system prompt on every other one),
    then the English filler a few times over.
    """
    rg = import_reasoning_gym()
    rng = random.Random(spec.seed)
    for task_index, task in enumerate(CORPUS_TASKS):
        dataset = rg.create_dataset(task, size=spec.examples_per_task, seed=spec.seed + task_index)
        for i in range(spec.examples_per_task):
            item = dataset[i]
            messages = []
            if i % 2 == 0:
                messages.append({"role": "system", "content": SYSTEM_PROMPT})
            messages.append({"role": "user", "content": str(item["question"]).strip()})
            messages.append(
                {"role": "assistant", "content": format_completion(str(item["answer"]), rng)}
            )
            yield render_chat(messages)
    for _ in range(4):
        yield from _FILLER


def _split_out_special(text: str) -> list[str]:
    """Cut the special-token strings out of ``text`` so BPE spends no merges on them."""
    pieces = [text]
    for token in SPECIAL_TOKENS:
        pieces = [part for piece in pieces for part in piece.split(token)]
    return [p for p in pieces if p]


# --------------------------------------------------------------------------------------------
# tokenizer


def _pretokenize_pattern() -> str:
    # Qwen2's split rule: words with an optional leading non-letter, single digits (so numbers
    # are read digit by digit, which helps arithmetic on a tiny model), punctuation runs and
    # whitespace. GGUF files name this rule "qwen2", so an exported preset keeps it.
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    return PRETOKENIZE_REGEX


def train_tokenizer(spec: TinySpec, corpus: list[str]):
    """Train the byte-level BPE tokenizer; returns a ``tokenizers.Tokenizer``."""
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tokenizer = Tokenizer(models.BPE())
    # NFC as Qwen2 does; transformers 5 loads a qwen2 folder with Qwen2Tokenizer, which adds NFC
    # anyway, so having it here keeps the raw tokenizer.json and AutoTokenizer in agreement.
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_pretokenize_pattern()), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    pieces = [piece for text in corpus for piece in _split_out_special(text)]
    tokenizer.train_from_iterator(pieces, trainer=trainer, length=len(pieces))

    # The trainer registers every token in ``special_tokens`` as special; the tags should be
    # single tokens that survive ``skip_special_tokens``, so flip their flag in the JSON.
    state = json.loads(tokenizer.to_str())
    for added in state["added_tokens"]:
        if added["content"] in TAG_TOKENS:
            added["special"] = False
    return Tokenizer.from_str(json.dumps(state))


def wrap_tokenizer(backend):
    """Wrap a ``tokenizers.Tokenizer`` as a transformers fast tokenizer with the ChatML template."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        bos_token=None,
        unk_token=None,
        chat_template=CHAT_TEMPLATE,
        padding_side="right",
        model_max_length=PRESET_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
    )


# --------------------------------------------------------------------------------------------
# model


@contextlib.contextmanager
def quiet_hf() -> Iterator[None]:
    """Silence transformers' info/warning logs and progress bars for the duration."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def make_config(spec: TinySpec, *, pad_token_id: int, eos_token_id: int):
    from transformers import LlamaConfig, Qwen2Config

    common = dict(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=spec.rms_norm_eps,
        tie_word_embeddings=spec.tie_word_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
        initializer_range=0.02,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=None,
    )
    if spec.architecture == "qwen2":
        return Qwen2Config(**common)
    if spec.architecture == "llama":
        return LlamaConfig(**common, head_dim=spec.head_dim)
    raise PresetError(f"Unsupported preset architecture {spec.architecture!r}")


def build_preset(spec: TinySpec, out_dir: Path) -> Path:
    """Build preset ``spec`` into ``out_dir`` (which should be empty). Returns ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    corpus = list(iter_corpus(spec))
    backend = train_tokenizer(spec, corpus)
    tokenizer = wrap_tokenizer(backend)
    if len(tokenizer) > spec.vocab_size:  # cannot happen with BpeTrainer, kept as a guard
        raise RuntimeError(f"tokenizer has {len(tokenizer)} tokens > vocab {spec.vocab_size}")

    pad_id = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    config = make_config(spec, pad_token_id=pad_id, eos_token_id=eos_id)

    with quiet_hf():
        # fork_rng: build with a fixed seed without disturbing the caller's RNG stream.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.seed)
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.generation_config = GenerationConfig(
            eos_token_id=eos_id,
            pad_token_id=pad_id,
            bos_token_id=None,
            max_new_tokens=256,
        )
        model.save_pretrained(out_dir, safe_serialization=True)
        tokenizer.save_pretrained(out_dir)

    info = {
        "preset": spec.name,
        "builder_version": BUILDER_VERSION,
        "spec": asdict(spec),
        "tokenizer_size": len(tokenizer),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "corpus_documents": len(corpus),
        "corpus_tasks": list(CORPUS_TASKS),
    }
    # Written last: its presence marks the build as complete.
    (out_dir / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    return out_dir


# --------------------------------------------------------------------------------------------
# GGUF export (tests and offline demos: a real GGUF file without any download)


def export_gguf(folder: str | os.PathLike, out_file: str | os.PathLike) -> Path:
    """Write the model in ``folder`` (a built preset) as an F32 GGUF file at ``out_file``.

    Supports the preset architectures (llama, qwen2) with a byte-level BPE tokenizer. The file
    loads with ``from_pretrained(dir, gguf_file=name)`` for both the tokenizer and the model.
    """
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    folder, out_file = Path(folder), Path(out_file)
    config = json.loads((folder / "config.json").read_text())
    tok_state = json.loads((folder / "tokenizer.json").read_text())
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    arch = config["model_type"]
    if arch not in ("llama", "qwen2"):
        raise ValueError(f"export_gguf supports llama and qwen2, not {arch!r}")

    n_layers = config["num_hidden_layers"]
    n_heads = config["num_attention_heads"]
    n_kv = config["num_key_value_heads"]
    hidden = config["hidden_size"]
    vocab_size = config["vocab_size"]

    # vocabulary in id order; ids the tokenizer does not use become unused padding entries
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [gguf.TokenType.UNUSED] * vocab_size
    for content, idx in tok_state["model"]["vocab"].items():
        tokens[idx] = content
        types[idx] = gguf.TokenType.NORMAL
    for added in tok_state["added_tokens"]:
        tokens[added["id"]] = added["content"]
        types[added["id"]] = (
            gguf.TokenType.CONTROL if added["special"] else gguf.TokenType.USER_DEFINED
        )
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok_state["model"]["merges"]]

    writer = gguf.GGUFWriter(str(out_file), arch)
    writer.add_name(folder.name)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(hidden)
    writer.add_block_count(n_layers)
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(n_heads)
    writer.add_head_count_kv(n_kv)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    if arch == "llama":
        writer.add_rope_dimension_count(hidden // n_heads)
    writer.add_vocab_size(vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_pad_token_id(config["pad_token_id"])
    writer.add_add_bos_token(False)
    writer.add_chat_template(tok_config.get("chat_template") or CHAT_TEMPLATE)

    def permute(w: np.ndarray, heads: int) -> np.ndarray:
        # llama.cpp stores llama q/k rows in its own rotary layout; loaders undo this
        return (
            w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape)
        )

    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    per_layer = {
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    for i in range(n_layers):
        for hf, gg in per_layer.items():
            for suffix in ("weight", "bias"):
                names[f"model.layers.{i}.{hf}.{suffix}"] = f"blk.{i}.{gg}.{suffix}"

    state = load_file(str(folder / "model.safetensors"))
    for key in sorted(state):
        if key not in names:
            raise ValueError(f"export_gguf: no GGUF name for tensor {key!r}")
        value = np.ascontiguousarray(state[key].astype(np.float32))
        if arch == "llama" and key.endswith("q_proj.weight"):
            value = permute(value, n_heads)
        elif arch == "llama" and key.endswith("k_proj.weight"):
            value = permute(value, n_kv)
        writer.add_tensor(names[key], value)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_file
