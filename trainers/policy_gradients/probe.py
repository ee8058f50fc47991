"""Difficulty probe: how the base model does on candidate reasoning-gym tasks before a run.

For each candidate (one or more reasoning-gym task specs, as ``data.specs`` takes them) the probe
draws ``prompts`` questions from the task mixture with a probe seed (a draw of its own, apart from
the run's training and held-out prompts), samples ``samples`` completions per question with the
run's sampling settings through the shared decoding loop (``trainers/core/decoding.py``), scores
each with this family's verifier reward (:func:`trainers.core.verifier.compute_rewards`:
correctness + ``format_weight`` × format), and reports per candidate:

* ``pass_rate``: share of samples whose verifier correctness is > 0 (the task is solved, at least
  partly: some reasoning-gym tasks grade);
* ``reward_positive_rate``: share of samples whose total reward is > 0 (with a format weight a
  single tag is enough, so this measures the format as much as the task);
* ``contrast``: share of prompts whose samples' total rewards differ (a group with contrast gives
  a non-zero advantage); ``correctness_contrast`` the same on correctness alone;
* ``format_rate``: share of samples with all four tags (format score 1); ``answer_tag_rate``:
  share with an ``<answer>…</answer>`` block;
* ``untagged_pass_rate``: share of samples *without* an answer tag whose last number, read as
  the answer, the task scores > 0 (a diagnostic for a model that answers in prose: what a warm
  start on the tag format could unlock; 0 for tasks whose answers are not numbers);
* response lengths in tokens (``length_p50``, ``length_p90``, ``length_max``), ``clipped``: share
  cut at ``max_new_tokens`` without an end-of-turn token; ``seconds`` spent on the candidate.

With ``--environment NAME`` (a run with ``env.name``) each sample is a multi-turn trajectory
with that environment (``--max-turns`` model turns, ``--max-new-tokens`` per turn; the verifier
scores the model's turns), and the report adds ``tool_call_rate``, the share of samples that
called the tool.

Run it as ``python -m trainers.policy_gradients.probe --model M --candidates JSON --prompts 32
--samples 4 --max-new-tokens 128 --json``; ``--candidates`` is a JSON list (inline or ``@file``)
of ``{"id": "chain_sum/1-digit", "specs": [{"name": "chain_sum", "config": {...}}]}`` (a bare
spec ``{"name", "config"}`` is one candidate). Exit 2 on bad input, nothing else written.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PROBE_SEED_OFFSET = 7_000_003
"""The probe's prompts come from the task mixture drawn with ``seed + PROBE_SEED_OFFSET``."""


@dataclass(frozen=True)
class ProbeSettings:
    """What the probe's numbers depend on besides the model and the candidates."""

    prompts: int = 32
    samples: int = 4
    max_new_tokens: int = 128
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 20
    min_p: float = 0.0
    format_weight: float = 0.5
    seed: int = 42
    batch_prompts: int = 8
    environment: str | None = None  # multi-turn: sample trajectories with this environment
    max_turns: int = 3


@dataclass
class CandidateResult:
    id: str
    specs: list[dict]
    prompts: int
    samples: int
    pass_rate: float
    reward_positive_rate: float
    contrast: float
    correctness_contrast: float
    format_rate: float
    answer_tag_rate: float
    untagged_pass_rate: float
    mean_reward: float
    length_p50: int
    length_p90: int
    length_max: int
    clipped: float
    seconds: float
    example: str
    tool_call_rate: float | None = None  # multi-turn probes only


def percentile(values: list[int], q: float) -> int:
    """The ``q``-th percentile (0-100) of ``values`` by the nearest-rank rule (0 when empty)."""
    if not values:
        return 0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return int(ordered[rank - 1])


def group_contrast(rewards: list[float], samples: int) -> float:
    """Share of consecutive groups of ``samples`` values that are not all equal."""
    groups = [rewards[i : i + samples] for i in range(0, len(rewards), samples)]
    if not groups:
        return 0.0
    return sum(max(g) != min(g) for g in groups) / len(groups)


