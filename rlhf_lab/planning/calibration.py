"""Difficulty calibration of runs that learn from their own samples (policy gradients, online
DPO, rejection sampling, distillation).

Before such a run the lab probes its base model on a few candidate reasoning-gym tasks and
difficulties (``python -m trainers.policy_gradients.probe``: ~32 prompts per candidate, a few
samples per prompt with the run's own sampling settings, scored by the family's verifier reward)
and picks a task where the base model's pass rate (share of samples whose verifier correctness
is > 0) lies in :data:`PASS_RANGE` and whose groups have contrast (share of prompts whose
samples' rewards differ, at least :data:`MIN_CONTRAST`): outside it every advantage is ~0 (all
wrong, or all right) and the run cannot learn from its samples. The generation limit follows
the base model's response lengths (:func:`generation_limit`).

Pieces, each usable alone: the candidate sets (:data:`CANDIDATE_SETS`), the choice rule as a
pure function of a pass-rate table (:func:`choose_task`), the generation-limit rule, the cache
(keyed like the evaluation cache: the model's weights fingerprint, the candidates, the sampling
settings and the prompt seed), the subprocess call (:func:`run_probe`), and :func:`calibrate`,
which returns a :class:`Calibration` whose ``overrides`` (task specs, generation limits) plan and
``launch --shrink`` apply after the shrink rules and before the user's overrides (those win).
``RLHF_LAB_CALIBRATE=0`` or ``--no-calibrate`` switches it off. The candidates are in
:mod:`rlhf_lab.planning.candidates`; applying it to plan and launch, the run folder's record and
the table in :mod:`rlhf_lab.planning.calibration_apply`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from rlhf_lab.planning.candidates import CANDIDATE_SETS, Candidate, as_candidate, candidates_for
from rlhf_lab.planning.overrides import Override, format_override
from rlhf_lab.planning.trainer_config import TrainerConfig

__all__ = [
    "CANDIDATE_SETS",
    "Calibration",
    "Candidate",
    "Choice",
    "ProbeRow",
    "ProbeSettings",
    "calibrate",
    "calibration_enabled",
    "choose_task",
    "generation_limit",
    "probe_cache_key",
]

PASS_RANGE = (0.10, 0.60)
"""Base-model pass rates (share of samples with correctness > 0) a run can learn from."""
MIN_CONTRAST = 0.2
"""Least share of prompts whose samples' rewards differ (groups with a non-zero advantage)."""
LENGTH_FACTOR = 1.5
LENGTH_STEP = 8
"""Generation limit: LENGTH_FACTOR × the base's p90 response length, rounded up to LENGTH_STEP."""
MIN_LIMIT = 16
PROBE_PROMPTS = 32
MIN_PROBE_PROMPTS = 16
MAX_PROBE_SAMPLES = 4
"""Samples per probe prompt: the run's group size, capped here (at least 2: contrast needs two)."""
PRESET_PROBE_PROMPTS = 8
"""Prompts per candidate on a random-init preset (tiny): enough to show it gets nothing right,
and a probe of seconds rather than minutes."""
PROBE_MAX_NEW_TOKENS = 128
"""The probe's own generation cap (the run's limit when lower)."""
TOKEN_BUDGET = 32_768
"""Cap on a probe's cost: candidates × prompts × samples × max new tokens (an upper bound on the
tokens it samples). Over it, prompts go down to MIN_PROBE_PROMPTS, then candidates are dropped."""
PROBE_TIMEOUT_S = 1800
CACHE_FORMAT = 1
PROBE_MODULE = "trainers.policy_gradients.probe"


# ---------------------------------------------------------------------------------------------
# The probe's table and the choice
# ---------------------------------------------------------------------------------------------


class ProbeRow(BaseModel):
    """One candidate as the probe measured it (``trainers.policy_gradients.probe``)."""

    id: str
    specs: list[dict[str, Any]] = Field(default_factory=list)
    prompts: int = 0
    samples: int = 0
    pass_rate: float
    contrast: float
    correctness_contrast: float = 0.0
    reward_positive_rate: float = 0.0
    format_rate: float = 0.0
    answer_tag_rate: float = 0.0
    untagged_pass_rate: float = 0.0
    length_p50: int = 0
    length_p90: int = 0
    clipped: float = 0.0
    seconds: float = 0.0

    @property
    def in_range(self) -> bool:
        lo, hi = PASS_RANGE
        return lo <= self.pass_rate <= hi and self.contrast >= MIN_CONTRAST

    def counts(self) -> str:
        n = self.prompts * self.samples
        return f"{round(self.pass_rate * n)}/{n}" if n else f"{self.pass_rate:.0%}"


