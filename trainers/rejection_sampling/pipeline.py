"""Stages 1–2 of rejection sampling and the evaluation: prompts, verifier, generation, scoring and
the shared cache.

* **Prompts** (:func:`load_prompts`): GSM8K from the hub (``openai/gsm8k``, config ``main``), a
  local file with the GSM8K schema (``question``; ``answer`` = reasoning then a final
  ``#### <number>`` line), or ``builtin:<task>[,<task>]`` questions generated offline by
  reasoning-gym. The first ``max_train_samples`` training rows and ``max_test_samples`` held-out
  rows are used (the book's slice; no shuffling).
* **Verifier** (:func:`verify`): GSM8K — the last ``\\boxed{…}`` (else a ``#### …`` line, else
  the last number of the text), commas removed, compared numerically (|a − b| < 1e-6, string
  equality as a fallback); builtin tasks — reasoning-gym's score of the last ``<answer>`` block,
  correct when it is 1.
* **Generation** (:func:`generate_pool`): N sampled completions per prompt, batched
  (``rollout_batch_size`` prompts × N sequences per call), seeded.
* **Scoring** (:func:`score_pool`): the verifier's score, or a trained reward model
  (``trainers.core.reward_scorer.RewardScorer``) on system + user + assistant.
* **Cache** (:func:`cache_fields`, :func:`cache_key`): generations and scores are stored under
  ``$RLHF_LAB_CACHE/rs_generations/`` keyed by everything that changes them — policy weights
  (fingerprint), data slice (content hash), sampling parameters, N, seed, max_new_tokens, batch
  shape, device/dtype, and (for scores) the scorer's identity — but not the selection strategy,
  SFT or evaluation settings, so the four strategies share one cache. Unscored rollouts are
  cached separately (``<key>.rollouts.json``), so a new scorer reuses the generations.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainers.core.datasets import read_json_rows
from trainers.core.prompts import builtin_questions
from trainers.core.rundir import atomic_write_json
from trainers.core.tasks import SYSTEM_PROMPT, extract_answer
from trainers.core.tiny import cache_root
from trainers.rejection_sampling.config import (
    GSM8K_SYSTEM_PROMPT,
    RejectionSamplingConfig,
    ScorerSection,
)

CACHE_VERSION = 1
VERIFIER_VERSION = 1
DATA_EXTENSIONS = (".jsonl", ".json", ".parquet", ".csv")
GSM8K_TASK = "gsm8k"

logger = logging.getLogger(__name__)


class DataError(ValueError):
    """The prompts cannot be loaded (missing file, wrong schema, unreachable hub)."""


# ---------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------


@dataclass
class RSPrompt:
    """One prompt: the question, its gold answer, and how to verify a completion."""

    question: str
    gold: str
    task: str = GSM8K_TASK  # "gsm8k" or a reasoning-gym task name
    entry: dict | None = field(default=None, repr=False)  # reasoning-gym entry (builtin only)

    def messages(self, system_prompt: str) -> list[dict]:
        head = [{"role": "system", "content": system_prompt}] if system_prompt else []
        return [*head, {"role": "user", "content": self.question}]


def system_prompt_for(cfg: RejectionSamplingConfig) -> str:
    if cfg.data.system_prompt is not None:
        return cfg.data.system_prompt
    return SYSTEM_PROMPT if cfg.data.is_builtin else GSM8K_SYSTEM_PROMPT


def looks_like_path(name: str) -> bool:
    if name.lower().endswith(DATA_EXTENSIONS):
        return True
    return name.startswith(("/", ".", "~")) or name.count("/") > 1


def _read_local_rows(path: Path, split: str | None = None) -> list[dict]:
    path = path.expanduser()
    if not path.exists():
        raise DataError(
            f"data file not found: {path}. Use an existing .jsonl/.json/.parquet/.csv file with "
            "the GSM8K schema (question, answer), openai/gsm8k, or builtin:<task> (offline)"
        )
    suffix = path.suffix.lower()
    if path.is_file() and suffix == ".jsonl":
        try:
            return read_json_rows(path)  # the shared reader: one JSON object per line
        except ValueError as err:
            raise DataError(str(err)) from None
    if path.is_file() and suffix == ".json":
        data = json.loads(path.read_text())
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            data = data["data"]
        if not isinstance(data, list):
            raise DataError(f"{path}: expected a JSON list of rows")
        return data
    import datasets

    if path.is_file():
        if suffix not in DATA_EXTENSIONS:
            raise DataError(f"unsupported data file {path}: use one of {DATA_EXTENSIONS}")
        builder = {".parquet": "parquet", ".csv": "csv"}[suffix]
        ds = datasets.load_dataset(builder, data_files={"train": str(path)}, split="train")
    else:
        ds = datasets.load_dataset(str(path), split=split or "train")
    return [dict(r) for r in ds]


def _gsm8k_prompts(rows: Sequence[dict], source: str) -> list[RSPrompt]:
    if rows and not {"question", "answer"} <= set(rows[0]):
        raise DataError(
            f"{source}: expected the GSM8K schema (columns 'question' and 'answer'), found "
            f"{sorted(rows[0])}"
        )
    out = []
    for n, row in enumerate(rows):
        gold = gsm8k_gold(str(row["answer"]))
        if gold is None:
            raise DataError(f"{source}: row {n} has no final '#### <answer>' line in 'answer'")
        out.append(RSPrompt(question=str(row["question"]), gold=gold))
    return out


def _first(items: list, n: int | None) -> list:
    return items if n is None else items[:n]


def _builtin_prompts(cfg: RejectionSamplingConfig) -> tuple[list[RSPrompt], list[RSPrompt]]:
    """Train and held-out questions of the built-in tasks
    (:func:`trainers.core.prompts.builtin_questions`: tasks taking turns, held-out questions
    never among the training ones)."""
    d = cfg.data
    n_train = d.max_train_samples or 1000
    n_test = 200 if d.max_test_samples is None else d.max_test_samples
    try:
        train, test = builtin_questions(
            d.builtin_tasks, d.builtin_task_configs, n_train, n_test, cfg.seed
        )
    except ValueError as err:
        raise DataError(str(err)) from err

    def prompt(task: str, entry: dict) -> RSPrompt:
        return RSPrompt(
            question=entry["question"], gold=str(entry["answer"]), task=task, entry=entry
        )

    return [prompt(*q) for q in train], [prompt(*q) for q in test]


def load_prompts(cfg: RejectionSamplingConfig) -> tuple[list[RSPrompt], list[RSPrompt]]:
    """(training prompts, held-out prompts) for ``cfg.data``. Raises :class:`DataError`."""
    d = cfg.data
    if d.is_builtin:
        return _builtin_prompts(cfg)
    test_rows = None
    if d.test_dataset is not None:
        test_rows = _gsm8k_prompts(
            _read_local_rows(Path(d.test_dataset), d.test_split), d.test_dataset
        )
    if looks_like_path(d.dataset) or Path(d.dataset).expanduser().exists():
        path = Path(d.dataset)
        if path.expanduser().is_dir():
            train = _gsm8k_prompts(_read_local_rows(path, d.train_split), d.dataset)
            if test_rows is None:
                test_rows = _gsm8k_prompts(_read_local_rows(path, d.test_split), d.dataset)
        else:
            rows = _gsm8k_prompts(_read_local_rows(path), d.dataset)
            if test_rows is None:
                if d.max_test_samples is None:
                    raise DataError(
                        "a single local data file needs data.max_test_samples (its last N rows "
                        "are held out) or data.test_dataset"
                    )
                cut = len(rows) - d.max_test_samples
                if cut < 1:
                    raise DataError(
                        f"{d.dataset} has {len(rows)} rows: not enough for "
                        f"{d.max_test_samples} held-out prompts and at least one training prompt"
                    )
                rows, test_rows = rows[:cut], rows[cut:]
            train = rows
    else:
        train = _gsm8k_prompts(_hub_rows(d.dataset, d.subset, d.train_split), d.dataset)
        if test_rows is None:
            test_rows = (
                []
                if d.max_test_samples == 0
                else _gsm8k_prompts(_hub_rows(d.dataset, d.subset, d.test_split), d.dataset)
            )
    train = _first(train, d.max_train_samples)
    test = _first(test_rows, d.max_test_samples)
    if not train:
        raise DataError(f"{d.dataset}: no training prompts")
    return train, test


def _hub_rows(dataset: str, subset: str | None, split: str) -> list[dict]:
    import datasets

    try:
        ds = datasets.load_dataset(dataset, subset, split=split)
    except Exception as err:
        raise DataError(
            f"could not load {dataset!r} ({subset}, {split}) from the Hugging Face Hub or its "
            f"cache ({type(err).__name__}: {err}). Offline, use a local GSM8K-schema file or "
            "builtin:<task> (e.g. builtin:chain_sum)"
        ) from None
    return [dict(r) for r in ds]


def data_fingerprint(prompts: Sequence[RSPrompt], system_prompt: str) -> str:
    digest = hashlib.sha256(system_prompt.encode())
    for p in prompts:
        digest.update(b"\0" + json.dumps([p.task, p.question, p.gold]).encode())
    return digest.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Verifier
# ---------------------------------------------------------------------------------------------

_GOLD_RE = re.compile(r"####\s*([^\n]*)")
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def normalise_number(text: str) -> str:
    """Strip spaces, '$', commas, a trailing '.', and map the unicode minus to '-'."""
    text = text.strip().replace("\u2212", "-").replace(",", "").replace("$", "").strip()
    return text[:-1] if text.endswith(".") else text


def gsm8k_gold(answer: str) -> str | None:
    """The gold answer of a GSM8K ``answer`` field: the text after the last ``####``."""
    found = _GOLD_RE.findall(answer)
    if not found:
        return None
    gold = normalise_number(found[-1])
    return gold or None


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{…}`` (nested braces allowed)."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth, body = start + len("\\boxed{"), 1, []
    while i < len(text):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return "".join(body).strip()
        body.append(ch)
        i += 1
    return None


def _last_number(text: str) -> str | None:
    found = _NUMBER_RE.findall(text.replace("\u2212", "-"))
    return normalise_number(found[-1]) if found else None


def extract_gsm8k_prediction(text: str) -> str | None:
    """The final answer of a completion: the last ``\\boxed{}`` (its last number, else its
    text), else a ``#### …`` line, else the last number anywhere; commas removed."""
    boxed = _last_boxed(text)
    if boxed is not None:
        return _last_number(boxed) or normalise_number(boxed) or None
    marked = _GOLD_RE.findall(text)
    if marked:
        return _last_number(marked[-1]) or normalise_number(marked[-1]) or None
    return _last_number(text)


def answers_match(prediction: str | None, gold: str) -> bool:
    if prediction is None:
        return False
    try:
        return abs(float(prediction) - float(gold)) < 1e-6
    except ValueError:
        return prediction.strip() == gold.strip()


def verify(prompt: RSPrompt, completion: str) -> tuple[float, bool, str | None]:
    """(score, correct, extracted prediction). GSM8K: score 1/0 on the final number; builtin
    tasks: reasoning-gym's score (possibly graded), correct when it is 1."""
    if prompt.task == GSM8K_TASK:
        pred = extract_gsm8k_prediction(completion)
        ok = answers_match(pred, prompt.gold)
        return float(ok), ok, pred
    from trainers.core.tasks import score_response

    score = score_response(completion, {"task": prompt.task, "entry": prompt.entry})
    return score, score >= 1.0 - 1e-9, extract_answer(completion)


# ---------------------------------------------------------------------------------------------
# The cache
# ---------------------------------------------------------------------------------------------


def cache_dir() -> Path:
    return cache_root() / "rs_generations"


def scorer_identity(scorer: ScorerSection) -> dict[str, Any]:
    """What identifies a scorer's outputs: the verifier's version, or the reward model's weights
    (fingerprint of the folder) and metadata."""
    if scorer.is_verifier:
        return {"kind": "verifier", "version": VERIFIER_VERSION}
    from trainers.core.models import model_fingerprint

    folder = Path(scorer.name).expanduser().absolute()
    meta = (folder / "reward_model.json").read_bytes()
    return {
        "kind": "reward_model",
        "path": str(folder),
        "fingerprint": model_fingerprint(str(folder)),
        "metadata": hashlib.sha256(meta).hexdigest()[:16],
        "device": scorer.device,
        "dtype": scorer.dtype,
    }


def cache_fields(
    cfg: RejectionSamplingConfig,
    train_prompts: Sequence[RSPrompt],
    *,
    device: str,
    dtype: str,
    attn: str,
    with_scorer: bool = True,
    world_size: int = 1,
) -> dict[str, Any]:
    """Everything that changes the generations (and, ``with_scorer``, their scores). Not the
    strategy, top_k, SFT or evaluation settings: the four strategies share one cache. Under
    torchrun the number of ranks (each samples its part with its own seed)."""
    from trainers.core.models import model_fingerprint

    g = cfg.generation
    system_prompt = system_prompt_for(cfg)
    fields: dict[str, Any] = {
        "version": CACHE_VERSION,
        "policy": {"name": cfg.model.name, "fingerprint": model_fingerprint(cfg.model.name)},
        "data": {
            "dataset": cfg.data.dataset,
            "subset": cfg.data.subset,
            "split": cfg.data.train_split,
            "max_train_samples": cfg.data.max_train_samples,
            "num_prompts": len(train_prompts),
            "fingerprint": data_fingerprint(train_prompts, system_prompt),
        },
        "sampling": {
            "num_completions_per_prompt": g.num_completions_per_prompt,
            "temperature": g.temperature,
            "top_p": g.top_p,
            "top_k": g.top_k,
            "min_p": g.min_p,
            "max_new_tokens": g.max_new_tokens,
            "rollout_batch_size": g.rollout_batch_size,
        },
        "seed": cfg.seed,
        "runtime": {"device": device, "dtype": dtype, "attn": attn},
    }
    if world_size > 1:
        fields["world_size"] = world_size
    if with_scorer:
        fields["scorer"] = scorer_identity(cfg.scorer)
    return fields


def cache_key(fields: dict[str, Any]) -> str:
    blob = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def read_cache(path: Path, fields: dict[str, Any]) -> dict | None:
    """The cached object at ``path`` if it exists, parses, and was written for ``fields``."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if data.get("key_fields") == json.loads(json.dumps(fields)) else None


def write_cache(path: Path, fields: dict[str, Any], payload: dict[str, Any]) -> None:
    atomic_write_json(path, {"key_fields": fields, **payload})


# ---------------------------------------------------------------------------------------------
# Generation and scoring
# ---------------------------------------------------------------------------------------------


def generate_pool(
    model,
    tokenizer,
    prompts: Sequence[RSPrompt],
    system_prompt: str,
    cfg: RejectionSamplingConfig,
    on_batch: Callable[[int, int], None] | None = None,
    batch_size: int | None = None,
) -> list[list[str]]:
    """N sampled completions per prompt (N = num_completions_per_prompt), in prompt order,
    ``batch_size`` prompts a call (default ``generation.rollout_batch_size``; a rank's share
    of it under torchrun). ``on_batch(prompts_done, total)`` runs after every batch
    (progress, stop requests)."""
    from trainers.core.generation import generate_completions

    g = cfg.generation
    n = g.num_completions_per_prompt
    per_call = batch_size or g.rollout_batch_size
    out: list[list[str]] = []
    for start in range(0, len(prompts), per_call):
        chunk = prompts[start : start + per_call]
        chats = [p.messages(system_prompt) for p in chunk]
        texts = generate_completions(
            model,
            tokenizer,
            chats,
            max_new_tokens=g.max_new_tokens,
            do_sample=True,
            temperature=g.temperature,
            top_p=g.top_p,
            top_k=g.top_k,
            min_p=g.min_p or None,
            batch_size=len(chats),
            samples_per_prompt=n,
        )
        out += [texts[i * n : (i + 1) * n] for i in range(len(chunk))]
        if on_batch is not None:
            on_batch(len(out), len(prompts))
    return out


def token_lengths(tokenizer, completions: Sequence[Sequence[str]]) -> list[list[int]]:
    return [
        [len(tokenizer(c, add_special_tokens=False)["input_ids"]) for c in row]
        for row in completions
    ]


def verify_pool(
    prompts: Sequence[RSPrompt], completions: Sequence[Sequence[str]]
) -> tuple[list[list[float]], list[list[bool]], list[list[str | None]]]:
    scores, correct, preds = [], [], []
    for p, row in zip(prompts, completions, strict=True):
        results = [verify(p, c) for c in row]
        scores.append([r[0] for r in results])
        correct.append([r[1] for r in results])
        preds.append([r[2] for r in results])
    return scores, correct, preds


def _steps_of(text: str) -> list[str]:
    lines = [line for line in text.split("\n") if line.strip()]
    return lines or [text or " "]


def reward_model_scores(
    scorer_cfg: ScorerSection,
    prompts: Sequence[RSPrompt],
    completions: Sequence[Sequence[str]],
    system_prompt: str,
) -> list[list[float]]:
    """Scores of a trained reward model: chat = system + user + assistant(completion); a PRM
    scores the completion's non-empty lines as steps (its weakest step)."""
    from trainers.core.reward_scorer import RewardScorer

    scorer = RewardScorer.from_pretrained(
        scorer_cfg.name,
        device=scorer_cfg.device,
        dtype=scorer_cfg.dtype,
        batch_size=scorer_cfg.score_batch_size,
    )
    if scorer.kind == "prm":
        items: list = [
            {"problem": p.question, "steps": _steps_of(c)}
            for p, row in zip(prompts, completions, strict=True)
            for c in row
        ]
    else:
        items = [
            [*p.messages(system_prompt), {"role": "assistant", "content": c}]
            for p, row in zip(prompts, completions, strict=True)
            for c in row
        ]
    flat = scorer.score(items)
    del scorer
    out, k = [], 0
    for row in completions:
        out.append([float(s) for s in flat[k : k + len(row)]])
        k += len(row)
    return out


def score_pool(
    cfg: RejectionSamplingConfig,
    prompts: Sequence[RSPrompt],
    completions: Sequence[Sequence[str]],
    system_prompt: str,
) -> dict[str, Any]:
    """Verifier verdicts for every completion, and the scorer's scores (= the verifier's when
    the scorer is the verifier). Returns scores, correct, predictions and score_s."""
    t0 = time.time()
    v_scores, correct, preds = verify_pool(prompts, completions)
    if cfg.scorer.is_verifier:
        scores = v_scores
    else:
        scores = reward_model_scores(cfg.scorer, prompts, completions, system_prompt)
    return {
        "scores": scores,
        "correct": correct,
        "predictions": preds,
        "score_s": time.time() - t0,
    }


def finite_or_none(value: float) -> float | None:
    return value if isinstance(value, int | float) and math.isfinite(value) else None


# ---------------------------------------------------------------------------------------------
# Held-out exact match (greedy)
# ---------------------------------------------------------------------------------------------


def greedy_completions(
    model, tokenizer, prompts: Sequence[RSPrompt], system_prompt: str, cfg: RejectionSamplingConfig
) -> list[str]:
    """One greedy completion per held-out prompt."""
    from trainers.core.generation import generate_completions

    return generate_completions(
        model,
        tokenizer,
        [p.messages(system_prompt) for p in prompts],
        max_new_tokens=cfg.eval.eval_max_new_tokens,
        do_sample=False,
        batch_size=cfg.eval.eval_batch_size,
    )


def exact_match_metrics(
    tokenizer, prompts: Sequence[RSPrompt], completions: Sequence[str], cfg: RejectionSamplingConfig
) -> tuple[dict[str, float], list[dict]]:
    """The ``eval/`` metrics of greedy completions, and the first ``eval.num_samples`` of them
    as sample rows (prompt, completion, gold, prediction, correct)."""
    results = [verify(p, c) for p, c in zip(prompts, completions, strict=True)]
    lengths = token_lengths(tokenizer, [completions])[0]
    n = max(len(prompts), 1)
    metrics = {
        "eval/exact_match": sum(r[1] for r in results) / n,
        "eval/mean_score": sum(r[0] for r in results) / n,
        "eval/num_prompts": float(len(prompts)),
        "eval/response_length": sum(lengths) / n,
        "eval/clipped_frac": sum(x >= cfg.eval.eval_max_new_tokens for x in lengths) / n,
    }
    rows = list(zip(prompts, completions, results, strict=True))[: cfg.eval.num_samples]
    samples = [
        {
            "kind": "eval",
            "prompt": p.question,
            "completion": c,
            "gold": p.gold,
            "prediction": r[2],
            "correct": r[1],
            "score": r[0],
        }
        for p, c, r in rows
    ]
    return metrics, samples


def eval_cache_fields(
    cfg: RejectionSamplingConfig,
    test_prompts: Sequence[RSPrompt],
    *,
    device: str,
    dtype: str,
    attn: str,
) -> dict[str, Any]:
    """Key of the starting policy's greedy held-out completions (the baseline evaluation, the
    same for every strategy)."""
    from trainers.core.models import model_fingerprint

    return {
        "version": CACHE_VERSION,
        "kind": "baseline_eval",
        "policy": {"name": cfg.model.name, "fingerprint": model_fingerprint(cfg.model.name)},
        "data": {
            "dataset": cfg.data.dataset,
            "test_dataset": cfg.data.test_dataset,
            "split": cfg.data.test_split,
            "fingerprint": data_fingerprint(test_prompts, system_prompt_for(cfg)),
        },
        "eval": {
            "max_new_tokens": cfg.eval.eval_max_new_tokens,
            "batch_size": cfg.eval.eval_batch_size,
        },
        "runtime": {"device": device, "dtype": dtype, "attn": attn},
    }