def summarise(
    cand_id: str, specs: list[dict], scored: dict[str, list], settings: ProbeSettings
) -> CandidateResult:
    """One candidate's figures from its per-sample ``correctness``, ``format``, ``total``,
    ``length``, ``truncated`` and ``text`` lists (samples of a prompt consecutive)."""
    n = len(scored["total"])
    k = settings.samples
    lengths = [int(x) for x in scored["length"]]
    positive = [i for i, c in enumerate(scored["correctness"]) if c > 0]
    example_at = positive[0] if positive else 0
    return CandidateResult(
        id=cand_id,
        specs=specs,
        prompts=n // k if k else 0,
        samples=k,
        pass_rate=len(positive) / n if n else 0.0,
        reward_positive_rate=sum(t > 0 for t in scored["total"]) / n if n else 0.0,
        contrast=group_contrast(scored["total"], k),
        correctness_contrast=group_contrast(scored["correctness"], k),
        format_rate=sum(f == 1.0 for f in scored["format"]) / n if n else 0.0,
        answer_tag_rate=sum(a for a in scored["answer_tag"]) / n if n else 0.0,
        untagged_pass_rate=sum(u > 0 for u in scored["untagged"]) / n if n else 0.0,
        mean_reward=sum(scored["total"]) / n if n else 0.0,
        length_p50=percentile(lengths, 50),
        length_p90=percentile(lengths, 90),
        length_max=max(lengths, default=0),
        clipped=sum(bool(t) for t in scored["truncated"]) / n if n else 0.0,
        seconds=0.0,
        example=scored["text"][example_at][:300] if n else "",
        tool_call_rate=sum(scored["called"]) / n if n and "called" in scored else None,
    )


LAST_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def untagged_score(text: str, meta: dict) -> float:
    """The task's score of the last number in a response that has no ``<answer>`` tag (0 when
    it has one, or no number): how often a prose answer is right."""
    from trainers.core.tasks import extract_answer, score_fn

    numbers = LAST_NUMBER.findall(text)
    if extract_answer(text) is not None or not numbers:
        return 0.0
    try:
        return float(score_fn(meta["task"])(numbers[-1], meta["entry"]))
    except Exception:  # noqa: BLE001 - a task that cannot score a bare number
        return 0.0


# ---- candidates ---------------------------------------------------------------------------


def parse_candidates(text: str) -> list[dict]:
    """Candidates from JSON text (or ``@file``): a list of ``{"id", "specs"}`` or bare specs.
    ValueError naming the problem."""
    if text.startswith("@"):
        text = Path(text[1:]).read_text()
    data = json.loads(text)
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not data:
        raise ValueError("--candidates must be a non-empty JSON list")
    out = []
    for item in data:
        if not isinstance(item, dict):
            raise ValueError(f"a candidate must be an object, got {item!r}")
        specs = item.get("specs") if "specs" in item else [item]
        if not isinstance(specs, list) or not specs:
            raise ValueError(f"candidate {item!r}: specs must be a non-empty list")
        clean = []
        for spec in specs:
            if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
                raise ValueError(f"candidate {item!r}: each spec needs a task name")
            clean.append(
                {
                    "name": spec["name"],
                    "weight": float(spec.get("weight", 1.0)),
                    "config": dict(spec.get("config") or {}),
                }
            )
        cand_id = item.get("id") or "+".join(s["name"] for s in clean)
        out.append({"id": str(cand_id), "specs": clean})
    return out


def probe_prompts(specs: list[dict], n: int, seed: int) -> list:
    """``n`` prompts of the mixture ``specs``, as the policy-gradient loader builds them
    (system prompt, question, scoring meta), from the probe's own seed."""
    from types import SimpleNamespace

    from trainers.core.prompts import build_composite, to_prompt

    objs = [
        SimpleNamespace(
            name=s["name"], weight=float(s.get("weight", 1.0)), config=s.get("config") or {}
        )
        for s in specs
    ]
    ds = build_composite(objs, n, seed + PROBE_SEED_OFFSET)
    return [to_prompt(ds[i]) for i in range(n)]


