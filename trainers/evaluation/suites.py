"""The evaluation suites. Each takes a :class:`~trainers.evaluation.jobs.Job` and returns a
:class:`~trainers.evaluation.jobs.SuiteResult`; the
formulas and caveats are in ``trainers/evaluation/README.md``.

Models are loaded one at a time (target, then baseline, then the judge or the reference) and
released in between, so the peak memory is one model's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from trainers.core.config import ConfigError
from trainers.core.harness import raise_if_stopping
from trainers.evaluation import cache
from trainers.evaluation import statistics as st
from trainers.evaluation.jobs import Job, SuiteResult, reasoning_check
from trainers.evaluation.prompts import (
    EvalPrompt,
    math_prompts,
    open_prompts,
    prompt_set_fingerprint,
    reasoning_prompts,
)
from trainers.evaluation.sampling import (
    Samples,
    release_memory,
    sequence_logps,
)

N_SAMPLE_ROWS = 8  # prompts whose completions go to samples.jsonl


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _per_prompt(samples: Samples, values: Sequence[float], n_prompts: int) -> list[float]:
    return [_mean([values[r] for r in samples.rows_of(i)]) for i in range(n_prompts)]


def _paired(job: Job, a: Sequence[float | None], b: Sequence[float | None]) -> st.Estimate:
    diffs = [x - y for x, y in zip(a, b, strict=True) if x is not None and y is not None]
    return job.mean(diffs)


# ---------------------------------------------------------------------------------------------
# reasoning and math: answers checked against a reference
# ---------------------------------------------------------------------------------------------


def _math_check(text: str, prompt: EvalPrompt) -> tuple[float, bool, bool]:
    """(score, correct, an answer was found) of a math response."""
    from trainers.evaluation.math_answers import is_correct

    ok, extracted = is_correct(text, prompt.meta["gold"])
    return float(ok), ok, extracted is not None


def _answer_metrics(
    job: Job, prompts: list[EvalPrompt], samples: Samples, check, pass_k: list[int]
) -> tuple[dict[str, st.Estimate], dict[str, list], list[dict]]:
    """Per-prompt values and their estimates for one model."""
    n, P = samples.n, len(prompts)
    checked = [check(samples.texts[r], prompts[r // n]) for r in range(P * n)]
    scores = [c[0] for c in checked]
    correct = [float(c[1]) for c in checked]
    fmt = [float(c[2]) for c in checked]
    per = {
        "accuracy": _per_prompt(samples, correct, P),
        "format_rate": _per_prompt(samples, fmt, P),
        "score_mean": _per_prompt(samples, scores, P),
        "mean_length": _per_prompt(samples, [float(x) for x in samples.lengths()], P),
        "never_ending": _per_prompt(samples, [float(t) for t in samples.truncated], P),
    }
    for k in sorted(set(pass_k)):
        if k > 1:
            per[f"pass@{k}"] = [
                st.pass_at_k(n, sum(c[1] for c in checked[i * n : (i + 1) * n]), k)
                for i in range(P)
            ]
    metrics = {name: _estimate(job, name, values) for name, values in per.items()}
    rows = [{"correct": int(sum(correct[r] for r in samples.rows_of(i))), "n": n} for i in range(P)]
    return metrics, per, rows


COMPARED = ("accuracy", "format_rate", "score_mean")
# per-prompt shares of 0/1 outcomes: their intervals are Wilson's when every value is 0 or 1
# (score_mean: a score in [0, 1]; when every prompt's is 0 or 1 it is a share like accuracy)
PROPORTIONS = frozenset({"accuracy", "format_rate", "score_mean", "never_ending", "pair_accuracy"})


def _is_proportion(name: str) -> bool:
    return name in PROPORTIONS or name.startswith("pass@")


def _estimate(job: Job, name: str, values: Sequence[float]) -> st.Estimate:
    """A metric's estimate: a proportion's through :meth:`Job.share`, any other mean's through
    the bootstrap."""
    return job.share(values) if _is_proportion(name) else job.mean(values)


def _cached_role(job: Job, role: str, key: str | None):
    """(metrics, per, rows) and the first completions of ``role`` from the cache, or None."""
    entry = cache.load(job.cfg.cache_dir, key)
    if entry is None:
        return None
    metrics = {
        k: st.Estimate(**v, level=job.cfg.bootstrap.level) for k, v in entry["metrics"].items()
    }
    first = Samples(n=1, prompt_ids=[], completion_ids=[], truncated=[], texts=entry["first"])
    print(f"cache hit: {role} ({key}) reused", flush=True)
    return (metrics, entry["per"], entry["rows"]), first


def answer_suite(job: Job, prompts: list[EvalPrompt], info: dict, check) -> SuiteResult:
    cfg = job.cfg
    pass_k = [k for k in cfg.reasoning.pass_k if k <= cfg.sampling.n]
    prompt_set = prompt_set_fingerprint(prompts)
    keys = {
        role: cache.model_key(cfg, job.fingerprints[role], prompt_set)
        if cfg.cache_dir and job.fingerprints.get(role)
        else None
        for role, _ in job.models()
    }
    cached: dict[str, bool] = {}
    results: dict[str, tuple] = {}
    texts: dict[str, Samples] = {}
    for role, ref in job.models():  # looked up in turn: a baseline may reuse the target's result
        hit = _cached_role(job, role, keys[role])
        cached[role] = hit is not None
        if hit is not None:
            results[role], texts[role] = hit
            continue
        job.plan(job.batches(len(prompts)))
        samples, _ = job.sample_with(role, ref, prompts)
        job.enter("evaluating", f"{role}: checking answers")
        results[role] = _answer_metrics(job, prompts, samples, check, pass_k)
        texts[role] = samples
        metrics_r, per_r, rows_r = results[role]
        first = [samples.texts[samples.rows_of(i)[0]] for i in range(len(prompts))]
        cache.store(
            cfg.cache_dir,
            keys[role],
            {
                "model": ref.model,
                "metrics": {k: v.as_dict() for k, v in metrics_r.items()},
                "per": per_r,
                "rows": rows_r,
                "first": first[:N_SAMPLE_ROWS],
            },
        )
    metrics, per, rows = results["target"]
    out = SuiteResult(
        metrics,
        details={
            "prompts": info,
            "cache": {
                role: ("hit" if cached[role] else "miss") if keys[role] else "off"
                for role, _ in job.models()
            },
        },
        prompt_set=prompt_set,
    )
    if "baseline" in results:
        b_metrics, b_per, b_rows = results["baseline"]
        out.baseline_metrics = b_metrics
        for name in per:
            if name in COMPARED or name.startswith("pass@"):
                out.difference[name] = _paired(job, per[name], b_per[name])
    for i, p in enumerate(prompts):
        item = {"id": p.id, "target": rows[i]}
        if "baseline" in results:
            item["baseline"] = results["baseline"][2][i]
        out.items.append(item)
    out.samples = _sample_rows(prompts, texts, lambda i, role: rows_of(results, role, i))
    return out


def rows_of(results: dict, role: str, i: int) -> dict:
    return results[role][2][i]


def _sample_rows(prompts, texts: dict[str, Samples], extra) -> list[dict]:
    out = []
    for i, p in enumerate(prompts[:N_SAMPLE_ROWS]):
        row: dict[str, Any] = {"prompt": p.question}
        for role, samples in texts.items():
            row[role] = samples.texts[samples.rows_of(i)[0]]
            row[f"{role}_result"] = extra(i, role)
        out.append(row)
    return out


def reasoning_suite(job: Job) -> SuiteResult:
    prompts, info = reasoning_prompts(job.cfg, job.target)
    return answer_suite(job, prompts, info, reasoning_check)


def math_suite(job: Job) -> SuiteResult:
    prompts, info = math_prompts(job.cfg)
    info = {**info, "checker": "math-verify"}
    return answer_suite(job, prompts, info, _math_check)


# ---------------------------------------------------------------------------------------------
# winrate: target vs baseline, judged by a reward model
# ---------------------------------------------------------------------------------------------


def _outcome(t_text: str, b_text: str, t_score: float, b_score: float, margin: float) -> int:
    if t_text == b_text or abs(t_score - b_score) <= margin:
        return st.TIE
    return st.WIN if t_score > b_score else st.LOSS


def winrate_suite(job: Job) -> SuiteResult:
    cfg = job.cfg
    assert job.baseline is not None and job.judge is not None
    prompts, info = open_prompts(cfg, job.target)
    n, P = cfg.sampling.n, len(prompts)
    job.plan(job.batches(P) * 2 + 2)
    t, _ = job.sample_with("target", job.target, prompts)
    b, _ = job.sample_with("baseline", job.baseline, prompts)

    from trainers.core.reward_scorer import RewardScorer

    job.enter("loading_model", f"judge {job.judge}")
    scorer = RewardScorer.from_pretrained(
        job.judge,
        device=cfg.device,
        dtype=cfg.dtype,
        attn_implementation=cfg.attn_implementation,
        batch_size=cfg.winrate.judge_batch_size,
    )
    job.enter("evaluating", "judging")

    def conversations(samples: Samples) -> list[list[dict]]:
        return [
            [*prompts[r // n].messages, {"role": "assistant", "content": samples.texts[r]}]
            for r in range(P * n)
        ]

    raise_if_stopping("eval_batch")
    t_scores = scorer.score(conversations(t))
    job.advance()
    raise_if_stopping("eval_batch")
    b_scores = scorer.score(conversations(b))
    job.advance()
    del scorer
    release_memory()

    margin = cfg.winrate.tie_margin
    outcomes = [
        [_outcome(t.texts[r], b.texts[r], t_scores[r], b_scores[r], margin) for r in t.rows_of(i)]
        for i in range(P)
    ]
    diffs = [[len(t.texts[r]) - len(b.texts[r]) for r in t.rows_of(i)] for i in range(P)]
    bs = cfg.bootstrap
    wtl = st.win_tie_loss(outcomes, resamples=bs.resamples, level=bs.level, seed=cfg.seed)
    lc, coverage = st.length_controlled_win_rate(
        outcomes,
        diffs,
        n_buckets=cfg.winrate.length_buckets,
        resamples=bs.resamples,
        level=bs.level,
        seed=cfg.seed,
    )
    t_len = _per_prompt(t, [float(len(x)) for x in t.texts], P)
    b_len = _per_prompt(b, [float(len(x)) for x in b.texts], P)
    t_judge = _per_prompt(t, t_scores, P)
    b_judge = _per_prompt(b, b_scores, P)
    metrics = {
        **wtl,
        "win_rate_length_controlled": lc,
        "judge_score": job.mean(t_judge),
        "mean_length_chars": job.mean(t_len),
    }
    out = SuiteResult(
        metrics,
        baseline_metrics={
            "judge_score": job.mean(b_judge),
            "mean_length_chars": job.mean(b_len),
        },
        difference={
            "judge_score": _paired(job, t_judge, b_judge),
            "mean_length_chars": _paired(job, t_len, b_len),
        },
        details={
            "prompts": info,
            "judge": job.judge,
            "length_unit": "characters",
            "length_controlled_coverage": coverage,
            "pairs": P * n,
            "tie_margin": margin,
        },
        prompt_set=prompt_set_fingerprint(prompts),
    )
    out.items = [
        {"id": p.id, "outcomes": outcomes[i], "length_diffs": diffs[i]}
        for i, p in enumerate(prompts)
    ]
    out.samples = _sample_rows(
        prompts,
        {"target": t, "baseline": b},
        lambda i, role: {
            "judge_score": (t_scores if role == "target" else b_scores)[i * n],
            "outcome": outcomes[i][0],
        },
    )
    return out


# ---------------------------------------------------------------------------------------------
# generation: health of the samples and KL to the baseline
# ---------------------------------------------------------------------------------------------


def _health(job: Job, samples: Samples, P: int) -> tuple[dict[str, st.Estimate], dict]:
    cfg = job.cfg
    groups = [[samples.texts[r] for r in samples.rows_of(i)] for i in range(P)]
    rep_n = cfg.generation.repetition_n
    reps = [st.repetition_rate(x, rep_n) for x in samples.texts]
    per = {
        "mean_length": _per_prompt(samples, [float(x) for x in samples.lengths()], P),
        "never_ending": _per_prompt(samples, [float(x) for x in samples.truncated], P),
        f"repetition_{rep_n}": [
            _mean([reps[r] for r in samples.rows_of(i) if reps[r] is not None]) for i in range(P)
        ],
    }
    metrics = {
        name: _estimate(job, name, [v for v in values if v is not None])
        for name, values in per.items()
    }
    texts = [x for g in groups for x in g]
    for k in cfg.generation.distinct:
        # a corpus statistic: a resample repeats texts, which lowers it, so the bootstrap's
        # percentiles would not bracket it; no interval (README.md, "generation")
        metrics[f"distinct_{k}"] = st.Estimate(st.distinct_n(texts, k), None, None, P)
    return metrics, per


def generation_suite(job: Job) -> SuiteResult:
    cfg = job.cfg
    prompts, info = open_prompts(cfg, job.target)
    n, P = cfg.sampling.n, len(prompts)
    lp_batches = -(-(P * n) // cfg.generation.logprob_batch_size)
    with_kl = cfg.generation.kl and job.baseline is not None
    job.plan(job.batches(P) * len(job.models()) + (2 * lp_batches if with_kl else 0))

    def logps_of(what: str, scored=None):
        """A ``sample_with`` hook: the loaded model's log-probs of ``scored`` (default: the
        samples it has just drawn); None when no KL is asked for."""

        def logps(model, tokenizer, samples):
            if not with_kl:
                return None
            job.enter("evaluating", what)
            pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
            rows = samples if scored is None else scored
            return sequence_logps(model, rows, pad, cfg.generation.logprob_batch_size, job.advance)

        return logps

    t, t_lp = job.sample_with(
        "target", job.target, prompts, logps_of("target log-probs of its samples")
    )
    metrics, t_per = _health(job, t, P)
    details: dict[str, Any] = {"prompts": info}
    out = SuiteResult(metrics, details=details, prompt_set=prompt_set_fingerprint(prompts))
    if job.baseline is None:
        return out

    baseline_logps = logps_of("baseline log-probs of the target's samples", scored=t)
    b, b_lp = job.sample_with("baseline", job.baseline, prompts, baseline_logps)
    out.baseline_metrics, b_per = _health(job, b, P)
    for name in t_per:
        out.difference[name] = _paired(job, t_per[name], b_per[name])
    if with_kl:
        ratio = [t_lp[r] - b_lp[r] for r in range(P * n)]
        per_prompt = [
            [(ratio[r], len(t.completion_ids[r])) for r in t.rows_of(i)] for i in range(P)
        ]
        metrics["kl_to_baseline"] = job.mean(_per_prompt(t, ratio, P))
        metrics["kl_per_token"] = job.of(
            per_prompt,
            lambda gs: sum(x for g in gs for x, _ in g) / max(1, sum(m for g in gs for _, m in g)),
        )
        exact = (
            cfg.sampling.temperature == 1
            and cfg.sampling.top_p == 1
            and cfg.sampling.top_k == 0
            and cfg.sampling.min_p == 0
        )
        details["kl"] = {
            "estimator": "mean over the target's samples of log pi_target(y|x) - "
            "log pi_baseline(y|x), summed over the completion's tokens",
            "unbiased": exact,
            "note": None
            if exact
            else "samples were drawn with temperature/top-k/top-p/min-p filters, not from "
            "pi_target itself: the estimate is E_q[log pi_target - log pi_baseline], not a KL",
        }
    out.items = [
        {
            "id": p.id,
            "target_lengths": [len(t.completion_ids[r]) for r in t.rows_of(i)],
            **({"log_ratios": [t_lp[r] - b_lp[r] for r in t.rows_of(i)]} if with_kl else {}),
        }
        for i, p in enumerate(prompts)
    ]
    out.samples = _sample_rows(
        prompts,
        {"target": t, "baseline": b},
        lambda i, role: {"truncated": (t if role == "target" else b).truncated[i * n]},
    )
    return out


# ---------------------------------------------------------------------------------------------
# pair_accuracy: a direct-alignment run's implicit reward on its held-out pairs
# ---------------------------------------------------------------------------------------------


def pair_accuracy_suite(job: Job) -> SuiteResult:
    """Per held-out pair, the run's own loss function decides whether the implicit reward ranks
    chosen above rejected (trainers.direct_alignment.pairs.micro_batch_loss on one pair): the one
    place evaluation reads a family's own code, since a direct-alignment loss defines what its
    implicit reward is."""
    from trainers.core.models import load_causal_lm, load_reference, load_tokenizer, pick_runtime
    from trainers.direct_alignment.pairs import (
        compute_reference_logps,
        micro_batch_loss,
        prepare_examples,
    )

    run_cfg = job.target.run_config
    model_section = run_cfg.model.model_copy(
        update={"device": job.cfg.device, "dtype": job.cfg.dtype}
    )
    device, dtype, attn = pick_runtime(model_section)
    job.enter("tokenizing", "the run's held-out pairs")
    tokenizer = load_tokenizer(job.target.model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    _, eval_ex, _, _ = prepare_examples(run_cfg, tokenizer)
    if not eval_ex:
        raise ConfigError(f"the run {job.target.given!r} held out no pairs (data.eval_size 0)")
    with_ref = run_cfg.needs_reference
    roles = [("target", job.target.model)]
    if not with_ref and job.baseline is not None:
        roles.append(("baseline", job.baseline.model))
    job.plan(len(eval_ex) * len(roles) + (1 if with_ref else 0))

    ref_eval = None
    if with_ref:
        ref_name = run_cfg.model.ref_name or run_cfg.model.name
        job.enter("reference_logprobs", ref_name)
        ref_model = load_reference(run_cfg.model, device, dtype, attn)
        ref_eval = compute_reference_logps(
            ref_model,
            eval_ex,
            pad_id,
            device,
            run_cfg.eval.eval_batch_size,
            with_kl=run_cfg.loss == "kto",
        )
        del ref_model
        release_memory()
        job.advance()

    per: dict[str, dict[str, list[float]]] = {}
    for role, name in roles:
        job.enter("loading_model", f"{role} {name}")
        model = load_causal_lm(
            name, device=device, dtype=dtype, attn_implementation=attn, trainable=False
        )
        job.enter("evaluating", f"{role}: implicit reward of each held-out pair")
        acc, margin = [], []
        for i in range(len(eval_ex)):
            raise_if_stopping("eval_batch")
            _, m, _ = micro_batch_loss(run_cfg, model, eval_ex, [i], ref_eval, pad_id, device)
            acc.append(float(m["accuracy"]))
            if "margins" in m:
                margin.append(float(m["margins"]))
            job.advance()
        per[role] = {"pair_accuracy": acc, "reward_margin": margin}
        del model
        release_memory()
    metrics = {k: _estimate(job, k, v) for k, v in per["target"].items() if v}
    out = SuiteResult(
        metrics,
        details={
            "loss": run_cfg.loss,
            "beta": run_cfg.beta,
            "held_out_pairs": len(eval_ex),
            "dataset": run_cfg.data.dataset,
            "reference": (run_cfg.model.ref_name or run_cfg.model.name) if with_ref else None,
            "baseline_note": (
                "the loss measures the policy against its reference, so the starting model's "
                "implicit reward is 0 on every pair: no baseline row"
                if with_ref
                else None
            ),
        },
    )
    if "baseline" in per:
        out.baseline_metrics = {k: _estimate(job, k, v) for k, v in per["baseline"].items() if v}
        out.difference = {
            k: _paired(job, per["target"][k], per["baseline"][k])
            for k in per["target"]
            if per["target"][k] and per["baseline"][k]
        }
    return out


def best_of_n_suite(job: Job) -> SuiteResult:
    """Best-of-n selection by an ORM, a PRM, majority vote and at random
    (:mod:`trainers.evaluation.best_of_n_suite`)."""
    from trainers.evaluation.best_of_n_suite import best_of_n_suite as run

    return run(job)


SUITE_FUNCTIONS: dict[str, Callable[[Job], SuiteResult]] = {
    "reasoning": reasoning_suite,
    "math": math_suite,
    "winrate": winrate_suite,
    "generation": generation_suite,
    "pair_accuracy": pair_accuracy_suite,
    "best_of_n": best_of_n_suite,
}
