"""The per-model result cache of the answer suites, on the job itself (tiny preset, a few
prompts): the same model with the same settings and prompts is a hit with the same numbers, a
changed setting misses, and a baseline that is the same model as the target reuses its result
within one job."""

from __future__ import annotations

from pathlib import Path

from conftest import trainer_argv

from trainers.core.runfolder import EvalFile, read_file
from trainers.evaluation import run as eval_run

CONFIG = Path(eval_run.__file__).resolve().parent / "configs" / "reasoning.yaml"
QUICK = [
    "target=tiny",
    "prompts.tasks=[chain_sum]",
    "prompts.size=4",
    "sampling.n=2",
    "sampling.max_new_tokens=8",
    "reasoning.pass_k=[1,2]",
    "bootstrap.resamples=100",
    "device=cpu",
]


def evaluate(run_dir: Path, cache: Path, extra: list[str]) -> EvalFile:
    argv = trainer_argv(CONFIG, run_dir, [*QUICK, f"cache_dir={cache}", *extra])
    assert eval_run.main(argv) == 0
    ev, warning = read_file(run_dir / "eval.json", EvalFile)
    assert ev is not None, warning
    return ev


def test_same_model_and_settings_hit_the_cache_and_a_changed_setting_misses(tmp_path):
    cache = tmp_path / "cache"
    first = evaluate(tmp_path / "a", cache, ["baseline=tiny"])
    # the baseline is the target's model: its result is the target's, reused
    assert first.details["cache"] == {"target": "miss", "baseline": "hit"}
    assert first.cache_keys["target"] == first.cache_keys["baseline"]
    assert (cache / f"{first.cache_keys['target']}.json").is_file()

    again = evaluate(tmp_path / "b", cache, [])
    assert again.details["cache"] == {"target": "hit"}
    assert again.metrics == first.metrics  # the same numbers, intervals included
    assert (tmp_path / "b" / "samples.jsonl").is_file()  # still shows completions

    other = evaluate(tmp_path / "c", cache, ["seed=1"])
    assert other.details["cache"] == {"target": "miss"}
    assert other.cache_keys["target"] != first.cache_keys["target"]
    assert len(list(cache.glob("*.json"))) == 2

    off = evaluate(tmp_path / "d", cache, ["cache_dir=null"])
    assert off.details["cache"] == {"target": "off"}