# ---- sampling and scoring -------------------------------------------------------------------


def sample_and_score(model, tokenizer, prompts: list, settings: ProbeSettings) -> dict[str, list]:
    """``settings.samples`` completions per prompt (consecutive), scored with the verifier
    reward; per-sample lists."""
    import torch

    from trainers.core.decoding import Sampling
    from trainers.core.generation import chat_prompt_ids, end_of_turn_ids
    from trainers.core.onpolicy import cut_at_first_stop, sample_policy
    from trainers.core.tasks import extract_answer
    from trainers.core.verifier import compute_rewards

    stop_ids = set(end_of_turn_ids(tokenizer))
    sampling = Sampling(
        temperature=settings.temperature,
        top_k=settings.top_k,
        top_p=settings.top_p,
        min_p=settings.min_p,
    )
    generator = torch.Generator(device=next(model.parameters()).device)
    generator.manual_seed(settings.seed)
    texts, lengths, truncated, metas = [], [], [], []
    if settings.environment:
        texts, lengths, truncated, metas, calls = sample_trajectories(
            model, tokenizer, prompts, settings, sampling
        )
    else:
        new = sample_policy(
            model,
            tokenizer,
            [chat_prompt_ids(tokenizer, p.messages) for p in prompts],
            max_new_tokens=settings.max_new_tokens,
            sampling=sampling,
            repeats=settings.samples,
            generator=generator,
            batch_size=settings.batch_prompts,
        )
        for i, tokens in enumerate(new):
            kept, cut = cut_at_first_stop(tokens, stop_ids)
            body = kept if cut else kept[:-1]
            texts.append(tokenizer.decode(body, skip_special_tokens=True))
            lengths.append(len(kept))
            truncated.append(cut)
            metas.append(prompts[i // settings.samples].meta)
    parts = compute_rewards(texts, metas, lengths, format_weight=settings.format_weight)
    return {
        "correctness": parts["correctness"].tolist(),
        "format": parts["format"].tolist(),
        "total": parts["total"].tolist(),
        "answer_tag": [extract_answer(t) is not None for t in texts],
        "untagged": [untagged_score(t, m) for t, m in zip(texts, metas, strict=True)],
        "length": lengths,
        "truncated": truncated,
        "text": texts,
        **({"called": calls} if settings.environment else {}),
    }


def sample_trajectories(model, tokenizer, prompts: list, settings: ProbeSettings, sampling):
    """Multi-turn samples with ``settings.environment``: (texts, model-token lengths, truncated,
    metas, whether each called a tool)."""
    from trainers.core.environments import make_environment
    from trainers.core.multiturn import TrajectoryRollout, TurnLimits

    per_turn = settings.max_new_tokens
    limits = TurnLimits(settings.max_turns, per_turn, 64, settings.max_turns * (per_turn + 80))
    rollout = TrajectoryRollout(tokenizer, limits)
    out: tuple[list, list, list, list, list] = ([], [], [], [], [])
    for start in range(0, len(prompts), settings.batch_prompts):
        chunk = prompts[start : start + settings.batch_prompts]
        envs = [
            make_environment(settings.environment) for _ in range(len(chunk) * settings.samples)
        ]
        trajs = rollout.run(model, chunk, envs, repeats=settings.samples, sampling=sampling)
        for i, t in enumerate(trajs):
            for column, value in zip(
                out,
                (
                    t.model_text,
                    t.model_tokens,
                    not t.finished,
                    chunk[i // settings.samples].meta,
                    t.tool_calls > 0,
                ),
                strict=True,
            ):
                column.append(value)
    return out


def run_probe(model_name: str, candidates: list[dict], settings: ProbeSettings) -> dict[str, Any]:
    """Load the model once and probe every candidate; the JSON-ready report."""
    import torch

    from trainers.core.models import load_causal_lm, load_tokenizer, model_fingerprint

    started = time.monotonic()
    tokenizer = load_tokenizer(model_name)
    model = load_causal_lm(model_name, trainable=False)
    load_s = time.monotonic() - started
    torch.manual_seed(settings.seed)
    results = []
    for cand in candidates:
        t0 = time.monotonic()
        prompts = probe_prompts(cand["specs"], settings.prompts, settings.seed)
        scored = sample_and_score(model, tokenizer, prompts, settings)
        result = summarise(cand["id"], cand["specs"], scored, settings)
        result.seconds = round(time.monotonic() - t0, 2)
        results.append(asdict(result))
    return {
        "model": model_name,
        "fingerprint": model_fingerprint(model_name),
        "settings": asdict(settings),
        "load_seconds": round(load_s, 2),
        "seconds": round(time.monotonic() - started, 2),
        "candidates": results,
    }


# ---- command line ---------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    d = ProbeSettings()
    p = argparse.ArgumentParser(
        prog="python -m trainers.policy_gradients.probe",
        description="Probe a base model's pass rate and group contrast on candidate tasks.",
    )
    p.add_argument("--model", required=True)
    p.add_argument("--candidates", required=True, help="JSON list (or @file) of candidates")
    p.add_argument("--prompts", type=int, default=d.prompts)
    p.add_argument("--samples", type=int, default=d.samples, help="completions per prompt")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    p.add_argument("--temperature", type=float, default=d.temperature)
    p.add_argument("--top-p", type=float, default=d.top_p)
    p.add_argument("--top-k", type=int, default=d.top_k)
    p.add_argument("--min-p", type=float, default=d.min_p)
    p.add_argument("--format-weight", type=float, default=d.format_weight)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--batch-prompts", type=int, default=d.batch_prompts)
    p.add_argument("--environment", default=None, help="multi-turn: an environment name")
    p.add_argument("--max-turns", type=int, default=d.max_turns, help="model turns (multi-turn)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def _settings(args: argparse.Namespace) -> ProbeSettings:
    for name in ("prompts", "samples", "max_new_tokens", "batch_prompts"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if not args.temperature > 0:
        raise ValueError("--temperature must be > 0")
    if args.environment is not None:
        from trainers.core.environments import environment_names

        if args.environment not in environment_names():
            known = ", ".join(environment_names())
            raise ValueError(f"--environment {args.environment!r} is not one of: {known}")
        if args.max_turns < 1:
            raise ValueError("--max-turns must be >= 1")
    return ProbeSettings(
        environment=args.environment,
        max_turns=args.max_turns,
        prompts=args.prompts,
        samples=args.samples,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        format_weight=args.format_weight,
        seed=args.seed,
        batch_prompts=args.batch_prompts,
    )


def _table(report: dict[str, Any]) -> str:
    lines = [
        f"model {report['model']} ({report['fingerprint']}); load {report['load_seconds']} s",
        f"{'candidate':32} {'pass':>6} {'contr':>6} {'fmt':>6} {'ans':>6} {'p50':>5} {'p90':>5} "
        f"{'prose':>6} {'clip':>6} {'s':>7}",
    ]
    for c in report["candidates"]:
        lines.append(
            f"{c['id']:32} {c['pass_rate']:6.2f} {c['contrast']:6.2f} {c['format_rate']:6.2f} "
            f"{c['answer_tag_rate']:6.2f} {c['length_p50']:5d} {c['length_p90']:5d} "
            f"{c['untagged_pass_rate']:6.2f} {c['clipped']:6.2f} {c['seconds']:7.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = _settings(args)
        candidates = parse_candidates(args.candidates)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from trainers.core.config import ConfigError

    try:
        report = run_probe(args.model, candidates, settings)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(report) if args.json else _table(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
