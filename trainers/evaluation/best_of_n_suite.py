"""Best-of-n by an ORM, a PRM, majority vote and at random: the ``best_of_n`` evaluation suite
(its command: :mod:`trainers.evaluation.best_of_n`).

The policy samples ``sampling.n`` (= n_max) completions of each held-out reasoning-gym question
once (the ``reasoning`` suite's prompts, sampling and verifier). Each completion gets:

* the verifier's verdict and extracted answer (``trainers.core.tasks``: reasoning-gym's
  ``score_answer`` on the last ``<answer>`` block — no other verifier);
* the ORM's P(correct) of the conversation (prompt + completion, the chat template it was
  trained with; :class:`~trainers.core.reward_scorer.RewardScorer`);
* the PRM's per-step P(not bad) of the completion cut into steps (:func:`solution_steps`) in the
  PRM's own text format (``Problem: …\\nReasoning trace:\\n`` + step + separator …), aggregated
  by ``best_of_n.prm_aggregate`` (product, Lightman et al. 2023's choice, or min); both
  aggregates are stored.

``items.jsonl`` holds one row per prompt with every sample's text, verdict, answer and scores,
enough to recompute every selection offline; ``eval.json`` holds the accuracy of each selector
at n = 1, 2, 4, … n_max and the paired leads PRM − ORM and PRM − majority
(:mod:`trainers.evaluation.best_of_n_stats`, formulas in the README).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainers.core.config import ConfigError
from trainers.core.harness import raise_if_stopping
from trainers.evaluation import best_of_n_stats as bs
from trainers.evaluation.config import EvalConfig
from trainers.evaluation.targets import saved_reward_model

N_SAMPLE_ROWS = 8

_THINK_RE = re.compile(r"<think>(.*?)(?:</think>|$)", re.DOTALL)
_ANSWER_BLOCK_RE = re.compile(r"<answer>.*?(?:</answer>|$)", re.DOTALL)
_SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+|\n+")


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------


def reward_model_folder(given: str, kind: str) -> str:
    """The folder of the saved reward model ``given`` names (a reward-model run folder or its
    ``final_model/``), checked to be of ``kind``; ConfigError otherwise."""
    path, meta = saved_reward_model(
        given, f"best_of_n.{kind}", f"name a {kind} reward-model run folder or its final_model/"
    )
    if meta.get("kind") != kind:
        raise ConfigError(
            f"best_of_n.{kind} {given!r} is a {meta.get('kind')!r} reward model; this slot "
            f"takes a {kind} one"
        )
    return str(path.absolute())


def check_inputs(cfg: EvalConfig) -> tuple[str, str]:
    """(ORM folder, PRM folder), each checked to be a saved reward model of its kind, and the
    earlier job of ``best_of_n.samples_from`` when one is named."""
    assert cfg.best_of_n.orm and cfg.best_of_n.prm  # the config validator asks for both
    if cfg.best_of_n.samples_from:
        samples_job(cfg.best_of_n.samples_from, cfg.sampling.n)
    return reward_model_folder(cfg.best_of_n.orm, "orm"), reward_model_folder(
        cfg.best_of_n.prm, "prm"
    )


# ---------------------------------------------------------------------------------------------
# Steps and aggregates
# ---------------------------------------------------------------------------------------------


def solution_steps(text: str, answer: str | None) -> list[str]:
    """A completion cut into PRM steps: the reasoning (inside ``<think>`` when there is one, else
    the text without its ``<answer>`` block) split into sentences and lines, each without its
    final full stop, then ``"The answer is {answer}."`` when an answer was extracted. This is
    the built-in step set's format (``trainers.core.builtin_data.builtin_step_records``): a
    chain-sum demonstration ``<think>3 + 4 = 7. 7 - 2 = 5.</think><answer>5</answer>`` gives
    ``["3 + 4 = 7", "7 - 2 = 5", "The answer is 5."]``. An empty completion has no step."""
    think = _THINK_RE.search(text)
    reasoning = think.group(1) if think else _ANSWER_BLOCK_RE.sub(" ", text)
    reasoning = reasoning.replace("</think>", " ")
    steps = [s.strip().rstrip(".").strip() for s in _SENTENCE_END_RE.split(reasoning)]
    steps = [s for s in steps if s]
    if answer is not None and answer.strip():
        steps.append(f"The answer is {answer.strip()}.")
    return steps


def aggregate(step_scores: Sequence[float], how: str) -> float:
    """A solution's PRM score from its steps' P(not bad): their product or their minimum; 0.0
    for a solution with no step (nothing to vouch for)."""
    if not step_scores:
        return 0.0
    if how == "min":
        return min(step_scores)
    if how == "product":
        return math.prod(step_scores)
    raise ValueError(f"unknown PRM aggregate {how!r}")


# ---------------------------------------------------------------------------------------------
# The suite
# ---------------------------------------------------------------------------------------------


def _chunks(n: int, size: int) -> list[range]:
    return [range(s, min(s + size, n)) for s in range(0, n, size)]


def _scores_in_chunks(
    job, n_rows: int, size: int, score: Callable[[range], list[Any]]
) -> list[Any]:
    out: list[Any] = []
    for rows in _chunks(n_rows, size):
        raise_if_stopping("eval_batch")
        out.extend(score(rows))
        job.advance()
    return out


def _load_scorer(cfg: EvalConfig, folder: str):
    from trainers.core.reward_scorer import RewardScorer

    return RewardScorer.from_pretrained(
        folder,
        device=cfg.device,
        dtype=cfg.dtype,
        attn_implementation=cfg.attn_implementation,
        batch_size=cfg.best_of_n.score_batch_size,
    )


def orm_scores(job, folder: str, prompts, texts: list[str]) -> list[float]:
    """P(correct) of every (prompt, completion) by the ORM, in row order."""
    from trainers.evaluation.sampling import release_memory

    n = len(texts) // len(prompts)
    job.enter("loading_model", f"orm {folder}")
    scorer = _load_scorer(job.cfg, folder)
    job.enter("evaluating", "ORM scores")

    def score(rows: range) -> list[float]:
        return scorer.score(
            [[*prompts[r // n].messages, {"role": "assistant", "content": texts[r]}] for r in rows]
        )

    out = _scores_in_chunks(job, len(texts), job.cfg.best_of_n.score_batch_size, score)
    scorer = None  # released before the next model loads
    release_memory()
    return out


def prm_step_scores(job, folder: str, prompts, steps: list[list[str]]) -> list[list[float]]:
    """Every step's P(not bad) by the PRM, per row (an empty list for a row with no step)."""
    from trainers.core.reward_model import BAD_CLASS
    from trainers.evaluation.sampling import release_memory

    n = len(steps) // len(prompts)
    job.enter("loading_model", f"prm {folder}")
    scorer = _load_scorer(job.cfg, folder)
    job.enter("evaluating", "PRM step scores")

    def score(rows: range) -> list[list[float]]:
        kept = [r for r in rows if steps[r]]
        probs = scorer.score_steps(
            [prompts[r // n].question for r in kept], [steps[r] for r in kept]
        )
        by_row = {r: [1.0 - p[BAD_CLASS] for p in pr] for r, pr in zip(kept, probs, strict=True)}
        return [by_row.get(r, []) for r in rows]

    out = _scores_in_chunks(job, len(steps), job.cfg.best_of_n.score_batch_size, score)
    scorer = None  # released before the next model loads
    release_memory()
    return out


@dataclass
class Drawn:
    """The policy's completions, prompt-major (sample ``j`` of prompt ``i`` is row
    ``i * n + j``): drawn now, or read back from an earlier job (``best_of_n.samples_from``)."""

    n: int
    texts: list[str]
    truncated: list[bool]
    lengths: list[int]

    def rows_of(self, i: int) -> range:
        return range(i * self.n, (i + 1) * self.n)


def read_samples(folder: str, prompts, n: int, target_model: str) -> Drawn:
    """The completions an earlier best_of_n job drew (its ``items.jsonl``), checked to come from
    the same policy, with the same n_max, on the same prompts; ConfigError otherwise."""
    ev, items_path = samples_job(folder, n)
    if ev.get("target_model") != target_model:
        raise ConfigError(
            f"best_of_n.samples_from {folder!r} sampled {ev.get('target_model')!r}, not the "
            f"target {target_model!r}"
        )
    rows = {}
    for line in items_path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows[row["id"]] = row["samples"]
    missing = [p.id for p in prompts if p.id not in rows]
    if missing:
        raise ConfigError(
            f"best_of_n.samples_from {folder!r} lacks {len(missing)} of this job's "
            f"{len(prompts)} prompts: draw them with the same prompts settings"
        )
    samples = [s for p in prompts for s in rows[p.id]]
    return Drawn(
        n,
        [s["text"] for s in samples],
        [bool(s["truncated"]) for s in samples],
        [int(s["length"]) for s in samples],
    )


def samples_job(folder: str, n: int) -> tuple[dict, Path]:
    """(eval.json, items.jsonl path) of the finished best_of_n job ``folder`` with n_max ``n``;
    ConfigError otherwise."""
    path = Path(folder).expanduser()
    eval_path, items_path = path / "eval.json", path / "items.jsonl"
    if not eval_path.is_file() or not items_path.is_file():
        raise ConfigError(
            f"best_of_n.samples_from {folder!r} holds no finished best_of_n evaluation "
            "(eval.json and items.jsonl)"
        )
    ev = json.loads(eval_path.read_text())
    settings = ev.get("settings") or {}
    drawn_n = (settings.get("sampling") or {}).get("n")
    if ev.get("suite") != "best_of_n" or drawn_n != n:
        raise ConfigError(
            f"best_of_n.samples_from {folder!r} is a {ev.get('suite')} evaluation with "
            f"{drawn_n} samples a prompt; this job needs best_of_n samples with n_max {n}"
        )
    return ev, items_path


def item_rows(prompts, samples: Drawn, per_row: dict[str, list], how: str) -> list[dict]:
    """One ``items.jsonl`` row per prompt: every sample with what selection needs. ``per_row``:
    ``checked`` (verifier score, verdict, format), ``answers``, ``orm``, ``steps`` and
    ``step_scores``, one entry per sample row."""
    checked, answers, orm = per_row["checked"], per_row["answers"], per_row["orm"]
    steps, step_scores = per_row["steps"], per_row["step_scores"]
    rows = []
    for i, p in enumerate(prompts):
        rows.append(
            {
                "id": p.id,
                "task": p.meta.get("task"),
                "question": p.question,
                "gold": str(p.meta.get("entry", {}).get("answer", "")),
                "samples": [
                    {
                        "text": samples.texts[r],
                        "answer": answers[r],
                        "correct": bool(checked[r][1]),
                        "format": bool(checked[r][2]),
                        "truncated": bool(samples.truncated[r]),
                        "length": samples.lengths[r],
                        "orm": orm[r],
                        "prm": aggregate(step_scores[r], how),
                        "prm_min": aggregate(step_scores[r], "min"),
                        "prm_product": aggregate(step_scores[r], "product"),
                        "steps": steps[r],
                        "step_scores": step_scores[r],
                    }
                    for r in samples.rows_of(i)
                ],
            }
        )
    return rows


def table_metrics(table: bs.BestOfNTable) -> dict[str, Any]:
    """``eval.json`` metrics: ``<selector>@<n>``, ``prm_minus_orm@<n>``,
    ``prm_minus_majority@<n>``, the headline ``prm_minus_orm`` (at n_max) and the growth of
    each lead from the smallest n > 1 to n_max."""
    last = table.sizes[-1]
    # what the ledger's Evaluation section shows first (its first six rows): the headline, each
    # selector at n_max, the growth of the lead
    out: dict[str, Any] = {"prm_minus_orm": table.lead["prm-orm"][last]}
    out.update({f"{sel}@{last}": table.accuracy[sel][last] for sel in ("prm", "orm", "majority")})
    out["prm_minus_orm_growth"] = table.growth["prm-orm"]
    out["prm_minus_majority"] = table.lead["prm-majority"][last]
    for sel, by_n in table.accuracy.items():
        out.update({f"{sel}@{n}": e for n, e in by_n.items() if f"{sel}@{n}" not in out})
    for name, by_n in table.lead.items():
        key = name.replace("-", "_minus_")
        out.update({f"{key}@{n}": e for n, e in by_n.items()})
        out[f"{key}_growth"] = table.growth[name]
    return out


def best_of_n_suite(job) -> Any:
    from trainers.core.tasks import extract_answer
    from trainers.evaluation.jobs import SuiteResult, reasoning_check
    from trainers.evaluation.prompts import prompt_set_fingerprint, reasoning_prompts

    cfg = job.cfg
    orm_folder, prm_folder = check_inputs(cfg)
    prompts, info = reasoning_prompts(cfg, job.target)
    n_max = cfg.sampling.n
    n_rows = len(prompts) * n_max
    score_units = 2 * len(_chunks(n_rows, cfg.best_of_n.score_batch_size))
    job.plan((0 if cfg.best_of_n.samples_from else job.batches(len(prompts))) + score_units)
    if cfg.best_of_n.samples_from:
        samples = read_samples(cfg.best_of_n.samples_from, prompts, n_max, job.target.model)
        print(f"samples: {n_rows} completions from {cfg.best_of_n.samples_from}", flush=True)
    else:
        drawn, _ = job.sample_with("target", job.target, prompts)
        samples = Drawn(n_max, drawn.texts, drawn.truncated, drawn.lengths())
    job.enter("evaluating", "verifier")
    checked = [reasoning_check(samples.texts[r], prompts[r // samples.n]) for r in range(n_rows)]
    answers = [extract_answer(t) for t in samples.texts]
    steps = [solution_steps(t, a) for t, a in zip(samples.texts, answers, strict=True)]
    orm = orm_scores(job, orm_folder, prompts, samples.texts)
    step_scores = prm_step_scores(job, prm_folder, prompts, steps)
    how = cfg.best_of_n.prm_aggregate
    per_row = {
        "checked": checked,
        "answers": answers,
        "orm": orm,
        "steps": steps,
        "step_scores": step_scores,
    }
    items = item_rows(prompts, samples, per_row, how)
    sizes = bs.subset_sizes(cfg.sampling.n)
    values = [
        bs.prompt_values(
            bs.PromptSamples.from_row(row), sizes, seed=cfg.seed, draws=cfg.best_of_n.majority_draws
        )
        for row in items
    ]
    b = cfg.bootstrap
    table = bs.best_of_n_table(values, resamples=b.resamples, level=b.level, seed=cfg.seed)
    out = SuiteResult(
        table_metrics(table),
        details={
            "prompts": info,
            "n_max": cfg.sampling.n,
            "sizes": sizes,
            "orm": orm_folder,
            "prm": prm_folder,
            "prm_aggregate": how,
            "samples_from": cfg.best_of_n.samples_from,
            "fingerprints": _fingerprints(orm_folder, prm_folder),
            "format_rate": sum(bool(c[2]) for c in checked) / max(1, n_rows),
            "answered_rate": sum(a is not None for a in answers) / max(1, n_rows),
            "mean_steps": sum(len(s) for s in steps) / max(1, len(steps)),
            "no_step_share": sum(1 for s in steps if not s) / max(1, len(steps)),
        },
        prompt_set=prompt_set_fingerprint(prompts),
    )
    out.items = items
    out.samples = [_sample_row(row) for row in items[:N_SAMPLE_ROWS]]
    return out


def _fingerprints(*folders: str) -> dict[str, str | None]:
    from trainers.core.models import model_fingerprint

    out: dict[str, str | None] = {}
    for role, folder in zip(("orm", "prm"), folders, strict=True):
        try:
            out[role] = model_fingerprint(folder)
        except Exception:  # noqa: BLE001 - a fingerprint must not fail an evaluation
            out[role] = None
    return out


def _sample_row(row: dict) -> dict:
    """The ORM's and the PRM's pick among a prompt's samples, for ``samples.jsonl``."""
    samples = row["samples"]
    pick = {k: max(range(len(samples)), key=lambda j: samples[j][k]) for k in ("orm", "prm")}
    return {
        "prompt": row["question"],
        "gold": row["gold"],
        **{f"{k}_pick": samples[j]["text"] for k, j in pick.items()},
        **{f"{k}_pick_result": {"correct": samples[j]["correct"]} for k, j in pick.items()},
    }