class Choice(BaseModel):
    chosen: str | None = Field(description="candidate id to train on (None: keep the config's)")
    requested: str | None = None
    in_range: list[str] = Field(default_factory=list)
    reasons: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)


def _middle_distance(row: ProbeRow) -> float:
    """Distance of the pass rate from the middle of PASS_RANGE, in 5-point steps (differences
    smaller than that are sampling noise at ~100 samples)."""
    mid = sum(PASS_RANGE) / 2
    return math.floor(abs(row.pass_rate - mid) / 0.05)


def _rank(rows: list[ProbeRow]) -> list[ProbeRow]:
    """Best first: nearest the middle of the range, then more contrast, then table order."""
    order = {id(r): i for i, r in enumerate(rows)}
    return sorted(rows, key=lambda r: (_middle_distance(r), -r.contrast, order[id(r)]))


def expectation(row: ProbeRow) -> str:
    """What a run on ``row``'s task should expect, in one sentence."""
    lo, hi = PASS_RANGE
    n = row.prompts
    contrast = f"{round(row.contrast * n)}/{n} prompts with group contrast" if n else ""
    if row.contrast == 0:
        return (
            f"pass rate {row.counts()} and no group contrast: every advantage is 0, the run "
            "cannot learn from its samples" + _prose(row)
        )
    if row.pass_rate < lo and row.correctness_contrast == 0:
        return (
            f"pass rate {row.counts()}, {contrast} from the format reward only: the run can "
            "learn the tags, but correctness gives no signal until some answers are right"
        )
    if row.pass_rate < lo:
        return f"pass rate {row.counts()}, {contrast}: a sparse signal, slow to learn"
    if row.pass_rate > hi:
        return f"pass rate {row.counts()}, {contrast}: mostly solved already, little left to learn"
    return f"pass rate {row.counts()}, {contrast}: too few groups with contrast"


def _prose(row: ProbeRow) -> str:
    """A clause for a model that answers without the tags the reward reads."""
    if row.answer_tag_rate > 0 or row.untagged_pass_rate <= 0:
        return ""
    return (
        f" (it writes no <answer> tag, yet {row.untagged_pass_rate:.0%} of its untagged answers "
        "are right: the tag format, not the task, is what it lacks)"
    )


def _suggestion(rows: list[ProbeRow], exclude: str | None) -> str:
    ranked = _rank([r for r in rows if r.in_range and r.id != exclude])
    if ranked:
        return f"try {ranked[0].id} (pass rate {ranked[0].counts()}, contrast {ranked[0].contrast:.2f})"
    return (
        "start from a short SFT warm start on the task (the r1-zero pipeline with the model "
        "<model>), or an easier task"
    )


def choose_task(table: list[ProbeRow], requested: str | None = None) -> Choice:
    """The task to train on from the probe's ``table``.

    In range: pass rate within PASS_RANGE and contrast >= MIN_CONTRAST. A ``requested`` task
    (the user's) is kept whatever its figures, with a warning saying what to expect and what to
    try when it is out of range. Otherwise the in-range candidate nearest the middle of the range
    (then the one with more contrast) is chosen; none in range: the config's task is kept
    (``chosen`` None) with the warning and the suggestion (an SFT warm start when nothing works).
    """
    lo, hi = PASS_RANGE
    in_range = [r.id for r in table if r.in_range]
    rule = f"pass rate in [{lo:.0%}, {hi:.0%}] and contrast >= {MIN_CONTRAST:.2f}"
    if requested is not None:
        row = next((r for r in table if r.id == requested), None)
        if row is None:
            return Choice(
                chosen=requested,
                requested=requested,
                in_range=in_range,
                warnings=[f"{requested} was not probed: its difficulty is unknown"],
            )
        if row.in_range:
            return Choice(
                chosen=requested,
                requested=requested,
                in_range=in_range,
                reasons=[f"{requested} (requested) is in range: {rule}"],
            )
        warning = (
            f"{requested} (requested, kept): {expectation(row)}; {_suggestion(table, requested)}"
        )
        return Choice(chosen=requested, requested=requested, in_range=in_range, warnings=[warning])
    ranked = _rank([r for r in table if r.in_range])
    if ranked:
        best = ranked[0]
        why = f"{best.id}: pass rate {best.counts()}, contrast {best.contrast:.2f} ({rule})"
        if len(ranked) > 1:
            why += f"; nearest the middle of the range of {len(ranked)} in range"
        return Choice(chosen=best.id, in_range=in_range, reasons=[why])
    mid = sum(PASS_RANGE) / 2  # ties: the one whose prose answers are right most often
    closest = min(
        table, key=lambda r: (abs(r.pass_rate - mid), -r.untagged_pass_rate), default=None
    )
    warning = "no probed task is in range (" + rule + ")"
    if closest is not None:
        warning += f"; closest {closest.id}: {expectation(closest)}"
    warning += "; " + _suggestion(table, None) + ". The configured task is kept."
    return Choice(chosen=None, in_range=in_range, warnings=[warning])


