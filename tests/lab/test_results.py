"""Held-out first, noise always: arms, intervals and verdicts of compare; the diagnosis of
held-out regression and of noise samples; the ledger's headline, commands, attempts, seeds and
Next section; sweep --seeds. All on synthetic run folders written with the run-folder schema."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rlhf_lab import api, cli, ledger
from rlhf_lab.errors import InvalidArgument
from rlhf_lab.ledger.followups import next_items
from rlhf_lab.planning.trainer_config import TrainerConfig
from rlhf_lab.results.compare import compare_runs
from rlhf_lab.results.diagnosis import diagnose, heldout_regression, noise_reason, noisy_samples
from tests._helpers.run_folders import write_jsonl, write_run_json
from tests._helpers.shipped_configs import shipped_config

REPO = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("lab_root")


def make_run(
    campaign: str,
    run_id: str,
    family: str,
    recipe: str,
    rows: list[dict],
    *,
    algorithm: str | None = None,
    overrides: tuple[str, ...] = (),
    samples: list[dict] | None = None,
    state: str = "succeeded",
    summary: dict | None = None,
    run_json: dict | None = None,
) -> Path:
    """A run folder as the launcher (run.json with the applied overrides, config.yaml resolved
    from the shipped recipe) and a trainer (metrics.jsonl, samples.jsonl, summary.json) write
    it."""
    path = ledger.experiments_dir() / campaign / "runs" / run_id
    source, cfg = shipped_config(family, recipe, overrides)
    meta = {
        "config_source": source,
        "overrides": list(overrides),
        "cwd": str(REPO),
        "state": state,
        "started_at": "2026-03-01T10:00:00.000+00:00",
    }
    write_run_json(path, family, algorithm or recipe, **{**meta, **(run_json or {})})
    (path / "config.yaml").write_text(yaml.safe_dump(cfg))
    write_jsonl(path / "metrics.jsonl", rows)
    if samples is not None:
        write_jsonl(path / "samples.jsonl", samples)
    if state not in ("running", "queued", "killed", "died"):
        body = {"outcome": state, "wall_time_s": 30.0, "steps": rows[-1]["step"] if rows else 0}
        (path / "summary.json").write_text(json.dumps({**body, **(summary or {})}))
    return path


TINY_DA = ("model.name=tiny", "data.max_samples=640", "data.eval_size=128", "train.max_steps=40")


def da_run(campaign: str, run_id: str, recipe: str, acc: float, seed: int = 42, extra=()):
    rows = [
        {"step": 20, "phase": "eval", "eval/accuracy": 0.6},
        {"step": 40, "phase": "train", "loss": 0.3, "accuracy": 0.9},
        {"step": 40, "phase": "eval", "eval/accuracy": acc, "eval/margins": 0.5},
    ]
    overrides = (*TINY_DA, *extra, f"seed={seed}")
    make_run(campaign, run_id, "direct_alignment", recipe, rows, overrides=overrides)


CAMP = "2026-03-01-losses"

# what a random-init tiny model writes (sampled and greedy), as the trainers decode it
RANDOM_INIT = [
    " FR AT appl stor mayole WITHvel follow flatw electricAP I MY ONE MAPingdomstead ent ask "
    "alsomark episodements BE CONTiz thusCI two man kilILLtalortsteadLmy stead DIS his again",
    " cip pe pe answerie( appldayressed cip takeAN notWEayingill WILLbr BEill triste NOW Check "
    "about dom wordort ent what trilling).\n\n kil kil).\n\nage madeich slew oneSEck",
    " pectuortut).\n\n ad episode what cip\ufffd AToh DEposeckohcks mayoh episode made his",
    "\n\n\n\n\n\n\n\n\n\n\n\n",
]
TEXT = [
    "<think>The word is hello; reversed it is olleh.</think><answer>olleh</answer>",
    "Let me think step by step. First, 3 + 4 = 7. So the answer is 7.",
    "To solve this we add the numbers: 12 + 30 + 7 = 49. Therefore the total is 49.",
]


# ---------------------------------------------------------------------------------------------
# compare: arms, intervals, verdicts
# ---------------------------------------------------------------------------------------------


def test_single_seed_sweep_gets_binomial_noise_and_a_tie_verdict():
    """The DPO/IPO/SimPO sweep of the issue: 0.867 / 0.844 / 0.813 on 128 held-out pairs."""
    for rid, recipe, acc in (
        ("dpo-20260301-000000-0001", "dpo", 0.867),
        ("ipo-20260301-000000-0002", "ipo", 0.844),
        ("simpo-20260301-000000-0003", "simpo", 0.813),
    ):
        da_run(CAMP, rid, recipe, acc)
    cmp = compare_runs(
        ["dpo-20260301-000000-0001", "ipo-20260301-000000-0002", "simpo-20260301-000000-0003"]
    )
    assert cmp.headline == "eval/accuracy" and cmp.higher_is_better
    assert [a.label for a in cmp.arms] == ["dpo", "ipo", "simpo"]
    dpo = cmp.arms[0]
    assert dpo.n_items == 128 and dpo.values == [0.867] and dpo.seeds == [42]
    assert "single seed" in dpo.basis and "n=128" in dpo.basis
    assert dpo.low == pytest.approx(0.7974, abs=1e-3) and dpo.high == pytest.approx(
        0.9152, abs=1e-3
    )
    assert [(v.a, v.b, v.verdict) for v in cmp.verdicts] == [
        ("dpo", "ipo", "tie within noise"),
        ("dpo", "simpo", "tie within noise"),
    ]
    first = cmp.verdicts[0]
    assert first.difference == pytest.approx(0.023) and first.low < 0 < first.high
    assert "Newcombe" in first.method and "single seed" in first.reason
    # the output leads with the result and states the rule
    md = cmp.markdown
    assert md.index("**Result**") < md.index("| run | algorithm")
    assert "**dpo vs ipo: tie within noise**" in md and "are noise here" in md
    assert "Single seed" in md and "_Rule:" in md and "Wilson" in md and "Welch" in md


def test_seeds_group_into_arms_with_t_intervals_and_a_welch_verdict():
    for i, (d, p) in enumerate(((0.80, 0.60), (0.85, 0.62), (0.90, 0.64))):
        da_run(CAMP, f"dpo-20260301-000000-00d{i}", "dpo", d, seed=1 + i)
        da_run(CAMP, f"ipo-20260301-000000-00i{i}", "ipo", p, seed=1 + i)
    ids = [f"{a}-20260301-000000-00{a[0]}{i}" for a in ("dpo", "ipo") for i in range(3)]
    cmp = compare_runs(ids)
    dpo, ipo = cmp.arms
    assert dpo.run_ids == ids[:3] and dpo.seeds == [1, 2, 3]
    assert dpo.mean == pytest.approx(0.85)
    assert (dpo.low, dpo.high) == (pytest.approx(0.725793, abs=1e-6), pytest.approx(0.974207))
    assert dpo.basis == "t interval over 3 seeds"
    (verdict,) = cmp.verdicts
    assert (verdict.a, verdict.b, verdict.verdict) == ("dpo", "ipo", "better")
    assert "Welch" in verdict.method and verdict.low > 0


def test_unmatched_arms_and_different_held_out_sets_are_not_comparable():
    da_run(CAMP, "dpo-20260301-000000-0001", "dpo", 0.9, extra=("train.learning_rate=1e-5",))
    da_run(CAMP, "ipo-20260301-000000-0002", "ipo", 0.6, extra=("train.learning_rate=3e-4",))
    cmp = compare_runs(["dpo-20260301-000000-0001", "ipo-20260301-000000-0002"])
    (verdict,) = cmp.verdicts
    assert verdict.verdict == "not comparable" and "train.learning_rate" in verdict.reason
    # a different held-out set (eval size) is not comparable either
    da_run(CAMP, "simpo-20260301-000000-0003", "simpo", 0.6, extra=("data.eval_size=64",))
    cmp = compare_runs(["dpo-20260301-000000-0001", "simpo-20260301-000000-0003"])
    assert cmp.verdicts[0].verdict == "not comparable"
    assert "held-out set differs: data.eval_size" in cmp.verdicts[0].reason
    # one algorithm at two learning rates: two matched arms of a learning-rate sweep
    da_run(CAMP, "dpo-20260301-000000-0004", "dpo", 0.5, extra=("train.learning_rate=3e-4",))
    cmp = compare_runs(["dpo-20260301-000000-0001", "dpo-20260301-000000-0004"])
    labels = [a.label for a in cmp.arms]
    assert labels == ["dpo (train.learning_rate=1e-05)", "dpo (train.learning_rate=0.0003)"]
    assert cmp.verdicts[0].verdict == "better"


def test_two_recipes_of_one_algorithm_are_named_by_their_recipes():
    """grpo_tools against grpo (both algorithm grpo, the same overrides): the arms are the two
    recipes, named so, and matched (the environment is what is compared)."""

    def pg(run_id: str, recipe: str, acc: float, seed: int) -> None:
        rows = [{"step": 16, "phase": "eval", "eval/avg_correctness": acc}]
        overrides = (*PG_TINY, "data.specs=[{name: chain_sum}]", f"seed={seed}")
        make_run(
            CAMP, run_id, "policy_gradients", recipe, rows, algorithm="grpo", overrides=overrides
        )

    pg("grpo-20260301-000000-0011", "grpo_tools", 0.95, 42)
    pg("grpo-20260301-000000-0012", "grpo_tools", 0.97, 43)
    pg("grpo-20260301-000000-0013", "grpo", 0.20, 42)
    pg("grpo-20260301-000000-0014", "grpo", 0.25, 43)
    cmp = compare_runs([f"grpo-20260301-000000-00{i}" for i in range(11, 15)])
    assert [a.label for a in cmp.arms] == ["grpo_tools", "grpo"]
    assert [len(a.run_ids) for a in cmp.arms] == [2, 2]
    (verdict,) = cmp.verdicts
    assert verdict.verdict == "better" and verdict.a == "grpo_tools", verdict.reason


def test_a_single_seed_loss_has_no_noise_estimate():
    def sft(run_id: str, loss: float, lr: str) -> None:
        rows = [{"step": 5, "phase": "eval", "eval/loss": loss}]
        overrides = ("model.name=tiny", f"train.learning_rate={lr}", "seed=42")
        make_run(CAMP, run_id, "sft", "sft", rows, overrides=overrides)

    sft("sft-20260301-000000-0001", 1.4, "1e-5")
    sft("sft-20260301-000000-0002", 1.2, "1e-4")
    sft("sft-20260301-000000-0003", 1.3, "1e-4")  # same setting, same seed: a replicate
    cmp = compare_runs(
        ["sft-20260301-000000-0001", "sft-20260301-000000-0002", "sft-20260301-000000-0003"]
    )
    assert cmp.headline == "eval/loss" and not cmp.higher_is_better
    assert [len(a.run_ids) for a in cmp.arms] == [1, 2]
    (verdict,) = cmp.verdicts
    assert verdict.a == "sft (train.learning_rate=0.0001)"  # the lower loss leads
    assert verdict.verdict == "undecided" and "3 seeds" in verdict.reason


# ---------------------------------------------------------------------------------------------
# diagnosis: held-out regression, noise samples
# ---------------------------------------------------------------------------------------------


def grpo_rows() -> list[dict]:
    """The GRPO case of the issue: sampled correctness 0.17 -> 0.45 while greedy held-out
    correctness falls 0.50 -> 0.28."""
    rows = [{"step": 0, "phase": "eval", "eval/avg_correctness": 0.50}]
    for step in range(1, 21):
        c = 0.17 + (0.45 - 0.17) * (step - 1) / 19
        rows.append(
            {
                "step": step,
                "phase": "train",
                "avg_correctness": round(c, 4),
                "avg_format": 0.8,
                "avg_binary": round(c / 2, 4),
                "loss": 0.01,
                "frac_reward_zero_std": 0.3,
            }
        )
    rows.append({"step": 20, "phase": "eval", "eval/avg_correctness": 0.28})
    return rows


def pg_samples(texts: list[str], step: int = 20) -> list[dict]:
    """samples.jsonl rows as trainers.policy_gradients.train.evaluate writes them."""
    return [
        {
            "step": step,
            "kind": "eval",
            "question": f"Spell backward: word{i}",
            "answer": f"{i}drow",
            "completion": text,
            "correctness": 0.0,
            "format": 0.0,
            "binary": 0.0,
        }
        for i, text in enumerate(texts)
    ]


GRPO = "grpo-20260301-000000-0001"
PG_TINY = ("model.name=tiny", "data.eval_size=64", "train.max_steps=20", "loss.beta=0.0")
EVAL_64 = TrainerConfig("policy_gradients", {"data": {"eval_size": 64}})


def test_heldout_regression_while_the_training_signal_rises_is_flagged_everywhere():
    make_run(CAMP, GRPO, "policy_gradients", "grpo", grpo_rows(), overrides=PG_TINY)
    found = heldout_regression("policy_gradients", "grpo", grpo_rows(), EVAL_64)
    assert found is not None and found.signal == "avg_correctness" and found.signal_improved
    assert "fell 0.5 → 0.28" in found.message
    assert "training signal avg_correctness rose 0.1995 → 0.4205" in found.message
    assert "not the result" in found.message and "n=64" in found.message
    # diagnosis (run_status alerts)
    alerts = {a.kind: a for a in diagnose(GRPO)}
    assert "heldout_regression" in alerts and "loss.beta" in alerts["heldout_regression"].hint
    # the ledger: a diagnostic, never "nothing unusual detected"
    rec = ledger.record_run(GRPO, plot=False)
    assert "heldout_regression" in rec.flags
    assert rec.headline.metric == "eval/avg_correctness" and rec.headline.value == 0.28
    text = Path(ledger.show_campaign(CAMP).campaign.path).read_text()
    obs = text.split("rlhf-lab:begin observations-auto")[1]
    assert "held-out eval/avg_correctness fell 0.5 → 0.28" in obs
    assert "nothing unusual detected" not in obs
    # compare: the headline leads, Δ avg_correctness is labelled training signal, a warning
    cmp = compare_runs([GRPO])
    assert cmp.columns[0] == "eval/avg_correctness" and cmp.rows[0].values[cmp.columns[0]] == 0.28
    assert cmp.rows[0].values["eval/avg_correctness_change"] == pytest.approx(-0.22)
    header = cmp.table.splitlines()[0]
    assert "Δ avg_correctness (training signal)" in header
    assert header.index("eval/avg_correctness") < header.index("Δ avg_correctness (training")
    assert any("fell 0.5 → 0.28" in w for w in cmp.warnings)


def test_a_small_held_out_dip_within_noise_is_not_a_regression():
    rows = grpo_rows()
    rows[-1]["eval/avg_correctness"] = 0.45  # 0.50 -> 0.45 on 64 prompts: noise
    assert heldout_regression("policy_gradients", "grpo", rows, EVAL_64) is None
    rows[-1]["eval/avg_correctness"] = 0.6  # better
    assert heldout_regression("policy_gradients", "grpo", rows, None) is None


def test_noise_rule_flags_random_init_text_and_keeps_real_text():
    for text in RANDOM_INIT:
        assert noise_reason(text), text
    for text in TEXT:
        assert noise_reason(text) is None, text
    assert "distinct" in noise_reason("1 " * 23 + "2")
    assert noisy_samples(pg_samples(RANDOM_INIT[:2] + TEXT[:1])) is not None  # 2 of 3
    assert noisy_samples(pg_samples(RANDOM_INIT[:1] + TEXT[:2])) is None  # 1 of 3


def test_noise_samples_of_a_policy_gradient_run_show_their_prompts_and_are_flagged():
    rows = [{"step": 1, "phase": "train", "avg_correctness": 0.0, "loss": 0.0}]
    make_run(
        CAMP,
        GRPO,
        "policy_gradients",
        "grpo",
        rows,
        overrides=PG_TINY,
        samples=pg_samples(RANDOM_INIT[:2], step=1),
    )
    assert "noise_samples" in {a.kind for a in diagnose(GRPO)}
    rec = ledger.record_run(GRPO, plot=False)
    # the prompt of a policy-gradient sample is its `question`
    assert rec.samples[0].prompt == "Spell backward: word0" and rec.samples[0].kind == "eval"
    assert "noise_samples" in rec.flags
    text = Path(ledger.show_campaign(CAMP).campaign.path).read_text()
    assert "> **prompt:** Spell backward: word0" in text
    assert "are noise, not text" in text and "nothing unusual detected" not in text
    # the Next section: warm-start the tiny model first
    assert f"uv run rlhf-lab launch sft_tiny_warmstart --campaign {CAMP}" in text


# ---------------------------------------------------------------------------------------------
# ledger: commands, attempts, states, seeds
# ---------------------------------------------------------------------------------------------


def test_stop_and_resume_shows_every_attempt_and_the_total_wall_time():
    run_id = "dpo-20260301-000000-0res"
    rows = [{"step": 8, "phase": "eval", "eval/accuracy": 0.7}]
    resumes = [
        {
            "state": "stopped",
            "started_at": "2026-03-01T10:00:00.000+00:00",
            "ended_at": "2026-03-01T10:00:20.000+00:00",
            "from_step": 3,
            "resumed_at": "2026-03-01T10:05:00.000+00:00",
        }
    ]
    path = make_run(
        CAMP,
        run_id,
        "direct_alignment",
        "dpo",
        rows,
        overrides=TINY_DA,
        summary={"wall_time_s": 40.0, "steps": 8},
        run_json={"resumes": resumes},
    )
    attempt = path / "attempts" / "1"
    attempt.mkdir(parents=True)
    stopped = {"outcome": "stopped", "wall_time_s": 12.0, "steps": 3, "detail": "stop requested"}
    (attempt / "summary.json").write_text(json.dumps(stopped))
    rec = ledger.record_run(run_id, plot=False)
    assert rec.wall_time_s == pytest.approx(52.0)
    assert [(a.number, a.state, a.steps, a.wall_time_s) for a in rec.attempts] == [
        (1, "stopped", 3, 12.0),
        (2, "succeeded", 8, 40.0),
    ]
    assert rec.attempts[1].resumed_from_step == 3
    assert rec.attempts[1].command == f"uv run rlhf-lab resume {run_id}"
    text = Path(ledger.show_campaign(CAMP).campaign.path).read_text()
    assert "succeeded (after 2 attempts)" in text and "| 52 s |" in text
    assert "1. stopped, reached step 3, 12 s — stop requested — the lab command above" in text
    assert (
        f"2. succeeded, from checkpoint step 3, reached step 8, 40 s — `uv run rlhf-lab resume {run_id}`"
        in text
    )


def test_stopped_and_killed_runs_say_how_they_ended_once():
    rows = [{"step": 3, "phase": "train", "accuracy": 0.6}]
    make_run(CAMP, "dpo-20260301-000000-0stp", "direct_alignment", "dpo", rows, state="stopped")
    make_run(CAMP, "dpo-20260301-000000-0kil", "direct_alignment", "dpo", rows, state="killed")
    stopped = ledger.record_run("dpo-20260301-000000-0stp", plot=False)
    killed = ledger.record_run("dpo-20260301-000000-0kil", plot=False)
    assert killed.state == "killed" and "no checkpoint or summary" in killed.failure
    text = Path(ledger.show_campaign(CAMP).campaign.path).read_text()
    assert "stopped: stopped" not in text and "killed: killed" not in text
    assert "| stopped on request at step 3;" in text
    assert "| killed by the lab: no checkpoint" in text
    assert stopped.failure.startswith("stopped on request at step 3")


def test_the_header_shows_the_seeds_the_runs_used():
    """Reward-model recipes ship different seeds (123, 7, 13): the front matter lists each."""
    camp = ledger.create_campaign("rm-kinds", "Which reward model?", seeds=[123])
    rows = [{"step": 4, "phase": "eval", "eval/accuracy": 0.7}]
    for rid, recipe in (
        ("preference-20260301-000000-0001", "preference_rm"),
        ("orm-20260301-000000-0002", "orm"),
        ("prm-20260301-000000-0003", "prm"),
    ):
        make_run(camp.id, rid, "reward_models", recipe, rows, algorithm=rid.split("-")[0])
        ledger.record_run(rid, plot=False)
    view = ledger.show_campaign(camp.id)
    assert [r.seed for r in view.runs] == [123, 7, 13]
    assert view.campaign.seeds == [123, 7, 13]
    assert "seeds: [123, 7, 13]" in Path(camp.path).read_text()


# ---------------------------------------------------------------------------------------------
# the Next section
# ---------------------------------------------------------------------------------------------


def next_block(campaign: str) -> str:
    text = Path(ledger.show_campaign(campaign).campaign.path).read_text()
    return text.split("<!-- rlhf-lab:begin next -->")[1].split("<!-- rlhf-lab:end next -->")[0]


def commands_in(block: str) -> list[str]:
    return [line.strip() for line in block.splitlines() if line.strip().startswith("uv run ")]


def parse_with_the_cli(command: str, monkeypatch) -> dict:
    """Run ``command`` through the real CLI with its API function replaced by a recorder: the
    command must parse, and the recorder sees what the lab would be asked to do."""
    argv = shlex.split(command)
    assert argv[:3] == ["uv", "run", "rlhf-lab"]
    seen: dict = {}
    operation = {"sweep": "sweep", "launch": "launch"}[argv[3]]

    def record(*args, **kwargs):
        if args and isinstance(args[0], api.RunRequest):  # launch takes the request whole
            request = args[0]
            args = (request.recipe, request.override_texts())
            kwargs = request.model_dump(exclude={"recipe", "overrides"})
        elif args and isinstance(args[0], api.SweepRequest):  # so does sweep
            request = args[0]
            args = (request.recipes, [o.text for o in request.overrides])
            kwargs = request.model_dump(exclude={"recipes", "overrides"})
        seen.update(args=args, kwargs=kwargs)
        raise InvalidArgument("RECORDED")

    monkeypatch.setattr(api, operation, record)
    result = CliRunner().invoke(cli.app, argv[3:])
    assert "error: RECORDED" in result.output, result.output
    return seen


def test_next_section_tie_asks_for_more_fresh_seeds_with_a_valid_command(monkeypatch):
    ledger.create_campaign(CAMP, "Which loss?")
    da_run(CAMP, "dpo-20260301-000000-0001", "dpo", 0.867)
    da_run(CAMP, "ipo-20260301-000000-0002", "ipo", 0.844)
    compare_runs(["dpo-20260301-000000-0001", "ipo-20260301-000000-0002"], record_in=CAMP)
    block = next_block(CAMP)
    assert "dpo vs ipo: tie within noise" in block
    (command,) = commands_in(block)
    assert command.startswith("uv run rlhf-lab sweep dpo,ipo --no-shrink")
    seen = parse_with_the_cli(command, monkeypatch)
    assert seen["args"][0] == ["dpo", "ipo"]
    assert seen["kwargs"]["seeds"] == 2 and seen["kwargs"]["base_seed"] == 43
    assert seen["kwargs"]["shrink"] is False and seen["kwargs"]["campaign"] == CAMP
    assert "data.eval_size=128" in seen["args"][1]
    assert not any(o.startswith("seed=") for o in seen["args"][1])


def test_next_section_winner_gets_a_finer_learning_rate_sweep(monkeypatch):
    ledger.create_campaign(CAMP, "Which loss?")
    da_run(CAMP, "dpo-20260301-000000-0001", "dpo", 0.95, extra=("train.learning_rate=2e-4",))
    da_run(CAMP, "ipo-20260301-000000-0002", "ipo", 0.55, extra=("train.learning_rate=2e-4",))
    compare_runs(["dpo-20260301-000000-0001", "ipo-20260301-000000-0002"], record_in=CAMP)
    block = next_block(CAMP)
    assert "finer sweep" in block
    lrs = []
    for command in commands_in(block):
        seen = parse_with_the_cli(command, monkeypatch)
        assert seen["args"][0] == ["dpo"]
        lrs += [o for o in seen["args"][1] if o.startswith("train.learning_rate=")]
    assert lrs == ["train.learning_rate=0.0001", "train.learning_rate=0.0004"]


def test_next_section_regression_gives_fewer_steps_and_a_stronger_kl(monkeypatch):
    ledger.create_campaign(CAMP, "Does GRPO hold up on held-out prompts?")
    make_run(CAMP, GRPO, "policy_gradients", "grpo", grpo_rows(), overrides=PG_TINY)
    ledger.record_run(GRPO, plot=False)
    commands = commands_in(next_block(CAMP))
    assert len(commands) == 2
    steps = parse_with_the_cli(commands[0], monkeypatch)
    # the best held-out value was the first (step 0): half the steps
    assert steps["args"][0] == "grpo" and "train.max_steps=10" in steps["args"][1]
    assert "train.max_steps=20" not in steps["args"][1]
    kl = parse_with_the_cli(commands[1], monkeypatch)
    assert "loss.beta=0.04" in kl["args"][1] and "loss.beta=0.0" not in kl["args"][1]
    assert kl["kwargs"]["campaign"] == CAMP


def test_next_section_flat_metric_gets_a_learning_rate_sweep(monkeypatch):
    ledger.create_campaign(CAMP, "Does DPO learn?")
    rows = [
        {"step": s, "phase": p, key: 0.5}
        for s in range(1, 8)
        for p, key in (("train", "accuracy"), ("eval", "eval/accuracy"))
    ]
    make_run(CAMP, "dpo-20260301-000000-0001", "direct_alignment", "dpo", rows, overrides=TINY_DA)
    rec = ledger.record_run("dpo-20260301-000000-0001", plot=False)
    assert "flat" in rec.flags
    lrs = []
    for command in commands_in(next_block(CAMP)):
        seen = parse_with_the_cli(command, monkeypatch)
        lrs += [o for o in seen["args"][1] if o.startswith("train.learning_rate=")]
    assert lrs == ["train.learning_rate=1.5e-05", "train.learning_rate=5e-05"]  # 5e-6 × 3, × 10


def test_hand_written_next_text_survives_and_old_ledgers_get_the_block():
    camp = ledger.create_campaign(CAMP, "Which loss?")
    md = Path(camp.path)
    text = md.read_text()
    mine_before = "- my own idea: try β 0.05\n\n"
    mine_after = "\nDecided on 2026-03-02: run the 3-seed sweep first.\n"
    text = text.replace("## Next\n\n", "## Next\n\n" + mine_before, 1) + mine_after
    md.write_text(text)
    da_run(CAMP, "dpo-20260301-000000-0001", "dpo", 0.867)
    ledger.record_run("dpo-20260301-000000-0001", plot=False)
    text = md.read_text()
    assert mine_before in text and text.endswith(mine_after)
    assert text.index(mine_before) < text.index("<!-- rlhf-lab:begin next -->")

    # a ledger written before the Next block existed: the block lands under the heading and
    # the hand text after it stays
    legacy = re.sub(
        r"<!-- rlhf-lab:begin next -->.*<!-- rlhf-lab:end next -->\n", "", text, flags=re.S
    )
    md.write_text(legacy)
    ledger.render_campaign(CAMP)
    text = md.read_text()
    assert text.count("<!-- rlhf-lab:begin next -->") == 1
    assert mine_before in text and text.endswith(mine_after)


def test_next_items_are_empty_without_findings():
    da_run(CAMP, "dpo-20260301-000000-0001", "dpo", 0.9)
    rec = ledger.record_run("dpo-20260301-000000-0001", plot=False)
    assert rec.flags == []
    data = ledger.campaigns._load_data(CAMP)
    assert next_items(data) == []
    assert "no finding that calls for a follow-up" in next_block(CAMP)


# ---------------------------------------------------------------------------------------------
# sweep --seeds, status headline
# ---------------------------------------------------------------------------------------------


def test_sweep_queues_matched_seeds_for_every_arm(no_queue_worker):  # nothing starts
    result = api.sweep(
        api.SweepRequest(
            recipes=["preference_rm", "orm"], model="tiny", campaign="rm-seeds", seeds=2
        )
    )
    assert result.seeds == [123, 124]  # the first recipe's seed, then the next
    seeds = []
    for launch in result.launches:
        cfg = yaml.safe_load((Path(launch.run.run_dir) / "config.yaml").read_text())
        seeds.append((launch.run.algorithm, cfg["seed"]))
    assert seeds == [("preference", 123), ("orm", 123), ("preference", 124), ("orm", 124)]
    result = api.sweep(
        api.SweepRequest(
            recipes=["dpo"], overrides=["seed=7"], model="tiny", campaign="rm-seeds", seeds=1
        )
    )
    assert result.seeds == [7]
    with pytest.raises(InvalidArgument, match="seeds must be between 1 and 16"):
        api.sweep(api.SweepRequest(recipes=["dpo"], seeds=0))


def test_a_policy_gradient_sweep_trains_every_arm_on_the_same_rollout_shape(no_queue_worker):
    """ppo ships 16 prompts x 1 rollout and grpo 4 x 8: a sweep gives both the same budget
    (nothing starts)."""
    result = api.sweep(
        api.SweepRequest(recipes=["ppo", "grpo"], model="tiny", campaign="pg-matched")
    )
    shapes = []
    for launch in result.launches:
        cfg = yaml.safe_load((Path(launch.run.run_dir) / "config.yaml").read_text())
        rollout = cfg["rollout"]
        shapes.append((rollout["prompts_per_step"], rollout["num_rollouts"], cfg["data"]["size"]))
    assert shapes[0] == shapes[1], shapes


def test_cli_sweep_takes_seeds_and_base_seed(monkeypatch):
    seen = parse_with_the_cli("uv run rlhf-lab sweep dpo,ipo --seeds 3 --base-seed 5", monkeypatch)
    assert seen["kwargs"]["seeds"] == 3 and seen["kwargs"]["base_seed"] == 5


def test_status_leads_with_the_held_out_headline():
    da_run(CAMP, "dpo-20260301-000000-0001", "dpo", 0.867)
    view = api.run_status("dpo-20260301-000000-0001")
    assert view.headline.startswith("held-out eval/accuracy 0.867 (step 40; 95% 0.797")
    assert "n=128" in view.headline and view.headline.endswith("training signal accuracy 0.9")
    output = CliRunner().invoke(cli.app, ["status", "dpo-20260301-000000-0001"]).output
    lines = output.splitlines()
    assert lines[1].strip().startswith("held-out eval/accuracy 0.867")
    assert lines[2].strip().startswith("held-out: eval/accuracy=0.867")
    assert lines[3].strip().startswith("training: loss=0.3")


def test_held_out_count_comes_from_the_trainer_or_the_config():
    from rlhf_lab.results.headline import heldout_items

    rs = TrainerConfig("rejection_sampling", {"data": {"max_test_samples": 200}})
    logged = heldout_items("rejection_sampling", rs, [{"eval/num_prompts": 150.0}])
    assert (logged.n, logged.source) == (150, "eval/num_prompts logged")
    configured = heldout_items("policy_gradients", EVAL_64, [])
    assert configured.n == 64 and "data.eval_size" in configured.source
    assert heldout_items("sft", None, []).n is None


def test_verdict_between_mixed_seed_counts_and_mismatches():
    from rlhf_lab.ledger import ArmSummary
    from rlhf_lab.results.compare import verdict_between

    three = ArmSummary(label="dpo", run_ids=["a", "b", "c"], values=[0.9, 0.92, 0.91], n_items=128)
    one = ArmSummary(label="ipo", run_ids=["d"], values=[0.6], n_items=128)
    mixed = verdict_between(three, one, higher_is_better=True, share=True)
    assert mixed.verdict == "better" and "seed noise not measured" in mixed.reason
    assert "n=384 and 128" in mixed.method  # three seeds pool 3 × 128 held-out items
    assert (
        verdict_between(three, one, higher_is_better=True, share=True, same_family=False).verdict
        == "not comparable"
    )
    assert (
        verdict_between(three, one, higher_is_better=True, share=True, same_metric=False).verdict
        == "not comparable"
    )
    empty = ArmSummary(label="simpo", run_ids=["e"], values=[])
    assert verdict_between(three, empty, higher_is_better=True, share=True).verdict == "undecided"