def generation_limit(p90: int, cap: int, clipped: float = 0.0) -> int:
    """LENGTH_FACTOR × the base's p90 response length, rounded up to a multiple of LENGTH_STEP,
    at least MIN_LIMIT and at most ``cap`` (the recipe's). When more than a tenth of the probe's
    samples were clipped, the p90 is the probe's cap, not a length: ``cap`` is kept."""
    if clipped > 0.1 or p90 <= 0:
        return cap
    limit = math.ceil(LENGTH_FACTOR * p90 / LENGTH_STEP) * LENGTH_STEP
    return max(MIN_LIMIT, min(cap, limit))


# ---------------------------------------------------------------------------------------------
# Where each family keeps its task, sampling and limits
# ---------------------------------------------------------------------------------------------


def _spec(task: str, settings: dict | None) -> dict[str, Any]:
    """A reasoning-gym spec of ``task``: its ``settings``, else the lab's easy ones."""
    from trainers.core.builtin_data import task_settings

    conf = dict(settings) if settings else task_settings(task)
    return {"name": task, "weight": 1.0, "config": conf}


@dataclass(frozen=True)
class Target:
    """How a family's config names its task, sampling settings, group size and lengths."""

    sampling: str  # section holding temperature, top_p, top_k, min_p
    group_key: str
    max_key: str
    eval_max_key: str | None
    specs_style: str  # "specs" (data.specs) | "builtin:<prefix>" (data.dataset + task configs)

    def specs_of(self, config: TrainerConfig) -> list[dict] | None:
        """The configured reasoning-gym specs, or None when the run's prompts are not a
        reasoning-gym task the verifier scores."""
        if self.specs_style == "specs":
            if (config.get("data.source", "reasoning_gym") or "") != "reasoning_gym":
                return None
            return [dict(s) for s in config.get("data.specs", None) or []] or None
        prefix = self.specs_style.partition(":")[2]
        dataset = str(config.get("data.dataset", "") or "")
        if not dataset.startswith(prefix):
            return None
        tasks = [t.strip() for t in dataset[len(prefix) :].lstrip(":").split(",") if t.strip()]
        if not tasks:  # builtin:reasoning-preferences: the built-in mix of tasks
            from trainers.core.builtin_data import DEFAULT_BUILTIN_TASKS

            tasks = list(DEFAULT_BUILTIN_TASKS)
        confs = config.get("data.builtin_task_configs", None) or {}
        return [_spec(t, confs.get(t)) for t in tasks]

    def spec_keys(self) -> tuple[str, ...]:
        if self.specs_style == "specs":
            return ("data.specs",)
        return ("data.dataset", "data.builtin_task_configs")

    def task_overrides(self, specs: list[dict]) -> dict[str, Any]:
        if self.specs_style == "specs":
            return {"data.specs": specs}
        prefix = self.specs_style.partition(":")[2]
        sep = "" if prefix.endswith(":") else ":"
        return {
            "data.dataset": prefix + sep + ",".join(str(s["name"]) for s in specs),
            "data.builtin_task_configs": {str(s["name"]): s.get("config") or {} for s in specs},
        }


TARGETS: dict[str, Target] = {
    "policy_gradients": Target(
        "rollout", "rollout.num_rollouts", "rollout.max_new_tokens", "eval.max_new_tokens", "specs"
    ),
    "distillation": Target(
        "rollout", "rollout.num_samples", "rollout.max_new_tokens", None, "specs"
    ),
    "rejection_sampling": Target(
        "generation",
        "generation.num_completions_per_prompt",
        "generation.max_new_tokens",
        "eval.eval_max_new_tokens",
        "builtin:builtin",
    ),
    "online_dpo": Target(
        "online",
        "online.num_samples",
        "online.max_new_tokens",
        None,
        "builtin:builtin:reasoning-preferences",
    ),
}


def target_for(family: str, algorithm: str) -> Target | None:
    if algorithm == "online_dpo":
        return TARGETS["online_dpo"]
    return TARGETS.get(family) if family != "direct_alignment" else None


def _format_weight(config: TrainerConfig) -> float:
    """The weight of the tag format in the run's reward (policy gradients only)."""
    if config.family != "policy_gradients":
        return 0.0
    return float(config.get("reward.format_weight", 0.5) or 0.0)


# ---------------------------------------------------------------------------------------------
# Probe settings, cost cap and cache
# ---------------------------------------------------------------------------------------------


class ProbeSettings(BaseModel):
    """What a probe's numbers depend on besides the model and the candidates: always the run's
    own sampling settings and reward weight (:func:`probe_settings`), so the lab states no
    sampling defaults of its own (the probe's command line has them for a probe run by hand)."""

    prompts: int = PROBE_PROMPTS
    samples: int
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    format_weight: float
    seed: int
    environment: str | None = None  # multi-turn runs (env.name): probe trajectories with it
    max_turns: int

    @property
    def turns(self) -> int:
        """Model turns a sample can take (1 for a single-turn probe): the cost multiplier."""
        return self.max_turns if self.environment else 1


# The probe measures the base model on a task, not a run: one prompt seed for every run, so the
# seeds of a sweep share one probe (and one choice: arms stay matched). With the run's seed each
# seed of a 3-seed sweep probed again (~2 min each on SmolLM2) beside the first, running, seed.
PROBE_SEED = 42


def probe_settings(target: Target, family: str, config: TrainerConfig) -> ProbeSettings:
    """The run's own sampling settings and reward weights; its group size capped at
    MAX_PROBE_SAMPLES (at least 2); its generation limit capped at PROBE_MAX_NEW_TOKENS."""
    s, g = target.sampling, config.get
    group = int(g(target.group_key, 2) or 2)
    run_max = int(g(target.max_key, 128) or 128)
    return ProbeSettings(
        samples=max(2, min(group, MAX_PROBE_SAMPLES)),
        max_new_tokens=min(run_max, PROBE_MAX_NEW_TOKENS),
        temperature=float(g(f"{s}.temperature", 1.0) or 1.0),
        top_p=float(g(f"{s}.top_p", 1.0) or 1.0),
        top_k=int(g(f"{s}.top_k", 0) or 0),
        min_p=float(g(f"{s}.min_p", 0.0) or 0.0),
        format_weight=_format_weight(config),
        seed=PROBE_SEED,
        environment=g("env.name", None) if family == "policy_gradients" else None,
        max_turns=int(g("env.max_turns", 3) or 3),
    )


def fit_budget(
    candidates: list[Candidate], settings: ProbeSettings, budget: int = TOKEN_BUDGET
) -> tuple[list[Candidate], ProbeSettings, list[str]]:
    """Candidates and settings within ``budget`` sampled tokens (upper bound): fewer prompts
    first (down to MIN_PROBE_PROMPTS), then the last candidates dropped (the first, a request,
    is always kept). Returns what was cut as notes."""
    per = settings.samples * settings.max_new_tokens * settings.turns
    notes = []
    if len(candidates) * settings.prompts * per > budget:
        prompts = max(MIN_PROBE_PROMPTS, budget // max(1, len(candidates) * per))
        if prompts < settings.prompts:
            notes.append(f"probe prompts {settings.prompts} -> {prompts} (cost cap)")
            settings = settings.model_copy(update={"prompts": prompts})
    keep = max(1, budget // max(1, settings.prompts * per))
    if keep < len(candidates):
        dropped = [c.id for c in candidates[keep:]]
        notes.append(f"not probed (cost cap of {budget} tokens): {', '.join(dropped)}")
        candidates = candidates[:keep]
    return candidates, settings, notes


def probe_cache_key(fingerprint: str, candidates: list[Candidate], settings: ProbeSettings) -> str:
    """The cache key of a probe: model weights fingerprint + candidates + sampling settings and
    prompt seed (as trainers/evaluation/cache.py keys a model's evaluation)."""
    blob = json.dumps(
        {
            "model": fingerprint,
            "candidates": [c.model_dump() for c in candidates],
            "settings": settings.model_dump(),
            "format": CACHE_FORMAT,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def default_cache_dir() -> Path:
    from rlhf_lab.paths import experiments_dir

    return experiments_dir() / ".lab" / "calibration-cache"


def load_cached(cache_dir: Path | None, key: str) -> dict[str, Any] | None:
    if cache_dir is None:
        return None
    try:
        entry = json.loads((Path(cache_dir) / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    return entry if isinstance(entry, dict) and entry.get("key") == key else None


def store_cached(cache_dir: Path | None, key: str, report: dict[str, Any]) -> None:
    if cache_dir is None:
        return
    path = Path(cache_dir) / f"{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({**report, "key": key}))
    os.replace(tmp, path)


ProbeFn = Callable[[str, list[Candidate], ProbeSettings], dict[str, Any]]


def probe_threads() -> int:
    """Torch threads of the probe: ``OMP_NUM_THREADS`` when set, else half the cores. On a busy
    2-core machine 2 threads made a tiny probe 3-10× slower than 1 (contended, measured)."""
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, (os.cpu_count() or 2) // 2)


def run_probe(model: str, candidates: list[Candidate], settings: ProbeSettings) -> dict[str, Any]:
    """Run the trainer-side probe in a subprocess; its JSON report. RuntimeError with the
    probe's last error line when it fails."""
    argv = [
        sys.executable,
        "-m",
        PROBE_MODULE,
        "--model",
        model,
        "--json",
        "--candidates",
        json.dumps([c.model_dump() for c in candidates]),
    ]
    for key, value in settings.model_dump().items():
        if key in ("environment", "max_turns") and not settings.environment:
            continue  # a single-turn probe
        argv += [f"--{key.replace('_', '-')}", str(value)]
    argv += ["--threads", str(probe_threads())]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the probe took more than {PROBE_TIMEOUT_S} s") from None
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
        raise RuntimeError(lines[-1] if lines else f"the probe exited {done.returncode}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# The calibration of one run
# ---------------------------------------------------------------------------------------------


class Calibration(BaseModel):
    """The probe and the choice, as plan shows them and the run folder keeps them."""

    model: str
    fingerprint: str | None = None
    settings: ProbeSettings
    rows: list[ProbeRow] = Field(default_factory=list)
    choice: Choice | None = None
    chosen_specs: list[dict[str, Any]] | None = None
    generation_limit: int | None = None
    overrides: list[str] = Field(
        default_factory=list, description="applied after the shrink rules, before yours"
    )
    cached: bool = False
    seconds: float | None = None
    notes: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)


def calibration_enabled(flag: bool = True) -> bool:
    """Off with ``flag`` False or ``RLHF_LAB_CALIBRATE=0`` in the environment."""
    env = os.environ.get("RLHF_LAB_CALIBRATE", "1").strip().lower()
    return flag and env not in {"0", "false", "no", "off"}


def _override_keys(overrides: Iterable[Override]) -> set[str]:
    """The keys ``overrides`` set."""
    return {o.key for o in overrides}


def _random_init_preset(model: str) -> bool:
    """A built-in preset itself (random weights; not a run trained from one)."""
    from trainers.core.tiny import PRESETS

    return model in PRESETS


def _existing_model(model: str) -> str | None:
    """What to probe for ``model``: a run reference (``run:<id>``) is its run's final model
    when that run has finished and kept it (None: not there yet); any other name as it is."""
    from rlhf_lab.runs.lineage import is_ref, ref_id, upstream

    if not is_ref(model):
        return model
    try:
        up = upstream(ref_id(model))
    except Exception:  # noqa: BLE001 - an unknown run: nothing to probe, said so
        return None
    return str(up.final_model) if up.has_output else None


def _fingerprint(model: str) -> str | None:
    from trainers.core.models import model_fingerprint

    try:
        return model_fingerprint(model)
    except Exception:  # noqa: BLE001 - an unresolvable model: no calibration, said so
        return None


def _overrides(
    target: Target, config: TrainerConfig, cal: Calibration, user_keys: set[str]
) -> list[str]:
    values: dict[str, Any] = {}
    if cal.choice and cal.choice.chosen and not cal.choice.requested and cal.chosen_specs:
        values.update(target.task_overrides(cal.chosen_specs))
    if cal.generation_limit is not None:
        values[target.max_key] = cal.generation_limit
        if target.eval_max_key and config.get(target.eval_max_key, None) is not None:
            values[target.eval_max_key] = cal.generation_limit
    return [
        format_override(k, v)
        for k, v in values.items()
        if k not in user_keys and config.get(k, None) != v
    ]


def calibrate(
    family: str,
    algorithm: str,
    config: TrainerConfig,
    requested_overrides: Sequence[Override],
    *,
    probe: ProbeFn = run_probe,
    cache_dir: Path | None | str = "default",
) -> Calibration | None:
    """Probe the base model of a shrunk ``config`` and choose its task and generation limit.

    ``requested_overrides``: the overrides given for the run (the user's, a pipeline stage's);
    one that sets the task makes it the requested task (kept, with a warning when out of
    range), and the keys they set are never overridden. None for a run the calibration does not
    concern (another family, prompts without a verifier, or no model). ``probe`` runs the probe
    (the subprocess by default; tests pass a stub); ``cache_dir`` None: no cache."""
    target = target_for(family, algorithm)
    model = config.get("model.name", None)
    configured = target.specs_of(config) if target else None
    if target is None or configured is None or not isinstance(model, str):
        return None
    user_keys = _override_keys(requested_overrides)
    requested = configured if user_keys & set(target.spec_keys()) else None
    settings = probe_settings(target, family, config)
    if _random_init_preset(model):
        settings = settings.model_copy(update={"prompts": PRESET_PROBE_PROMPTS})
    cal = Calibration(model=model, settings=settings)
    model = _existing_model(model)
    if model is None or (cal_fp := _fingerprint(model)) is None:
        cal.notes.append(f"not calibrated: {cal.model} is not a model that exists yet")
        return cal
    cal.fingerprint = cal_fp
    candidates, settings, cut = fit_budget(candidates_for(requested, configured), settings)
    cal.settings, cal.notes = settings, cut
    key = probe_cache_key(cal_fp, candidates, settings)
    folder = default_cache_dir() if cache_dir == "default" else cache_dir
    report = load_cached(Path(folder) if folder else None, key)
    cal.cached = report is not None
    if report is None:
        from rlhf_lab.planning.notices import starting

        starting(
            f"probing {cal.model} on {len(candidates)} candidate task(s), {settings.prompts} "
            f"prompts × {settings.samples} samples each, to pick the run's task (once: cached)..."
        )
        try:
            report = probe(model, candidates, settings)
        except Exception as err:  # noqa: BLE001 - a failed probe leaves the run as configured
            cal.warnings.append(f"calibration probe failed ({err}): the configured task is kept")
            return cal
        store_cached(Path(folder) if folder else None, key, report)
    cal.seconds = report.get("seconds")
    cal.rows = [ProbeRow.model_validate(r) for r in report.get("candidates", [])]
    return _decide(cal, target, config, requested, user_keys)


def _decide(
    cal: Calibration,
    target: Target,
    config: TrainerConfig,
    requested: list[dict] | None,
    user_keys: set[str],
) -> Calibration:
    """Fill the choice, the generation limit and the overrides of a probed calibration."""
    requested_id = as_candidate(requested).id if requested else None
    cal.choice = choose_task(cal.rows, requested_id)
    cal.warnings += [w.replace("<model>", cal.model) for w in cal.choice.warnings]
    row = next((r for r in cal.rows if r.id == cal.choice.chosen), None)
    if row is None:  # none chosen: the configured task's row, when it was probed
        configured = as_candidate(target.specs_of(config) or []).id
        row = next((r for r in cal.rows if r.id == configured), None)
    cal.chosen_specs = row.specs if row is not None else None
    cap = int(config.get(target.max_key, 128) or 128)
    if row is not None:
        cal.generation_limit = generation_limit(row.length_p90, cap, row.clipped)
        if row.clipped > 0.1:
            cal.notes.append(
                f"{row.clipped:.0%} of the probe's samples on {row.id} reached its "
                f"{cal.settings.max_new_tokens}-token cap: the generation limit stays {cap}"
            )
    cal.overrides = _overrides(target, config, cal, user_keys)
    return cal
